"""Deliveries taken straight off the reading connection's bytes, before pika decodes them (issue 20).

pika spends 22-25 us of the reading thread per 1 KiB delivery: it copies its frame
buffer once per frame (quadratic in the bytes of one socket read, which it keeps at
4 KiB for that reason), decodes each frame into objects and dispatches the message
through three layers of callbacks and a generator. The bare pika readers the
benchmarks compare with pay the same; rbak paid it and its own record work on top.

While a read runs, ``FastConsume`` takes the connection's received bytes first:
complete ``Basic.Deliver`` messages of the one channel being read are parsed by
``scan_deliveries`` (C, or its pure-Python twin) and queued as tuples; every other
frame goes to pika's own frame processing, one at a time and in order, so pika still
sees every method, close, cancel and heartbeat. A delivery is therefore never seen
by both, and never by neither: the parser only takes whole messages and stops at
the first frame that is not one. Frames of a delivery interleaved with another
frame (RabbitMQ never writes them so) stop the fast path with an error: the read
fails and every message goes back, as on any other read error.

Only the reading connection of one read has it, for the read's duration
(``install`` ... ``uninstall``): never pika's classes, never other connections.
If pika's internals are not those this was written against, ``install`` returns
None and the read uses pika's consumer generator as before.

Reads that stay on pika's paths (basic.get, the consumer generator with
``RBAK_FAST_CONSUME=0``, the stream probe) install one with ``headers``: it parses no
delivery but builds every content-header frame itself with ``KeptProperties`` (pika's
properties plus the header's bytes) before pika processes it. That is how a backup keeps
each header's AMQP type (pika's decoder truncates floats and fails on NaN) on one
connection, without replacing ``BasicProperties.decode`` for the whole process.

Small reads pay per queue for their AMQP methods more than for their messages: pika's
blocking RPC layer cost ~0.45 ms of the GIL per call, four calls a queue (issue 20,
1,000 x 100). ``call`` sends methods as marshalled frames and takes its awaited reply
off the wire the same way deliveries are taken; ``consume(raw=True)`` starts a consumer
pika does not know (``nowait``), whose broker-sent cancel is taken here too, since
pika's blocking channel fails on a cancel of a consumer it does not know.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import select
import struct
import time
import weakref
from typing import Any, Iterator

import pika
import pika.exceptions
import pika.frame
import pika.spec

from ..errors import AmqpError
from ..format.amqp091_frames import BROKEN, INCOMPLETE, scan_deliveries

log = logging.getLogger(__name__)

try:
    from pika.adapters.blocking_connection import _IoloopTimerContext
except ImportError:  # pragma: no cover - a pika without it: the generator path
    _IoloopTimerContext = None
try:
    from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport
except ImportError:  # pragma: no cover - a pika without it: pika's I/O loop for every wait
    _AsyncPlaintextTransport = None

#: Use the fast path where pika's internals allow it (False, or RBAK_FAST_CONSUME=0 in the environment:
#: pika's consumer generator, to compare).
ENABLED = os.environ.get("RBAK_FAST_CONSUME", "1").strip() != "0"
#: Bytes per socket read while installed: pika's 4 KiB is ~4 messages of 1 KiB per read and callback.
RECV_BYTES = 128 * 1024
#: Properties objects kept by raw bytes (a queue's messages mostly carry the same few).
PROPS_CACHE = 512
#: Seconds between runs of pika's timers (heartbeats) while ``pump`` waits instead of pika's I/O loop.
TIMERS_EVERY = 0.1

_IMPL_ATTRS = ("_on_data_available", "_frame_buffer", "_read_frame", "_process_frame", "bytes_received",
               "_transport", "is_closed")
_SIZE = struct.Struct(">I")
_CONTENT_HEADER = struct.Struct(">HHQ")  # class id, weight, body size: the start of a header frame's payload
_METHOD_ID = struct.Struct(">HH")  # class id, method id: the start of a method frame's payload
# the replies rbak awaits itself, and the broker's cancel of a consumer pika does not know (class, method)
DECLARE_OK = (pika.spec.Queue.DeclareOk.INDEX >> 16, pika.spec.Queue.DeclareOk.INDEX & 0xFFFF)
CANCEL_OK = (pika.spec.Basic.CancelOk.INDEX >> 16, pika.spec.Basic.CancelOk.INDEX & 0xFFFF)
QOS_OK = (pika.spec.Basic.QosOk.INDEX >> 16, pika.spec.Basic.QosOk.INDEX & 0xFFFF)
BROKER_CANCEL = (pika.spec.Basic.Cancel.INDEX >> 16, pika.spec.Basic.Cancel.INDEX & 0xFFFF)
_TAGS = itertools.count(1)


class Deliver:
    """What the backup reads of a ``Basic.Deliver`` (``to_record`` and the queue reader's checks)."""

    __slots__ = ("delivery_tag", "redelivered", "exchange", "routing_key")

    def __init__(self, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str):
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key


class KeptProperties(pika.spec.BasicProperties):
    """pika's properties of a content header, with the header's bytes (``raw``) for rbak's typed decode.

    pika's table decoder truncates float headers to ints, folds the integer widths together and
    fails on NaN (``undecodable``: its fields are then partly unset, and only ``raw`` tells the
    truth). Every content header a backup's connection receives while a ``FastConsume`` is
    installed becomes one of these, on the fast path and on pika's own (``header_frame``).
    """

    def __init__(self, raw: bytes):
        super().__init__()
        self.raw = raw
        self.undecodable = False
        try:
            self.decode(raw)
        except Exception:  # noqa: BLE001 - pika cannot decode it; rbak's decoder reads the raw bytes
            self.undecodable = True


_PROPS: dict[bytes, KeptProperties] = {}


def properties(raw: bytes) -> KeptProperties:
    """The properties of these raw content-header bytes, decoded once per distinct bytes.
    Shared objects: nothing mutates a delivery's properties."""
    p = _PROPS.get(raw)
    if p is None:
        p = KeptProperties(raw)
        if len(_PROPS) >= PROPS_CACHE:
            _PROPS.clear()
        _PROPS[raw] = p
    return p


def header_frame(buf: bytes | bytearray, pos: int, size: int) -> pika.frame.Header | None:
    """The content-header frame at ``buf[pos:pos + size]`` as pika's decoder builds it, with
    ``KeptProperties``; None for a class other than Basic (pika decodes it)."""
    if buf[pos + size - 1] != pika.spec.FRAME_END:
        raise pika.exceptions.InvalidFrameError("Invalid FRAME_END marker")
    class_id, _weight, body_size = _CONTENT_HEADER.unpack_from(buf, pos + 7)
    if class_id != pika.spec.BasicProperties.INDEX:
        return None
    num = (buf[pos + 1] << 8) | buf[pos + 2]
    return pika.frame.Header(num, body_size, properties(bytes(buf[pos + 19:pos + size - 1])))


class FastConsume:
    """The fast path on one BlockingConnection for one read: ``install``, ``consume`` / ``wait`` /
    ``take``, then ``uninstall`` (always, in a ``finally``)."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.impl = conn._impl
        self.channel = 0  # the channel whose deliveries are parsed here (0: none)
        self.pending: list[tuple] = []
        self.error: str | None = None
        self.cancelled: set[int] = set()  # channels whose consumer the broker cancelled
        self.awaiting: dict[int, tuple[int, int]] = {}  # channel -> the (class, method) reply ``call`` awaits
        self.replies: dict[int, bytes] = {}  # channel -> that reply's arguments, once it arrived
        # channel -> the tags of its ``raw`` consumers, oldest first (pika does not know them); a quorum
        # read keeps several on one channel (queue_reader: one channel, so a cut returns them in order)
        self.raw_tags: dict[int, list[bytes]] = {}
        self._held = bytearray()  # bytes neither side has taken yet (an incomplete frame or delivery)
        self._poll: Any = None  # select.poll on the socket, for ``pump``
        self._timers_at = 0.0

    @classmethod
    def install(cls, conn: Any, parse: bool = True) -> "FastConsume | None":
        """On ``conn`` until ``uninstall``; None when another is installed on it, when pika's internals
        are not those this was written against, or (``parse``) when the fast path is turned off.
        ``parse=False``: deliveries stay pika's; only content headers are decoded here (``headers``)."""
        if (parse and not ENABLED) or not _fits(conn):
            return None
        impl = conn._impl
        if "_on_data_available" in impl.__dict__:
            return None
        fc = cls(conn)
        if impl._frame_buffer:  # a partial frame pika holds (not counted by it yet): ours now, counted
            fc._held += impl._frame_buffer
            impl.bytes_received += len(impl._frame_buffer)
            impl._frame_buffer = b""
        impl._on_data_available = fc._on_data
        if impl._transport is not None and hasattr(impl._transport, "_MAX_RECV_BYTES"):
            impl._transport._MAX_RECV_BYTES = RECV_BYTES
        return fc

    @classmethod
    def headers(cls, conn: Any) -> "FastConsume | None":
        """Installed on ``conn`` for a read on pika's own paths (the consumer generator, basic.get, a
        probe): content headers are decoded here, so the records keep every header's type and a
        header pika cannot decode (NaN) does not abort the connection. None when one is installed
        already (it does the same); raises ``AmqpError`` on a pika whose internals differ (a read
        would lose header types): pyproject.toml pins the tested range."""
        fc = cls.install(conn, parse=False)
        if fc is None and not _fits(conn):
            raise AmqpError(f"pika {getattr(pika, '__version__', '?')} is not a version rbak was tested with "
                            "(its connection internals differ); install the version pyproject.toml names")
        return fc

    def uninstall(self) -> None:
        """pika's own data path again (bytes not taken yet go back to pika's frame buffer)."""
        self.channel = 0
        impl = self.impl
        impl.__dict__.pop("_on_data_available", None)
        t = impl._transport
        if t is not None:
            t.__dict__.pop("_MAX_RECV_BYTES", None)
        held, self._held = self._held, bytearray()
        if held and not impl.is_closed:
            impl._frame_buffer = bytes(held) + impl._frame_buffer
            impl.bytes_received -= len(held)  # pika counts them again as it takes their frames
        self.pending = []

    # -- the data path -------------------------------------------------------------------------
    def _on_data(self, data_in: bytes) -> None:
        """pika's ``_on_data_available`` with the fast parse in front of it.

        Bytes that neither side can take yet wait in ``_held``, a bytearray the next reads are
        appended to: a delivery arriving over many socket reads is not copied once per read
        (concatenating bytes did, quadratic: 66 s of CPU for a 128 MiB message, pika's path 0.13 s).
        ``bytes_received`` counts bytes as they arrive, where pika counts each frame it takes:
        the parser takes a delivery only once it is whole, and pika's heartbeat checker must see
        activity while a large one arrives slowly.
        """
        impl = self.impl
        impl.bytes_received += len(data_in)
        held = self._held
        buf: bytes | bytearray
        if held:
            held += data_in
            buf = held
        else:
            buf = data_in
        pos, n = 0, len(buf)
        try:
            while pos < n:
                ch = self.channel
                if ch:
                    end, got, status = scan_deliveries(buf, pos, ch)
                    if got:
                        self.pending.extend(got)
                        pos = end
                    if status == INCOMPLETE:
                        break
                    if status == BROKEN:
                        self.error = (f"channel {ch}: a delivery's frames were interleaved with another frame "
                                      "(malformed AMQP 0-9-1 from the broker)")
                        self.channel = 0
                    if pos >= n:
                        break
                # one whole frame for pika, decoded and processed as its own loop does it
                if n - pos < 7:
                    break
                size = 8 + _SIZE.unpack_from(buf, pos + 3)[0]
                if n - pos < size:
                    break
                if buf[pos] == 1 and (self.awaiting or self.raw_tags) and self._took_method(buf, pos, size):
                    pos += size
                    continue
                # a content header is decoded here (pika's decoder would lose its header types)
                frame_value = header_frame(buf, pos, size) if buf[pos] == pika.spec.FRAME_HEADER else None
                if frame_value is None:
                    impl._frame_buffer = bytes(buf[pos:pos + size])
                    size, frame_value = impl._read_frame()  # pika's decoder (raises on a bad frame end)
                    impl._frame_buffer = b""
                    if not frame_value:  # pragma: no cover - a whole frame always decodes or raises
                        break
                pos += size
                impl._process_frame(frame_value)
                if impl.is_closed:  # the stream ended while processing it: pika drops what it had buffered
                    pos = n
        finally:
            if buf is held:
                del held[:pos]  # from the front: CPython moves no bytes
            elif pos < n:
                held += memoryview(buf)[pos:]

    def _took_method(self, buf, pos: int, size: int) -> bool:
        """Take a method frame that is ours: an awaited reply, or the broker's cancel of a raw consumer."""
        num = (buf[pos + 1] << 8) | buf[pos + 2]
        which = _METHOD_ID.unpack_from(buf, pos + 7)
        if self.awaiting.get(num) == which:
            del self.awaiting[num]
            self.replies[num] = bytes(buf[pos + 11:pos + size - 1])
            return True
        tags = self.raw_tags.get(num)
        if tags and which == BROKER_CANCEL and bytes(buf[pos + 12:pos + 12 + buf[pos + 11]]) in tags:
            self.cancelled.add(num)  # the queue was deleted, or 4.3's consumer timeout; no reply (nowait)
            return True
        return False

    # -- methods without pika's RPC layer ---------------------------------------------------------
    def send(self, ch: Any, *methods: Any) -> None:
        """Write ``methods`` on channel ``ch`` (no reply is awaited: nowait methods, basic.nack).

        On a plain TCP connection with nothing queued, straight to the socket: pika's transport
        would queue them and turn its writability watcher on and off around one send."""
        if not ch.is_open:
            ch._impl._raise_if_not_open()
        impl = self.impl
        num = ch.channel_number
        data = b"".join([pika.frame.Method(num, m).marshal() for m in methods])
        impl.bytes_sent += len(data)  # pika's counters (its heartbeat checker reads bytes_sent)
        impl.frames_sent += len(methods)
        t = impl._transport
        sent = 0
        if self._plain(t) and not t._tx_buffers and t._state == t._STATE_ACTIVE:
            try:
                sent = t._sock.send(data)
            except OSError:  # would block, or failed: pika's transport sends (or fails) the rest itself
                sent = 0
        if sent < len(data):
            impl._adapter_emit_data(data[sent:])

    @staticmethod
    def _plain(t: Any) -> bool:
        """A plain TCP transport of the pika this was written against (TLS goes through pika's loop)."""
        return _AsyncPlaintextTransport is not None and type(t) is _AsyncPlaintextTransport

    def call(self, ch: Any, reply: tuple[int, int], *methods: Any) -> bytes:
        """Send ``methods`` on ``ch`` and wait for the ``reply`` (class, method) on it; its argument bytes.

        Waits as pika's blocking RPCs do, until the reply, the channel's close (the broker's raises
        its ``ChannelClosedByBroker``) or the connection's loss (pika's error)."""
        num = ch.channel_number
        self.replies.pop(num, None)
        self.awaiting[num] = reply
        try:
            self.send(ch, *methods)
            self.pump(ch, lambda: num in self.replies)
        finally:
            self.awaiting.pop(num, None)
        got = self.replies.pop(num, None)
        if got is None:  # the channel was closed (pika raises a lost connection itself)
            reason = getattr(ch, "_closing_reason", None)
            if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
                raise reason
            raise pika.exceptions.ChannelClosed(0, f"channel {num} closed before its reply ({reason!r})")
        return got

    def cancel(self, ch: Any) -> None:
        """Cancel ``ch``'s raw consumers, oldest first, each awaiting the broker's Cancel-Ok (nothing is
        delivered to a consumer after it)."""
        tags = self.raw_tags.get(ch.channel_number) or []
        while tags:
            self.call(ch, CANCEL_OK, pika.spec.Basic.Cancel(consumer_tag=tags[0].decode()))
            tags.pop(0)
        self.raw_tags.pop(ch.channel_number, None)

    # -- the read's side -----------------------------------------------------------------------
    def consume(self, ch: Any, queue: str, arguments: dict | None = None, raw: bool = False) -> str:
        """Start a consumer on ``ch`` whose deliveries are parsed here (from its first one).

        ``raw``: a ``nowait`` Basic.Consume pika does not know; ``cancel`` ends it (pika's own
        ``basic_cancel`` does not know its tag). Raw tags are zero-padded so that they sort in the
        order the consumers were started: RabbitMQ 3.10 keys a quorum queue's consumers by
        (tag, channel) and returns a closed channel's consumers in key order."""
        num = ch.channel_number
        self.channel = num  # before Basic.Consume is sent: no delivery can precede its Consume-Ok
        self.pending = []  # anything an earlier channel of the read left is never this consumer's
        if raw:
            tag = f"rbak.{num}.{next(_TAGS):012d}"
            self.raw_tags.setdefault(num, []).append(tag.encode())
            self.send(ch, pika.spec.Basic.Consume(queue=queue, consumer_tag=tag, nowait=True, arguments=arguments))
            return tag
        # one cancel callback per channel (a shared reading channel serves many reads): it tells
        # whichever read is consuming on the channel now (``_CONSUMING``, not an attribute of pika's channel)
        if ch not in _CONSUMING:
            ch._impl.add_on_cancel_callback(functools.partial(_broker_cancelled, weakref.ref(ch), num))
        _CONSUMING[ch] = weakref.ref(self)
        # pika sees a delivery of this channel only once the fast path has stopped with an error
        return ch.basic_consume(queue, _ignore, auto_ack=False, arguments=arguments)

    def messages(self, ch: Any, queue: str, inactivity_timeout: float,
                 arguments: dict | None = None, raw: bool = False) -> Iterator[tuple[Any, Any, Any]]:
        """``BlockingChannel.consume``'s contract on the fast path: ``(method, properties, body)`` per
        delivery, in order; ``(None, None, None)`` after ``inactivity_timeout`` s without one; the end
        once the broker cancelled the consumer (after what had arrived). Raises pika's
        ``ChannelClosedByBroker`` when the broker closes the channel, and pika's connection errors."""
        self.consume(ch, queue, arguments, raw)
        num = ch.channel_number
        while True:
            batch = self.take()
            if batch:
                for item in batch:
                    yield to_delivery(item)
                continue
            if self.error is not None:
                raise AmqpError(f"queue {queue!r}: {self.error}")
            if ch.is_closed:
                reason = getattr(ch, "_closing_reason", None)
                if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
                    raise reason
                raise pika.exceptions.ChannelClosedByBroker(0, repr(reason))
            if num in self.cancelled:
                return
            if not self.wait(ch, inactivity_timeout):
                yield None, None, None

    def take(self) -> list[tuple]:
        got = self.pending
        if got:
            self.pending = []
        return got

    def wait(self, ch: Any, timeout: float) -> bool:
        """Process I/O until deliveries are pending, the consumer or channel is gone, or an error;
        False when ``timeout`` seconds passed with none of them."""
        def ready() -> bool:
            return bool(self.pending) or self.error is not None or ch.channel_number in self.cancelled \
                or ch.is_closed

        if ready():
            return True
        return self.pump(ch, ready, timeout)

    def _read(self, t: Any) -> None:
        """One socket read into ``_on_data``, as pika's ``_on_socket_readable`` does it; an end of
        file or a socket error is left to that handler itself (it reads them again, and aborts
        the transport as pika would), and a failure to process the bytes aborts it too."""
        try:
            data = t._sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            t._on_socket_readable()
            return
        try:
            self._on_data(data)
        except Exception as e:  # noqa: BLE001 - pika's transport aborts the connection on this too
            log.exception("processing received AMQP data failed: %r", e)
            t._initiate_abort(e)

    def pump(self, ch: Any, ready: Any, timeout: float | None = None) -> bool:
        """Take received bytes until ``ready()`` (True) or ``timeout`` seconds pass (False).

        pika's I/O loop cost ~0.1 ms of the GIL per turn in layers (poller, dispatch, timers, a
        write turn before every read), several turns per method a small queue's read awaits
        (issue 20). On a plain TCP connection with nothing left to write, this polls the socket
        itself, reads it into ``_on_data`` (``_read``), writes what ``send`` buffered with
        pika's ``_on_socket_writable``, and runs pika's timers every ``TIMERS_EVERY`` s
        (heartbeats). Anything else (TLS, a write the socket would not take, an ended
        transport, a closed channel) goes on in pika's loop, which raises what pika raises."""
        impl = self.impl
        t = impl._transport
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._plain(t):
            if t._tx_buffers:
                t._on_socket_writable()
            if self._poll is None:
                self._poll = select.poll()
                self._poll.register(t._sock.fileno(), select.POLLIN | select.POLLPRI)
            active = t._STATE_ACTIVE
            while not t._tx_buffers and t._state == active and not ch.is_closed and not ready():
                now = time.monotonic()
                if now - self._timers_at >= TIMERS_EVERY:
                    self._timers_at = now
                    impl.ioloop.process_timeouts()
                    continue  # a timer may have written (a heartbeat) or closed something
                wait = TIMERS_EVERY if deadline is None else min(TIMERS_EVERY, deadline - now)
                if wait <= 0:
                    return False
                if self._poll.poll(wait * 1000):
                    self._read(t)

        def closed() -> bool:
            return ch.is_closed

        if not ready() and not ch.is_closed:
            if deadline is None:
                self.conn._flush_output(closed, ready)
            elif (left := deadline - time.monotonic()) > 0:
                with _IoloopTimerContext(left, impl) as timer:
                    self.conn._flush_output(timer.is_ready, closed, ready)
        elif t is not None and t.get_write_buffer_size():
            self.conn._flush_output()  # what pika wrote meanwhile (a Close-Ok, a heartbeat)
        return ready()


def _fits(conn: Any) -> bool:
    """``conn`` is a BlockingConnection of the pika this was written against."""
    impl = getattr(conn, "_impl", None)
    return _IoloopTimerContext is not None and impl is not None and hasattr(conn, "_flush_output") \
        and all(hasattr(impl, a) for a in _IMPL_ATTRS)


def deliveries(fc: "FastConsume | None", ch: Any, queue: str, inactivity_timeout: float,
               arguments: dict | None = None, raw: bool = False) -> Iterator[tuple[Any, Any, Any]]:
    """A read's deliveries: from the fast path when ``fc`` is installed, else pika's consumer generator
    (the same contract: ``(None, None, None)`` after ``inactivity_timeout`` s without one). ``raw``:
    see ``FastConsume.consume``."""
    if fc is not None:
        return fc.messages(ch, queue, inactivity_timeout, arguments, raw)
    return ch.consume(queue, auto_ack=False, inactivity_timeout=inactivity_timeout, arguments=arguments)


#: channel -> the read consuming on it now, for the broker's cancel (weak both ways: the read holds its
#: connection, which holds the channel)
_CONSUMING: "weakref.WeakKeyDictionary[Any, weakref.ref[FastConsume]]" = weakref.WeakKeyDictionary()


def _broker_cancelled(ch_ref: "weakref.ref[Any]", num: int, _frame: Any) -> None:
    """pika's callback for the broker's ``Basic.Cancel`` on a channel: tell the read consuming on it."""
    ch = ch_ref()
    fc_ref = _CONSUMING.get(ch) if ch is not None else None
    fc = fc_ref() if fc_ref is not None else None
    if fc is not None:
        fc.cancelled.add(num)


def _ignore(*_args: Any) -> None:
    """The pika consumer callback: deliveries reach it only after the fast path stopped (self.error)."""


def to_delivery(item: tuple) -> tuple[Deliver, pika.spec.BasicProperties, bytes]:
    """(method, properties, body) of one ``scan_deliveries`` tuple, as the queue reader's sink takes them."""
    tag, redelivered, exchange, routing_key, raw, body = item
    return Deliver(tag, redelivered, exchange, routing_key), properties(raw), body
