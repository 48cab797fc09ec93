"""Exactly-once resume of a restore into a stream, from the stream itself.

A queue's depth says how many messages a killed restore left behind; a
stream's does not (a passive declare reports 0 on 3.10 and a sampled figure
on 4.x). But a stream is a log with one offset per message that nobody
consumes away, so the restore records the stream's *next offset* before it
publishes anything (``initial_offset`` in the checkpoint). Its records then
sit at ``initial_offset + 0, 1, 2, ...`` in publish order: on resume, the
messages at and after ``initial_offset + confirmed`` are exactly the ones
the broker took but the checkpoint had not yet recorded. They are read back
(non-destructively) and their bodies compared, one by one, with the records
the restore would publish next: equal ones are counted as restored, and any
difference means another publisher wrote to the stream, which is refused
before anything is published.

Every read here attaches an ``x-stream-offset`` consumer. On anything that is
not a stream that consumer would take messages, so the first delivery
without an ``x-stream-offset`` header stops the read before any ack (the
unacked deliveries return to the queue when the channel closes).
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..broker.stream_end import probe_end
from ..broker.stream_reader import read_stream
from ..broker.transport import TargetConnection, wire_connection
from ..config import ConnectionConfig
from ..errors import CheckpointError, RestoreError

log = logging.getLogger(__name__)
_PREFETCH = 256


def body_digest(body: bytes) -> bytes:
    return hashlib.sha256(body).digest()


@dataclass
class LandedTail:
    """What a killed run left in the stream after the checkpoint's confirmed prefix."""

    start: int  # first offset after the checkpointed prefix
    digests: deque[bytes] = field(default_factory=deque)  # bodies at start, start+1, ... in order

    def __len__(self) -> int:
        return len(self.digests)


def _read_offsets(conn: TargetConnection, vhost: str, queue: str, first: int | str, sink: Callable[[int, bytes], None],
                  idle_secs: float, end: int | None = None) -> None:
    """``sink(offset, body)`` for each message from ``first`` (the backup's stream reader: acks only
    return credit), ending at offset ``end`` when known, else after ``idle_secs`` without a delivery. A
    message without an offset means the queue is not a stream: the read stops before anything was
    acked (its deliveries return)."""
    where = f"stream {queue!r} in vhost {vhost!r}"

    def check(_method, _props, body: bytes, off: int) -> None:
        if off < 0:
            raise RestoreError(f"{where} is not a stream (its messages carry no x-stream-offset); "
                               f"the backup restores a stream into it")
        sink(off, body)

    read_stream(wire_connection(conn), vhost, queue, first, check, prefetch=_PREFETCH, idle_secs=idle_secs, end_offset=end)


def settled_end(target: ConnectionConfig | None, conn: TargetConnection, vhost: str, queue: str) -> int | None:
    """The stream's last offset (-1: empty) from the stream protocol, only when no written chunk is
    still uncommitted (3.11+); None: find the end by reading until a quiet period instead."""
    end = probe_end(target, wire_connection(conn), vhost, queue, settled=True) if target is not None else None
    if end is None:
        log.info("stream %r in vhost %r: its end is found by a quiet period", queue, vhost)
    return end


def stream_next_offset(conn: TargetConnection, vhost: str, queue: str, idle_secs: float = 1.0,
                       target: ConnectionConfig | None = None) -> int:
    """The offset the next message published to the stream will get; 0 for an empty stream.

    Asks the stream protocol on ``target`` first; else attaches at ``last`` (the start of the
    newest chunk) and reads that chunk until ``idle_secs`` pass without a delivery.
    """
    end = settled_end(target, conn, vhost, queue)
    if end is not None:
        return end + 1
    last = -1

    def sink(off: int, _body: bytes) -> None:
        nonlocal last
        last = max(last, off)

    _read_offsets(conn, vhost, queue, "last", sink, idle_secs)
    return last + 1


def landed_tail(conn: TargetConnection, vhost: str, queue: str, initial_offset: int, confirmed: int,
                limit: int, last_confirmed: bytes | None = None, idle_secs: float = 1.0,
                target: ConnectionConfig | None = None) -> LandedTail:
    """The messages a killed run left after its checkpoint, checked against the checkpoint.

    The stream must hold the checkpoint's last confirmed record at offset ``start - 1`` (its
    body is ``last_confirmed`` when known) and nothing between it and what follows; more than
    ``limit`` messages after it cannot have come from one killed run. Each case is a
    ``CheckpointError`` naming the stream.
    """
    start = initial_offset + confirmed
    where = f"stream {queue!r} in vhost {vhost!r}"
    tail = LandedTail(start)
    seen_previous = start == 0
    expected = start

    def sink(off: int, body: bytes) -> None:
        nonlocal seen_previous, expected
        if off < start - 1:
            return  # the chunk holding start - 1 began earlier
        if off == start - 1:
            seen_previous = True
            if last_confirmed is not None and body_digest(body) != body_digest(last_confirmed):
                raise CheckpointError(
                    f"{where}: the message at offset {off} is not the last record this restore's checkpoint "
                    f"confirmed; something else wrote into the stream since the restore began (another "
                    f"publisher, or a stream-protocol client's offset tracking, which also takes offsets). "
                    f"Resuming could not be exact: restore into a fresh stream with a fresh checkpoint_state.")
            return
        if off != expected:
            raise CheckpointError(f"{where} skips from offset {expected - 1} to {off} after this restore's "
                                  f"records; retention or another writer changed it. Resuming could not be "
                                  f"exact: restore into a fresh stream with a fresh checkpoint_state.")
        if len(tail.digests) >= limit:
            raise CheckpointError(
                f"{where} holds more than {limit} messages after offset {start - 1}, the last one this restore's "
                f"checkpoint confirmed; one killed run leaves fewer, so another publisher wrote to it. Resuming "
                f"could not be exact: restore into a fresh stream with a fresh checkpoint_state.")
        tail.digests.append(body_digest(body))
        expected = off + 1

    _read_offsets(conn, vhost, queue, max(start - 1, 0), sink, idle_secs, settled_end(target, conn, vhost, queue))
    if not seen_previous:
        raise CheckpointError(
            f"{where} ends before offset {start - 1}, which this restore's checkpoint says the broker confirmed: "
            f"the stream was deleted and declared again, or truncated. Resuming would leave a gap: restore "
            f"into it again with a fresh checkpoint_state.")
    return tail


def check_landed(tail: LandedTail, body: bytes, where: str, record: str) -> None:
    """The next landed message must be this record: anything else is another publisher's."""
    if body_digest(body) != tail.digests.popleft():
        raise CheckpointError(
            f"{where}: the message at offset {tail.start} is not {record}, the record this restore would publish "
            f"there; another publisher wrote to the stream. Resuming could not be exact: restore into a fresh "
            f"stream with a fresh checkpoint_state.")
    tail.start += 1
