"""Non-destructive reads of classic and quorum queues over AMQP 0-9-1.

Nothing is ever acked: every message is consumed unacknowledged, and nacking
and/or closing the channel(s) gives all of them back. Facts measured on 3.10.8 and 4.0.5
that shape this code (see docs/backup.md):

- classic: with prefetch 0 one consumer receives every message; closing the
  channel requeues them in their original order.
- quorum: a prefetch-0 consumer is capped at 2000 unacked; one consumer
  with ``basic.qos(65535)`` receives 65535 and returning them keeps the
  order. Deeper queues use one consumer (window) after another, each with a
  prefetch of exactly the messages it takes (so no consumer has spare credit
  to receive messages an earlier one returns: that is what scrambled the
  order in our measurements), returned in the order they were started. On
  the fast path the windows are consumers of ONE channel (up to
  MAX_CONSUMERS_PER_CHANNEL): a connection the broker closes returns separate
  channels in any order, one channel's consumers in order (issue 27).
- quorum, 3.10 and 4.0: every return (channel close, nack, reject, AMQP 1.0
  ``released`` or ``modified``) adds 1 to ``x-delivery-count``
  (benchmarks/return_costs.py); a message returned past its delivery limit is
  dropped or dead-lettered. Reads with a limit therefore take small windows
  first (``next_window``) and stop at a message whose return would reach
  ``limit - margin``, so a stop costs one delivery to at most one window.
- every version: a returned message joins the tail of the queue's returns, so
  a read cut off after an earlier complete backup leaves the queue rotated
  ([not taken, taken]); nothing RabbitMQ offers returns a message to the head, so the
  caller repairs it with two more reads (``cut_repair``).
- quorum, 4.3: ``basic.nack(requeue)`` is a plain return (``rabbit_fifo``
  ``#return{}``: ``x-acquired-count`` + 1, no delivery count); a channel close
  or ``basic.reject`` is a failed delivery and counts. With the consumer
  cancelled first (so it cannot receive what it returns), nacking each channel
  in the order they were opened keeps the queue's order (measured on 4.3.6).
- 4.3 cancels a consumer whose message outlives ``consumer_timeout`` (its
  messages are returned), where older versions closed the channel; both fail
  the read with an error naming the queue.
- basic.get reads register no consumer: an auto-delete queue that never had a
  consumer is deleted when one goes away, so those are read with basic.get.

The read stops at the queue depth measured just before it (passive declare),
so messages published meanwhile are not taken into this backup.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from ..errors import AmqpConnectionError, AmqpError, ChannelClosedByBroker, ConnectionLost, DeliveryLimitError, ReadCut
from ..broker.channels import READING, kept_channel
from ..broker.declare import passive_declare
from ..broker.deliveries import Deliver, properties, receive
from ..broker.wire import Channel, Connection
from .convert import delivery_count
from .limits import budget_ceiling, may_take
from .read_return import return_in_order, return_shared
from .stages import DeliverySink, Throttle

log = logging.getLogger(__name__)
# 4.3+ quorum queues (the nack return): the consumer's own x-consumer-timeout takes precedence over the
# queue's argument, policy and rabbitmq.conf. The backup holds messages on purpose and gives them back in
# order; a broker timeout returning some of them early would reorder the queue (measured on 4.3.6 with a
# 1 s queue timeout: ct-00 came back behind ct-04). A dead backup's connection returns everything anyway.
HOLD_ARGUMENTS = {"x-consumer-timeout": 24 * 3600 * 1000}

QUORUM_PREFETCH = 65535  # the largest basic.qos prefetch_count (16 bits)
GROWTH = 4  # each quorum window this many times the previous one while counts leave headroom
NEAR_LIMIT_WINDOW = 16  # the largest window once a message seen will be AT its limit after this read
MAX_CHANNELS = 1000  # windows (consumers) per read (servers allow 2047 channels)
# Quorum windows are consumers on ONE channel, up to this many (then the next channel):
# a connection the broker closes returns each channel's messages when that channel's process goes down,
# in no particular order between channels (issue 27: [498, 499, 0, 1] at position 400), but all of one
# channel's consumers in consumer order, which rabbit_fifo keeps for a small map only: with more than 32
# consumers on one channel 3.10.8 and 4.0.5 returned them out of order even on a plain close (measured).
MAX_CONSUMERS_PER_CHANNEL = 32
# Classic reads of at most this many messages use the connection's shared reading channel. Giving
# messages back on it waits for the queue to requeue them (~8 us a message: 0.8 s for 100,000 on
# 3.10.8), where a channel close hands the requeue over in 1-3 ms, still ahead of any later reader;
# a fresh channel costs three round trips (~1-2 ms here). They break even at a few hundred messages.
SHARED_MAX_DEPTH = 256

# A read that receives nothing for this long asks the queue whether any message is ready: none
# means another consumer holds (or acked) the rest, and waiting the whole read_timeout for them
# made every backup of a queue with a live consumer 30 s long (issue 27, scenario 5).
DRY_CHECK_SECS = 2.0

CLOSE = "close"  # return by closing the channels (every broker; counts as a delivery on quorum queues)
NACK = "nack"  # cancel, then basic.nack(multiple, requeue): 4.3+ quorum queues count no delivery


@dataclass(slots=True)
class ReadResult:
    records: int = 0
    max_delivery_count: int = 0
    nearest: str = ""  # the message with the highest x-delivery-count
    channels: int = 0
    short: str = ""  # why the read ended before the depth it was asked for (empty: it did not)
    last_tag: int = 0  # the delivery tag of the last message taken (where a quorum window ends)
    last_redelivered: bool = False  # it came from the queue's returns (an earlier backup or consumer)


def describe_message(position: int, props: Any) -> str:
    mid = getattr(props, "message_id", None)
    return f"message #{position}" + (f" (message_id {mid!r})" if mid else "")


def next_window(previous: int, max_seen: int, limit: int | None, remaining: int, channels: int) -> int:
    """How many messages the next quorum channel may take (a pure decision).

    A return by channel close adds 1 to ``x-delivery-count`` of EVERY message a channel holds,
    including those the broker already pushed to us but we have not looked at, so a stop
    (error, kill, refusal) costs exactly the messages at their limit inside the open window.
    Windows start at 1 (the head, where returned messages wait, is checked alone), grow while
    every message seen so far keeps headroom, and stay small once one will be at its limit.
    Without a limit, or on a broker where returns do not count, one channel takes up to 65,535.
    """
    if limit is None:
        w = QUORUM_PREFETCH
    elif previous == 0:
        w = 1
    elif max_seen + 1 >= limit:
        w = min(previous, NEAR_LIMIT_WINDOW)
    else:
        w = min(QUORUM_PREFETCH, previous * GROWTH)
    left = max(1, MAX_CHANNELS - channels)
    if remaining > w * left:  # never run out of channels: widen evenly instead
        w = min(QUORUM_PREFETCH, -(-remaining // left))
    return max(1, min(w, remaining))


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How a read takes messages and gives them back (the ``backup.*`` settings a read honours).

    ``return_mode`` NACK: quorum messages go back by ``basic.nack(multiple, requeue)`` after the
    consumer is cancelled (4.3+: no delivery counted); CLOSE: by closing the channels. ``margin``:
    ``backup.delivery_limit_margin``; the read stops at a message whose count would reach
    ``delivery_limit - margin`` once returned (``limits.may_take``). ``single_consumer``: a
    single-active-consumer quorum queue, read by one consumer (a second one would wait behind the
    first and receive nothing): no windows, at most QUORUM_PREFETCH. ``use_get``: basic.get instead
    of a consumer (an auto-delete queue is deleted when its last consumer goes away)."""

    delivery_limit: int | None = None
    margin: int = 1
    return_mode: str = CLOSE
    single_consumer: bool = False
    use_get: bool = False
    read_timeout: float = 30.0
    deadline: float | None = None
    throttle: Throttle | None = None


DEFAULT_READ = ReadOptions()


def read_queue(conn: Connection, vhost: str, queue: str, queue_type: str, depth: int, sink: DeliverySink,
               opts: ReadOptions = DEFAULT_READ, *, hold: list[QueueRead] | None = None) -> ReadResult:
    """Read the first ``depth`` messages of a classic or quorum queue without acking any.

    ``sink(method, properties, body)`` receives each one in queue order. On any error every
    message is still returned (nacked and/or the channels closed, first opened first) and the
    error names the queue. ``hold`` (quorum): the read keeps its messages, even on an error, and
    appends itself, whose ``give_back`` returns them, for a caller that returns several reads in
    an order of its own (``cut_repair``).
    """
    if depth <= 0:
        return ReadResult()
    return QueueRead(conn, vhost, queue, queue_type == "quorum", depth, sink, opts).run(hold)


class QueueRead:
    """One read's state: its channels, their consumers (tags) and window ends, the consumers the
    broker cancelled, and the delivery budget; the read modes (consumer windows, basic.get) and
    the return are its methods."""

    def __init__(self, conn: Connection, vhost: str, queue: str, quorum: bool, depth: int, sink: DeliverySink,
                 opts: ReadOptions = DEFAULT_READ):
        self.conn, self.vhost, self.queue, self.quorum, self.depth = conn, vhost, queue, quorum, depth
        self.sink, self.opts = sink, opts
        self.where = f"queue {queue!r} in vhost {vhost!r}"
        self.res = ReadResult()
        self.nack = quorum and opts.return_mode == NACK
        ceiling = budget_ceiling(opts.delivery_limit, opts.margin) if quorum else None
        limit = opts.delivery_limit
        # nack returns never reach a limit
        self.budget = None if self.nack or ceiling is None or limit is None else (ceiling, limit)
        # windows stay bounded by the limit with nack too: a lost connection returns by close, which counts.
        # next_window narrows once a message seen would be AT its bound after this read: the highest count
        # a message may be taken at is ceiling - 2 (returned at ceiling - 1)
        self.window_limit = None if ceiling is None else ceiling - 1
        self.channels: list[Channel] = []
        self.ends: dict[int, list[int]] = {}  # channel number -> the last delivery tag of each of its windows
        self.tags: dict[int, list[str]] = {}  # channel number -> its consumers, oldest first
        self.cancelled: list[Channel] = []  # channels with a consumer the broker cancelled (4.3: a consumer timeout)
        # small classic reads share one channel per connection (reading_channel)
        self.shared = not opts.use_get and not quorum and depth <= SHARED_MAX_DEPTH
        self.quiet = False  # give_back: the read failed, the return may fail too

    def run(self, hold: list[QueueRead] | None = None) -> ReadResult:
        error: BaseException | None = None
        try:
            if self.opts.use_get:
                self.by_get()
            else:
                self.by_consumers()
            # once per read: a cancel the broker sent while we were taking what had already arrived. Only
            # a read over several channels waits for one (a cancelled earlier channel's messages could
            # reach a later one twice); one channel holds every message it took, so what is already here
            # is enough, and the 50 ms wait per queue was most of a many-queue backup's time (issue 20)
            # With the nack return every consumer holds HOLD_ARGUMENTS (a day's consumer timeout), so no
            # timeout cancel can be late: what is already here is checked without the wait.
            several = len(self.channels) > 1
            self.check_cancelled(wait=0.05 if several and not self.nack else 0.0)
            if several:
                # an earlier channel closed by the broker (consumer_timeout) gave its messages back
                # while later channels were reading: they may hold those again (duplicates)
                _check_open(self.channels, self.where, self.res.records, self.depth)
            self.res.channels = len(self.channels)
            return self.res
        except ChannelClosedByBroker as e:
            error = e
            raise _channel_closed_error(e, self.where, self.res.records, self.depth) from None
        except ConnectionLost as e:
            error = e
            raise self._cut(e) from None
        except BaseException as e:
            error = e
            raise
        finally:
            self.quiet = error is not None
            if hold is not None and not self.shared:
                hold.append(self)  # the caller gives these back when it chooses (cut_repair)
            elif not (self.shared and error is None
                      and return_shared(self.channels, self.tags, self.queue, self.where)):
                # a quorum read waits for its returns even on one channel: the next reader (the next backup's
                # depth, a cut's repair) otherwise found the queue short while they landed (issue 46)
                return_in_order(self.channels, self.tags, self.where, self.nack, quiet=self.quiet, ends=self.ends,
                                settle=self.queue if self.quorum else None)

    def give_back(self) -> None:
        """Return a held read's messages (``read_queue(hold=...)``), first-opened channel first."""
        return_in_order(self.channels, self.tags, self.where, self.nack, quiet=self.quiet, ends=self.ends,
                        settle=self.queue)

    def _cut(self, e: ConnectionLost) -> AmqpError:
        res, depth, n = self.res, self.depth, len(self.channels)
        lost = (f"{self.where}: the connection was lost after {res.records} of {depth} messages ({e}); "
                "the broker returns every unacked message to the queue")
        note = _rotation_note(self.quorum, res, depth)
        context = ", behind the ones it had not taken (the queue's messages had been returned before)"
        if not note:
            note = _channels_note(self.quorum, n)
            context = f" (it held them on {n} channels, which the broker gives back in no particular order)"
        if note:
            return ReadCut(lost + note, lost, context)
        return AmqpConnectionError(lost)

    def by_consumers(self) -> None:
        """Consumer windows: one channel for a classic queue; quorum windows as consumers of one
        channel after another (up to MAX_CONSUMERS_PER_CHANNEL each), each with a prefetch of
        exactly what it takes."""
        conn, res, quorum, channels, where = self.conn, self.res, self.quorum, self.channels, self.where
        window = windows = on_channel = 0
        while res.records < self.depth:
            if quorum:
                window = min(self.depth, QUORUM_PREFETCH) if self.opts.single_consumer else \
                    next_window(window, res.max_delivery_count, self.window_limit, self.depth - res.records, windows)
                windows += 1
            want = window if quorum else self.depth - res.records
            if quorum and channels and on_channel < MAX_CONSUMERS_PER_CHANNEL:
                ch = channels[-1]  # the next window is one more consumer there (its own basic.qos below)
                on_channel += 1
                _check_open(channels + [None], where, res.records, self.depth)  # e.g. 3.x/4.0's consumer_timeout
            else:
                ch = reading_channel(conn) if self.shared else conn.channel()
                channels.append(ch)
                on_channel = 1
            if not self.shared:
                # quorum: prefetch exactly what this channel takes, so no consumer ever has spare
                # credit: otherwise messages returned by an earlier channel would be redelivered to
                # a later channel and come back out of order. classic: prefetch 0, one channel.
                ch.qos(want if quorum else 0)
            _check_open(channels, where, res.records, self.depth)
            filled = self.fill(ch, want)
            if quorum:
                self.ends.setdefault(ch.number, []).append(res.last_tag)
            if not filled:
                self.cancelled.append(ch)  # the generator ended: the broker cancelled the consumer
            # a filled channel keeps its consumer until the return (no credit left, so it receives
            # nothing): if a delivery times out on 4.3 the broker then cancels it and releases the
            # messages uncounted, where a consumer we had cancelled would get its channel closed (406)
            self.check_cancelled()

    def fill(self, ch: Channel, want: int) -> bool:
        """Take up to ``want`` messages by a new consumer on ``ch``: False if the broker cancelled it.

        The depth shrinks when the queue runs dry early (another consumer holds the rest). The
        consumer's tag joins the channel's (cancelled oldest first when the read ends); the read's
        consumers on its other channels count as its own too.

        A queue with none ready and no consumer but this read's has handed what is left to this read:
        the deliveries are on their way (a broker slow to send them: 3.10.8 took over 2 s to start
        a 50,000-message quorum read on a loaded machine), so the read waits up to ``read_timeout``
        before calling itself short."""
        conn, res, where, sink, quorum, budget = self.conn, self.res, self.where, self.sink, self.quorum, self.budget
        read_timeout, throttle, deadline = self.opts.read_timeout, self.opts.throttle, self.opts.deadline
        depth = self.depth
        consumers = self.tags.setdefault(ch.number, [])
        earlier = sum(len(t) for n, t in self.tags.items() if n != ch.number)
        taken = 0
        idle = 0.0
        check = min(read_timeout, DRY_CHECK_SECS)
        ch.deliveries.clear()  # an earlier consumer's leftovers (held unacked, returned with the channel's)
        tag = ch.consume(self.queue, HOLD_ARGUMENTS if self.nack else None)
        consumers.append(tag)
        for method, props, body in receive(conn, ch, tag, check):
            if method is None:
                idle += check
                counts = passive_declare(conn, self.vhost, self.queue)
                if counts.messages == 0:
                    if counts.consumers <= earlier + len(consumers) and idle < read_timeout:
                        continue  # no other consumer: what this read was given is still on its way
                    if counts.consumers > earlier + len(consumers):
                        res.short = _short(where, res.records, depth,
                                           f"no message arrived for {idle:g}s and the queue has none ready")
                    else:
                        res.short = _short(where, res.records, depth, f"no message arrived for {idle:g}s, the "
                                           "queue has none ready and no other consumer", "the rest left the queue "
                                           "meanwhile: expired, purged or dead-lettered")
                    self.depth = res.records
                    return True
                if idle < read_timeout:
                    continue  # messages are ready but not reaching us yet: wait up to read_timeout
                raise AmqpError(f"{where}: no message arrived for {idle:g}s after {res.records} of "
                                f"{depth} (backup.read_timeout_secs); every message was returned to the queue")
            idle = 0.0
            _take(res, where, sink, method, props, body, quorum, budget)
            taken += 1
            if throttle is not None:
                throttle(res.records)
            _check_deadline(deadline, where, res.records, depth)
            if taken >= want or res.records >= depth:
                return True
        return False

    def by_get(self) -> None:
        """basic.get one message at a time: no consumer is registered, so an auto-delete queue stays."""
        ch = self.conn.channel()
        self.channels.append(ch)
        res, where, throttle, deadline = self.res, self.where, self.opts.throttle, self.opts.deadline
        while res.records < self.depth:
            got = ch.get(self.queue)
            if got is None:
                res.short = _short(where, res.records, self.depth, "basic.get found the queue empty")
                self.depth = res.records
                return
            m = got.method
            _take(res, where, self.sink, Deliver(m.delivery_tag, m.redelivered, m.exchange, m.routing_key),
                  properties(got.raw_properties), got.body, self.quorum, self.budget)
            if throttle is not None:
                throttle(res.records)
            _check_deadline(deadline, where, res.records, self.depth)

    def check_cancelled(self, wait: float = 0.0) -> None:
        """4.3 cancels a consumer whose delivery outlived its consumer timeout and returns those messages
        at once: a later channel could then receive them again, so the read fails (nothing is lost).
        What arrived is taken first (``wait`` s at most)."""
        _check_cancelled(self.conn, self.channels, self.tags, self.cancelled, self.where, self.res.records,
                         self.depth, wait)


def _rotation_note(quorum: bool, res: ReadResult, depth: int) -> str:
    """What a cut does to a quorum queue whose messages were returned before (rabbit_fifo, every version).

    Returns join the tail of the queue's returns. The last message taken was ``redelivered``,
    so it came from the returns, and so may the ones not taken: those are delivered first now,
    and the messages the backup had taken come back behind them."""
    if not quorum or not res.last_redelivered or res.records >= depth:
        return ""
    return (f" BEHIND the ones it had not taken: the queue's messages had been returned before (an earlier "
            f"backup), and RabbitMQ returns messages to the tail of its returns, so the queue is now rotated "
            f"(its first {res.records} or more messages come after the rest; nothing lost)")


def _channels_note(quorum: bool, channels: int) -> str:
    """What a cut does to a quorum read held on several channels (deeper than MAX_CONSUMERS_PER_CHANNEL
    windows): each channel's messages come back intact, the channels in whatever order the broker
    takes them down."""
    if not quorum or channels < 2:
        return ""
    return (f"; the read held them on {channels} channels, which the broker gives back in no particular order, "
            f"so the queue may now be out of order (nothing lost)")


def reading_channel(conn: Connection) -> Channel:
    """The connection's channel for small classic reads, kept open across queues.

    A channel per queue cost three round trips (open, qos, close) and the broker's channel
    processes on every queue: most of a many-queue backup (issue 20: 1,000 x 100). A read
    gives its messages back by cancelling its consumer and ``basic.nack(multiple, requeue)``,
    which requeues a classic queue's messages exactly as a channel close does (the same
    requeue, to their original positions), then waits for the requeue (``return_shared``). A
    failed read closes the channel instead, and the next read opens a fresh one.
    """
    return kept_channel(conn, READING, _no_prefetch_cap)


def _no_prefetch_cap(ch: Channel) -> None:
    ch.qos(0)  # explicit: a broker's default_consumer_prefetch would cap the read


def _channel_closed_error(e: ChannelClosedByBroker, where: str, records: int, depth: int) -> AmqpError:
    hint = ""
    if e.code == 406 and "timeout" in (e.text or "").lower():
        hint = (" (the broker's consumer_timeout: raise it for this queue, e.g. the x-consumer-timeout "
                "argument or policy on 3.12+/4.x, or rabbitmq.conf consumer_timeout)")
    return AmqpError(f"{where}: the broker closed the channel after {records} of {depth} messages: "
                     f"{e.code} {e.text}{hint}; every unacked message returned to the queue")


def _short(where: str, records: int, depth: int, how: str,
           cause: str = "another consumer, or another backup, holds the rest unacked") -> str:
    """The reason a read fell short (the queue is recorded as partial, never as complete)."""
    why = f"read {records} of the {depth} messages the queue held when the read started: {how} ({cause})"
    log.warning("%s: %s; the backup is PARTIAL", where, why)
    return why


def _take(res: ReadResult, where: str, sink: DeliverySink, method: Any, props: Any, body: bytes, quorum: bool,
          budget: tuple[int, int] | None) -> None:
    """Check one delivered message against the delivery budget BEFORE it counts as taken, then hand it on.

    ``budget``: (ceiling, limit), the ceiling being ``limit - margin`` (``limits.budget_ceiling``);
    None when returns cost nothing (4.3+ nack) or no limit applies."""
    c = delivery_count(props) if quorum else 0
    if c > res.max_delivery_count or not res.nearest:
        res.max_delivery_count = c
        res.nearest = describe_message(res.records + 1, props)
    if budget is not None and not may_take(c, budget[0]):
        ceiling, limit = budget
        name = describe_message(res.records + 1, props)
        if c + 1 <= limit:
            fate = f"it goes back at x-delivery-count {c + 1}, within the limit"
        else:
            fate = ("it was at its limit before the backup started, and returning it (the only way back on this "
                    "broker) drops or dead-letters it, so it may be beyond saving")
        err = DeliveryLimitError(
            f"{where}: {name} had already been delivered {c} times when this backup took it; the queue's "
            f"delivery limit is {limit} and backup.delivery_limit_margin {limit - ceiling}, so a backup never "
            f"leaves a message at x-delivery-count {ceiling} or more: {fate}. The backup took nothing more; the "
            f"{res.records} messages before it go back with one more delivery each")
        err.message_name = name
        err.count = c
        raise err
    sink(method, props, body)
    res.records += 1
    res.last_tag = method.delivery_tag
    res.last_redelivered = method.redelivered


def _check_cancelled(conn: Connection, channels: list[Channel], tags: dict[int, list[str]],
                     cancelled: list[Channel], where: str, records: int, depth: int, wait: float = 0.0) -> None:
    """4.3 cancels a consumer whose delivery outlived its consumer timeout and returns those messages
    at once: a later channel could then receive them again, so the read fails (nothing is lost).
    What arrived is taken first (``wait`` s at most)."""
    if not cancelled and conn.is_open:
        conn.sleep(wait)
        for ch in channels:
            if any(t in ch.cancelled for t in tags.get(ch.number, ())):
                cancelled.append(ch)
    if cancelled:
        raise AmqpError(
            f"{where}: the broker cancelled the backup's consumer after {records} of {depth} messages (the queue "
            "was deleted, or RabbitMQ 4.3 saw a delivery outlive the consumer timeout: raise x-consumer-timeout / "
            "the consumer-timeout policy key for this queue, or rabbitmq.conf consumer_timeout); every message was "
            "returned to the queue")


def _check_deadline(deadline: float | None, where: str, records: int, depth: int) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise AmqpError(f"{where}: the read took longer than allowed (backup.max_duration_secs) after "
                        f"{records} of {depth} messages; every message was returned to the queue")


def _check_open(channels: list, where: str, records: int, depth: int) -> None:
    for i, ch in enumerate(channels[:-1], 1):
        if not ch.is_open:
            raise AmqpError(
                f"{where}: the broker closed channel {i} of the read after {records} of {depth} messages (most "
                "likely its consumer_timeout: raise it for this queue, e.g. the x-consumer-timeout argument or "
                "policy on 3.12+/4.x, or rabbitmq.conf consumer_timeout); every unacked message returned to the queue")
