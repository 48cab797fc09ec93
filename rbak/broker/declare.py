"""The one passive ``queue.declare``: a queue's ready messages and consumers right now, exactly
(the management API's figures are sampled), and the one reading of the broker's refusals.

Every caller (the backup before and during a read, the restore before and after publishing)
asks here, on the connection's kept ``CONTROL`` channel (``channels``): a refusal closes that
channel and the next declare opens a fresh one. The broker's channel close becomes an error
naming vhost and queue: ``QueueNotFound`` (404), ``QueueLocked`` (405, another connection's
exclusive queue), ``QueueAccessRefused`` (403), else ``AmqpError`` with the broker's code and text.
A lost connection is ``wire.ConnectionLost`` (its callers may open a new one).
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import AmqpError, ChannelClosedByBroker, QueueAccessRefused, QueueLocked, QueueNotFound
from .channels import CONTROL, kept_channel
from .transport import TargetConnection


class QueueCounts(NamedTuple):
    messages: int  # ready (not counting those delivered and unacked)
    consumers: int


def passive_declare(conn: TargetConnection, vhost: str, queue: str) -> QueueCounts:
    """``queue``'s counts in ``vhost`` (the vhost ``conn`` is open on); raises ``QueueNotFound``,
    ``QueueLocked``, ``QueueAccessRefused`` or ``AmqpError``, each naming vhost and queue."""
    ch = kept_channel(conn, CONTROL)
    try:
        return QueueCounts(*ch.declare_passive(queue))
    except ChannelClosedByBroker as e:
        raise refusal(e, vhost, queue) from None


def queue_counts(conn: TargetConnection, vhost: str, queue: str) -> QueueCounts | None:
    """``passive_declare``, or None when the queue does not exist (a restore target not created yet)."""
    try:
        return passive_declare(conn, vhost, queue)
    except QueueNotFound:
        return None


def refusal(e: ChannelClosedByBroker, vhost: str, queue: str) -> AmqpError:
    """The error for the broker's close of a channel over ``queue``."""
    where = f"queue {queue!r} in vhost {vhost!r}"
    code, text = e.code, e.text
    if code == 404:
        return QueueNotFound(f"{where}: no such queue ({code} {text})")
    if code == 405:
        return QueueLocked(f"{where}: exclusive queue: only its owning connection can use it ({code} {text})")
    if code == 403:
        return QueueAccessRefused(f"{where}: access refused for the connection's user ({code} {text})")
    return AmqpError(f"{where}: {code} {text}")
