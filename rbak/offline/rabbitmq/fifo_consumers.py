"""``rabbit_fifo``'s consumers: checkout specs, credit, cancel/down and single active consumer.

Credit: a ``simple_prefetch`` consumer (AMQP 0-9-1) gets its prefetch and
one back per settled or returned message (at most the prefetch); a
``credited`` one (AMQP 1.0 links; 3.x's ``credited`` mode) only what each
``{credit, Key, Credit, DeliveryCount, Drain}`` grants: ``DeliveryCount +
Credit - the consumer's own delivery count`` (serial numbers, floor 0), and
with ``drain`` whatever is left after the checkout is consumed (its
delivery count advances). Each delivery advances the consumer's delivery
count. A cancelled consumer (lifetime ``once``) keeps what it holds and
gets no credit back.

Single active consumer (``consumer_strategy = single_active``): one consumer
in ``consumers`` is active (the first by key that is up or quiescing); the
others wait in ``waiting_consumers``, which 4.x keeps sorted (higher
priority, then more credit, then lower key; consumers not up last) and 3.x
in arrival order. ``activate_next_consumer`` (after checkouts, settles,
returns, cancels and downs) promotes the head of the waiting list when
nothing is active; on 4.x a higher-priority waiting consumer takes over
from an idle active one (which goes back to waiting) or makes a busy one
``quiescing`` (no more deliveries) until it holds nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .erlang_terms import Atom

_SERIAL = 1 << 32
DEFAULT_CONSUMER_TIMEOUT = 1_800_000  # rabbit_fifo's ?DEFAULT_CONSUMER_TIMEOUT_MS


def _is(x: Any, name: str) -> bool:
    return isinstance(x, Atom) and x == name


@dataclass(slots=True)
class Consumer:
    key: Any
    cid: Any
    priority: int = 0
    credit: int = 0
    prefetch: int | None = None  # simple_prefetch's maximum; None: credited
    checked_out: dict = field(default_factory=dict)
    next_msg_id: int = 0
    once: bool = False  # lifetime once (also every cancelled consumer): credit is never given back
    cancelled: bool = False  # status cancelled: keeps what it holds, takes nothing new
    quiescing: bool = False  # SAC: a higher-priority consumer waits for this one to hold nothing
    delivery_count: int = 0  # the sender's AMQP delivery count
    timeout: int = DEFAULT_CONSUMER_TIMEOUT  # 4.3: ms a message may stay checked out (checkout meta's timeout)
    locks: dict = field(default_factory=dict)  # 4.3: msg id -> lock expiry (delivery time + timeout)
    timed_out: set = field(default_factory=set)  # 4.3: msg ids returned by a timeout, not yet settled by it

    @property
    def up(self) -> bool:
        return not (self.cancelled or self.quiescing or self.timed_out)

    def give_back(self, n: int) -> None:
        """``increase_credit``: settles and returns restore a simple_prefetch consumer's credit."""
        if self.once or self.prefetch is None:
            return
        self.credit = min(self.prefetch, self.credit + n) if self.prefetch > 0 else self.credit + n

    def grant(self, delivery_count_rcv: int, credit_rcv: int) -> None:
        d = (delivery_count_rcv + credit_rcv - self.delivery_count) % _SERIAL
        self.credit = max(0, d - _SERIAL if d >= _SERIAL // 2 else d)

    def drain(self) -> None:
        self.delivery_count = (self.delivery_count + self.credit) % _SERIAL
        self.credit = 0

    def delivered(self, m: Any, ts: int = 0) -> None:
        self.locks[self.next_msg_id] = ts + self.timeout
        self.checked_out[self.next_msg_id] = m
        self.next_msg_id += 1
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) % _SERIAL


def parse_spec(spec: Any) -> tuple[str, str, int, int]:
    """A checkout spec -> (lifetime, mode, included credit, initial delivery count).
    4.x: ``{auto|once, {simple_prefetch, N}}`` or ``{auto|once, {credited, DeliveryCount}}``;
    3.x: ``{auto|once, Credit, simple_prefetch|credited}`` (both modes start with that credit)."""
    if isinstance(spec, tuple) and len(spec) == 2:
        life, inner = spec
        if isinstance(inner, tuple) and len(inner) == 2 and _is(inner[0], "simple_prefetch"):
            return str(life), "simple_prefetch", int(inner[1]), 0
        dc = inner[1] if isinstance(inner, tuple) and len(inner) == 2 and isinstance(inner[1], int) else 0
        return str(life), "credited", 0, dc
    if isinstance(spec, tuple) and len(spec) == 3:
        return str(spec[0]), str(spec[2]), int(spec[1]) if isinstance(spec[1], int) else 0, 0
    return "auto", "credited", 0, 0


def _waiting_le(a: Consumer, b: Consumer) -> bool:
    """``sort_waiting``'s order (4.x): a before b."""
    a_up, b_up = a.up, b.up
    if a_up and b_up:
        if a.priority != b.priority:
            return b.priority <= a.priority
        if a.credit == b.credit:
            return _key_lt_eq(a.key, b.key)
        return b.credit <= a.credit
    return not b_up


def _key_lt_eq(a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    return isinstance(a, int) or repr(a) <= repr(b)


def _cmp(a: Consumer, b: Consumer) -> int:
    ab, ba = _waiting_le(a, b), _waiting_le(b, a)
    return 0 if ab == ba else (-1 if ab else 1)


class ConsumerRules:
    """Mixed into ``FifoReplay``: it provides ``consumers``, ``by_cid``, ``service``, ``waiting``, ``mv``,
    ``limits``, ``_return_one``, ``_take`` and ``_expire``."""

    # What FifoReplay provides, declared for the type checker (FifoReplay.__init__ sets them).
    consumers: dict[Any, Consumer]
    by_cid: dict[Any, Any]
    service: list[Any]
    waiting: list[Consumer]
    mv: int
    ts: int
    last_active: int
    limits: Any  # rabbit_fifo.Limits

    if TYPE_CHECKING:
        def _return_one(self, m: Any, failed: bool, anns: Any = None) -> None: ...
        def _take(self) -> Any: ...
        def _expire(self) -> None: ...
        def _checkout(self) -> None: ...

    def _consumer(self, key: Any) -> Consumer | None:
        c = self.consumers.get(key)
        if c is None and key in self.by_cid:
            c = self.consumers.get(self.by_cid[key])
        return c

    def _waiting_one(self, key: Any) -> Consumer | None:
        k = self.by_cid.get(key, key)
        return next((c for c in self.waiting if c.key == k), None)

    def _active(self) -> Consumer | None:
        """``active_consumer``: the first consumer by key that is up or quiescing (3.x: up)."""
        for k in sorted(self.consumers, key=_key_order):
            c = self.consumers[k]
            if not c.cancelled and not c.timed_out:
                return c
        return None

    def _add_waiting(self, c: Consumer) -> None:
        """``add_waiting``: ``lists:keystore`` (replaced in place, else appended), sorted on 4.x."""
        at = next((i for i, w in enumerate(self.waiting) if w.key == c.key), None)
        if at is None:
            self.waiting.append(c)
        else:
            self.waiting[at] = c
        if self.mv >= 4:
            self.waiting.sort(key=functools.cmp_to_key(_cmp))

    def _c_checkout(self, idx: int, cmd: tuple) -> None:
        if len(cmd) < 3:
            return
        cid, spec = cmd[1], cmd[2]
        meta = cmd[3] if len(cmd) > 3 and isinstance(cmd[3], dict) else {}
        if _is(spec, "cancel") or _is(spec, "remove"):
            self._cancel(cid, _is(spec, "remove"))
            return
        if isinstance(spec, tuple) and spec and _is(spec[0], "dequeue"):
            if self.limits.single_active:
                return  # {error, {unsupported, single_active_consumer}}: nothing changes
            self.last_active = self.ts  # a dequeue always counts as activity (x-expires)
            self._expire()  # a basic.get goes through checkout_one, which expires first
            m = self._take()
            if m is not None and len(spec) > 1 and _is(spec[1], "unsettled"):
                once = self._consumer(cid) or self._new_consumer(cid, idx, ("once", "simple_prefetch", 0, 0), 0)
                once.checked_out[once.next_msg_id] = m
                once.next_msg_id += 1
            return
        parsed = parse_spec(spec)
        prio = meta.get(Atom("priority"), 0) if isinstance(meta, dict) else 0
        prio = prio if isinstance(prio, int) else 0
        timeout = meta.get(Atom("timeout")) if isinstance(meta, dict) else None
        c = self._consumer(cid)
        if self.limits.single_active:
            active = self._active()
            if c is not None and ((active is c and not c.cancelled) or active is None):
                self._merge(c, parsed, prio)
            else:
                w = self._waiting_one(cid)
                key = w.key if w is not None else (c.key if c is not None else (idx if self.mv >= 4 else cid))
                self._add_waiting(self._make(cid, key, parsed, prio, timeout))
                self.by_cid[cid] = key
            return
        if c is None:
            c = self._new_consumer(cid, idx if self.mv >= 4 else cid, parsed, prio, timeout)
        else:
            self._merge(c, parsed, prio)
        self._serve(c)

    @staticmethod
    def _make(cid: Any, key: Any, parsed: tuple, prio: int, timeout: Any = None) -> Consumer:
        life, mode, credit, dc = parsed
        return Consumer(key, cid, prio, credit, credit if mode == "simple_prefetch" else None,
                        once=life == "once", delivery_count=dc,
                        timeout=timeout if isinstance(timeout, int) else DEFAULT_CONSUMER_TIMEOUT)

    def _new_consumer(self, cid: Any, key: Any, parsed: tuple, prio: int, timeout: Any = None) -> Consumer:
        c = self._make(cid, key, parsed, prio, timeout)
        self.consumers[key] = c
        self.by_cid[cid] = key
        return c

    def _merge(self, c: Consumer, parsed: tuple, prio: int) -> None:
        """``merge_consumer``: a checkout for a known consumer updates it (up again, credit less what it holds)."""
        life, mode, credit, _dc = parsed
        c.credit = max(0, credit - len(c.checked_out))
        c.prefetch = credit if mode == "simple_prefetch" else None
        c.once, c.cancelled, c.priority = life == "once", False, prio
        self._serve(c)

    def _serve(self, c: Consumer) -> None:
        if c.credit > 0 and c.up and c.key not in self.service and c.key in self.consumers:
            # priority_queue: higher consumer priority first, FIFO within one priority
            i = len(self.service)
            while i > 0 and self.consumers[self.service[i - 1]].priority < c.priority:
                i -= 1
            self.service.insert(i, c.key)

    def _cancel(self, cid: Any, remove: bool) -> None:
        """``cancel_consumer``: a waiting one just leaves; an active one returns everything (remove) or keeps
        what it holds, cancelled (cancel), and is removed once it holds nothing."""
        c = self._consumer(cid)
        if c is None:
            w = self._waiting_one(cid)
            if w is not None:
                self.waiting.remove(w)
            return
        if remove or not c.checked_out:
            self._remove_consumer(c)
        else:
            c.credit, c.once, c.cancelled = 0, True, True
            if c.key in self.service:
                self.service.remove(c.key)

    def _remove_consumer(self, c: Consumer, down: bool = False) -> None:
        """``cancel_consumer0``: what it holds goes back in msg id order, a failed delivery when it went down.
        On 4.3 a quiescing single active consumer is moved to the waiting list, up, by its last return
        (``return_one`` calls ``update_or_remove_con``) before it is removed: it stays there though its
        pid is gone."""
        quiescing = self.mv >= 8 and c.quiescing and bool(c.checked_out)  # 4.0-4.2 put it back as it is
        for mid in sorted(c.checked_out):
            c.give_back(1)
            self._return_one(c.checked_out[mid], down)
        c.checked_out.clear()
        self.consumers.pop(c.key, None)
        self.last_active = self.ts
        if c.key in self.service:
            self.service.remove(c.key)
        if quiescing:
            c.quiescing = False
            self._add_waiting(c)
        else:
            self.by_cid.pop(c.cid, None)

    def _update_or_remove(self, c: Consumer) -> None:
        """``update_or_remove_con`` once a consumer holds nothing: a cancelled (lifetime once, no credit) one is
        gone; a quiescing one goes back to the waiting list, up."""
        if c.checked_out or c.key not in self.consumers:
            return
        if c.once and c.credit == 0:
            self.consumers.pop(c.key)
            self.by_cid.pop(c.cid, None)
            self.last_active = self.ts
        elif c.quiescing:
            self.consumers.pop(c.key)
            c.quiescing = False
            self._add_waiting(c)
        else:
            return
        if c.key in self.service:
            self.service.remove(c.key)

    def _time_out(self) -> None:
        """``{timeout, evaluate_consumer_timeout}`` (4.3): each consumer's messages whose lock has expired go
        back (msg id order, not failures) and it takes nothing more until it settles those ids; a single
        active consumer left holding nothing goes back to the waiting list."""
        for c in sorted(self.consumers.values(), key=lambda c: _key_order(c.key)):
            due = sorted(mid for mid in c.checked_out if self.ts >= c.locks.get(mid, self.ts + 1))
            if not due:
                continue
            c.timed_out.update(due)
            if c.key in self.service:
                self.service.remove(c.key)
            for mid in due:
                c.give_back(1)
                self._return_one(c.checked_out.pop(mid), False)
        if self.limits.single_active:
            for c in sorted(self.consumers.values(), key=lambda c: _key_order(c.key)):
                if c.timed_out and not c.checked_out:
                    self.consumers.pop(c.key)
                    self._add_waiting(c)

    def _untimeout(self, c: Consumer, mids: list) -> None:
        """``maybe_untimeout``: once it has settled every timed-out id the consumer is up again."""
        if c.timed_out:
            c.timed_out.difference_update(mids)

    def _time_out_ghosts(self) -> None:
        """Consumers left after every pid was found dead (a single active consumer that went back to waiting,
        then was activated after its own down): the consumer timeout returns what they hold, msg id order,
        not as failures, and they stop being active (``evaluate_consumer_timeout``)."""
        for c in sorted(self.consumers.values(), key=lambda c: _key_order(c.key)):
            for mid in sorted(c.checked_out):
                self._return_one(c.checked_out[mid], False)
            c.checked_out.clear()
        self.consumers.clear()
        self.waiting.clear()
        self.service.clear()

    def _c_down(self, idx: int, cmd: tuple) -> None:
        """``handle_down``: the pid's waiting consumers leave, then its consumers go (key order)."""
        if len(cmd) < 3 or _is(cmd[2], "noconnection"):
            self.last_active = self.ts
            return  # suspected down: its messages stay checked out
        self._down(cmd[1])

    def _down(self, pid: Any) -> None:
        self.waiting = [w for w in self.waiting if _pid(w) != pid]
        for c in sorted((c for c in self.consumers.values() if _pid(c) == pid), key=lambda c: _key_order(c.key)):
            self._remove_consumer(c, down=True)

    def _c_credit(self, idx: int, cmd: tuple) -> None:
        if len(cmd) < 5 or not (isinstance(cmd[2], int) and isinstance(cmd[3], int)):
            return
        drain = _is(cmd[4], "true")
        c = self._consumer(cmd[1])
        if c is not None:
            c.grant(cmd[3], cmd[2])
            self._serve(c)
            self._checkout()
            if drain and c.credit > 0:
                c.drain()
            return
        w = self._waiting_one(cmd[1])
        if w is not None:
            w.grant(cmd[3], cmd[2])
            if drain:
                w.drain()
            self._add_waiting(w)

    def _activate_next(self) -> None:
        """``activate_next_consumer`` for a single-active-consumer queue."""
        if not self.limits.single_active:
            return
        nxt = self.waiting[0] if self.waiting and self.waiting[0].up else None
        active = self._active()
        if nxt is None:
            return
        if active is None:
            self.waiting.pop(0)
            old = self.consumers.get(nxt.key)
            if old is not None:  # a cancelled one coming back: keeps what it holds, takes the new settings
                old.priority, old.prefetch, old.once, old.cancelled = nxt.priority, nxt.prefetch, nxt.once, False
                old.credit, old.delivery_count = nxt.credit, nxt.delivery_count
                nxt = old
            self.consumers[nxt.key] = nxt
            self.by_cid[nxt.cid] = nxt.key
            self._serve(nxt)
        elif self.mv >= 4 and nxt.priority > active.priority:
            if active.checked_out:
                active.quiescing = True
                return
            self.waiting.pop(0)
            self.consumers.pop(active.key, None)
            if active.key in self.service:
                self.service.remove(active.key)
            self.consumers[nxt.key] = nxt
            self.by_cid[nxt.cid] = nxt.key
            self._serve(nxt)
            self._add_waiting(active)


def _pid(c: Consumer) -> Any:
    return c.cid[-1] if isinstance(c.cid, tuple) else c.cid


def _key_order(k: Any) -> tuple:
    """Erlang term order for consumer keys: Raft indexes (4.x) before ``{Tag, Pid}`` ids (3.x)."""
    return (0, k, b"") if isinstance(k, int) else (1, 0, repr(k).encode())


def pid_order(p: Any) -> tuple:
    """Pids of one node sort by their id then serial (the bytes after the node atom, big-endian)."""
    data = getattr(p, "data", None)
    return (str(getattr(p, "node", "")), data if isinstance(data, bytes) else repr(p).encode())
