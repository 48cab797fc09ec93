"""A quorum queue's length limits and its at-least-once dead-letter state, as ``rabbit_fifo`` keeps them.

Limits (``#cfg{}``: ``overflow_strategy``, ``max_length``, ``max_bytes``,
set from the Ra server's machine config and replaced whole by each
``update_config`` command a policy change writes): after every command's
checkout, while the ready messages (returned ones included) plus those
awaiting at-least-once dead-lettering number more than ``max_length`` or
weigh more than ``max_bytes``, ``drop_head`` takes the next message to
deliver (returns first) off the queue. ``reject_publish`` changes nothing
in the queue: the broker only tells publishers to stop, so every enqueue
that reached the log is in it. (``reject-publish-dlx`` is drop-head for a
quorum queue.) A message weighs its body size up to machine version 7
(4.2) and metadata + body from version 8 (4.3).

Dead-lettering (``dead_letter_handler``): ``at_most_once`` publishes a
rejected, expired, over-delivered or dropped message to the dead-letter
exchange and forgets it; ``at_least_once`` (``rabbit_fifo_dlx``, only with
``reject_publish``) keeps it in the source queue's state, first in
``discards``, then checked out to the DLX worker (``{dlx, {checkout, Pid,
Prefetch}}``), until the worker's ``{dlx, {settle, Ids}}``. Those messages
are no longer deliverable from the source queue.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

from .erlang_terms import Atom, ImproperList
from .fifo_delayed import RetryConfig

AT_LEAST_ONCE = "at_least_once"
AT_MOST_ONCE = "at_most_once"
DROP_HEAD = "drop_head"


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _dlh(v: Any) -> tuple[str | None, str]:
    """A ``dead_letter_handler`` term -> (kind, target as text)."""
    if isinstance(v, Atom) and v == AT_LEAST_ONCE:
        return AT_LEAST_ONCE, ""
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], Atom) and v[0] == AT_MOST_ONCE:
        # {at_most_once, {rabbit_quorum_queue, dead_letter_publish, [Exchange, RoutingKey, QName]}}
        # the exchange as its #resource{}; the routing key a binary or undefined (the message's own)
        mfa = v[1]
        args = mfa[2] if isinstance(mfa, tuple) and len(mfa) == 3 and isinstance(mfa[2], list) else []
        x = args[0] if args else None
        x = x[3] if isinstance(x, tuple) and len(x) == 4 else x
        rk = args[1] if len(args) > 1 else None
        return AT_MOST_ONCE, dlx_target(x if isinstance(x, bytes) else None, rk if isinstance(rk, bytes) else None)
    return None, ""


def dlx_target(exchange: bytes | None, routing_key: bytes | None) -> str:
    if exchange is None:
        return ""
    out = f"exchange '{exchange.decode('utf-8', 'replace')}'"
    return out + (f" with routing key '{routing_key.decode('utf-8', 'replace')}'" if routing_key is not None else "")


@dataclass
class Limits:
    max_length: int | None = None
    max_bytes: int | None = None
    overflow: str = DROP_HEAD
    dlh: str | None = None  # None (no dead-lettering), at_most_once or at_least_once
    dlx_target: str = ""  # at_most_once: "exchange/routing key"
    delayed_retry: RetryConfig | None = None  # 4.3: {all|failed|returned, Min, Max}
    single_active: bool = False  # consumer_strategy single_active (x-single-active-consumer)
    expires: int | None = None  # x-expires: ms unused before the queue deletes itself
    created: int | None = None  # the machine config's creation time: the first last_active

    @classmethod
    def from_conf(cls, conf: dict) -> Limits:
        """An ``update_config`` map, as ``rabbit_fifo:update_config/2`` reads it (a missing key: the default)."""
        kind, target = _dlh(conf.get(Atom("dead_letter_handler")))
        ovf = conf.get(Atom("overflow_strategy"))
        return cls(_int_or_none(conf.get(Atom("max_length"))), _int_or_none(conf.get(Atom("max_bytes"))),
                   str(ovf) if isinstance(ovf, Atom) else DROP_HEAD, kind, target,
                   RetryConfig.from_term(conf.get(Atom("delayed_retry"))),
                   conf.get(Atom("single_active_consumer_on")) == "true", _int_or_none(conf.get(Atom("expires"))))

    @classmethod
    def from_cfg(cls, cfg: Any) -> Limits:
        """A snapshot's ``#cfg{}`` record (dead_letter_handler 4, overflow_strategy 6, max_length 7, max_bytes 8,
        consumer_strategy 9, expires 11, delayed_retry 14 on 4.3)."""
        if not (isinstance(cfg, tuple) and len(cfg) > 8):
            return cls()
        kind, target = _dlh(cfg[4])
        return cls(_int_or_none(cfg[7]), _int_or_none(cfg[8]),
                   str(cfg[6]) if isinstance(cfg[6], Atom) else DROP_HEAD, kind, target,
                   RetryConfig.from_term(cfg[14]) if len(cfg) > 14 else None,
                   cfg[9] == "single_active", _int_or_none(cfg[11]) if len(cfg) > 11 else None)

    @classmethod
    def from_config_text(cls, text: bytes) -> Limits:
        """The machine map in a Ra server's ``config`` file (Erlang terms printed as text)."""
        def num(key: bytes) -> int | None:
            m = re.search(rb"\b" + key + rb"\s*=>\s*(\d+)", text)
            return int(m.group(1)) if m else None

        ovf = re.search(rb"\boverflow_strategy\s*=>\s*([a-z_]+)", text)
        dlh = re.search(rb"\bdead_letter_handler\s*=>\s*(\{\s*at_most_once|at_least_once)", text)
        kind = None if dlh is None else (AT_LEAST_ONCE if dlh.group(1) == b"at_least_once" else AT_MOST_ONCE)
        dr = re.search(rb"\bdelayed_retry\s*=>\s*\{\s*(all|failed|returned)\s*,\s*(\d+)\s*,\s*(\d+)\s*\}", text)
        sac = re.search(rb"\bsingle_active_consumer_on\s*=>\s*true\b", text)
        return cls(num(b"max_length"), num(b"max_bytes"), ovf.group(1).decode() if ovf else DROP_HEAD, kind,
                   delayed_retry=RetryConfig(dr.group(1).decode(), int(dr.group(2)), int(dr.group(3))) if dr else None,
                   single_active=sac is not None, expires=num(b"expires"), created=num(b"created"))

    @property
    def drops_head(self) -> bool:
        return self.overflow == DROP_HEAD and (self.max_length is not None or self.max_bytes is not None)

    def over(self, count: int, nbytes: int) -> bool:
        """``is_over_limit``: strictly more messages or bytes than allowed."""
        return (self.max_length is not None and count > self.max_length) or \
            (self.max_bytes is not None and nbytes > self.max_bytes)

    def describe(self) -> str:
        return self.dlx_target or "the queue's dead-letter exchange"


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def expiry_note(expires: int | None, last_active: int | None, stop_ts: int, had_consumers: bool) -> str | None:
    """x-expires (``is_expired``, checked on each tick: no consumer and now > last_active + expires, then the
    queue deletes itself with its messages). The files cannot say when a node would be restarted, so the
    import exports the messages and says when a restart would delete the queue."""
    if expires is None:
        return None
    what = f"x-expires {expires} ms: exported, but RabbitMQ deletes the queue with its messages"
    if had_consumers:
        return (f"{what} {expires} ms after a restart unless a consumer attaches (the consumers it had at the "
                "stop are found dead then, which counts as activity)")
    if last_active is None:
        return f"{what} {expires} ms after its last use (not in these files) once restarted without a consumer"
    at = last_active + expires
    if stop_ts > at:
        return (f"{what} at the first tick of any restart: unused since {_utc(last_active)}, it had expired "
                f"at {_utc(at)}, before the node stopped (last command at {_utc(stop_ts)})")
    return f"{what} at the first tick of a restart after {_utc(at)} (unused since {_utc(last_active)})"


class SizedDeque(deque):
    """A deque of messages that keeps the sum of their ``size`` (``msg_bytes_enqueue`` for the returns)."""

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)
        self.bytes = sum(m.size for m in self)

    def append(self, m) -> None:
        super().append(m)
        self.bytes += m.size

    def appendleft(self, m) -> None:
        super().appendleft(m)
        self.bytes += m.size

    def extend(self, ms) -> None:
        for m in ms:
            self.append(m)

    def popleft(self) -> Any:
        m = super().popleft()
        self.bytes -= m.size
        return m

    def clear(self) -> None:
        super().clear()
        self.bytes = 0


@dataclass
class DeadLetters:
    """``rabbit_fifo_dlx``'s state: discarded messages held for at-least-once dead-lettering."""

    discards: SizedDeque = field(default_factory=SizedDeque)
    checked: dict[int, Any] = field(default_factory=dict)  # the DLX worker's msg id -> Msg
    prefetch: int | None = None  # None: no DLX worker has checked out yet
    next_id: int = 0

    def stat(self) -> tuple[int, int]:
        return len(self.discards) + len(self.checked), self.discards.bytes + sum(m.size for m in self.checked.values())

    def pending(self) -> list:
        """In the order the worker would dead-letter them after a restart (its checked-out ones go back first)."""
        return [self.checked[i] for i in sorted(self.checked)] + list(self.discards)

    def apply(self, cmd: Any) -> None:
        """``{checkout, Pid, Prefetch}``: a (new) worker; what the old one held goes back in front.
        ``{settle, MsgIds}``: dead-lettered (the target confirmed), gone from the source queue."""
        if not (isinstance(cmd, tuple) and cmd and isinstance(cmd[0], Atom)):
            return
        if cmd[0] == "checkout" and len(cmd) == 3 and isinstance(cmd[2], int):
            back = [self.checked[i] for i in sorted(self.checked)]
            for m in reversed(back):
                self.discards.appendleft(m)
            self.checked, self.prefetch, self.next_id = {}, cmd[2], 0
        elif cmd[0] == "settle" and len(cmd) == 2:
            ids = cmd[1].items if isinstance(cmd[1], ImproperList) else cmd[1]
            for i in ids if isinstance(ids, list) else []:
                self.checked.pop(i, None)

    def checkout(self) -> None:
        """``rabbit_fifo_dlx:checkout``: hand discards to the worker up to its prefetch."""
        while self.prefetch is not None and len(self.checked) < self.prefetch and self.discards:
            self.checked[self.next_id] = self.discards.popleft()
            self.next_id += 1
