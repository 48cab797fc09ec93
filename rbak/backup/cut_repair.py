"""Put a quorum queue back in order after a cut read rotated it (issue 27, scenario 4).

``rabbit_fifo`` (3.10.8, 4.0.5, 4.3.6) appends every returned message to the tail of the queue's
*returns*, which are delivered before anything never delivered. Once a queue has been returned
whole (every quorum queue after its first complete backup), a read cut off after taking its
first ``m`` messages leaves it ``[A, B, C]``: ``A`` the returns rbak had not reached, ``B`` the
``m`` it had taken, ``C`` messages never delivered (published since). The original order was
``[B, A, C]``.

No return puts a message at a head, and returns of several messages are not applied in the
order they are sent (``rabbit_fifo_client`` stashes them per consumer: measured on all three
brokers, ``benchmarks/return_costs.py``), but a read that holds a prefix and gives it back in
consumer order moves that prefix behind the other returns intact. So the repair is two reads
of the ordinary kind (``queue_reader.read_queue``, with its windows, delivery budget and
in-order return):

1. read the whole queue and give it back unchanged, to find ``A``: the messages before the
   first one the cut read had taken (matched by content against what it recorded; the match
   must be unique, and every message up to the end of ``B`` must come from the returns);
2. read exactly ``len(A)`` messages, check they are ``A``, and give them back: they go behind
   ``B``, which restores ``[B, A, C]``.

Two cases need more than one move, and get a read in parts instead (``reorder_plan``): a read
deeper than ``MAX_CONSUMERS_PER_CHANNEL`` windows held ``B`` on several channels, which a cut
gives back in whatever order the broker takes them down (``[A, B3, B1, B2]``; ``Taken`` records
where each channel's messages began), or never-delivered messages ``C`` were taken by read 1 (3.x
below). Read 2 then takes the whole of what read 1 took, one part after another (``A``, each
``Bi``, ``C``), each held on channels of its own, checks each against read 1, and gives the parts
back in their original order ``[B1 .. Bk, A, C]``.

Read 1 takes no more than the returns where the broker says how many there are, so that ``C`` is
neither read nor moved. AMQP 0-9-1 has no peek, so read 1 stops at the number of returned messages the
broker reports (``messages_ready_returned``, 4.0+, read once its statistics show every message back
and none unacked) and checks that each one it took came from the returns. Without that figure (3.x)
it reads the whole queue, and the read in parts puts ``C`` last again.

Each read costs a delivery on brokers that count returns (3.x and 4.0 return by channel close),
so both are bounded by the same ``delivery_limit - margin`` as the backup itself. Anything the
repair cannot be sure of (another consumer, a queue that changed, a second cut, an ambiguous
match) stops it before the second read, and the caller reports the queue as rotated.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol
from urllib.parse import quote

from ..errors import RbakError
from ..broker.wire import Connection
from .queue_reader import QueueRead, ReadOptions, read_queue

log = logging.getLogger(__name__)

STATS_SECS = 60.0  # how long the management statistics may take to show the returned messages (a loaded node: long)
PREFIX = 64  # messages of the cut read remembered to find them again (content, not position)
SETTLE_SECS = 60.0  # how long the broker may take to give a closed connection's messages back and drop its consumers
# (4.0.5 under load still listed a cut read's 6 consumers 30 s after its connection was closed: the repair gave up)


def identity(props: Any, body: bytes) -> bytes:
    """What tells one message from another across deliveries: the body and the properties a
    publisher sets, never the headers the broker changes on each delivery (x-delivery-count)."""
    h = hashlib.blake2b(body, digest_size=16)
    for v in (getattr(props, "message_id", None), getattr(props, "correlation_id", None),
              getattr(props, "timestamp", None)):
        h.update(b"\0" + repr(v).encode())
    return h.digest()


@dataclass(slots=True)
class Taken:
    """The start of a read, kept in case it is cut: the first ``PREFIX`` identities, and where each
    later channel's messages begin with the first ``PREFIX`` of them. A cut gives each channel's
    messages back intact, but separate channels in whatever order the broker takes them down (a read
    deeper than ``MAX_CONSUMERS_PER_CHANNEL`` windows uses several): the repair must find every block
    in its place before it says the order is back."""

    prefix: list[bytes] = field(default_factory=list)
    blocks: list[tuple[int, list[bytes]]] = field(default_factory=list)  # (position, first identities)
    _tag: int = field(default=0, init=False, repr=False)  # the last delivery tag: 1 again on each channel
    _filling: bool = field(default=False, init=False, repr=False)  # the newest block has < PREFIX identities

    def lead(self) -> list[bytes]:
        """The prefix within the first channel's messages: what a cut keeps together at its head."""
        return self.prefix[:self.blocks[0][0]] if self.blocks else self.prefix

    def see(self, position: int, tag: int, props: Any, body: bytes) -> None:
        """Delivery number ``position`` (0-based) of the read, with its channel's ``tag``. Called for
        every quorum delivery: the usual call is one comparison."""
        if tag <= self._tag:
            self.blocks.append((position, []))
            self._filling = True
        self._tag = tag
        if position < PREFIX:
            self.prefix.append(identity(props, body))
        if self._filling:
            ids = self.blocks[-1][1]
            ids.append(identity(props, body))
            self._filling = len(ids) < PREFIX


@dataclass(slots=True)
class Seen:
    ids: list[bytes] = field(default_factory=list)
    redelivered: list[bool] = field(default_factory=list)
    max_count: int = 0

    def sink(self, method: Any, props: Any, body: bytes) -> None:
        self.ids.append(identity(props, body))
        self.redelivered.append(bool(method.redelivered))
        h = props.headers or {}
        try:
            self.max_count = max(self.max_count, int(h.get("x-delivery-count") or 0))
        except (TypeError, ValueError):
            pass


def returned_prefix(redelivered: list[bool]) -> int:
    """How many of a read's first messages came from the queue's returns (redelivered)."""
    return next((i for i, r in enumerate(redelivered) if not r), len(redelivered))


def rotation(seen: list[bytes], redelivered: list[bool], prefix: list[bytes]) -> int | None:
    """How many messages stand before the cut read's first one (``len(A)``), or None when that is
    not certain: no match, several matches, or a match not wholly inside the returns (a pure decision)."""
    p = len(prefix)
    if p == 0:
        return None
    returns = returned_prefix(redelivered)
    hits = [j for j in range(0, returns - p + 1) if seen[j:j + p] == prefix]
    return hits[0] if len(hits) == 1 else None


def blocks_in_place(seen: list[bytes], j: int, blocks: list[tuple[int, list[bytes]]]) -> bool:
    """Whether, with the ``j`` messages ahead moved behind, every later channel's messages stand where
    the cut read had found them (a pure decision). ``seen`` is what the check read took: a block it
    did not reach, or one cut short by its end, cannot be vouched for."""
    n = len(seen)
    for start, ids in blocks:
        if start + len(ids) > n:
            return False
        if [seen[(j + start + i) % n] for i in range(len(ids))] != ids:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Plan:
    """How to give the queue's messages back in their original order: read them as ``segments``
    (``[start, end)`` of the check read, in queue order), hold them all, give them back in ``order``."""

    segments: list[tuple[int, int]]
    order: list[int]


def reorder_plan(seen: list[bytes], redelivered: list[bool], j: int, blocks: list[tuple[int, list[bytes]]]) -> Plan | None:
    """The plan that restores ``[B1 .. Bk, A, C]`` from what the check read ``seen`` (a pure decision),
    or None when a part cannot be placed with certainty.

    ``A``: the returns the cut read had not reached, at the head; ``B1`` at ``j`` (the cut read's
    lead), each later channel's ``Bi`` where its first identities are, in any order behind ``A``;
    ``C``: never delivered when the check read took it (at the tail). Every ``Bi`` but the last has
    the length the cut read gave it; the last also holds what was on its way when the cut came."""
    returns, n = returned_prefix(redelivered), len(seen)
    starts = [j]
    for _, ids in blocks:
        p = len(ids)
        hits = [i for i in range(0, returns - p + 1) if seen[i:i + p] == ids]
        if len(hits) != 1:
            return None
        starts.append(hits[0])
    if len(set(starts)) != len(starts):
        return None
    begins = [start for start, _ in blocks]  # where channels 2..k began in the cut read (B1 at 0)
    lengths: list[int | None] = [b - a for a, b in zip([0, *begins], begins)]
    lengths.append(None)  # the last channel's: also what was on its way when the cut came
    now = sorted(range(len(starts)), key=lambda k: starts[k])
    segments: list[tuple[int, int]] = []
    rank: list[int] = []  # each segment's place in the original order: B1..Bk, then A, then C
    if starts[now[0]] > 0:
        segments.append((0, starts[now[0]]))
        rank.append(len(starts))
    for i, k in enumerate(now):
        end = starts[now[i + 1]] if i + 1 < len(now) else returns
        want = lengths[k]
        if end <= starts[k] or (want is not None and end - starts[k] != want):
            return None
        segments.append((starts[k], end))
        rank.append(k)
    if returns < n:
        segments.append((returns, n))
        rank.append(len(starts) + 1)
    return Plan(segments, sorted(range(len(segments)), key=lambda i: rank[i]))


@dataclass(slots=True)
class Repair:
    repaired: bool
    why: str  # what was done, or why the queue was left as it is
    max_count: int = 0  # the highest x-delivery-count the repair saw (for the delivery guard)


def returned_ready(client: Any, vhost: str, queue: str, ready: int, wait_secs: float = STATS_SECS,
                   sleep: Callable[[float], None] = time.sleep, reported: bool = False, taken: int = 0) -> int | None:
    """How many of the queue's ``ready`` messages wait in its returns, from the management API
    (``messages_ready_returned``, 4.0+), or None: not reported (3.x) or not settled in time. A
    sample counts only once it shows all ``ready`` messages back, none unacked, and at least the
    ``taken`` messages the cut read held returned. The first two alone also match a sample from
    before the read (statistics lag by seconds on a loaded node: a cut read of a fresh queue then
    looked like one with no returns, and the repair read the never-delivered messages too). With
    the third, an older sample is either refused or right: a cut inside the returns leaves their
    number as it was. ``reported``: the broker reports the figure (4.0+), so a sample without it
    is waited past (4.0.5 sent some right after a cut)."""
    deadline = time.monotonic() + wait_secs
    while True:
        try:
            info = client.request("GET", f"queues/{quote(vhost, safe='')}/{quote(queue, safe='')}") or {}
        except RbakError as e:
            log.debug("queue %r in vhost %r: no statistics: %s", queue, vhost, e)
            return None
        if "messages_ready" in info and "messages_ready_returned" not in info and not reported:
            return None
        returned = info.get("messages_ready_returned")
        if info.get("messages_ready") == ready and info.get("messages_unacknowledged") == 0 \
                and isinstance(returned, int) and returned >= taken:
            return returned
        if time.monotonic() >= deadline:
            return None
        sleep(0.5)


class RepairSource(Protocol):
    """The broker side of a repair (``queue_backup`` provides it for the queue the cut read left)."""

    def connect(self) -> Connection:
        """A fresh connection to the queue's vhost."""

    def counts(self, conn: Connection) -> tuple[int, int]:
        """The queue's (ready messages, consumers), by passive declare."""

    def returned(self, ready: int) -> int | None:
        """How many of the ``ready`` messages wait in the queue's returns (``returned_ready``), or None."""


def repair(source: RepairSource, vhost: str, queue: str, depth: int, taken: Taken, opts: ReadOptions) -> Repair:
    """Restore ``[B, A, C]`` after a cut (module docstring), with reads bounded by ``opts`` (the cut
    read's delivery limit, margin, return mode and read timeout)."""
    try:
        conn = source.connect()
    except (RbakError, OSError) as e:
        return Repair(False, f"rbak could not reconnect to put it back in order ({e})")
    try:
        return _repair(conn, source, vhost, queue, depth, taken, opts)
    except RbakError as e:
        return Repair(False, f"putting it back in order failed ({e})")
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - a broken connection gives everything back anyway
            pass


def _repair(conn: Connection, source: RepairSource, vhost: str, queue: str, depth: int, taken: Taken,
            opts: ReadOptions) -> Repair:
    counts = source.counts
    deadline = time.monotonic() + SETTLE_SECS
    ready, consumers = counts(conn)
    while (ready < depth or consumers) and time.monotonic() < deadline:
        # the broker returns a closed connection's messages, and removes its consumers, asynchronously
        # (4.3.6 still listed the cut read's consumers when the repair began: another consumer would
        # stay, and is refused below once this wait is over)
        time.sleep(0.1)
        ready, consumers = counts(conn)
    if consumers:
        return Repair(False, f"not put back in order: {consumers} consumer(s) are attached to it")
    if ready < depth:
        return Repair(False, f"not put back in order: it holds {ready} of the {depth} messages it held when "
                             f"the backup started")
    in_returns = source.returned(ready)
    first = in_returns if in_returns is not None and 0 < in_returns < ready else ready
    log.info("queue %r in vhost %r: %d ready, %s of them returned (management API): the check read takes %d",
             queue, vhost, ready, "an unknown number" if in_returns is None else in_returns, first)
    whole = Seen()
    res = read_queue(conn, vhost, queue, "quorum", first, whole.sink, opts)
    if res.records < first:
        return Repair(False, f"not put back in order: a check read took {res.records} of {first} messages")
    if first < ready and not all(whole.redelivered):
        return Repair(False, "not put back in order: the broker's count of returned messages was out of date, "
                             "so the check read took messages that had never been delivered", whole.max_count)
    lead = taken.lead()
    j = rotation(whole.ids, whole.redelivered, lead)
    if j is None and first < ready and all(whole.redelivered):
        # Not among the returns the broker counted: 4.3.6 can keep a cut read's messages out of
        # that count, ahead of the never-delivered ones and behind the counted returns, which the
        # check read has just given back behind them. Whether that put the queue back in order is
        # read from the queue itself: all of it, given back in order (the order it finds stays).
        again = Seen()
        res = read_queue(conn, vhost, queue, "quorum", ready, again.sink, opts)
        count = max(whole.max_count, again.max_count)
        p = len(lead)
        if res.records == ready and p and again.ids[:p] == lead and again.ids.count(lead[0]) == 1 \
                and blocks_in_place(again.ids, 0, taken.blocks):
            log.info("queue %r in vhost %r: a cut read had left %d returned messages ahead; giving them back put "
                     "them behind", queue, vhost, first)
            return Repair(True, f"rbak reconnected and put it back in its original order (gave the {first} "
                                f"messages the broker had placed ahead back behind the others, then read the "
                                f"whole queue to check)", count)
        log.warning("queue %r in vhost %r: the cut read's first %d message(s) were not found at the head of the %d "
                    "read back (the broker reported %s returned)", queue, vhost, p, res.records, in_returns)
        return Repair(False, "not put back in order: the messages the backup had taken could not be "
                             "found again with certainty", count)
    if j is None:
        return Repair(False, "not put back in order: the messages the backup had taken could not be "
                             "found again with certainty", whole.max_count)
    prefix = returned_prefix(whole.redelivered)
    if not blocks_in_place(whole.ids, j, taken.blocks) or (j and prefix < len(whole.ids)):
        # channels given back in another order, or never-delivered messages C behind (3.x reads them:
        # it does not report how many are returned): no single move does it, a read in parts does
        plan = reorder_plan(whole.ids, whole.redelivered, j, taken.blocks)
        if plan is None:
            return Repair(False, "not put back in order: the parts the broker gave back could not be placed with "
                                 "certainty", whole.max_count)
        return _reorder(conn, vhost, queue, whole, plan, opts)
    if j == 0:
        return Repair(True, "its order was checked and is unchanged", whole.max_count)
    ahead = Seen()
    res = read_queue(conn, vhost, queue, "quorum", j, ahead.sink, opts)
    if ahead.ids != whole.ids[:j]:
        return Repair(False, f"not put back in order: the queue changed while rbak was putting it back (moved "
                             f"{res.records} messages)", max(whole.max_count, ahead.max_count))
    log.info("queue %r in vhost %r: a cut read had rotated it by %d; the %d messages ahead went back behind",
             queue, vhost, depth - j, j)
    return Repair(True, f"rbak reconnected and put it back in its original order (moved the {j} messages the "
                        f"broker had placed ahead behind the others)", max(whole.max_count, ahead.max_count))


def _reorder(conn: Connection, vhost: str, queue: str, whole: Seen, plan: Plan, opts: ReadOptions) -> Repair:
    """Read the queue again in ``plan.segments``, each held on channels of its own, check each is what
    the check read saw there, and give them back in ``plan.order`` (each return joins the tail of the
    returns, so the order they are given back in is the queue's). Anything unexpected gives them back
    as they were read, which leaves the order as it was."""
    held: list[QueueRead] = []
    count = whole.max_count
    why = ""
    try:
        for a, b in plan.segments:
            part = Seen()
            res = read_queue(conn, vhost, queue, "quorum", b - a, part.sink, opts, hold=held)
            count = max(count, part.max_count)
            if part.ids != whole.ids[a:b]:
                why = f"the queue changed while rbak was putting it back (read {res.records} of {b - a} in one part)"
                break
    except RbakError as e:
        why = f"putting it back in order failed ({e})"
    order = range(len(held)) if why else plan.order
    for i in order:
        held[i].give_back()
    if not why and not conn.is_open:  # channels not closed by us come back in the broker's order
        why = "the connection was lost while rbak gave the parts back"
    if why:
        return Repair(False, f"not put back in order: {why}", count)
    log.info("queue %r in vhost %r: read in %d parts and given back in their original order", queue, vhost,
             len(plan.segments))
    return Repair(True, f"rbak reconnected and put it back in its original order (read it again in "
                        f"{len(plan.segments)} parts and gave them back in their original order)", count)
