"""The one passive ``queue.declare``: a queue's ready messages and consumers right now, exactly
(the management API's figures are sampled), and the one reading of the broker's refusals.

Every caller (the backup before and during a read, the restore before and after publishing)
asks here, on the connection's kept ``CONTROL`` channel (``channels``): a refusal closes that
channel and the next declare opens a fresh one. The broker's channel close becomes an error
naming vhost and queue: ``QueueNotFound`` (404), ``QueueLocked`` (405, another connection's
exclusive queue), ``QueueAccessRefused`` (403), else ``AmqpError`` with the broker's code and text.

Where the fast path can install on the connection (``fast_consume``), the declare is sent and
its reply taken without pika's blocking RPC layer: most of a small queue's cost in a many-queue
backup (issue 20). Otherwise pika's ``queue_declare``; the answers and errors are the same.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import pika.exceptions
import pika.spec

from ..errors import AmqpError, QueueAccessRefused, QueueLocked, QueueNotFound
from .channels import CONTROL, kept_channel
from .fast_consume import DECLARE_OK, FastConsume

_COUNTS = struct.Struct(">II")  # Declare-Ok after its queue name: message count, consumer count


class QueueCounts(NamedTuple):
    messages: int  # ready (not counting those delivered and unacked)
    consumers: int


def passive_declare(conn: Any, vhost: str, queue: str) -> QueueCounts:
    """``queue``'s counts in ``vhost`` (the vhost ``conn`` is open on); raises ``QueueNotFound``,
    ``QueueLocked``, ``QueueAccessRefused`` or ``AmqpError``, each naming vhost and queue."""
    try:
        ch = kept_channel(conn, CONTROL)
    except pika.exceptions.AMQPError as e:
        raise AmqpError(f"vhost {vhost!r}: cannot open a channel: {e!r}") from None
    try:
        fc = FastConsume.install(conn)  # None when not possible (or a read on this connection has it now)
        if fc is None:
            ok = ch.queue_declare(queue, passive=True).method
            return QueueCounts(ok.message_count, ok.consumer_count)
        try:
            args = fc.call(ch, DECLARE_OK, pika.spec.Queue.Declare(queue=queue, passive=True))
        finally:
            fc.uninstall()
        return declare_ok_counts(args)
    except pika.exceptions.ChannelClosedByBroker as e:
        raise refusal(e, vhost, queue) from None


def declare_ok_counts(args: bytes) -> QueueCounts:
    """The counts in a ``Queue.DeclareOk``'s argument bytes (after the queue name, a short string)."""
    return QueueCounts(*_COUNTS.unpack_from(args, 1 + args[0]))


def queue_counts(conn: Any, vhost: str, queue: str) -> QueueCounts | None:
    """``passive_declare``, or None when the queue does not exist (a restore target not created yet)."""
    try:
        return passive_declare(conn, vhost, queue)
    except QueueNotFound:
        return None


def refusal(e: pika.exceptions.ChannelClosedByBroker, vhost: str, queue: str) -> AmqpError:
    """The error for the broker's close of a channel over ``queue``."""
    where = f"queue {queue!r} in vhost {vhost!r}"
    code, text = e.reply_code, e.reply_text
    if code == 404:
        return QueueNotFound(f"{where}: no such queue ({code} {text})")
    if code == 405:
        return QueueLocked(f"{where}: exclusive queue: only its owning connection can use it ({code} {text})")
    if code == 403:
        return QueueAccessRefused(f"{where}: access refused for the connection's user ({code} {text})")
    return AmqpError(f"{where}: {code} {text}")
