"""Where a stream ends, asked over the RabbitMQ stream protocol before a backup reads it.

Over AMQP 0-9-1 a stream has no end a consumer can see (a passive declare
reports 0 on 3.10 and a sampled figure on 4.x), so without this the read can
only stop after a quiet second. The stream protocol delivers whole chunks
with their header: subscribing at ``last`` delivers the newest committed
chunk, whose ``first offset + record count - 1`` is the stream's last offset
at that moment, exactly. Works on 3.10 (which lacks ``StreamStats``) and 4.x.

Only the handshake, one subscription with one chunk of credit, an
unsubscribe and a close are spoken; no message is decoded. The broker sends
the ``last`` chunk while it handles the subscribe, before it answers the
unsubscribe that follows, so no delivery by then means it found no chunk.
That answer alone is not trusted (a chunk written but not yet committed is
not delivered): on 3.11+ ``StreamStats`` confirms it (no chunk written, none
committed), and on 3.10, which lacks it, the caller falls back to the
quiet-period end, as it does whenever this probe cannot run (no stream
listener on ``stream_port``, another broker on that port).

Why not ``rstream`` (the RabbitMQ team's client, which the benchmarks use): its 1.1.1 has no
``StreamStats`` command, and its frame decoder looks every response key up in its own enum,
so a ``StreamStats`` answer would end its connection; adding the command would mean patching
its registry for the whole process. It is also asyncio-only, and this probe is four
commands on a blocking socket before a synchronous read.
"""

from __future__ import annotations

import logging
import socket
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING
from ..errors import StreamProtocolError

if TYPE_CHECKING:
    from ..config import ConnectionConfig

log = logging.getLogger(__name__)

_PEER_PROPERTIES, _SASL_HANDSHAKE, _SASL_AUTHENTICATE, _TUNE, _OPEN, _CLOSE = 0x11, 0x12, 0x13, 0x14, 0x15, 0x16
_SUBSCRIBE, _DELIVER, _UNSUBSCRIBE, _HEARTBEAT, _STREAM_STATS = 0x07, 0x08, 0x0C, 0x17, 0x1C
_RESPONSE = 0x8000
_OK = 1
_OFFSET_LAST = 2
_CHUNK_HEADER = struct.Struct(">bbHIqQQiIII")  # osiris chunk header, after the subscription id


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The newest committed chunk: its first offset and its last one (the stream's end)."""

    chunk_first: int
    last_offset: int  # -1: the stream is empty (confirmed by StreamStats)

    @property
    def empty(self) -> bool:
        return self.last_offset < 0


EMPTY = StreamEnd(-1, -1)
STATS_SINCE = (3, 11)  # the first RabbitMQ with the StreamStats command


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def _map(d: dict[str, str]) -> bytes:
    return struct.pack(">i", len(d)) + b"".join(_string(k) + _string(v) for k, v in d.items())


def _read_map(buf: bytes, pos: int) -> tuple[dict[str, str], int]:
    (n,), pos = struct.unpack_from(">i", buf, pos), pos + 4
    out = {}
    for _ in range(max(n, 0)):
        k, pos = _read_string(buf, pos)
        v, pos = _read_string(buf, pos)
        out[k] = v
    return out, pos


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    if n < 0:
        return "", pos
    return buf[pos:pos + n].decode(errors="replace"), pos + n


class _Conn:
    """A blocking stream-protocol connection: frames out, frames in, correlation ids."""

    def __init__(self, host: str, port: int, timeout: float, tls=None):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # tune + open go out back to back
        if tls is not None:
            ctx, server_name = tls
            self.sock = ctx.wrap_socket(self.sock, server_hostname=server_name)
        self.sock.settimeout(timeout)
        self.corr = 0
        self.buf = bytearray()

    def send(self, key: int, body: bytes, version: int = 1) -> None:
        frame = struct.pack(">HH", key, version) + body
        self.sock.sendall(struct.pack(">I", len(frame)) + frame)

    def request(self, key: int, body: bytes) -> int:
        self.corr += 1
        self.send(key, struct.pack(">I", self.corr) + body)
        return self.corr

    def frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.buf) >= 4:
                (size,) = struct.unpack_from(">I", self.buf)
                if len(self.buf) >= 4 + size:
                    data = bytes(self.buf[4:4 + size])
                    del self.buf[:4 + size]
                    (key,) = struct.unpack_from(">H", data)
                    return key, data[4:]
            chunk = self.sock.recv(65536)
            if not chunk:
                raise StreamProtocolError("the broker closed the stream connection")
            self.buf += chunk

    def response(self, key: int, corr: int, on_other=None) -> bytes:
        """The response to request ``corr`` (after its code is checked); other frames go to ``on_other``."""
        while True:
            k, body = self.frame()
            if k == (key | _RESPONSE) and struct.unpack_from(">I", body)[0] == corr:
                (code,) = struct.unpack_from(">H", body, 4)
                if code != _OK:
                    raise StreamProtocolError(f"command 0x{key:02x} answered with response code {code}")
                return body[6:]
            if k == _HEARTBEAT:
                continue
            if on_other is not None:
                on_other(k, body)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _open(host: str, port: int, vhost: str, user: str, password: str, timeout: float,
          tls=None) -> tuple[_Conn, dict[str, str]]:
    """A connection opened on ``vhost``, with the server's peer properties (its cluster name)."""
    c = _Conn(host, port, timeout, tls)
    try:
        body = c.response(_PEER_PROPERTIES, c.request(_PEER_PROPERTIES, _map({"product": "rbak"})))
        props, _ = _read_map(body, 0)
        c.response(_SASL_HANDSHAKE, c.request(_SASL_HANDSHAKE, b""))
        auth = f"\0{user}\0{password}".encode()
        c.response(_SASL_AUTHENTICATE, c.request(_SASL_AUTHENTICATE, _string("PLAIN") + struct.pack(">i", len(auth)) + auth))
        while True:  # the server's tune comes before open; echo it (no heartbeats: the probe lasts ms)
            k, body = c.frame()
            if k == _TUNE:
                c.send(_TUNE, struct.pack(">II", struct.unpack_from(">I", body)[0], 0))
                break
        c.response(_OPEN, c.request(_OPEN, _string(vhost)))
        return c, props
    except BaseException:
        c.close()
        raise


def stream_cluster(cfg: "ConnectionConfig") -> str | None:
    """The cluster name the listener on ``cfg.stream_port`` gives in its peer properties (before any login),
    so a start can refuse a port of another cluster, where every probe would only fall back."""
    from .connect import ssl_context

    ctx = (ssl_context(cfg), cfg.tls.server_name or cfg.host) if cfg.use_tls else None
    c = _Conn(cfg.host, cfg.stream_port, cfg.connection_timeout_secs, ctx)
    try:
        props, _ = _read_map(c.response(_PEER_PROPERTIES, c.request(_PEER_PROPERTIES, _map({"product": "rbak"}))), 0)
    finally:
        c.close()
    return props.get("cluster_name")


NO_STREAM_LISTENER = (StreamProtocolError, OSError, struct.error)  # what ``stream_cluster`` raises when none answers


def foreign_stream_cluster(cfg: "ConnectionConfig", cluster: str | None) -> str | None:
    """The cluster ``cfg.stream_port`` answers for when it is not ``cluster`` (the 5552 default on a host running
    several brokers); None when it is the same or either name is unknown. Raises one of ``NO_STREAM_LISTENER``
    when nobody answers there; each caller says what that costs it."""
    stream = stream_cluster(cfg)
    return stream if cluster and stream and stream != cluster else None


def _version(v: str) -> tuple[int, ...]:
    """``"4.3.6"`` -> (4, 3, 6); anything unparsable -> () (older than every release)."""
    parts = []
    for p in v.split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def _stats(body: bytes) -> dict[str, int]:
    (n,), pos = struct.unpack_from(">i", body, 0), 4
    out = {}
    for _ in range(max(n, 0)):
        k, pos = _read_string(body, pos)
        (out[k],), pos = struct.unpack_from(">q", body, pos), pos + 8
    return out


def stream_end(host: str, port: int, vhost: str, stream: str, user: str, password: str, *,
               cluster_name: str | None = None, timeout: float = 10.0, tls=None,
               settled: bool = False) -> StreamEnd | None:
    """The stream's newest committed chunk, ``EMPTY`` when the broker confirmed it holds none, or None
    when it delivered none and could not confirm that (3.10): the caller must not rely on that. ``cluster_name``: the AMQP connection's;
    a stream listener of another cluster on this port is refused (``StreamProtocolError``).
    ``tls``: ``(SSLContext, server name)`` for a TLS stream listener. ``settled``: only an end no
    written-but-uncommitted chunk can still extend (confirmed by StreamStats, so None on 3.10): a
    restore resuming into the stream must see every message a killed run left there."""
    try:
        c, props = _open(host, port, vhost, user, password, timeout, tls)
    except (OSError, struct.error) as e:
        raise StreamProtocolError(f"cannot open a stream connection to {host}:{port} ({e})") from None
    try:
        if cluster_name is not None and props.get("cluster_name") not in (None, cluster_name):
            raise StreamProtocolError(f"{host}:{port} belongs to cluster {props.get('cluster_name')!r}, "
                                      f"not {cluster_name!r}")
        end = _end_on(c, props, stream, settled)
        try:
            c.request(_CLOSE, struct.pack(">H", 1) + _string("rbak: done"))
        except OSError:
            pass
        return end
    except (OSError, struct.error) as e:
        raise StreamProtocolError(f"stream connection to {host}:{port} failed ({e})") from None
    finally:
        c.close()


def _end_on(c: _Conn, props: dict[str, str], stream: str, settled: bool) -> StreamEnd | None:
    """``stream_end`` on an open connection (one subscription at a time: id 1, unsubscribed before return)."""
    chunks: list[StreamEnd] = []

    def on_frame(key: int, body: bytes) -> None:
        if key == _DELIVER and body[:1] == b"\x01":
            _magic, _type, _entries, records, _ts, _epoch, first, *_ = _CHUNK_HEADER.unpack_from(body, 1)
            chunks.append(StreamEnd(first, first + records - 1))

    c.response(_SUBSCRIBE, c.request(_SUBSCRIBE, b"\x01" + _string(stream) + struct.pack(">HH", _OFFSET_LAST, 1)
                                      + _map({})), on_frame)
    c.response(_UNSUBSCRIBE, c.request(_UNSUBSCRIBE, b"\x01"), on_frame)
    end = max(chunks, key=lambda e: e.last_offset) if chunks else None
    if (end is None or settled) and _version(props.get("version", "")) >= STATS_SINCE:
        stats = _stats(c.response(_STREAM_STATS, c.request(_STREAM_STATS, _string(stream))))
        committed, written = stats.get("committed_chunk_id"), stats.get("last_chunk_id")
        if end is None and committed == -1 and written == -1:
            end = EMPTY  # nothing written, nothing committed
        elif settled and (end is None or committed != written or committed != end.chunk_first):
            end = None  # a chunk is written but not yet committed: the end is still moving
    elif settled:
        end = None  # 3.10: no StreamStats to confirm nothing is in flight
    return end


def _ends_on(c: _Conn, props: dict[str, str], streams: list[str]) -> dict[str, StreamEnd | None]:
    """``_end_on`` for up to 255 streams at once, pipelined: every subscribe (ids 1..n) goes out before
    any answer is read, then every unsubscribe, so the probe costs one round trip, not one per stream.
    A stream the broker refuses (gone) is absent from the answer; None: no chunk and none confirmed."""
    chunks: dict[int, StreamEnd] = {}
    refused: set[int] = set()
    pending: dict[int, int] = {}  # correlation id -> subscription id

    def on_frame(key: int, body: bytes) -> None:
        if key == _DELIVER:
            sub = body[0]
            _magic, _type, _entries, records, _ts, _epoch, first, *_ = _CHUNK_HEADER.unpack_from(body, 1)
            end = StreamEnd(first, first + records - 1)
            if sub not in chunks or chunks[sub].last_offset < end.last_offset:
                chunks[sub] = end

    def answers(key: int) -> None:
        while pending:
            k, body = c.frame()
            corr = struct.unpack_from(">I", body)[0] if k & _RESPONSE else None
            if k == (key | _RESPONSE) and corr in pending:
                if struct.unpack_from(">H", body, 4)[0] != _OK:
                    refused.add(pending[corr])
                del pending[corr]
            elif k != _HEARTBEAT:
                on_frame(k, body)

    for i, stream in enumerate(streams, 1):
        pending[c.request(_SUBSCRIBE, bytes([i]) + _string(stream) + struct.pack(">HH", _OFFSET_LAST, 1)
                          + _map({}))] = i
    answers(_SUBSCRIBE)
    for i in range(1, len(streams) + 1):
        if i not in refused:
            pending[c.request(_UNSUBSCRIBE, bytes([i]))] = i
    answers(_UNSUBSCRIBE)
    out: dict[str, StreamEnd | None] = {}
    stats = _version(props.get("version", "")) >= STATS_SINCE
    for i, stream in enumerate(streams, 1):
        if i in refused:
            continue
        end = chunks.get(i)
        if end is None and stats:
            st = _stats(c.response(_STREAM_STATS, c.request(_STREAM_STATS, _string(stream))))
            if st.get("committed_chunk_id") == -1 and st.get("last_chunk_id") == -1:
                end = EMPTY
        out[stream] = end
    return out


class EndProber:
    """Committed ends of many streams of one vhost on one stream-protocol connection, kept open
    between probes (``rbak archive`` probes every stream it follows at each tick: one connection per
    probe was a TCP and SASL handshake per stream per tick), all of them in one pipelined round trip.
    A failed probe closes the connection (the next one opens another) and answers None."""

    def __init__(self, cfg: "ConnectionConfig", conn, vhost: str):
        self.cfg, self.vhost = cfg, vhost
        cluster = (conn.server_properties or {}).get("cluster_name")
        self.cluster = cluster.decode(errors="replace") if isinstance(cluster, bytes) else cluster
        self._c: _Conn | None = None
        self._props: dict[str, str] = {}

    def ends(self, streams: list[str]) -> dict[str, int | None] | None:
        """Every stream's committed end (-1: empty; None: no chunk, unconfirmed) in one pipelined round
        trip (``_ends_on``), at most 255 at once; a stream the broker refused is absent; None when the
        stream protocol could not be asked at all."""
        out: dict[str, int | None] = {}
        try:
            for i in range(0, len(streams), 255):
                c = self._connect()
                for name, end in _ends_on(c, self._props, streams[i:i + 255]).items():
                    out[name] = end.last_offset if end is not None else None
        except (StreamProtocolError, OSError, struct.error) as e:
            self.close()
            log.info("vhost %r: the stream protocol on port %d did not answer (%s)", self.vhost, self.cfg.stream_port, e)
            return None
        return out

    def _connect(self) -> _Conn:
        from .connect import ssl_context

        cfg = self.cfg
        if self._c is None:
            ctx = (ssl_context(cfg), cfg.tls.server_name or cfg.host) if cfg.use_tls else None
            try:
                self._c, self._props = _open(cfg.host, cfg.stream_port, self.vhost, cfg.username, cfg.password,
                                             cfg.connection_timeout_secs, ctx)
            except (OSError, struct.error) as e:
                raise StreamProtocolError(f"cannot open a stream connection to {cfg.host}:{cfg.stream_port} "
                                          f"({e})") from None
            got = self._props.get("cluster_name")
            if self.cluster is not None and got not in (None, self.cluster):
                self.close()
                raise StreamProtocolError(f"{cfg.host}:{cfg.stream_port} belongs to cluster {got!r}, "
                                          f"not {self.cluster!r}")
        return self._c

    def close(self) -> None:
        if self._c is not None:
            self._c.close()
            self._c = None


def probe_end(cfg: "ConnectionConfig", conn, vhost: str, stream: str, settled: bool = False) -> int | None:
    """The stream's last offset (-1: empty) for broker ``cfg`` whose AMQP connection is ``conn``;
    None when the stream protocol cannot say (the caller reads until a quiet period)."""
    from .connect import ssl_context

    try:
        ctx = (ssl_context(cfg), cfg.tls.server_name or cfg.host) if cfg.use_tls else None
        cluster = (conn.server_properties or {}).get("cluster_name")
        if isinstance(cluster, bytes):
            cluster = cluster.decode(errors="replace")
        end = stream_end(cfg.host, cfg.stream_port, vhost, stream, cfg.username, cfg.password,
                         cluster_name=cluster, timeout=cfg.connection_timeout_secs, tls=ctx, settled=settled)
    except (StreamProtocolError, OSError) as e:
        log.info("stream %r in vhost %r: the end is found by a quiet period (stream protocol on port %d: %s)",
                 stream, vhost, cfg.stream_port, e)
        return None
    return end.last_offset if end is not None else None
