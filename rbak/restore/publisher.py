"""Publishing with publisher confirms and ``mandatory``, pipelined.

pika's ``BlockingChannel.confirm_delivery`` waits for every confirm before
the next publish, which caps a restore at one round trip per message. Here
the channel's underlying (asynchronous) pika channel is put in confirm mode
with our own ack/nack callback, up to ``window`` messages stay in flight, and
the blocking connection's ``process_data_events`` drives the socket. A record
counts as restored only when the broker has confirmed it and every record
published before it (``confirmed_token`` is the token of the last record of
that contiguous prefix).

Unroutable messages come back as ``basic.return`` before their confirm; the
returned message is matched to its in-flight entry (earliest one with the same
exchange, routing key and body), counted as failed, and the publisher raises
``PublishError`` naming the queue. A nack, a channel or connection closed by
the broker do the same.

Properties are encoded by ``rbak.format.amqp091.encode_basic_properties`` (pika cannot
express every header variant) and handed to pika as finished bytes.
"""

from __future__ import annotations

import logging
import struct
from collections import OrderedDict
from typing import Any, Hashable

import pika
import pika.exceptions
import pika.spec

from ..errors import PublishError, RbakError

log = logging.getLogger(__name__)

_FRAME = struct.Struct(">BHI")  # frame type, channel, payload size
_CONTENT_HEADER = struct.Struct(">HHQ")  # class id, weight, body size
_FLUSH_BYTES = 256 * 1024


class RawBasicProperties(pika.spec.BasicProperties):
    """Basic properties whose wire encoding was computed already."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes):  # noqa: D107 - pika never reads the attributes when encoding
        self._raw = raw

    def encode(self) -> list[bytes]:
        return [self._raw]


class ConfirmingPublisher:
    """One channel in confirm mode with at most ``window`` unconfirmed messages."""

    def __init__(self, connection: pika.BlockingConnection, label: str, window: int = 500, confirms: bool = True):
        self.label = label  # "queue 'q' in vhost 'v'" for error messages
        self.window = max(1, window)
        self.confirms = confirms
        self._conn = connection
        self._bch = connection.channel()
        self._ch = self._bch._impl  # the asynchronous channel underneath (see module docstring)
        self._inflight: OrderedDict[int, list] = OrderedDict()  # tag -> [token, exchange, rk, body, state]
        self._returned: set[int] = set()
        self._next_tag = 1
        self._last_done_token: Hashable = None
        self._advanced = False
        self.published = 0
        self.confirmed = 0
        self.failed = 0
        self.failure: str | None = None
        # Fast path: marshal publish frames here and hand pika one buffer per batch
        # (pika writes each frame with its own send(), three syscalls a message).
        impl = connection._impl
        self._impl_conn = impl
        self._body_max = getattr(impl, "_body_max_length", None)
        self._fast = bool(self._body_max) and hasattr(impl, "_output_marshaled_frames")
        self._chno = self._ch.channel_number
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._ch.add_on_return_callback(self._on_return)
        self._ch.add_on_close_callback(self._on_close)
        if confirms:
            self._ch.confirm_delivery(ack_nack_callback=self._on_ack_nack)
            self._pump(0)

    # -- callbacks --------------------------------------------------------
    def _on_ack_nack(self, frame: Any) -> None:
        m = frame.method
        tag = m.delivery_tag
        nack = isinstance(m, pika.spec.Basic.Nack)
        if m.multiple:
            for t, entry in self._inflight.items():
                if t > tag:
                    break
                self._mark(t, entry, nack)
        else:
            entry = self._inflight.get(tag)
            if entry is not None:
                self._mark(tag, entry, nack)
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

    def _on_return(self, _ch: Any, method: Any, _props: Any, body: bytes) -> None:
        for tag, (_, exchange, rk, b, state) in self._inflight.items():
            if state == 0 and tag not in self._returned and exchange == method.exchange and rk == method.routing_key and b == body:
                self._returned.add(tag)
                break
        if self.failure is None:
            self.failure = (
                f"message for {self.label} was returned as unroutable by exchange {method.exchange!r} "
                f"with routing key {method.routing_key!r}: {method.reply_code} {method.reply_text}"
            )

    def _on_close(self, _ch: Any, reason: Exception) -> None:
        if self.failure is None:
            self.failure = f"the broker closed the channel publishing {self.label}: {reason}"

    # -- driving ----------------------------------------------------------
    def _flush(self) -> None:
        if self._out:
            data = b"".join(self._out)
            self._out.clear()
            self._out_bytes = 0
            self._impl_conn._output_marshaled_frames([data])

    def _emit(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        """Basic.Publish (mandatory) + content header + body frames, appended to the batch buffer."""
        ex = exchange.encode("utf-8")
        rk = routing_key.encode("utf-8")
        if len(ex) > 255 or len(rk) > 255:
            raise PublishError(f"{self.label}: exchange or routing key longer than 255 bytes ({exchange[:40]!r}, {routing_key[:40]!r})")
        method = b"\x00\x3c\x00\x28\x00\x00" + bytes((len(ex),)) + ex + bytes((len(rk),)) + rk + b"\x01"
        n = len(body)
        header = _CONTENT_HEADER.pack(60, 0, n) + properties
        out = self._out
        ch = self._chno
        out.append(_FRAME.pack(1, ch, len(method)))
        out.append(method)
        out.append(b"\xce")
        out.append(_FRAME.pack(2, ch, len(header)))
        out.append(header)
        out.append(b"\xce")
        step = self._body_max
        mv = memoryview(body)
        for start in range(0, n, step):
            chunk = mv[start : start + step]
            out.append(_FRAME.pack(3, ch, len(chunk)))
            out.append(chunk)
            out.append(b"\xce")
        self._out_bytes += n + len(header) + 64
        if self._out_bytes >= _FLUSH_BYTES:
            self._flush()

    def _pump(self, time_limit: float | None) -> None:
        self._flush()
        try:
            self._conn.process_data_events(time_limit=time_limit)
        except pika.exceptions.AMQPError as e:
            if self.failure is None:
                self.failure = f"connection lost while publishing {self.label}: {type(e).__name__} {e}"
            raise PublishError(self.failure) from None
        except RbakError:
            raise
        except Exception as e:  # noqa: BLE001 - pika's frame decoder on a hostile returned message
            raise PublishError(f"AMQP frame error while publishing {self.label}: {type(e).__name__}: {e}") from None

    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes, token: Hashable) -> None:
        """Send one message; blocks (pumping I/O) while the window is full. Raises on a failure."""
        if self.failure is not None:
            raise PublishError(self.failure)
        while self.confirms and len(self._inflight) >= self.window:
            self._pump(0.05)
            if self.failure is not None:
                raise PublishError(self.failure)
        tag = self._next_tag
        self._next_tag += 1
        if self.confirms:
            self._inflight[tag] = [token, exchange, routing_key, body, 0]
        try:
            if self._fast:
                if not self._ch.is_open:
                    raise PublishError(self.failure or f"the channel publishing {self.label} is closed")
                self._emit(exchange, routing_key, properties, body)
            else:
                self._ch.basic_publish(exchange, routing_key, body, RawBasicProperties(properties), mandatory=True)
        except pika.exceptions.AMQPError as e:
            raise PublishError(f"cannot publish to {self.label}: {type(e).__name__} {e}") from None
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
        import time

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
            self._flush()
            if self._bch.is_open:
                self._bch.close()
        except Exception:  # noqa: BLE001 - closing after a broker error
            pass
