"""Replay a quorum queue's ``rabbit_fifo`` commands to find what it held when its node stopped.

The commands (Erlang records, the same field order in 3.10 through 4.3):
``{enqueue, Pid, Seq, Msg}``, ``{e, Seq, Msg, Size}`` (4.x), ``{checkout,
ConsumerId, Spec, Meta}``, ``{settle|return|discard, Key, MsgIds}``,
``{modify, Key, MsgIds, DeliveryFailed, UndeliverableHere, Anns}`` (4.x),
``{requeue, Key, MsgId, Index, Header, Msg}``, ``{credit, Key, Credit,
DeliveryCount, Drain}``, ``{purge}``, ``{down, Pid, Reason}``, wrapped by Ra
as ``{'$usr', Meta, Cmd, ReplyMode}``. A consumer's key is the Raft index of
its first checkout on machine version 4+ (its ``{Tag, Pid}`` id before, and
either is accepted).

Delivery follows ``rabbit_fifo``: returned messages first (in return order),
then the ready messages: one FIFO before machine version 4; two levels
(priority above 4, "hi", and the rest, "no") where every third delivery may
take the older "no" message (``rabbit_fifo_q``, versions 4-7); 32 strict
levels (``rabbit_fifo_pq``, version 8+: 4.3). Consumers are served in turn
(highest consumer priority first), each taking messages while it has credit;
msg ids count up per consumer, which is how settles name messages.

At stop every message not settled or discarded is still the queue's;
``remaining`` replays the restart (each dead pid's ``down`` in turn, see
there). Credit and single active consumer: ``fifo_consumers``; 4.3's
delayed retry: ``fifo_delayed``.
Expiry is replayed as ``expire_msgs`` applies it: each message's expiry is
its enqueue command's ``ts`` plus min(queue ``msg_ttl``, its own TTL), and
the next message to deliver is dropped at each checkout round once the
current command's ``ts`` reaches it. Delivery-limit drops, length limits
(drop-head after each command's deliveries) and at-least-once dead-letter
state are replayed too (``fifo_limits``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .erlang_terms import Atom, ImproperList
from .fifo_consumers import Consumer, ConsumerRules, _pid, pid_order
from .fifo_delayed import DEFERRAL_TOKEN, Delayed, ready_at
from .fifo_limits import AT_LEAST_ONCE, DeadLetters, Limits, SizedDeque, expiry_note


@dataclass(slots=True)
class Msg:
    idx: int  # raft index of the command holding the message (the enqueue, or a requeue)
    body_idx: int  # raft index whose command holds the message body
    priority: int
    failed: int = 0  # delivery failures, for the delivery limit
    expiry: int | None = None  # absolute ms: enqueue time + min(queue msg_ttl, message TTL)
    size: int = 0  # the header's size, for x-max-length-bytes
    acquired: int = 0  # every return counts (acquired_count: the delivery limit on machine versions 4-7)


class Ready:
    """The ready messages, ordered as ``rabbit_fifo_q`` / ``rabbit_fifo_pq`` / the old FIFO take them."""

    def __init__(self, machine_version: int):
        self.mode = "fifo" if machine_version < 4 else ("q" if machine_version < 8 else "pq")
        self.buckets: dict[int, deque[Msg]] = {}
        self.counter = 0  # rabbit_fifo_q's dequeue_counter
        self.bytes = 0  # sum of the messages' sizes

    def level(self, priority: int) -> int:
        if self.mode == "fifo":
            return 0
        if self.mode == "q":
            return 1 if priority > 4 else 0
        return max(0, min(priority, 31))

    def push(self, m: Msg, level: int | None = None) -> None:
        self.buckets.setdefault(self.level(m.priority) if level is None else level, deque()).append(m)
        self.bytes += m.size

    def __len__(self) -> int:
        return sum(len(q) for q in self.buckets.values())

    def peek(self) -> Msg | None:
        """What ``pop`` would take, leaving the queue (and ``rabbit_fifo_q``'s counter) as it is."""
        live = [p for p, q in self.buckets.items() if q]
        if not live:
            return None
        if self.mode == "q":
            hi, no = self.buckets.get(1), self.buckets.get(0)
            if hi and no and self.counter == 2:
                return hi[0] if hi[0].idx < no[0].idx else no[0]
            either = hi or no
            assert either is not None  # live is not empty, and in this mode every level is 0 or 1
            return either[0]
        return self.buckets[max(live)][0]

    def pop(self) -> Msg | None:
        live = [p for p, q in self.buckets.items() if q]
        if not live:
            return None
        if self.mode == "q":
            hi, no = self.buckets.get(1), self.buckets.get(0)
            c0 = self.counter
            self.counter = 0 if c0 == 2 else c0 + 1
            if hi and no and c0 == 2:
                m = (hi if hi[0].idx < no[0].idx else no).popleft()
            else:
                either = hi or no
                assert either is not None  # live is not empty, and in this mode every level is 0 or 1
                m = either.popleft()
        else:
            m = self.buckets[max(live)].popleft()
        self.bytes -= m.size
        return m

    def clear(self) -> list[Msg]:
        out = [m for q in self.buckets.values() for m in q]
        self.buckets.clear()
        self.bytes = 0
        return out


#: Commands that do not change which messages the queue holds or their order.
_NO_EFFECT = frozenset({"register_enqueuer", "garbage_collection", "nodeup", "nodedown",
                        "purge_nodes", "eval_consumer_timeouts", "consumer_timeout"})


#: Commands after which ``activate_next_consumer`` runs.
_ACTIVATES = frozenset({"checkout", "settle", "return", "discard", "modify", "requeue", "down", "timeout"})


def _is(x: Any, name: str) -> bool:
    return isinstance(x, Atom) and x == name


class FifoReplay(ConsumerRules):
    """Apply commands in log order; ``remaining()`` is the queue at the end, in delivery order."""

    def __init__(self, machine_version: int, priority_of: Callable[[int, Any], int], delivery_limit: int | None,
                 ttl_of: Callable[[int, Any], int | None] | None = None, msg_ttl: int | None = None,
                 limits: Limits | None = None, size_of: Callable[[int, Any], int] | None = None):
        self.mv = machine_version
        self.priority_of = priority_of  # (raft index, message term) -> priority
        self.delivery_limit = delivery_limit
        self.ready = Ready(machine_version)
        self.returns: SizedDeque = SizedDeque()
        self.consumers: dict[Any, Consumer] = {}
        self.by_cid: dict[Any, Any] = {}
        self.service: list[Any] = []  # consumer keys waiting for messages
        self.waiting: list[Consumer] = []  # single active consumer: the waiting list (fifo_consumers)
        self.dropped = 0
        self.expired = 0
        self.ttl_of = ttl_of  # (raft index, message term) -> the message's own TTL in ms, or None
        self.msg_ttl = msg_ttl  # the queue's x-message-ttl
        self.ts = 0  # the current command's timestamp (the '$usr' meta's ts), as rabbit_fifo's RaCmdTs
        self.unknown: dict[str, int] = {}
        self.limits = limits or Limits()
        self.size_of = size_of  # (raft index, message term) -> its size when the command does not say
        self.dlx = DeadLetters()  # at-least-once dead-lettering in progress
        self.maxlen_dropped = 0
        self.dead_lettered = 0  # handed to an at-most-once dead-letter exchange (gone from the queue)
        self.dlx_lost = 0  # at-least-once ones deleted by a switch to another dead-letter strategy
        self.delayed = Delayed()  # 4.3's delayed-retry messages (fifo_delayed)
        self.last_active = self.limits.created  # x-expires: the queue's last activity (ms)
        self.consumers_at_stop = False
        self.delayed_at_stop = 0
        self.restart_dropped = 0  # past the delivery limit when the restart returns them

    def set_version(self, mv: int) -> None:
        if mv == self.mv:
            return
        self.mv = mv
        old = self.ready
        self.ready = Ready(mv)
        for m in old.clear():  # an upgrade converts the queue keeping its order (rabbit_fifo_*:from_lqueue)
            self.ready.push(m)

    # ------------------------------------------------------------------ commands
    def apply(self, idx: int, cmd: Any) -> None:
        if isinstance(cmd, tuple) and len(cmd) >= 3 and _is(cmd[0], "noop") and isinstance(cmd[2], int):
            self.set_version(cmd[2])  # each new leader's first entry names the machine version in effect
            return
        if not (isinstance(cmd, tuple) and len(cmd) >= 3 and _is(cmd[0], "$usr")):
            return  # Ra's own commands ('$ra_cluster_change', ...)
        if isinstance(cmd[1], dict) and isinstance(ts := cmd[1].get(Atom("ts")), int):
            self.ts = ts
        cmd = cmd[2]
        if not (isinstance(cmd, tuple) and cmd and isinstance(cmd[0], Atom)):
            return
        name = str(cmd[0])
        if name in _NO_EFFECT:
            return
        handler = getattr(self, "_c_" + name, None)
        if handler is None:
            self.unknown[name] = self.unknown.get(name, 0) + 1
            return
        handler(idx, cmd)
        self._after(name in _ACTIVATES)

    def _after(self, activate: bool) -> None:
        """What ``rabbit_fifo`` does after a command: single active consumer's activation, the checkout
        (expiry first), the dead-letter worker's checkout, the length limit."""
        if activate:
            self._activate_next()
        self._checkout()
        if self.limits.dlh == AT_LEAST_ONCE:
            self.dlx.checkout()
        self._evaluate_limit()

    def _enqueue_msg(self, idx: int, msg: Any, size: Any = None) -> None:
        self.ready.push(Msg(idx, idx, self.priority_of(idx, msg), expiry=self._expiry(idx, msg),
                            size=self._size(idx, msg, size)))

    def _size(self, idx: int, msg: Any, size: Any) -> int:
        """The header size: the enqueue's ``{MetaSize, BodySize}`` (4.x: body only before machine version 8,
        both from 8), else the message's body size (3.x: ``message_size/1`` of the payload)."""
        if isinstance(size, tuple) and len(size) == 2 and all(isinstance(x, int) for x in size):
            return size[0] + size[1] if self.mv >= 8 else size[1]
        if isinstance(size, int):
            return size
        return self.size_of(idx, msg) if self.size_of else 0

    def _evaluate_limit(self) -> None:
        """``evaluate_limit`` with ``drop_head``: drop the next message to deliver while over a limit."""
        if not self.limits.drops_head:
            return
        n_dlx, b_dlx = self.dlx.stat()
        n_dlx, b_dlx = n_dlx + len(self.delayed), b_dlx + self.delayed.bytes  # messages_ready_plus_delayed
        while self.limits.over(len(self.returns) + len(self.ready) + n_dlx,
                               self.returns.bytes + self.ready.bytes + b_dlx):
            m = self._take()
            if m is None:
                return
            self.maxlen_dropped += 1
            if self.limits.dlh is not None:  # at_most_once (at_least_once never comes with drop_head)
                self.dead_lettered += 1

    def _dead_letter(self, m: Msg) -> None:
        """A message rejected, expired or over the delivery limit leaves the queue; at-least-once keeps it."""
        if self.limits.dlh == AT_LEAST_ONCE:
            self.dlx.discards.append(m)
        elif self.limits.dlh is not None:
            self.dead_lettered += 1

    def _c_dlx(self, idx: int, cmd: tuple) -> None:
        if self.limits.dlh == AT_LEAST_ONCE and len(cmd) == 2:
            self.dlx.apply(cmd[1])

    def _expiry(self, idx: int, msg: Any) -> int | None:
        """``maybe_set_msg_ttl``: min of the queue's and the message's TTL from the enqueue's time (0 -> +1 ms)."""
        ttls = [t for t in (self.msg_ttl, self.ttl_of(idx, msg) if self.ttl_of else None) if t is not None]
        if not ttls or not self.ts:
            return None
        return self.ts + (min(ttls) or 1)

    def _c_update_config(self, idx: int, cmd: tuple) -> None:
        conf = cmd[1] if len(cmd) > 1 and isinstance(cmd[1], dict) else {}
        if Atom("msg_ttl") in conf:
            t = conf[Atom("msg_ttl")]
            self.msg_ttl = t if isinstance(t, int) else None
        if Atom("delivery_limit") in conf:
            d = conf[Atom("delivery_limit")]
            self.delivery_limit = d if isinstance(d, int) and d >= 0 else None
        new = Limits.from_conf(conf)
        if new.dlh != self.limits.dlh:  # rabbit_fifo_dlx:update_config: a switch starts an empty state
            if self.limits.dlh == AT_LEAST_ONCE:
                self.dlx_lost += self.dlx.stat()[0]
            self.dlx = DeadLetters()
        self.limits = new

    def _c_timeout(self, idx: int, cmd: tuple) -> None:
        """``{timeout, expire_msgs}``: on 4.3 the delayed messages due by now join the returns (``expire_shallow``);
        the checkout after it expires. Other timeouts change nothing here."""
        what = cmd[1] if len(cmd) > 1 else None
        if _is(what, "expire_msgs") or (isinstance(what, tuple) and what and _is(what[0], "expire_msgs")):
            self.returns.extend(self.delayed.take_due(self.ts))
        elif _is(what, "evaluate_consumer_timeout") and self.mv >= 8:
            self._time_out()

    def _c_delayed_cmd(self, idx: int, cmd: tuple) -> None:
        """``{retry, all | N}``: the first delayed ones join the returns; ``{assign_deferred, Key, Tokens}``:
        the named ones go straight to that consumer (if up and with credit for all of them)."""
        op = cmd[1] if len(cmd) > 1 else None
        if not (isinstance(op, tuple) and op and isinstance(op[0], Atom)):
            return
        if op[0] == "retry" and len(op) == 2:
            n = None if _is(op[1], "all") else op[1] if isinstance(op[1], int) else 0
            self.returns.extend(self.delayed.take_first(n))
        elif op[0] == "assign_deferred" and len(op) == 3 and isinstance(op[2], list):
            c = self._consumer(op[1])
            if c is None or c.cancelled:
                return
            tokens = [t for t in op[2] if t in self.delayed.tokens]
            if len(tokens) > c.credit:
                return
            for m in self.delayed.take_tokens(tokens):
                c.delivered(m, self.ts)

    def _c_enqueue(self, idx: int, cmd: tuple) -> None:
        if len(cmd) == 4:
            self._enqueue_msg(idx, cmd[3])

    def _c_e(self, idx: int, cmd: tuple) -> None:
        if len(cmd) >= 3:
            self._enqueue_msg(idx, cmd[2], cmd[3] if len(cmd) > 3 else None)

    def _msgs(self, cmd: tuple, at: int) -> list[int]:
        ids = cmd[at] if len(cmd) > at else []
        if isinstance(ids, ImproperList):
            ids = ids.items
        return [i for i in ids if isinstance(i, int)] if isinstance(ids, list) else []

    def _settle_like(self, cmd: tuple, what: str, failed: bool = False, anns: Any = None) -> None:
        c = self._consumer(cmd[1]) if len(cmd) > 1 else None
        if c is None:
            return
        self._untimeout(c, self._msgs(cmd, 2))
        for mid in self._msgs(cmd, 2):
            m = c.checked_out.pop(mid, None)
            if m is None:
                continue
            c.give_back(1)
            if what == "return":
                self._return_one(m, failed, anns)
            elif what == "discard":
                self.dropped += 1
                self._dead_letter(m)
        self._update_or_remove(c)
        self._serve(c)

    def _return_one(self, m: Msg, failed: bool, anns: Any = None) -> None:
        """``return_one``: count the attempt (``incr_msg``), drop past the delivery limit (machine versions
        4-7 count every acquisition, the others failed deliveries), else back to ``returns`` or, on 4.3,
        delayed when its delayed-retry setting or an ``x-opt-delivery-time`` says so."""
        m.acquired += 1
        if failed or self.mv < 4:  # 3.x counts every return as a delivery attempt
            m.failed += 1
        count = m.acquired if 4 <= self.mv < 8 else m.failed
        if self.delivery_limit is not None and count > self.delivery_limit:
            self.dropped += 1
            self._dead_letter(m)
            return
        if self.mv >= 8:
            anns = anns if isinstance(anns, dict) else None
            at = ready_at(self.limits.delayed_retry, failed, self.ts, m.failed, anns)
            if at is not None:
                self.delayed.add(at, m, (anns or {}).get(DEFERRAL_TOKEN))
                return
        self.returns.append(m)

    def _c_settle(self, idx: int, cmd: tuple) -> None:
        self._settle_like(cmd, "settle")

    def _c_return(self, idx: int, cmd: tuple) -> None:
        self._settle_like(cmd, "return", failed=self.mv < 4)

    def _c_discard(self, idx: int, cmd: tuple) -> None:
        self._settle_like(cmd, "discard")

    def _c_modify(self, idx: int, cmd: tuple) -> None:
        failed = len(cmd) > 3 and _is(cmd[3], "true")
        undeliverable = len(cmd) > 4 and _is(cmd[4], "true")
        self._settle_like(cmd, "discard" if undeliverable else "return", failed=failed,
                          anns=cmd[5] if len(cmd) > 5 else None)

    def _c_requeue(self, idx: int, cmd: tuple) -> None:
        c = self._consumer(cmd[1]) if len(cmd) > 1 else None
        if c is None or len(cmd) < 3:
            return
        m = c.checked_out.pop(cmd[2], None)
        if m is None:
            return
        c.give_back(1)
        # Back into the ready queue at the requeue's own index, default priority (the body is in this command).
        self.ready.push(Msg(idx, idx, 4, m.failed, m.expiry, m.size, m.acquired), self.ready.level(4))
        self._serve(c)

    def _c_purge(self, idx: int, cmd: tuple) -> None:
        """Ready and returned messages go (no dead-lettering); checked-out ones stay."""
        self.dropped += len(self.ready.clear()) + len(self.returns) + len(self.delayed.clear())
        self.returns.clear()

    # ------------------------------------------------------------------ delivery
    def _take(self) -> Msg | None:
        if self.returns:
            return self.returns.popleft()
        return self.ready.pop()

    def _expire(self) -> None:
        """``expire_msgs``: drop the next message(s) to deliver whose expiry the command's time has reached."""
        while True:
            m = self.returns[0] if self.returns else self.ready.peek()
            if m is None or m.expiry is None or self.ts < m.expiry:
                return
            taken = self._take()
            assert taken is not None  # m was there to take
            self._dead_letter(taken)
            self.expired += 1

    def _checkout(self) -> None:
        while True:
            self._expire()  # checkout_one expires first, on every round
            if not (self.service and (self.returns or len(self.ready))):
                return
            key = self.service.pop(0)
            c = self.consumers.get(key)
            if c is None or c.credit <= 0 or not c.up:
                continue
            c.delivered(self._take(), self.ts)
            self._serve(c)

    def expiry_note(self) -> str | None:
        """What x-expires does to the queue (after ``remaining``): see ``fifo_limits.expiry_note``."""
        return expiry_note(self.limits.expires, self.last_active, self.ts, self.consumers_at_stop)

    def remaining(self) -> list[Msg]:
        """The queue at stop, in the order a consumer attaching after a restart would get it.

        The restarted leader monitors every consumer pid (``state_enter(leader)``, ``lists:usort``
        order); each is found dead and its ``{down, Pid, noproc}`` is applied like any command:
        its waiting consumers leave, its consumers return what they held (key, then msg id order;
        a failed delivery: it counts toward the delivery limit and, on 4.3, may be delayed), a
        waiting single active consumer (whose own pid is not processed yet) is activated, and
        consumers not yet found dead take messages with the credit they had (returned again
        when their turn comes), then expiry and the length limit. The files cannot say when the
        restart happens: it is taken to be at the last command's time or, on 4.3, once every
        delay set before the stop has come due, whichever is later. Then, with no consumer
        attached, the timer moves 4.3's delayed messages to the returns as they come due
        (``fifo_delayed``): returns, delayed, ready."""
        self.delayed_at_stop, dropped = len(self.delayed), self.dropped
        if (latest := self.delayed.latest()) is not None:
            self.ts = max(self.ts, latest)
        pids = {pid_order(p): p for p in (_pid(c) for c in [*self.consumers.values(), *self.waiting])}
        self.consumers_at_stop = bool(pids)
        for k in sorted(pids):
            self._down(pids[k])
            self._after(True)
        self._time_out_ghosts()
        self.restart_dropped = self.dropped - dropped
        self.returns.extend(self.delayed.drain())
        self._evaluate_limit()
        out = list(self.returns)
        self.returns.clear()
        while (m := self.ready.pop()) is not None:
            out.append(m)
        return out
