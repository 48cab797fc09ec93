"""Giving a read's messages back: the shared reading channel's nack, and every channel in the order it was
opened, each waiting for the queue to hold its messages again where that order matters."""

from __future__ import annotations

import logging
import time

from ..broker.channels import CONTROL, kept_channel
from ..broker.wire import Channel

log = logging.getLogger(__name__)
RETURN_SETTLE_SECS = 30.0  # _await_returns: how long one channel's returns may take to land
# A small read's returns land within a millisecond or two: polls start that short and double up to
# 10 ms, so the wait of every quorum read (issue 46) costs about one poll, not a 10 ms sleep.
SETTLE_FIRST_PAUSE = 0.0005
SETTLE_MAX_PAUSE = 0.01


def return_shared(channels: list[Channel], tags: dict[int, list[str]], queue: str, where: str) -> bool:
    """Return a shared reading channel's messages and keep it (True), or False: close it instead.

    ``basic.nack`` has no reply, and the queue requeues asynchronously: a passive declare from
    another connection 14 ms after a nack of 100,000 saw 0 messages (3.10.8), so a backup started
    right after this one could find the queue short. The passive declare that follows on the same
    channel asks the queue process itself for its depth, and Erlang delivers the channel's requeue
    to it first, so once the reply arrives every message is back. (A channel close reaches the
    queue ahead of any later reader's declare too: one 1 ms after a close of 100,000 waited for
    the requeue and saw them all.)

    The cancel is awaited before the nack is sent: deliveries the queue sent before it took the
    cancel reach the channel before the Cancel-Ok, so the nack covers them. Sent together, the nack
    could overtake them and leave them held by this channel."""
    if len(channels) != 1 or not channels[0].is_open:
        return False
    ch = channels[0]
    try:
        _cancel(ch, tags)  # first: a consumer still there would receive what the nack requeues
        ch.deliveries.clear()  # what arrived and was not taken goes back with the nack: never the next read's
        ch.nack(0, multiple=True, requeue=True)
        ch.declare_passive(queue)
        return True
    except Exception as e:  # noqa: BLE001 - closing gives everything back too
        log.debug("%s: returning the shared channel's messages: %r", where, e)
        return False


def _cancel(ch: Channel, tags: dict[int, list[str]]) -> None:
    """Cancel ``ch``'s consumers, oldest first, each awaiting its Cancel-Ok (nothing is delivered after it)."""
    mine = tags.get(ch.number) or []
    while mine:
        ch.cancel(mine[0])
        mine.pop(0)


def return_in_order(channels: list[Channel], tags: dict[int, list[str]], where: str, nack: bool, quiet: bool,
                     ends: dict[int, list[int]] | None = None, settle: str | None = None) -> None:
    """Give every message back, first-opened channel first: that is what keeps a quorum queue's order.

    Each channel's consumers are cancelled first (so none can receive what is returned). NACK:
    then ``basic.nack(multiple, requeue)`` up to the end of each window in turn (``ends``: one
    consumer's messages after another, as they were taken), then everything left; then close.

    ``settle`` (the quorum queue's name): wait until each channel's messages are back before the next
    channel gives its own back. A Close-Ok (or a nack) does not mean the queue has taken the returns:
    each channel process hands them to the queue on its own, so under load a later channel's could
    land first (3.10.8 under a parallel suite, issue 42), and the last channel's could land after the
    next reader had looked: a passive declare from another connection right after a one-channel read
    of 100,000 saw 0 ready (3.10.8, issue 46). Used for every quorum read.
    """
    for i, ch in enumerate(channels):
        probe = _settle_probe(channels, i) if settle else None
        before = _ready(probe, settle) if probe is not None and settle else None
        try:
            if ch.is_open:
                # cancelled before the close: closing a 3.10.8 / 4.0.5 quorum channel whose consumer was
                # still there returned its window's first two messages swapped, about 1 backup in 3
                # (test_five_runs_then_fresh_dir...)
                _cancel(ch, tags)
                if nack:
                    upto: list[int] = []
                    for t in (ends or {}).get(ch.number, []):
                        if t > (upto[-1] if upto else 0):  # a window that took nothing has no end of its own
                            upto.append(t)
                    upto.append(0)  # what is left (messages the broker pushed that were not taken)
                    for t in upto:
                        ch.nack(t, multiple=True, requeue=True)
            ch.close()  # one the broker closed (a 404) leaves the connection's channels only here
        except Exception as e:  # noqa: BLE001 - the connection may be gone; the broker requeues anyway
            if not quiet:
                log.debug("%s: returning a channel's messages: %r", where, e)
        held = max((ends or {}).get(ch.number) or [0])
        if probe is not None and settle and before is not None and held:
            _await_returns(probe, settle, before + held, where)


def _settle_probe(channels: list[Channel], i: int) -> Channel | None:
    """A channel to watch the queue's depth on while channel ``i`` gives back: the next channel of the
    read (still open, its consumers about to be cancelled), or after the last the connection's kept
    ``CONTROL`` channel (never consumes; no channel opened per read)."""
    if i + 1 < len(channels) and channels[i + 1].is_open:
        return channels[i + 1]
    try:
        return kept_channel(channels[i].conn, CONTROL) if channels[i].conn.is_open else None
    except Exception:  # noqa: BLE001 - no probe: the returns are given back without the wait
        return None


def _ready(probe: Channel, queue: str) -> int | None:
    try:
        return probe.declare_passive(queue)[0]
    except Exception:  # noqa: BLE001 - the probe's channel is gone (or the queue): no wait
        if not probe.is_open:
            probe.close()  # a 404 closed it: off the connection's channels (the next probe opens another)
        return None


def _await_returns(probe: Channel, queue: str, want: int, where: str) -> None:
    """Poll the queue's ready count until ``want`` (the count before the return plus what it gave
    back); a queue that another client drains may never get there, so the wait is bounded."""
    deadline = time.monotonic() + RETURN_SETTLE_SECS
    pause = SETTLE_FIRST_PAUSE
    while True:
        ready = _ready(probe, queue)
        if ready is None or ready >= want:
            return
        if time.monotonic() >= deadline:
            log.warning("%s: %d of the %d ready messages expected after a channel's return after %.0f s; the "
                        "next channel gives its own back anyway", where, ready, want, RETURN_SETTLE_SECS)
            return
        time.sleep(pause)
        pause = min(pause * 2, SETTLE_MAX_PAUSE)
