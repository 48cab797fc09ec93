"""rbak's own AMQP 0-9-1 connection for its hot paths: pika's codec, rbak's socket loop.

The backup's reads and the restore's publishes spend most of their time per message in
the client (issue 20). Until now the fast path lived inside pika's BlockingConnection
through its private names; here the connection is rbak's, and pika is used only through
its public codec: ``pika.spec`` methods and properties, ``pika.frame`` marshalling and
``decode_frame``. Deliveries are taken whole by ``scan_deliveries`` (C), content headers
keep their raw bytes (pika's table decoder loses header types), and every other frame is
decoded by pika and dispatched here, in the order it arrived.

One thread uses a connection at a time, as with pika's blocking connection. Nothing is
sent or read behind the caller's back: a caller waits with ``Connection.pump``, which
also sends heartbeats and notices missed ones. Failures are rbak's errors (``rbak.errors``): a channel the
broker closed is ``ChannelClosedByBroker`` (code and text), a lost or closed connection
``ConnectionLost``; the handshake's refusals are ``AmqpAuthenticationError``.
"""

from __future__ import annotations

import itertools
import select
import socket
import ssl
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pika.frame
import pika.spec

from ..errors import AmqpAuthenticationError, AmqpConnectionError, AmqpError, ChannelClosedByBroker, ConnectionLost
from ..format.amqp091_frames import BROKEN, INCOMPLETE, scan_deliveries

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
RECV_BYTES = 128 * 1024
FRAME_MAX = 131072  # what RabbitMQ offers by default; the smaller of the two is used
_HEAD = struct.Struct(">BHI")  # frame type, channel, payload size
_METHOD_ID = struct.Struct(">HH")
_CONTENT_HEADER = struct.Struct(">HHQ")  # class id, weight, body size
_DELIVER = (60, 60)
_CONTENT_METHODS = {pika.spec.Basic.GetOk.INDEX, pika.spec.Basic.Return.INDEX, pika.spec.Basic.Deliver.INDEX}
_HEARTBEAT = pika.frame.Heartbeat().marshal()
#: The content header bytes (from the property flags on) of a message with only delivery_mode 2.
PERSISTENT = b"".join(pika.spec.BasicProperties(delivery_mode=2).encode())
_TAGS = itertools.count(1)


@dataclass
class Params:
    """How to reach and log in to a broker (``broker.connect`` builds these from a ``ConnectionConfig``)."""

    host: str
    port: int
    vhost: str = "/"
    username: str = "guest"
    password: str = "guest"
    ssl_context: ssl.SSLContext | None = None
    server_hostname: str | None = None
    heartbeat: int = 60  # seconds; 0 turns heartbeats off (the broker's offer is taken if smaller)
    connect_timeout: float = 10.0
    client_properties: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{'amqps' if self.ssl_context else 'amqp'}://{self.host}:{self.port} vhost {self.vhost!r}"


@dataclass
class Content:
    """A message that came with a method other than a parsed delivery (Basic.GetOk, Basic.Return)."""

    method: Any  # the pika.spec method
    raw_properties: bytes = b""
    body_size: int = 0
    parts: list[bytes] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)


class Channel:
    """One channel of a ``Connection``: methods, and what the broker sent on it so far."""

    def __init__(self, conn: "Connection", number: int):
        self.conn = conn
        self.number = number
        self.is_open = False
        self.closed_by: ChannelClosedByBroker | None = None
        self.deliveries: list[tuple] = []  # scan_deliveries 6-tuples, in arrival order
        self.gets: list[Content | None] = []  # Basic.GetOk contents, None for a Basic.GetEmpty
        self.returns: list[Content] = []  # Basic.Return contents (mandatory publishes)
        self.cancelled: set[str] = set()  # consumer tags the broker cancelled
        self.acks: list[tuple[bool, int, bool]] = []  # publisher confirms: (ack?, delivery tag, multiple)
        self.next_publish_tag = 0  # 0: confirms are off
        self._awaiting: tuple[int, ...] = ()
        self._reply: Any = None
        self._content: Content | None = None

    # -- sending --------------------------------------------------------------------------
    def send(self, *methods: Any) -> None:
        """Write methods that await no reply (nowait methods, acks, nacks)."""
        self.check_open()
        self.conn.send(b"".join(pika.frame.Method(self.number, m).marshal() for m in methods))

    def rpc(self, method: Any, *replies: Any) -> Any:
        """Send ``method`` and wait for one of the ``replies`` (pika.spec classes) on this channel."""
        self.check_open()
        self._awaiting = tuple(r.INDEX for r in replies)
        self._reply = None
        try:
            self.conn.send(pika.frame.Method(self.number, method).marshal())
            self.conn.pump(lambda: self._reply is not None or not self.is_open)
        finally:
            self._awaiting = ()
        if self._reply is None:
            self.check_open()
        reply, self._reply = self._reply, None
        return reply

    def check_open(self) -> None:
        self.conn.check()
        if self.closed_by is not None:
            raise self.closed_by
        if not self.is_open:
            raise AmqpError(f"channel {self.number} is closed")

    # -- the methods rbak uses ------------------------------------------------------------
    def qos(self, prefetch_count: int) -> None:
        self.rpc(pika.spec.Basic.Qos(prefetch_count=prefetch_count), pika.spec.Basic.QosOk)

    def declare_passive(self, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of ``queue``; ``ChannelClosedByBroker`` 404/405/403 if refused."""
        ok = self.rpc(pika.spec.Queue.Declare(queue=queue, passive=True), pika.spec.Queue.DeclareOk)
        return ok.message_count, ok.consumer_count

    def declare(self, queue: str, durable: bool = True, arguments: dict | None = None, exclusive: bool = False,
                auto_delete: bool = False) -> tuple[int, int]:
        """Declare ``queue`` (not passive): (ready messages, consumers)."""
        ok = self.rpc(pika.spec.Queue.Declare(queue=queue, durable=durable, exclusive=exclusive,
                                              auto_delete=auto_delete, arguments=arguments), pika.spec.Queue.DeclareOk)
        return ok.message_count, ok.consumer_count

    def delete(self, queue: str) -> int:
        """Delete ``queue``: the messages it held."""
        return self.rpc(pika.spec.Queue.Delete(queue=queue), pika.spec.Queue.DeleteOk).message_count

    def consume(self, queue: str, arguments: dict | None = None, tag: str | None = None) -> str:
        """Start a consumer without waiting for its Consume-Ok (deliveries cannot precede it).
        Tags are zero-padded so they sort in start order (3.10 returns a closed channel's quorum
        consumers in key order)."""
        tag = tag or f"rbak.{self.number}.{next(_TAGS):012d}"
        self.send(pika.spec.Basic.Consume(queue=queue, consumer_tag=tag, nowait=True, arguments=arguments))
        return tag

    def cancel(self, tag: str) -> None:
        """Cancel a consumer and wait for its Cancel-Ok: nothing is delivered to it after that."""
        if tag in self.cancelled:
            return
        self.rpc(pika.spec.Basic.Cancel(consumer_tag=tag), pika.spec.Basic.CancelOk)

    def get(self, queue: str) -> Content | None:
        """One message by basic.get (unacked), or None when the queue is empty."""
        self.check_open()
        self.gets.clear()
        self.conn.send(pika.frame.Method(self.number, pika.spec.Basic.Get(queue=queue)).marshal())
        self.conn.pump(lambda: bool(self.gets) or not self.is_open)
        self.check_open()
        return self.gets.pop(0)

    def nack(self, delivery_tag: int = 0, multiple: bool = True, requeue: bool = True) -> None:
        self.send(pika.spec.Basic.Nack(delivery_tag=delivery_tag, multiple=multiple, requeue=requeue))

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.send(pika.spec.Basic.Ack(delivery_tag=delivery_tag, multiple=multiple))

    def select_confirms(self) -> None:
        self.rpc(pika.spec.Confirm.Select(), pika.spec.Confirm.SelectOk)
        self.next_publish_tag = 1

    def publish(self, exchange: str, routing_key: str, raw_properties: bytes, body: bytes,
                mandatory: bool = False, flush: bool = True) -> int:
        """Queue a message for sending (``flush``: write now); its confirm tag (0 without confirms).
        ``raw_properties``: the content header from the property flags on (``encode_basic_properties``)."""
        self.check_open()
        data = publish_frames(self.number, exchange, routing_key, raw_properties, body, mandatory,
                              self.conn.frame_max)
        self.conn.send(data, flush=flush)
        tag = self.next_publish_tag
        if tag:
            self.next_publish_tag += 1
        return tag

    def close(self) -> None:
        """Close the channel (what it holds unacked goes back to its queues)."""
        if self.is_open and self.conn.is_open:
            try:
                self.rpc(pika.spec.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), pika.spec.Channel.CloseOk)
            except AmqpError:
                pass
        self.is_open = False
        self.conn.channels.pop(self.number, None)

    # -- what the broker sends ---------------------------------------------------------------
    def _on_method(self, index: int, method: Any) -> None:
        if index in self._awaiting:
            self._reply = method
            self._awaiting = ()
        elif index in _CONTENT_METHODS:
            self._content = Content(method)
        elif index == pika.spec.Basic.GetEmpty.INDEX:
            self.gets.append(None)
        elif index == pika.spec.Basic.Ack.INDEX:
            self.acks.append((True, method.delivery_tag, method.multiple))
        elif index == pika.spec.Basic.Nack.INDEX:
            self.acks.append((False, method.delivery_tag, method.multiple))
        elif index == pika.spec.Basic.Cancel.INDEX:
            self.cancelled.add(method.consumer_tag)
        elif index == pika.spec.Channel.Close.INDEX:
            self.closed_by = ChannelClosedByBroker(self.number, method.reply_code, method.reply_text)
            self.is_open = False
            self.conn.send(pika.frame.Method(self.number, pika.spec.Channel.CloseOk()).marshal())
        elif index == pika.spec.Channel.CloseOk.INDEX:
            self.is_open = False
        elif index == pika.spec.Channel.Flow.INDEX:
            self.conn.send(pika.frame.Method(self.number, pika.spec.Channel.FlowOk(active=method.active)).marshal())

    def _on_header(self, body_size: int, raw: bytes) -> None:
        c = self._content
        if c is None:
            raise AmqpError(f"channel {self.number}: a content header without its method")
        c.body_size, c.raw_properties = body_size, raw
        if body_size == 0:
            self._content_done()

    def _on_body(self, part: bytes) -> None:
        c = self._content
        if c is None:
            raise AmqpError(f"channel {self.number}: a content body without its method")
        c.parts.append(part)
        if sum(len(p) for p in c.parts) >= c.body_size:
            self._content_done()

    def _content_done(self) -> None:
        c, self._content = self._content, None
        assert c is not None
        index = c.method.INDEX
        if index == pika.spec.Basic.GetOk.INDEX:
            self.gets.append(c)
        elif index == pika.spec.Basic.Return.INDEX:
            self.returns.append(c)
        else:  # a delivery the parser did not take whole (never from RabbitMQ): kept in order
            m = c.method
            self.deliveries.append((m.delivery_tag, m.redelivered, m.exchange, m.routing_key,
                                    c.raw_properties, c.body))


class Connection:
    """An open AMQP 0-9-1 connection (``Connection.open``); its channels by number."""

    def __init__(self, sock: socket.socket, params: Params):
        self.sock = sock
        self.params = params
        self.channels: dict[int, Channel] = {}
        self.is_open = False
        self.blocked = False
        self.frame_max = FRAME_MAX
        self.channel_max = 2047
        self.heartbeat = 0
        self.server_properties: dict[str, Any] = {}
        self.error: ConnectionLost | None = None
        self._held = bytearray()
        self._out: list[bytes] = []
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        self._last_recv = self._last_send = time.monotonic()
        self._next_channel = 1
        self._awaiting0: tuple[int, ...] = ()
        self._reply0: Any = None

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, params: Params) -> "Connection":
        where = params.where
        try:
            sock = socket.create_connection((params.host, params.port), timeout=params.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if params.ssl_context is not None:
                sock = params.ssl_context.wrap_socket(sock, server_hostname=params.server_hostname or params.host)
        except ssl.SSLCertVerificationError as e:
            raise AmqpConnectionError(f"{where}: cannot connect (TLS certificate verification failed: "
                                      f"{e.verify_message})") from None
        except ssl.SSLError as e:
            raise AmqpConnectionError(f"{where}: cannot connect (TLS error: {e.reason or e})") from None
        except OSError as e:
            raise AmqpConnectionError(f"{where}: cannot connect ({e})") from None
        conn = cls(sock, params)
        try:
            conn._handshake()
        except BaseException:
            conn.abort()
            raise
        sock.settimeout(max(params.connect_timeout, 2.0 * conn.heartbeat if conn.heartbeat else 30.0))
        return conn

    def _handshake(self) -> None:
        p = self.params
        self.send(PROTOCOL_HEADER)
        start = self._await0(pika.spec.Connection.Start, timeout=p.connect_timeout, step="its greeting")
        mechanisms = start.mechanisms.decode() if isinstance(start.mechanisms, bytes) else str(start.mechanisms)
        if "PLAIN" not in mechanisms.split():
            raise AmqpAuthenticationError(f"{p.where}: the broker offers no PLAIN login ({start.mechanisms!r})")
        self.server_properties = start.server_properties or {}
        props = {"product": "rbak", "capabilities": {
            "authentication_failure_close": True, "basic.nack": True, "connection.blocked": True,
            "consumer_cancel_notify": True, "publisher_confirms": True}, **p.client_properties}
        response = b"\x00" + p.username.encode() + b"\x00" + p.password.encode()
        self._send_method0(pika.spec.Connection.StartOk(client_properties=props, mechanism="PLAIN",
                                                        response=response, locale="en_US"))
        tune = self._await0(pika.spec.Connection.Tune, timeout=p.connect_timeout, step="the login",
                            refused=AmqpAuthenticationError(f"{p.where}: authentication failed for user "
                                                            f"{p.username!r}"))
        self.frame_max = min(x for x in (tune.frame_max, FRAME_MAX) if x) if tune.frame_max else FRAME_MAX
        self.channel_max = tune.channel_max or 2047
        offered = tune.heartbeat
        self.heartbeat = 0 if not p.heartbeat else min(offered, p.heartbeat) if offered else p.heartbeat
        self._send_method0(pika.spec.Connection.TuneOk(channel_max=self.channel_max, frame_max=self.frame_max,
                                                       heartbeat=self.heartbeat))
        self._send_method0(pika.spec.Connection.Open(virtual_host=p.vhost))
        self._await0(pika.spec.Connection.OpenOk, timeout=p.connect_timeout, step="opening the vhost",
                     refused=AmqpAuthenticationError(f"{p.where}: access to the vhost was refused for user "
                                                     f"{p.username!r}"))
        self.is_open = True

    def _send_method0(self, method: Any) -> None:
        self.send(pika.frame.Method(0, method).marshal())

    def _await0(self, reply: Any, timeout: float, step: str, refused: AmqpError | None = None) -> Any:
        self._awaiting0 = (reply.INDEX,)
        self._reply0 = None
        try:
            ok = self.pump(lambda: self._reply0 is not None, timeout=timeout, handshake=True)
        except ConnectionLost as e:
            if refused is not None and e.code in (0, 403, 530):  # a refused login ends the socket or closes 403
                raise refused from None
            if reply is pika.spec.Connection.Start:
                raise ConnectionLost(self._no_greeting("closed the connection"), e.code, e.text) from None
            raise
        if not ok:
            if reply is pika.spec.Connection.Start:
                raise AmqpConnectionError(self._no_greeting(f"sent no answer within {timeout:g} s"))
            raise AmqpConnectionError(f"{self.params.where}: no answer to {step} within {timeout:g} s")
        return self._reply0

    def _no_greeting(self, what: str) -> str:
        """Why a server that never greeted in AMQP 0-9-1 failed the connection: most often ``amqp_url``
        names another port of the host (the management API's :15672 answers HTTP, after ~5 s)."""
        p = self.params
        http = bytes(self._held[:5]) == b"HTTP/"
        return (f"{p.where}: the server {what} before greeting in AMQP 0-9-1"
                f"{' and answered in HTTP' if http else ''}: port {p.port} may not be an AMQP listener (the "
                f"management API's HTTP port?); point the AMQP URL at the broker's AMQP port (5672 by default, "
                f"5671 with TLS)")

    # -- channels ------------------------------------------------------------------------------
    def channel(self) -> Channel:
        self.check()
        for _ in range(self.channel_max):
            num = self._next_channel
            self._next_channel = num % self.channel_max + 1
            if num not in self.channels:
                break
        else:
            raise AmqpError(f"{self.params.where}: all {self.channel_max} channels are in use")
        ch = self.channels[num] = Channel(self, num)
        ch.is_open = True
        try:
            ch.rpc(pika.spec.Channel.Open(), pika.spec.Channel.OpenOk)
        except BaseException:
            self.channels.pop(num, None)
            raise
        return ch

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (0: no wait) while taking what arrives (heartbeats, closes, confirms);
        raises ``ConnectionLost`` when the connection is gone."""
        self.pump(lambda: False, timeout=seconds)

    # -- I/O -----------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise the connection's error if it is gone."""
        if self.error is not None:
            raise self.error

    def send(self, data: bytes, flush: bool = True) -> None:
        """Write ``data`` (``flush=False``: with the next flushed write, for batched publishes)."""
        self.check()
        self._out.append(data)
        if flush:
            self.flush()

    def flush(self) -> None:
        if not self._out:
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        try:
            self.sock.sendall(data)
        except (OSError, ssl.SSLError) as e:
            self._lost(f"{self.params.where}: the connection was lost while writing ({e!r})")
            self.check()
        self._last_send = time.monotonic()

    def pump(self, ready: Callable[[], bool], timeout: float | None = None, handshake: bool = False) -> bool:
        """Read and dispatch what arrives until ``ready()`` (True) or ``timeout`` s pass (False).
        Raises ``ConnectionLost`` when the connection goes; sends heartbeats while it waits."""
        self.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            self.check()
            now = time.monotonic()
            if self.heartbeat and not handshake:
                if now - self._last_send >= self.heartbeat / 2:
                    self.send(_HEARTBEAT)
                if now - self._last_recv > 2 * self.heartbeat:
                    self._lost(f"{self.params.where}: no data from the broker for {now - self._last_recv:.0f} s "
                               f"(heartbeat {self.heartbeat} s)")
                    self.check()
            wait = self.heartbeat / 2 if self.heartbeat else 1.0
            if deadline is not None:
                wait = min(wait, max(deadline - now, 0.0))
            pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
            if pending or self._poll.poll(wait * 1000):
                self._read()
            if deadline is not None and time.monotonic() >= deadline:
                if ready():
                    return True
                self.check()
                return False
        return True

    def _read(self) -> None:
        try:
            data = self.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            return
        except (OSError, ssl.SSLError) as e:
            self._lost(f"{self.params.where}: the connection was lost ({e!r})")
            return
        if not data:
            self._lost(f"{self.params.where}: the broker closed the connection")
            return
        self._last_recv = time.monotonic()
        self.on_bytes(data)

    def on_bytes(self, data: bytes) -> None:
        """Take received bytes: whole deliveries by the parser, every other whole frame by pika's
        decoder, dispatched in order; an incomplete tail waits for the next bytes."""
        held = self._held
        held += data
        buf = held
        pos, n = 0, len(buf)
        try:
            while n - pos >= 8:
                ftype, num, size = _HEAD.unpack_from(buf, pos)
                if ftype == 1 and size >= 4 and _METHOD_ID.unpack_from(buf, pos + 7) == _DELIVER \
                        and num in self.channels:
                    end, got, status = scan_deliveries(buf, pos, num)
                    if got:
                        self.channels[num].deliveries.extend(got)
                        pos = end
                    if status == INCOMPLETE:
                        break
                    if status == BROKEN:
                        self._lost(f"{self.params.where}: channel {num}: a delivery's frames were interleaved "
                                   "with another frame (malformed AMQP 0-9-1 from the broker)")
                        return
                    if got:
                        continue
                if n - pos < 8 + size:
                    break
                if buf[pos + 7 + size] != 0xCE:
                    self._lost(f"{self.params.where}: a frame without its end marker (malformed AMQP 0-9-1)")
                    return
                self._frame(ftype, num, buf, pos + 7, size)
                pos += 8 + size
                if self.error is not None:
                    return
        finally:
            del held[:pos]

    def _frame(self, ftype: int, num: int, buf: bytearray, start: int, size: int) -> None:
        if ftype == 8:  # heartbeat
            return
        ch = self.channels.get(num)
        if ftype == 2:  # content header: the properties' raw bytes, from their flags on
            _cls, _weight, body_size = _CONTENT_HEADER.unpack_from(buf, start)
            if ch is not None:
                ch._on_header(body_size, bytes(buf[start + 12:start + size]))
            return
        if ftype == 3:
            if ch is not None:
                ch._on_body(bytes(buf[start:start + size]))
            return
        if ftype != 1:
            self._lost(f"{self.params.where}: frame type {ftype} (malformed AMQP 0-9-1)")
            return
        try:
            _used, frame = pika.frame.decode_frame(bytes(buf[start - 7:start + size + 1]))
            method = frame.method
        except Exception as e:  # noqa: BLE001 - pika's decoder on malformed bytes: the connection cannot go on
            self._lost(f"{self.params.where}: a method frame that cannot be decoded ({type(e).__name__}: {e})")
            return
        index = method.INDEX
        if num == 0:
            self._on_method0(index, method)
        elif ch is not None:
            ch._on_method(index, method)

    def _on_method0(self, index: int, method: Any) -> None:
        if index in self._awaiting0:
            self._reply0 = method
            self._awaiting0 = ()
        elif index == pika.spec.Connection.Close.INDEX:
            try:
                self._send_method0(pika.spec.Connection.CloseOk())
            except AmqpError:
                pass
            self._lost(f"{self.params.where}: the broker closed the connection: {method.reply_code} "
                       f"{method.reply_text}", method.reply_code, method.reply_text)
        elif index == pika.spec.Connection.Blocked.INDEX:
            self.blocked = True
        elif index == pika.spec.Connection.Unblocked.INDEX:
            self.blocked = False
        elif index == pika.spec.Connection.CloseOk.INDEX:
            self._lost(f"{self.params.where}: closed")

    def _lost(self, message: str, code: int = 0, text: str = "") -> None:
        if self.error is None:
            self.error = ConnectionLost(message, code, text)
        self.is_open = False
        for ch in self.channels.values():
            ch.is_open = False
        try:
            self.sock.close()
        except OSError:
            pass

    # -- closing -------------------------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        """Close the connection (every message its channels hold goes back to its queue)."""
        if self.is_open:
            try:
                self._send_method0(pika.spec.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
                self._awaiting0 = (pika.spec.Connection.CloseOk.INDEX,)
                self.pump(lambda: self._reply0 is not None, timeout=timeout)
            except AmqpError:
                pass
        self.abort()

    def abort(self) -> None:
        """Drop the socket without a Connection.Close (the broker returns what was held)."""
        self._lost(f"{self.params.where}: closed")

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def publish_frames(num: int, exchange: str, routing_key: str, raw_properties: bytes, body: bytes,
                   mandatory: bool, frame_max: int) -> bytes:
    """The frames of one Basic.Publish: method, content header (``raw_properties`` from the flags on),
    the body in pieces of at most ``frame_max - 8`` bytes."""
    parts = [pika.frame.Method(num, pika.spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                            mandatory=mandatory)).marshal()]
    header = _CONTENT_HEADER.pack(60, 0, len(body)) + raw_properties
    parts.append(_HEAD.pack(2, num, len(header)) + header + b"\xce")
    step = frame_max - 8
    for i in range(0, len(body), step):
        piece = body[i:i + step]
        parts.append(_HEAD.pack(3, num, len(piece)) + piece + b"\xce")
    return b"".join(parts)
