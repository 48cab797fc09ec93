"""Streams followed without end: the backup's record stage and segments, flushed on each tick.

A ``FollowerGroup`` reads up to ``archiver.GROUP_STREAMS`` streams of a vhost by offset on one AMQP
connection and one thread (a channel and an ``x-stream-offset`` consumer each) and hands each
delivery to its stream's ``StreamFollower``: the backup's ``RecordThread`` builds the same records,
a ``store_pool.StreamSegments`` closes segments whenever the archiver asks (a tick) and stores them
on the archive's shared pool (the same ``SegmentStore``). What a follower reports is only what the
storage holds: ``on_durable`` moves its durable position, never the read.

Each record's ``backed_up_at`` is when the follower read it, as in a backup (non-decreasing; over
AMQP 0-9-1 none of 3.10.8, 4.0.5 and 4.3.6 sends ``x-stream-chunk-timestamp``, measured; a broker
that does gives the chunk's time instead). A caught-up follower reads a record milliseconds after
it is committed, so a point-in-time restore selects records by about when they were published; one
catching up stamps them late, never early.

At every flush request (a tick) the group first probes the stream's committed end over the stream
protocol (``broker.stream_end.EndProber``), then keeps reading until it has read that end (at most
``CATCHUP_SECS``), then closes the segment. Every record the broker had committed at the probe's
instant is then in the flushed segment (or an earlier one), so once it is durable and named the
stream is complete up to that instant: exact, where a record's read time says nothing about records
committed before it and not read yet (a backlog). An idle stream's recovery point advances the same
way, with no data written.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..backup.convert import BROKER_HEADERS, to_record
from ..backup.record_thread import RecordThread
from ..backup.stream_chain import NON_MESSAGE_SLACK, ChainDecision
from ..broker.connect import connect
from ..broker.deliveries import Deliver, properties, to_delivery
from ..broker.stream_end import EndProber
from ..broker.stream_reader import chunk_timestamp, split_offset, stream_offset
from ..config import ConnectionConfig
from ..errors import AmqpConnectionError, AmqpError, ChannelClosedByBroker, ConnectionLost
from ..format.manifest import SegmentMetadata, StreamGap, StreamInfo, TapOf

log = logging.getLogger(__name__)

IDLE_SECS = 0.05  # how often a quiet read looks at the archiver's requests (a tick waits for it)
CATCHUP_SECS = 0.5  # a flush waits at most this long for the read to reach the end probed (longer: a backlog)
THREADED_UP_TO = 2  # a group of at most this many streams encodes each on a thread of its own
#: A group's reading thread encodes each stream's deliveries this many at a time as they arrive, so a
#: tick finds little left to encode: with the backup's 2,048, 50 streams x 100 msg/s were all encoded
#: at the tick, one stream after another, and the last stream answered 0.5-1.0 s after the probe
#: (0.15-0.4 s with 64; benchmarks/archive.py --only scale, rmq310, moto S3, 2026-12-06).
GROUP_BATCH = 64
EMPTY_MARGIN_MS = 500  # no chunk delivered and no StreamStats to confirm the stream empty (3.10): a little less


@dataclass(slots=True)
class Durable:
    """What the storage holds of the stream (the segments not yet named by a tick are in ``segments``)."""

    last_offset: int | None
    last_sha256: str | None
    last_chunk_timestamp: int | None
    last_ts: int | None  # the last durable record's backed_up_at
    next_sequence: int = 1


@dataclass(frozen=True, slots=True)
class Probe:
    """The stream's committed end ``end`` (-1: empty; None: no chunk delivered, unconfirmed) at ``at`` (ms):
    every record the broker had committed by ``at`` has an offset at most ``end``."""

    at: int
    end: int | None
    margin: int = 0  # ms the claim is moved back when the end could not be confirmed


@dataclass(slots=True)
class FlushAnswer:
    """A follower's answer to flush request ``seq``: everything read up to ``target`` was handed to
    the segment writer; ``probe``: the committed end probed before (None: the stream protocol could not
    say, so the archiver falls back to the records' read times)."""

    seq: int
    target: int | None
    probe: Probe | None


class StreamFollower:
    """One stream's follow: its records, segments, flush answers and durable position. It owns no
    thread and no connection: a ``FollowerGroup`` reads it with others on one connection."""

    def __init__(self, vhost: str, name: str, decision: ChainDecision, durable: Durable,
                 writer: Callable[[str, str, int, Callable[[SegmentMetadata, Any], None]], Any],
                 on_bytes: Callable[[int, int], None] | None = None):
        self.vhost, self.name = vhost, name
        self.decision = decision
        self.durable = durable
        self._writer = writer
        self.on_bytes = on_bytes
        self.lock = threading.Lock()
        self.new_segments: list[SegmentMetadata] = []
        self.received: int | None = durable.last_offset
        self._last_ts = durable.last_ts or 0
        self._first = True
        self.flush_request = 0
        self.answer: FlushAnswer | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._rt: RecordThread | None = None
        self.records = 0
        self._min_offset = decision.start if isinstance(decision.start, int) else -1
        self._asked = 0  # the flush request probed so far ...
        self._probed: Probe | None = None  # ... its probe ...
        self._asked_at = 0.0  # ... and when (monotonic)

    @property
    def where(self) -> str:
        return f"stream {self.name!r} in vhost {self.vhost!r}"

    def pending(self) -> bool:
        """Records read but not yet named by a tick (or segments durable but not taken)."""
        with self.lock:
            return bool(self.new_segments) or self.received != self.durable.last_offset

    def take(self) -> tuple[list[SegmentMetadata], Durable]:
        """The segments made durable since the last take, and the durable position they end at."""
        with self.lock:
            segs, self.new_segments = self.new_segments, []
            return segs, replace(self.durable)

    # -- on its group's thread ----------------------------------------------------------------
    def open(self, threaded: bool) -> None:
        """``threaded``: records are encoded on a thread of the stream's own (a stream read alone, where
        it overlaps the read), else on the group's reading thread (many streams: no thread each)."""
        self._rt = RecordThread(self._writer(self.vhost, self.name, self.durable.next_sequence, self._on_durable),
                                self._build, threaded=threaded, **({} if threaded else {"batch": GROUP_BATCH}))

    def finish(self, error: BaseException | None) -> None:
        """The read ended (``error``: why, None when the archiver stops): what was read is stored first."""
        rt = self._rt
        try:
            if rt is not None:
                rt.close()
        except BaseException as e:  # noqa: BLE001
            error = error or e
            rt.abort()  # type: ignore[union-attr]
        self.error = error
        self.done.set()

    def _build(self, d: tuple) -> Any:
        return to_record(d[0], d[1], d[2], self.vhost, self.name, d[3], BROKER_HEADERS, stream_offset=d[4])

    def deliver(self, method: Any, props: Any, body: bytes, off: int | None = None) -> None:
        """One delivery, in order; ``off``: its offset when the caller took it from the header bytes."""
        if off is None:
            off = stream_offset(props)
        if off is not None and off < self._min_offset:
            return  # a chunk may start before the requested offset
        offset = off if off is not None else -1
        chunk_ts = chunk_timestamp(props)
        ts = max(chunk_ts if chunk_ts is not None else int(time.time() * 1000), self._last_ts)
        if self._first:
            self._first = False
            self._first_record(offset, ts)
        self._last_ts = ts
        assert self._rt is not None
        self._rt.put((method, props, body, ts, offset), (offset, ts, body, chunk_ts), len(body))
        self.received = offset
        self.records += 1
        if self.on_bytes is not None:
            self.on_bytes(1, len(body))

    def _first_record(self, offset: int, ts: int) -> None:
        """A later first offset than asked: the stream's retention removed the ones between (a gap)."""
        d, start = self.decision, self.decision.start
        if d.first_offset is None and offset >= 0:
            d.first_offset = offset
        if isinstance(start, int) and offset - start > NON_MESSAGE_SLACK:
            gap = StreamGap(start, offset - 1, self.durable.last_ts, ts)
            with self.lock:
                d.gaps.append(gap)
            log.warning("%s: offsets %d..%d (at most %d message(s)) were removed by the stream's retention before "
                        "the archive read them; recorded as a gap", self.where, start, offset - 1, gap.count)

    def wants_probe(self) -> int | None:
        """The flush request not probed yet, if any."""
        seq = self.flush_request
        if self._asked == seq or (self.answer is not None and self.answer.seq >= seq):
            return None
        return seq

    def probed(self, seq: int, probe: Probe | None) -> None:
        """The committed end probed for flush request ``seq`` (None: the stream protocol could not say)."""
        self._asked, self._asked_at, self._probed = seq, time.monotonic(), probe

    def serve(self) -> None:
        """Answer the archiver's flush request once it is probed: read on until the committed end probed
        is read (``CATCHUP_SECS`` at most: further is a backlog), then hand the open segment to the store.
        Called after every batch read, and every ``IDLE_SECS``."""
        seq = self.flush_request
        if self._asked != seq or (self.answer is not None and self.answer.seq >= seq):
            return
        assert self._rt is not None
        p = self._probed
        if (p is not None and p.end is not None and p.end >= 0 and (self.received is None or self.received < p.end)
                and time.monotonic() - self._asked_at < CATCHUP_SECS):
            return  # what the broker committed by the probe is still being read
        target = self.received
        self._rt.flush()
        self.answer = FlushAnswer(seq, target, p)

    def _on_durable(self, meta: SegmentMetadata, tag: Any) -> None:
        """On a storing thread, once a segment is stored (in sequence order): the durable position moves."""
        offset, ts, body, chunk_ts = tag
        sha = hashlib.sha256(body).hexdigest()
        with self.lock:
            self.new_segments.append(meta)
            self.durable = Durable(offset, sha, chunk_ts, ts, meta.sequence + 1)

    def stream_info(self, durable: Durable) -> StreamInfo:
        """The manifest's ``stream`` record for what is durable (the chain decision's link, gaps so far)."""
        return stream_info(self.decision, durable, self.lock)


class FollowerGroup:
    """Streams of one vhost read on one AMQP connection by one thread: a channel and a consumer
    (``x-stream-offset``) per stream, deliveries handed to each stream's follower as they arrive,
    acked in batches (acks only move a stream consumer's credit). Each stream's credit is its
    prefetch, so what waits in memory is bounded by ``prefetch`` deliveries per stream; every
    stream's committed end is probed at each tick on one stream-protocol connection, all at once
    (``broker.stream_end.EndProber.ends``).

    A failure of the connection ends every follower of the group with it (the archiver starts
    again from the storage); the broker cancelling one consumer (a stream deleted) ends that one."""

    def __init__(self, source: ConnectionConfig, vhost: str, followers: list[StreamFollower], prefetch: int,
                 conn_name: str):
        self.source, self.vhost, self.followers = source, vhost, followers
        self.prefetch = prefetch
        self.conn_name = conn_name
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"rbak-archive {self.conn_name}", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        conn = None
        prober = None
        subs: list[tuple[Any, str, StreamFollower]] = []
        error: BaseException | None = None
        try:
            conn = connect(self.source, self.vhost, name=self.conn_name)
            prober = EndProber(self.source, conn, self.vhost)
            for f in self.followers:
                f.open(threaded=len(self.followers) <= THREADED_UP_TO)
                ch = conn.channel()
                ch.qos(self.prefetch)
                start = f.decision.start
                subs.append((ch, ch.consume(f.name, {"x-stream-offset": start if isinstance(start, str)
                                                     else int(start)}), f))
            self._loop(conn, prober, subs)
        except BaseException as e:  # noqa: BLE001 - reported to the archiver, which starts again from storage
            error = e
        live = [f for f in self.followers if not f.done.is_set()]
        if isinstance(error, ChannelClosedByBroker):
            error = AmqpError(f"vhost {self.vhost!r}: the broker closed a stream's channel: {error.code} {error.text}")
        elif isinstance(error, ConnectionLost):
            error = AmqpConnectionError(f"vhost {self.vhost!r}: the archive's connection was lost ({error})")
        for f in live:
            f.finish(None if self.stopping.is_set() and error is None else error)
        if prober is not None:
            prober.close()
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    def _loop(self, conn: Any, prober: "EndProber", subs: list[tuple[Any, str, StreamFollower]]) -> None:
        ack_every = max(1, self.prefetch // 2)
        unacked = {id(ch): (0, 0) for ch, _, _ in subs}  # channel -> (unacked count, last delivery tag)
        live = list(subs)

        def ready() -> bool:
            return self.stopping.is_set() or any(ch.deliveries or tag in ch.cancelled or not ch.is_open
                                                 or f.wants_probe() is not None for ch, tag, f in live)

        while live:
            conn.pump(ready, timeout=IDLE_SECS)
            if self.stopping.is_set():
                return
            probe_all(prober, [f for _, _, f in live])
            for ch, tag, f in list(live):
                if ch.deliveries:
                    batch, ch.deliveries = ch.deliveries, []
                    n, last = unacked[id(ch)]
                    for item in batch:
                        split = split_offset(item[4])
                        if split is not None:  # the common case: the offset is the only header
                            f.deliver(Deliver(item[0], item[1], item[2], item[3]), properties(split[1]), item[5],
                                      split[0])
                        else:
                            method, props, body = to_delivery(item)
                            f.deliver(method, props, body)
                        n, last = n + 1, item[0]
                        if n >= ack_every:
                            ch.ack(last, multiple=True)
                            n = 0
                    unacked[id(ch)] = (n, last)
                elif tag in ch.cancelled or not ch.is_open:
                    conn.check()  # the connection itself: every stream of the group ends with it
                    live.remove((ch, tag, f))
                    why = ch.closed_by
                    f.finish(AmqpError(f"{f.where}: the broker " + (
                        f"closed the archive's channel: {why.code} {why.text}" if why is not None else
                        "cancelled the archive's consumer (the stream was deleted, or its leader moved)")))
                    continue
                f.serve()


def probe_all(prober: EndProber, followers: list[StreamFollower]) -> None:
    """Probe the committed end of every follower with a new flush request, all in one round trip."""
    asked = [(f, seq) for f in followers if (seq := f.wants_probe()) is not None]
    if not asked:
        return
    at = int(time.time() * 1000)
    ends = prober.ends([f.name for f, _ in asked])
    for f, seq in asked:
        if ends is None or f.name not in ends:
            f.probed(seq, None)
        else:
            end = ends[f.name]
            f.probed(seq, Probe(at, end, EMPTY_MARGIN_MS if end is None else 0))


def stream_info(d: ChainDecision, durable: Durable, lock: threading.Lock | None = None,
                tap: TapOf | None = None) -> StreamInfo:
    """A stream's ``stream`` record: its chain decision (link, gaps), what is durable of it, the queue it taps."""
    if lock is not None:
        with lock:
            gaps = list(d.gaps)
    else:
        gaps = list(d.gaps)
    stored = durable.next_sequence > 1  # a segment of this generation is durable
    return StreamInfo(first_offset=d.first_offset if stored else None, last_offset=durable.last_offset,
                      previous_backup=d.previous_backup, previous_last_offset=d.previous_last_offset,
                      last_record_sha256=durable.last_sha256, last_chunk_timestamp=durable.last_chunk_timestamp,
                      recreated=d.recreated, gaps=gaps, tap=tap)


def stored_one(f: StreamFollower, seq: int, before: int | None) -> bool:
    """The answer to ``seq`` asked for a segment: records read past what was durable at the request."""
    a = f.answer
    return a is not None and a.seq == seq and a.target is not None and a.target != before


def flushed(f: StreamFollower, seq: int) -> bool:
    """The follower answered flush request ``seq`` and what it read by then is durable (or it ended)."""
    a = f.answer
    if f.error is not None or f.done.is_set():
        return True
    if a is None or a.seq < seq:
        return False
    with f.lock:
        last = f.durable.last_offset
    return a.target is None or (last is not None and last >= a.target)
