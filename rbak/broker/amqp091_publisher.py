"""The AMQP 0-9-1 ``Publisher``: publisher confirms and ``mandatory``, pipelined, on rbak's own connection.

A record counts as restored only when the broker has confirmed it and every record
published before it (``confirmed_token`` is the token of the last record of that
contiguous prefix). Up to ``window`` messages stay in flight; their frames are written
in batches (``wire.Channel.publish`` without a flush) and confirms are taken as they
arrive.

Unroutable messages come back as ``basic.return`` before their confirm; the
returned message is matched to its in-flight entry (earliest one with the same
exchange, routing key and body), counted as failed, and the publisher raises
``PublishError`` naming the queue. A nack, a channel or connection closed by
the broker do the same. A connection the broker blocks (a memory or disk alarm)
is waited for, up to ``BLOCKED_TIMEOUT`` seconds, then the restore fails saying so.

Properties are encoded by ``rbak.format.amqp091.encode_basic_properties`` (pika cannot
express every header variant) and sent as finished bytes.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Hashable

from ..errors import AmqpError, ChannelClosedByBroker, ConnectionLost, PublishError
from .publisher import Encoding
from .wire import Connection, Content

log = logging.getLogger(__name__)

_FLUSH_BYTES = 256 * 1024
BLOCKED_TIMEOUT = 300.0  # seconds a blocked connection (broker alarm) is waited for before the restore fails


class ConfirmingPublisher:
    """One channel in confirm mode with at most ``window`` unconfirmed messages."""

    encoding: Encoding = "amqp091"

    def __init__(self, connection: Connection, label: str, window: int = 500, confirms: bool = True):
        self.label = label  # "queue 'q' in vhost 'v'" for error messages
        self.window = max(1, window)
        self.confirms = confirms
        self._conn = connection
        self._ch = connection.channel()
        self._inflight: OrderedDict[int, list] = OrderedDict()  # tag -> [token, exchange, rk, body, state]
        self._returned: set[int] = set()
        self._next_tag = 1
        self._last_done_token: Hashable = None
        self._advanced = False
        self._out_bytes = 0
        self.published = 0
        self.confirmed = 0
        self.failed = 0
        self.failure: str | None = None
        if confirms:
            self._ch.select_confirms()

    # -- what the broker sent ---------------------------------------------------
    def _take(self) -> None:
        """Returns first (a message's return always precedes its confirm), then confirms, then a close."""
        ch = self._ch
        if ch.returns:
            returns, ch.returns = ch.returns, []
            for c in returns:
                self._on_return(c)
        if ch.acks:
            acks, ch.acks = ch.acks, []
            for ack, tag, multiple in acks:
                self._on_ack_nack(ack, tag, multiple)
        if ch.closed_by is not None and self.failure is None:
            self.failure = f"the broker closed the channel publishing {self.label}: {ch.closed_by.code} {ch.closed_by.text}"

    def _on_ack_nack(self, ack: bool, tag: int, multiple: bool) -> None:
        if multiple:
            for t, entry in self._inflight.items():
                if t > tag:
                    break
                self._mark(t, entry, not ack)
        else:
            one = self._inflight.get(tag)
            if one is not None:
                self._mark(tag, one, not ack)
        # pop the settled prefix; a failed entry stops it (nothing after it counts)
        while self._inflight:
            t, entry = next(iter(self._inflight.items()))
            if entry[4] != 1:
                break
            self._inflight.popitem(last=False)
            self.confirmed += 1
            self._last_done_token = entry[0]
            self._advanced = True

    def _mark(self, tag: int, entry: list, nack: bool) -> None:
        if entry[4] != 0:
            return
        if nack or tag in self._returned:
            entry[4] = 2
            self.failed += 1
            if self.failure is None:
                self.failure = (
                    f"the broker rejected (nack) a message for {self.label} "
                    f"(exchange {entry[1]!r}, routing key {entry[2]!r})"
                )
        else:
            entry[4] = 1

    def _on_return(self, c: Content) -> None:
        method, body = c.method, c.body
        for tag, (_, exchange, rk, b, state) in self._inflight.items():
            if state == 0 and tag not in self._returned and exchange == method.exchange and rk == method.routing_key and b == body:
                self._returned.add(tag)
                break
        if self.failure is None:
            self.failure = (
                f"message for {self.label} was returned as unroutable by exchange {method.exchange!r} "
                f"with routing key {method.routing_key!r}: {method.reply_code} {method.reply_text}"
            )

    # -- driving ----------------------------------------------------------
    def _pump(self, time_limit: float) -> None:
        """Send what is batched, take what arrived (waiting up to ``time_limit`` s for something)."""
        ch = self._ch
        self._out_bytes = 0
        try:
            self._conn.pump(lambda: bool(ch.acks or ch.returns) or not ch.is_open, timeout=time_limit)
        except ConnectionLost as e:
            if self.failure is None:
                self.failure = f"connection lost while publishing {self.label}: {e}"
            raise PublishError(self.failure) from None
        except AmqpError as e:  # a malformed frame (a hostile returned message): the connection is dropped
            raise PublishError(f"AMQP frame error while publishing {self.label}: {e}") from None
        self._take()

    def _unblocked(self) -> None:
        """Wait while the broker blocks the connection (``connection.blocked``: a memory or disk alarm)."""
        if not self._conn.blocked:
            return
        log.warning("%s: the broker blocked the connection (a resource alarm); waiting up to %.0f s",
                    self.label, BLOCKED_TIMEOUT)
        try:
            if self._conn.pump(lambda: not self._conn.blocked, timeout=BLOCKED_TIMEOUT):
                return
        except ConnectionLost as e:
            raise PublishError(f"connection lost while publishing {self.label}: {e}") from None
        self.failure = self.failure or (
            f"the broker blocked the connection publishing {self.label} for {BLOCKED_TIMEOUT:.0f} s (a memory or "
            "disk alarm: see the broker's log); the messages not confirmed were not restored")
        raise PublishError(self.failure)

    def fits(self, size: int) -> bool:
        """0-9-1 announces no limit: the broker refuses an oversize body at publish (a channel close)."""
        return True

    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes, token: Hashable) -> None:
        """Send one message; blocks (pumping I/O) while the window is full. Raises on a failure."""
        if self.failure is not None:
            raise PublishError(self.failure)
        while self.confirms and len(self._inflight) >= self.window:
            self._pump(0.05)
            if self.failure is not None:
                raise PublishError(self.failure)
        if len(exchange.encode()) > 255 or len(routing_key.encode()) > 255:
            raise PublishError(f"{self.label}: exchange or routing key longer than 255 bytes "
                               f"({exchange[:40]!r}, {routing_key[:40]!r})")
        tag = self._next_tag
        self._next_tag += 1
        if self.confirms:
            self._inflight[tag] = [token, exchange, routing_key, body, 0]
        self._out_bytes += len(body) + len(properties) + 64
        flush = self._out_bytes >= _FLUSH_BYTES
        if flush:
            self._unblocked()
            self._out_bytes = 0
        try:
            self._ch.publish(exchange, routing_key, properties, body, mandatory=True, flush=flush)
        except ChannelClosedByBroker as e:
            self._take()
            raise PublishError(self.failure or f"the broker closed the channel publishing {self.label}: "
                                               f"{e.code} {e.text}") from None
        except AmqpError as e:
            raise PublishError(f"cannot publish to {self.label}: {e}") from None
        self.published += 1
        if not self.confirms:
            self.confirmed += 1
            self._last_done_token = token
            self._advanced = True
        if tag % 128 == 0:
            self._pump(0)  # flush the socket and read confirms without waiting

    def take_progress(self) -> tuple[bool, Hashable]:
        """(whether the confirmed prefix grew since the last call, its last token)."""
        adv, self._advanced = self._advanced, False
        return adv, self._last_done_token

    @property
    def in_flight(self) -> int:
        return sum(1 for e in self._inflight.values() if e[4] == 0)

    def drain(self, timeout: float = 120.0) -> None:
        """Wait until every published message is confirmed (or raise)."""
        deadline = time.monotonic() + timeout
        self._pump(0)
        while self._inflight and any(e[4] == 0 for e in self._inflight.values()):
            if self.failure is not None:
                raise PublishError(self.failure)
            if time.monotonic() > deadline:
                raise PublishError(f"{len(self._inflight)} message(s) for {self.label} not confirmed within {timeout:.0f} s")
            self._pump(0.05)
        if self.failure is not None:
            raise PublishError(self.failure)

    def close(self) -> None:
        try:
            self._conn.flush()
            self._ch.close()
        except Exception:  # noqa: BLE001 - closing after a broker error
            pass
