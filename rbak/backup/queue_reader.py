"""Non-destructive reads of classic and quorum queues over AMQP 0-9-1.

Nothing is ever acked: every message is consumed unacknowledged, and closing
the channel(s) gives all of them back. Facts measured on 3.10.8 and 4.0.5
that shape this code (see docs/backup.md):

- classic: with prefetch 0 one consumer receives every message; closing the
  channel requeues them in their original order.
- quorum: a prefetch-0 consumer is capped at 2000 unacked; one consumer
  with ``basic.qos(65535)`` receives 65535 and returning them keeps the
  order. Deeper queues use one channel after another, each with a prefetch
  of exactly the messages it takes (so no consumer has spare credit to
  receive messages an earlier channel returns: that is what scrambled the
  order in our measurements), closed in the order they were opened.
- quorum: every return (channel close, nack, AMQP 1.0 ``released`` or
  ``modified``, all measured on 4.0.5) adds 1 to ``x-delivery-count``; a
  message returned past its delivery limit is dropped or dead-lettered. So a
  quorum queue with a delivery limit is read only if no message can cross it
  (see ``engine`` for the check before reading); a message already AT the
  limit stops the read at once.

The read stops at the queue depth measured just before it (passive declare),
so messages published meanwhile are not taken into this backup.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import pika
import pika.exceptions

from ..errors import AmqpError, RbakError
from .convert import delivery_count

log = logging.getLogger(__name__)

QUORUM_PREFETCH = 65535  # the largest basic.qos prefetch_count (16 bits)


class DeliveryLimitError(RbakError):
    """A quorum queue whose messages a backup could push past their delivery limit."""

    prefix = "Delivery limit"


@dataclass(slots=True)
class ReadResult:
    records: int = 0
    max_delivery_count: int = 0
    nearest: str = ""  # the message with the highest x-delivery-count
    channels: int = 0


Sink = Callable[[object, object, bytes], None]


def describe_message(position: int, props) -> str:
    mid = getattr(props, "message_id", None)
    return f"message #{position}" + (f" (message_id {mid!r})" if mid else "")


def passive_depth(conn: pika.BlockingConnection, vhost: str, queue: str) -> int:
    """Ready messages right now (exact, unlike the management API's sampled stats)."""
    try:
        ch = conn.channel()
    except pika.exceptions.AMQPError as e:
        raise AmqpError(f"vhost {vhost!r}: cannot open a channel: {e!r}") from None
    try:
        return ch.queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker as e:
        raise AmqpError(f"queue {queue!r} in vhost {vhost!r}: {e.reply_code} {e.reply_text}") from None
    finally:
        if ch.is_open:
            ch.close()


def read_queue(
    conn: pika.BlockingConnection,
    vhost: str,
    queue: str,
    queue_type: str,
    depth: int,
    sink: Sink,
    *,
    delivery_limit: int | None = None,
    read_timeout: float = 30.0,
    deadline: float | None = None,
    throttle: Callable[[int], None] | None = None,
) -> ReadResult:
    """Read the first ``depth`` messages of a classic or quorum queue without acking any.

    ``sink(method, properties, body)`` receives each one in queue order. On any
    error every message is still returned (the channels are closed) and the
    error names the queue.
    """
    res = ReadResult()
    where = f"queue {queue!r} in vhost {vhost!r}"
    if depth <= 0:
        return res
    per_channel = 0 if queue_type == "classic" else QUORUM_PREFETCH
    channels: list = []
    error: BaseException | None = None
    try:
        while res.records < depth:
            ch = conn.channel()
            channels.append(ch)
            taken = 0
            want = depth - res.records if per_channel == 0 else min(per_channel, depth - res.records)
            # quorum: prefetch exactly what this channel takes, so no consumer ever has spare
            # credit: otherwise messages returned by an earlier channel's close would be
            # redelivered to a later channel and come back out of order.
            ch.basic_qos(prefetch_count=0 if per_channel == 0 else want)
            _check_open(channels, where, res.records, depth)
            gen = ch.consume(queue, auto_ack=False, inactivity_timeout=read_timeout)
            for method, props, body in gen:
                if method is None:
                    ready = passive_depth(conn, vhost, queue)
                    if ready == 0:
                        log.warning("%s: only %d of %d messages could be read (another consumer holds the rest); "
                                    "backing up those", where, res.records, depth)
                        depth = res.records
                        break
                    raise AmqpError(f"{where}: no message arrived for {read_timeout:g}s after {res.records} of "
                                    f"{depth} (backup.read_timeout_secs); every message was returned to the queue")
                c = delivery_count(props) if queue_type == "quorum" else 0
                if c > res.max_delivery_count or not res.nearest:
                    res.max_delivery_count = c
                    res.nearest = describe_message(res.records + 1, props)
                if delivery_limit is not None and c >= delivery_limit:
                    raise DeliveryLimitError(
                        f"{where}: {describe_message(res.records + 1, props)} has already been delivered {c} times "
                        f"and the queue's delivery limit is {delivery_limit}: returning it would drop or "
                        f"dead-letter it, so the backup stops taking messages here (the {res.records + 1} taken "
                        "go back now; this one may cross the limit because a return is the only way back)")
                sink(method, props, body)
                res.records += 1
                taken += 1
                if throttle is not None:
                    throttle(res.records)
                if deadline is not None and time.monotonic() > deadline:
                    raise AmqpError(
                        f"{where}: the read took longer than allowed (backup.max_duration_secs) after "
                        f"{res.records} of {depth} messages; every message was returned to the queue")
                if taken >= want or res.records >= depth:
                    break
        if len(channels) > 1:
            # an earlier channel closed by the broker (consumer_timeout) gave its messages back
            # while later channels were reading: they may hold those again (duplicates)
            _check_open(channels, where, res.records, depth)
        res.channels = len(channels)
        return res
    except pika.exceptions.ChannelClosedByBroker as e:
        error = e
        hint = ""
        if e.reply_code == 406 and "timeout" in (e.reply_text or "").lower():
            hint = (" (the broker's consumer_timeout: raise it for this queue, e.g. the x-consumer-timeout "
                    "argument or policy on 3.12+/4.x, or rabbitmq.conf consumer_timeout)")
        raise AmqpError(f"{where}: the broker closed the channel after {res.records} of {depth} messages: "
                        f"{e.reply_code} {e.reply_text}{hint}; every unacked message returned to the queue") from None
    except (pika.exceptions.ConnectionClosed, pika.exceptions.StreamLostError, pika.exceptions.AMQPConnectionError) as e:
        error = e
        raise AmqpError(f"{where}: the connection was lost after {res.records} of {depth} messages ({e!r}); "
                        "the broker returns every unacked message to the queue") from None
    except BaseException as e:
        error = e
        raise
    finally:
        _close_in_order(channels, where, quiet=error is not None)


def _check_open(channels: list, where: str, records: int, depth: int) -> None:
    for i, ch in enumerate(channels[:-1], 1):
        if ch.is_closed:
            raise AmqpError(
                f"{where}: the broker closed channel {i} of the read after {records} of {depth} messages (most "
                "likely its consumer_timeout: raise it for this queue, e.g. the x-consumer-timeout argument or "
                "policy on 3.12+/4.x, or rabbitmq.conf consumer_timeout); every unacked message returned to the queue")


def _close_in_order(channels: list, where: str, quiet: bool) -> None:
    """Close the channels first-opened first: that is what keeps a quorum queue's order."""
    for ch in channels:
        try:
            if ch.is_open:
                ch.close()
        except Exception as e:  # noqa: BLE001 - the connection may be gone; the broker requeues anyway
            if not quiet:
                log.debug("%s: closing a channel: %r", where, e)
