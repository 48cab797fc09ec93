"""RabbitMQ 4.3's delayed retry (machine version 8): returned messages held back until a time.

``#cfg.delayed_retry`` (queue argument / policy ``delayed-retry-type``,
``-min``, ``-max``): ``disabled`` or ``{all | failed | returned, Min, Max}``.
``return_one`` (a return, a modify, a consumer found down or timed out)
delays the message instead of putting it in ``returns`` when the type
matches (``failed``: the delivery failed, as on a reject, a ``modify`` with
``delivery_failed`` or a dead consumer; ``returned``: it did not; ``all``:
both), ready at ``max(last_command_time, Ts) + min(Min * max(1,
delivery_count), Max)``; an AMQP 1.0 ``x-opt-delivery-time`` annotation
later than that time wins over the configuration. Delayed messages sit in
a ``gb_tree`` keyed ``{ReadyAt, RaftIdx}`` (optionally named by an
``x-opt-deferral-token``) and are only moved to the tail of ``returns``, in
key order, by ``{timeout, {expire_msgs, shallow}}`` (the timer the leader
sets for the next ``ReadyAt``: those due by the command's time),
``{delayed_cmd, {retry, all | N}}`` (the N first) or handed to a consumer
by ``{delayed_cmd, {assign_deferred, Key, Tokens}}``. They count towards
the length limit; a purge deletes them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from .erlang_terms import Atom

DELIVERY_TIME = b"x-opt-delivery-time"
DEFERRAL_TOKEN = b"x-opt-deferral-token"


@dataclass(frozen=True)
class RetryConfig:
    kind: str  # all | failed | returned
    min_ms: int
    max_ms: int

    @classmethod
    def from_term(cls, v: Any) -> RetryConfig | None:
        """``{all|failed|returned, Min, Max}`` -> the config; ``disabled`` or anything else -> None."""
        if isinstance(v, tuple) and len(v) == 3 and isinstance(v[0], Atom) and \
                str(v[0]) in ("all", "failed", "returned") and all(isinstance(x, int) for x in v[1:]):
            return cls(str(v[0]), v[1], v[2])
        return None

    def delays(self, failed: bool) -> bool:
        return self.kind == "all" or (self.kind == "failed") == failed


def ready_at(cfg: RetryConfig | None, failed: bool, ts: int, delivery_count: int,
             anns: dict | None) -> int | None:
    """``should_delay``: when the returned message becomes deliverable again, or None (returned at once)."""
    t = (anns or {}).get(DELIVERY_TIME)
    if isinstance(t, int) and not isinstance(t, bool) and t > ts:
        return t
    if cfg is None or not cfg.delays(failed):
        return None
    return ts + min(cfg.min_ms * max(1, delivery_count), cfg.max_ms)


@dataclass
class Delayed:
    """The ``#delayed{}`` tree as a sorted list of ``(ReadyAt, Idx, Msg)``, plus the deferral tokens."""

    items: list = field(default_factory=list)
    tokens: dict = field(default_factory=dict)  # token -> (ReadyAt, Idx)
    #: ``next``: the entry the timer waits for. A new entry replaces it only when strictly earlier, so of
    #: two due at the same time the first delayed leaves first even with the higher index.
    next: tuple | None = None

    def __len__(self) -> int:
        return len(self.items)

    @property
    def bytes(self) -> int:
        return sum(m.size for _r, _i, m in self.items)

    def add(self, at: int, m: Any, token: Any = None) -> None:
        bisect.insort(self.items, (at, m.idx, m), key=lambda x: (x[0], x[1]))
        if self.next is None or at < self.next[0]:
            self.next = (at, m.idx)
        if isinstance(token, bytes):
            self.tokens[token] = (at, m.idx)

    def _forget(self, taken: list) -> None:
        keys = {(a, i) for a, i, _m in taken}
        self.tokens = {t: k for t, k in self.tokens.items() if k not in keys}

    def latest(self) -> int | None:
        return self.items[-1][0] if self.items else None

    def _pop_key(self, key: tuple) -> Any:
        for j, (a, i, m) in enumerate(self.items):
            if (a, i) == key:
                del self.items[j]
                self.tokens = {t: k for t, k in self.tokens.items() if k != key}
                return m
        return None

    def take_due(self, ts: int) -> list:
        """``take_ready_delayed``: while ``next`` is due take it, ``next`` becoming the smallest key left."""
        out = []
        while self.next is not None and ts >= self.next[0]:
            m = self._pop_key(self.next)
            self.next = (self.items[0][0], self.items[0][1]) if self.items else None
            if m is not None:
                out.append(m)
        return out

    def drain(self) -> list:
        """Everything, in the order timers would release it with no consumer taking anything meanwhile."""
        return self.take_due(max((a for a, _i, _m in self.items), default=0))

    def take_first(self, n: int | None) -> list:
        """``take_delayed_for_retry``: the ``n`` first (all when None), whatever their time."""
        return self._take(len(self.items) if n is None else min(n, len(self.items)))

    def _take(self, n: int) -> list:
        taken, self.items = self.items[:n], self.items[n:]
        self._forget(taken)
        self.next = (self.items[0][0], self.items[0][1]) if self.items else None
        return [m for _a, _i, m in taken]

    def take_tokens(self, tokens: list) -> list:
        """``take_deferred``: the messages named by these tokens (unknown ones skipped), in token order."""
        out = []
        for t in tokens:
            key = self.tokens.pop(t, None)
            m = self._pop_key(key) if key is not None else None
            if m is not None:
                out.append(m)
                self.next = (self.items[0][0], self.items[0][1]) if self.items else None
        return out

    def clear(self) -> list:
        out = [m for _a, _i, m in self.items]
        self.items, self.tokens, self.next = [], {}, None
        return out


def load_tree(d: Any, msg_ref) -> Delayed:
    """A snapshot's ``#delayed{tree, next, deferred}`` (gb_tree keyed ``[ReadyAt | Idx]``) -> Delayed."""
    out = Delayed()
    if not (isinstance(d, tuple) and len(d) == 4 and isinstance(d[0], Atom) and d[0] == "delayed"):
        return out

    def walk(node: Any) -> None:
        while isinstance(node, tuple) and len(node) == 4:
            walk(node[2])
            k = node[0]
            key = (k.items[0], k.tail) if hasattr(k, "items") and hasattr(k, "tail") else \
                (k[0], k[1]) if isinstance(k, tuple) and len(k) == 2 else None
            m = msg_ref(node[1], "delayed")
            out.items.append((key[0] if key else 0, m.idx, m))
            node = node[3]

    tree = d[1]
    if isinstance(tree, tuple) and len(tree) == 2:
        walk(tree[1])
    out.items.sort(key=lambda x: (x[0], x[1]))
    nxt = d[2]  # {ReadyAt, Idx, Msg} or undefined
    if isinstance(nxt, tuple) and len(nxt) == 3 and isinstance(nxt[0], int) and isinstance(nxt[1], int):
        out.next = (nxt[0], nxt[1])
    elif out.items:
        out.next = (out.items[0][0], out.items[0][1])
    deferred = d[3]
    if isinstance(deferred, dict):
        for tok, k in deferred.items():
            key = (k.items[0], k.tail) if hasattr(k, "items") and hasattr(k, "tail") else k
            if isinstance(tok, bytes) and isinstance(key, tuple):
                out.tokens[tok] = tuple(key)
    return out
