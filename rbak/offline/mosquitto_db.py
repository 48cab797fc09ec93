"""Mosquitto's persistence file (``mosquitto.db``): typed chunks, reader, writer.

Layout as Mosquitto 1.4-2.0 reads it (``src/persist_read*.c``) and 2.0 writes
it (``persist_write*.c``, format version 6):

* Header, 23 bytes: magic ``00 B5 00 "mosquitto db"``, CRC u32 (always 0,
  never checked), version u32 big-endian. Versions 2-6 are read.
* Chunks: header (type u32 + length u32 in v5/v6; type u16 + length u32 in
  v2-v4, all big-endian), then the body.
* v5/v6 bodies are C structs written with ``fwrite``: 16/32-bit fields are
  big-endian, but the 64-bit ones (``last_db_id``, ``store_id``,
  ``expiry_time``, ``session_expiry_time``) are in *host* order, i.e.
  little-endian on every machine Mosquitto ships for; structs carry padding
  (CFG 16 bytes, CLIENT 24, SUB 12). v2-v4 bodies are field by field, with
  ``store_id`` also host order.
* Like Mosquitto, the length field is used only to size the MQTT v5 property
  block of MSG_STORE and CLIENT_MSG chunks and to skip unknown chunks; CFG,
  RETAIN, SUB and CLIENT are read by their fixed size plus strings (Mosquitto's
  own fixtures contain a RETAIN chunk of length 0).
* Mosquitto 2.0.0-2.0.15 reused one CLIENT struct for all clients, so a client
  without a username may carry the previous client's ``username_len`` (byte
  swapped) and that many stale bytes; the lengths stay consistent, so the
  username is kept as raw bytes and never trusted.

64-bit host order is assumed little-endian (``HOST_ORDER``); pass
``byte_order=">"`` for a file written on a big-endian machine.
"""

from __future__ import annotations

import enum
import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Union

from ..errors import ImportFormatError

MAGIC = b"\x00\xb5\x00mosquitto db"
HEADER_SIZE = 23
SUPPORTED_VERSIONS = (2, 3, 4, 5, 6)
WRITE_VERSION = 6
DBID_SIZE = 8
MQTT_MAX_PAYLOAD = 268_435_455
HOST_ORDER = "<"


class ChunkType(enum.IntEnum):
    CFG = 1
    MSG_STORE = 2
    CLIENT_MSG = 3
    RETAIN = 4
    SUB = 5
    CLIENT = 6


class MsgState(enum.IntEnum):
    """``enum mosquitto_msg_state`` (lib/mosquitto_internal.h)."""

    INVALID = 0
    PUBLISH_QOS0 = 1
    PUBLISH_QOS1 = 2
    WAIT_FOR_PUBACK = 3
    PUBLISH_QOS2 = 4
    WAIT_FOR_PUBREC = 5
    RESEND_PUBREL = 6
    WAIT_FOR_PUBREL = 7
    RESEND_PUBCOMP = 8
    WAIT_FOR_PUBCOMP = 9
    SEND_PUBREC = 10
    QUEUED = 11


class Direction(enum.IntEnum):
    IN = 0   # from a publishing client, not yet released (QoS 2)
    OUT = 1  # to a subscribing client


# --------------------------------------------------------------------------
# MQTT v5 properties (the block after a stored message / client message).
# --------------------------------------------------------------------------


class PropType(enum.Enum):
    BYTE = 1
    U16 = 2
    U32 = 3
    VARINT = 4
    STRING = 5
    BINARY = 6
    PAIR = 7


# Property identifier -> wire type (MQTT 5.0 section 2.2.2.2).
PROPERTY_TYPES: dict[int, PropType] = {
    1: PropType.BYTE, 2: PropType.U32, 3: PropType.STRING, 8: PropType.STRING,
    9: PropType.BINARY, 11: PropType.VARINT, 17: PropType.U32, 18: PropType.STRING,
    19: PropType.U16, 21: PropType.STRING, 22: PropType.BINARY, 23: PropType.BYTE,
    24: PropType.U32, 25: PropType.BYTE, 26: PropType.STRING, 28: PropType.STRING,
    31: PropType.STRING, 33: PropType.U16, 34: PropType.U16, 35: PropType.U16,
    36: PropType.BYTE, 37: PropType.BYTE, 38: PropType.PAIR, 39: PropType.U32,
    40: PropType.BYTE, 41: PropType.BYTE, 42: PropType.BYTE,
}
PAYLOAD_FORMAT_INDICATOR = 1
MESSAGE_EXPIRY_INTERVAL = 2
CONTENT_TYPE = 3
RESPONSE_TOPIC = 8
CORRELATION_DATA = 9
SUBSCRIPTION_IDENTIFIER = 11
TOPIC_ALIAS = 35
USER_PROPERTY = 38

PropValue = Union[int, str, bytes, tuple[str, str]]


@dataclass(frozen=True, slots=True)
class MqttProperties:
    """The property list in file order; ``(identifier, value)`` pairs.

    Strings are ``str`` (UTF-8, undecodable bytes kept via surrogateescape so
    writing them back is exact), binary data ``bytes``, user properties
    ``(name, value)``.
    """

    items: tuple[tuple[int, PropValue], ...] = ()

    def first(self, ident: int) -> PropValue | None:
        for k, v in self.items:
            if k == ident:
                return v
        return None

    @property
    def content_type(self) -> str | None:
        return self.first(CONTENT_TYPE)  # type: ignore[return-value]

    @property
    def response_topic(self) -> str | None:
        return self.first(RESPONSE_TOPIC)  # type: ignore[return-value]

    @property
    def correlation_data(self) -> bytes | None:
        return self.first(CORRELATION_DATA)  # type: ignore[return-value]

    @property
    def payload_format_indicator(self) -> int | None:
        return self.first(PAYLOAD_FORMAT_INDICATOR)  # type: ignore[return-value]

    @property
    def message_expiry_interval(self) -> int | None:
        return self.first(MESSAGE_EXPIRY_INTERVAL)  # type: ignore[return-value]

    @property
    def user_properties(self) -> tuple[tuple[str, str], ...]:
        return tuple(v for k, v in self.items if k == USER_PROPERTY)  # type: ignore[misc]

    @property
    def subscription_identifiers(self) -> tuple[int, ...]:
        return tuple(v for k, v in self.items if k == SUBSCRIPTION_IDENTIFIER)  # type: ignore[misc]

    def __bool__(self) -> bool:
        return bool(self.items)


NO_PROPERTIES = MqttProperties()


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def _name(b: bytes, pos: int, what: str) -> str:
    """A client id or topic: it names a queue or a routing key, so it must be UTF-8 (MQTT requires it)."""
    try:
        return bytes(b).decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Damage(pos + e.start, f"{what} is not valid UTF-8 (byte {bytes(b)[e.start]:#04x} at {e.start} "
                                     f"of {len(b)}): {bytes(b)[:64]!r}") from None


def _raw(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def encode_varint(n: int) -> bytes:
    if n < 0 or n > 268_435_455:
        raise ValueError(f"variable byte integer out of range: {n}")
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def encode_properties(props: MqttProperties) -> bytes:
    """Property block as in a v5 PUBLISH: varint length + properties."""
    body = bytearray()
    for ident, value in props.items:
        t = PROPERTY_TYPES.get(ident)
        if t is None:
            raise ValueError(f"unknown MQTT property identifier {ident}")
        body += encode_varint(ident)
        if t is PropType.BYTE:
            body.append(int(value))  # type: ignore[arg-type]
        elif t is PropType.U16:
            body += struct.pack(">H", value)
        elif t is PropType.U32:
            body += struct.pack(">I", value)
        elif t is PropType.VARINT:
            body += encode_varint(int(value))  # type: ignore[arg-type]
        elif t is PropType.STRING:
            raw = _raw(value)  # type: ignore[arg-type]
            body += struct.pack(">H", len(raw)) + raw
        elif t is PropType.BINARY:
            body += struct.pack(">H", len(value)) + bytes(value)  # type: ignore[arg-type]
        else:
            k, v = value  # type: ignore[misc]
            rk, rv = _raw(k), _raw(v)
            body += struct.pack(">H", len(rk)) + rk + struct.pack(">H", len(rv)) + rv
    return encode_varint(len(body)) + bytes(body)


# --------------------------------------------------------------------------
# Chunks.
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DbHeader:
    version: int
    crc: int = 0


@dataclass(slots=True)
class CfgChunk:
    last_db_id: int
    shutdown: bool
    dbid_size: int = DBID_SIZE
    offset: int = -1


@dataclass(slots=True)
class MsgStoreChunk:
    """A stored message; clients and retained entries refer to it by ``store_id``."""

    store_id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    expiry_time: int = 0           # unix seconds, 0 = never
    source_mid: int = 0
    source_id: str | None = None
    source_username: str | None = None
    source_port: int = 0
    properties: MqttProperties = NO_PROPERTIES
    offset: int = -1


@dataclass(slots=True)
class ClientMsgChunk:
    """One message in a persistent client's session (in flight or queued)."""

    store_id: int
    client_id: str
    mid: int
    qos: int
    state: int
    direction: int
    retain: bool = False
    dup: bool = False
    properties: MqttProperties = NO_PROPERTIES
    offset: int = -1


@dataclass(slots=True)
class RetainChunk:
    store_id: int
    offset: int = -1


@dataclass(slots=True)
class SubChunk:
    client_id: str
    topic: str
    qos: int
    identifier: int = 0
    options: int = 0
    offset: int = -1


@dataclass(slots=True)
class ClientChunk:
    """A persistent session. ``username`` is raw bytes: see the 2.0.11 note above."""

    client_id: str
    last_mid: int = 0
    session_expiry_time: int = 0
    session_expiry_interval: int = 0
    listener_port: int = 0
    username: bytes | None = None
    disconnect_time: int | None = None  # v3/v4 only (time_t, unused by Mosquitto)
    offset: int = -1


@dataclass(slots=True)
class UnknownChunk:
    chunk_type: int
    data: bytes
    offset: int = -1


Chunk = Union[CfgChunk, MsgStoreChunk, ClientMsgChunk, RetainChunk, SubChunk, ClientChunk, UnknownChunk]


@dataclass(slots=True)
class DamagedRegion:
    """What ``skip_damaged`` stepped over: offset, byte count (None = to EOF), why."""

    offset: int
    length: int | None
    chunk_type: int | None
    reason: str


@dataclass(slots=True)
class MosquittoDb:
    path: str
    header: DbHeader
    size: int = 0
    cfg: CfgChunk | None = None
    chunks: list[Chunk] = field(default_factory=list)
    damaged: list[DamagedRegion] = field(default_factory=list)

    def of_type(self, cls: type) -> Iterator:
        return (c for c in self.chunks if isinstance(c, cls))

    @property
    def msg_stores(self) -> dict[int, MsgStoreChunk]:
        return {c.store_id: c for c in self.of_type(MsgStoreChunk)}

    @property
    def clients(self) -> list[ClientChunk]:
        return list(self.of_type(ClientChunk))

    @property
    def client_msgs(self) -> list[ClientMsgChunk]:
        return list(self.of_type(ClientMsgChunk))

    @property
    def retains(self) -> list[RetainChunk]:
        return list(self.of_type(RetainChunk))

    @property
    def subs(self) -> list[SubChunk]:
        return list(self.of_type(SubChunk))


# --------------------------------------------------------------------------
# Reader.
# --------------------------------------------------------------------------


class _Damage(Exception):
    """Internal: a chunk could not be decoded; carries the offset."""

    def __init__(self, offset: int, reason: str):
        self.offset = offset
        self.reason = reason


class _Cur:
    __slots__ = ("buf", "pos", "end", "u64")

    def __init__(self, buf: bytes, pos: int, end: int, byte_order: str):
        self.buf = buf
        self.pos = pos
        self.end = end
        self.u64 = struct.Struct(byte_order + "Q")

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > self.end:
            raise _Damage(self.pos, f"truncated {what}: needs {n} bytes, {max(self.end - self.pos, 0)} left")
        v = self.buf[self.pos:self.pos + n]
        self.pos += n
        return v

    def unpack(self, st: struct.Struct, what: str) -> tuple:
        return st.unpack(self.take(st.size, what))

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return int.from_bytes(self.take(2, what), "big")

    def u32(self, what: str) -> int:
        return int.from_bytes(self.take(4, what), "big")

    def hu64(self, what: str) -> int:
        return self.u64.unpack(self.take(8, what))[0]

    def string(self, n: int, what: str) -> str:
        return _text(bytes(self.take(n, what)))

    def lstring(self, what: str) -> str:
        return self.string(self.u16(what + " length"), what)

    def name(self, n: int, what: str) -> str:
        at = self.pos
        return _name(self.take(n, what), at, what)

    def lname(self, what: str) -> str:
        return self.name(self.u16(what + " length"), what)

    def varint(self, what: str) -> int:
        n, mult = 0, 1
        for _ in range(4):
            b = self.u8(what)
            n += (b & 0x7F) * mult
            if not b & 0x80:
                return n
            mult *= 128
        raise _Damage(self.pos, f"malformed variable byte integer in {what}")


_HDR56 = struct.Struct(">II")
_HDR234 = struct.Struct(">HI")
# Fixed parts (16/32-bit big-endian; 64-bit fields read separately in host order).
_MSG_STORE_TAIL = struct.Struct(">IHHHHHBB")     # after store_id + expiry_time
_CLIENT_MSG_TAIL = struct.Struct(">HHBBBB")      # after store_id
_SUB = struct.Struct(">IHHBBxx")                 # 12 bytes incl. padding
_CLIENT_V6_TAIL = struct.Struct(">IHHHHxxxx")    # after session_expiry_time: 16 bytes
_CLIENT_V5_TAIL = struct.Struct(">IHH")          # 8 bytes


def _parse_properties(c: _Cur, end: int) -> MqttProperties:
    total = c.varint("property block length")
    if c.pos + total != end:
        raise _Damage(c.pos, f"property block length {total} does not fill the chunk ({end - c.pos} bytes left)")
    items: list[tuple[int, PropValue]] = []
    while c.pos < end:
        ident_at = c.pos
        ident = c.varint("property identifier")
        t = PROPERTY_TYPES.get(ident)
        if t is None:
            raise _Damage(ident_at, f"unknown MQTT property identifier {ident}")
        if t is PropType.BYTE:
            v: PropValue = c.u8("byte property")
        elif t is PropType.U16:
            v = c.u16("two-byte property")
        elif t is PropType.U32:
            v = c.u32("four-byte property")
        elif t is PropType.VARINT:
            v = c.varint("varint property")
        elif t is PropType.STRING:
            v = c.lstring("string property")
        elif t is PropType.BINARY:
            v = bytes(c.take(c.u16("binary property length"), "binary property"))
        else:
            v = (c.lstring("user property name"), c.lstring("user property value"))
        items.append((ident, v))
    return MqttProperties(tuple(items))


class _Reader:
    def __init__(self, path: str, buf: bytes, byte_order: str, skip_damaged: bool):
        self.path = path
        self.buf = buf
        self.size = len(buf)
        self.byte_order = byte_order
        self.skip_damaged = skip_damaged
        self.qq = struct.Struct(byte_order + "Qq")
        self.q = struct.Struct(byte_order + "Q")

    def fail(self, offset: int, reason: str) -> ImportFormatError:
        return ImportFormatError(f"{self.path}: byte offset {offset}: {reason}")

    def read(self) -> MosquittoDb:
        buf = self.buf
        if self.size == 0:
            raise self.fail(0, "file is empty: not a Mosquitto persistence file")
        if self.size < 15 or bytes(buf[:15]) != MAGIC:
            raise self.fail(0, "not a Mosquitto persistence file (bad magic; expected 00 B5 00 'mosquitto db')")
        if self.size < HEADER_SIZE:
            raise self.fail(15, f"truncated file header ({self.size} of {HEADER_SIZE} bytes)")
        crc, version = struct.unpack_from(">II", buf, 15)
        if version not in SUPPORTED_VERSIONS:
            raise self.fail(19, f"unsupported database version {version} (supported: 2-6)")
        db = MosquittoDb(self.path, DbHeader(version, crc), self.size)
        pos = HEADER_SIZE
        v56 = version >= 5
        hdr = _HDR56 if v56 else _HDR234
        while pos < self.size:
            if pos + hdr.size > self.size:
                reason = f"truncated chunk header ({self.size - pos} of {hdr.size} bytes)"
                if not self.skip_damaged:
                    raise self.fail(pos, reason)
                db.damaged.append(DamagedRegion(pos, self.size - pos, None, reason))
                break
            ctype, length = hdr.unpack_from(buf, pos)
            body = pos + hdr.size
            try:
                chunk, nxt = self.chunk(ctype, length, body, version)
            except _Damage as d:
                reason = f"{_type_name(ctype)} chunk at offset {pos}: {d.reason}"
                if not self.skip_damaged:
                    raise self.fail(d.offset, reason) from None
                if length and body + length <= self.size and ctype in _KNOWN:
                    db.damaged.append(DamagedRegion(pos, hdr.size + length, ctype, f"{reason} (byte offset {d.offset})"))
                    pos = body + length
                    continue
                db.damaged.append(DamagedRegion(pos, None, ctype, f"{reason} (byte offset {d.offset}); rest of file unreadable"))
                break
            if isinstance(chunk, CfgChunk):
                db.cfg = chunk
            db.chunks.append(chunk)
            pos = nxt
        return db

    def chunk(self, ctype: int, length: int, body: int, version: int) -> tuple[Chunk, int]:
        order = self.byte_order
        v56 = version >= 5
        if ctype not in _KNOWN:
            if ctype == 0:  # no Mosquitto writes it: zeroed or junk data (else a run of zeros is millions of chunks)
                raise _Damage(body - (8 if v56 else 6), "chunk type 0 is not a Mosquitto chunk (zeroed or junk data)")
            if body + length > self.size:
                raise _Damage(body, f"chunk length {length} runs past the end of the file ({self.size - body} bytes left)")
            return UnknownChunk(ctype, bytes(self.buf[body:body + length]), body - (8 if v56 else 6)), body + length
        off = body - (8 if v56 else 6)
        # Bodies of MSG_STORE/CLIENT_MSG (v5/v6) are bounded by the length;
        # the others, as in Mosquitto, by the file only.
        bounded = v56 and ctype in (ChunkType.MSG_STORE, ChunkType.CLIENT_MSG)
        if bounded and body + length > self.size:
            raise _Damage(body, f"chunk length {length} runs past the end of the file ({self.size - body} bytes left)")
        if bounded:  # the hot chunks of a big file: fixed parts by unpack_from, no cursor
            if ctype == ChunkType.MSG_STORE:
                return self.msg_store_v56(body, length, off)
            return self.client_msg_v56(body, length, off)
        c = _Cur(self.buf, body, self.size, order)
        if ctype == ChunkType.CFG:
            if v56:
                last = c.hu64("CFG last_db_id")
                shutdown = c.u8("CFG shutdown")
                dbid_size = c.u8("CFG dbid_size")
                c.take(6, "CFG struct padding")
            else:
                shutdown = c.u8("CFG shutdown")
                dbid_size = c.u8("CFG dbid_size")
                last = c.hu64("CFG last_db_id")
            if dbid_size != DBID_SIZE:
                raise _Damage(off, f"CFG dbid_size is {dbid_size}, expected {DBID_SIZE}")
            return CfgChunk(last, bool(shutdown), dbid_size, off), c.pos
        if ctype == ChunkType.MSG_STORE:
            return self.msg_store_v234(c, version, off)
        if ctype == ChunkType.CLIENT_MSG:  # v2-v4
            client_id = c.lname("CLIENT_MSG client id")
            store_id = c.hu64("CLIENT_MSG store_id")
            mid = c.u16("CLIENT_MSG mid")
            qos = c.u8("CLIENT_MSG qos")
            retain = c.u8("CLIENT_MSG retain")
            direction = c.u8("CLIENT_MSG direction")
            state = c.u8("CLIENT_MSG state")
            dup = c.u8("CLIENT_MSG dup")
            _check_qos(qos, c.pos, "CLIENT_MSG")
            return ClientMsgChunk(store_id, client_id, mid, qos, state, direction, bool(retain & 0x0F),
                                  bool(dup), NO_PROPERTIES, off), c.pos
        if ctype == ChunkType.RETAIN:
            return RetainChunk(c.hu64("RETAIN store_id"), off), c.pos
        if ctype == ChunkType.SUB:
            if v56:
                identifier, id_len, topic_len, qos, options = c.unpack(_SUB, "SUB fields")
                client_id = c.name(id_len, "SUB client id")
                topic = c.name(topic_len, "SUB topic")
            else:
                identifier, options = 0, 0
                client_id = c.lname("SUB client id")
                topic = c.lname("SUB topic")
                qos = c.u8("SUB qos")
            return SubChunk(client_id, topic, qos, identifier, options, off), c.pos
        # CLIENT
        if version == 6:
            sexp = c.unpack(struct.Struct(order + "q"), "CLIENT session_expiry_time")[0]
            interval, last_mid, id_len, port, ulen = c.unpack(_CLIENT_V6_TAIL, "CLIENT fields")
            client_id = c.name(id_len, "CLIENT client id")
            username = bytes(c.take(ulen, "CLIENT username")) if ulen else None
            disc = None
        elif version == 5:
            sexp = c.unpack(struct.Struct(order + "q"), "CLIENT session_expiry_time")[0]
            interval, last_mid, id_len = c.unpack(_CLIENT_V5_TAIL, "CLIENT fields")
            client_id = c.name(id_len, "CLIENT client id")
            port, username, disc = 0, None, None
        else:
            client_id = c.lname("CLIENT client id")
            last_mid = c.u16("CLIENT last_mid")
            disc = c.unpack(struct.Struct(order + "q"), "CLIENT disconnect time")[0] if version != 2 else None
            sexp, interval, port, username = 0, 0, 0, None
        if not client_id:
            raise _Damage(off, "CLIENT chunk with an empty client id")
        return ClientChunk(client_id, last_mid, sexp, interval, port, username, disc, off), c.pos

    def msg_store_v56(self, body: int, length: int, off: int) -> tuple[Chunk, int]:
        buf, end = self.buf, body + length  # end <= file size: checked by the caller
        if length < 32:
            raise _Damage(body, f"MSG_STORE chunk length {length} is smaller than its fixed part (32 bytes)")
        store_id, expiry = self.qq.unpack_from(buf, body)
        payloadlen, source_mid, id_len, user_len, topic_len, port, qos, retain = _MSG_STORE_TAIL.unpack_from(
            buf, body + 16)
        if payloadlen > MQTT_MAX_PAYLOAD:
            raise _Damage(body + 16, f"MSG_STORE payload length {payloadlen} exceeds the MQTT maximum")
        need = 32 + id_len + user_len + topic_len + payloadlen
        if need > length:
            raise _Damage(body, f"MSG_STORE chunk length {length} is smaller than its fields ({need} bytes)")
        if qos > 2:
            raise _Damage(body + 30, f"MSG_STORE QoS {qos} is not 0, 1 or 2")
        p = body + 32
        source_id = _text(buf[p:p + id_len]) if id_len else None
        p += id_len
        username = _text(buf[p:p + user_len]) if user_len else None
        p += user_len
        if not topic_len:
            raise _Damage(off, "MSG_STORE with an empty topic")
        topic = _name(buf[p:p + topic_len], p, "MSG_STORE topic")
        p += topic_len
        payload = buf[p:p + payloadlen]
        p += payloadlen
        props = _parse_properties(_Cur(buf, p, end, self.byte_order), end) if p < end else NO_PROPERTIES
        return MsgStoreChunk(store_id, topic, payload, qos, bool(retain), expiry, source_mid, source_id,
                             username, port, props, off), end

    def client_msg_v56(self, body: int, length: int, off: int) -> tuple[Chunk, int]:
        buf, end = self.buf, body + length
        if length < 16:
            raise _Damage(body, f"CLIENT_MSG chunk length {length} is smaller than its fixed part (16 bytes)")
        (store_id,) = self.q.unpack_from(buf, body)
        mid, id_len, qos, state, rd, direction = _CLIENT_MSG_TAIL.unpack_from(buf, body + 8)
        if 16 + id_len > length:
            raise _Damage(body, f"CLIENT_MSG chunk length {length} is smaller than its fields ({16 + id_len} bytes)")
        if qos > 2:
            raise _Damage(body + 12, f"CLIENT_MSG QoS {qos} is not 0, 1 or 2")
        p = body + 16
        client_id = _name(buf[p:p + id_len], p, "CLIENT_MSG client id")
        p += id_len
        props = _parse_properties(_Cur(buf, p, end, self.byte_order), end) if p < end else NO_PROPERTIES
        return ClientMsgChunk(store_id, client_id, mid, qos, state, direction, bool((rd & 0xF0) >> 4 & 0x0F),
                              bool(rd & 0x0F), props, off), end

    def msg_store_v234(self, c: _Cur, version: int, off: int) -> tuple[Chunk, int]:
        store_id = c.hu64("MSG_STORE store_id")
        source_id = c.lstring("MSG_STORE source id") or None
        username, port = None, 0
        if version == 4:
            username = c.lstring("MSG_STORE source username") or None
            port = c.u16("MSG_STORE source port")
        source_mid = c.u16("MSG_STORE source mid")
        c.u16("MSG_STORE mid")
        topic = c.lname("MSG_STORE topic")
        qos = c.u8("MSG_STORE qos")
        retain = c.u8("MSG_STORE retain")
        payloadlen = c.u32("MSG_STORE payload length")
        if payloadlen > MQTT_MAX_PAYLOAD:
            raise _Damage(c.pos - 4, f"MSG_STORE payload length {payloadlen} exceeds the MQTT maximum")
        payload = bytes(c.take(payloadlen, "MSG_STORE payload"))
        expiry, props = 0, NO_PROPERTIES
        _check_qos(qos, c.pos, "MSG_STORE")
        if not topic:
            raise _Damage(off, "MSG_STORE with an empty topic")
        return MsgStoreChunk(store_id, topic, payload, qos, bool(retain), expiry, source_mid, source_id,
                             username, port, props, off), c.pos


_KNOWN = frozenset(int(t) for t in ChunkType)


def _check_qos(qos: int, pos: int, what: str) -> None:
    if qos > 2:
        raise _Damage(pos, f"{what} QoS {qos} is not 0, 1 or 2")


def _type_name(ctype: int) -> str:
    try:
        return ChunkType(ctype).name
    except ValueError:
        return f"type-{ctype}"


def parse_db(data: bytes | memoryview, path: str = "<mosquitto.db>", *, skip_damaged: bool = False,
             byte_order: str = HOST_ORDER) -> MosquittoDb:
    """Decode a whole ``mosquitto.db`` image (errors name ``path`` and the byte offset)."""
    return _Reader(path, data if isinstance(data, bytes) else bytes(data), byte_order, skip_damaged).read()


def read_db(path: str | os.PathLike[str], *, skip_damaged: bool = False, byte_order: str = HOST_ORDER) -> MosquittoDb:
    """Read a persistence file (opened read-only; Mosquitto holds it all in memory too)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            head = f.read(len(MAGIC))
            if head != MAGIC:  # before anything else: /dev/zero or a huge junk file is never read whole
                return parse_db(head, p, skip_damaged=skip_damaged, byte_order=byte_order)
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ImportFormatError(f"{p}: not a regular file; copy the persistence file out first")
            if os.fstat(f.fileno()).st_size == 0:
                return parse_db(b"", p, skip_damaged=skip_damaged, byte_order=byte_order)
            # Mapped, not read: pages come from the page cache as chunks are decoded (no second copy).
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _Reader(p, data, byte_order, skip_damaged).read()
    except OSError as e:
        raise ImportFormatError(f"{p}: cannot read: {e.strerror or e}") from None


# --------------------------------------------------------------------------
# Writer (version 6, as Mosquitto 2.0 writes it).
# --------------------------------------------------------------------------


def _hdr(ctype: ChunkType, length: int) -> bytes:
    return _HDR56.pack(int(ctype), length)


def encode_chunk(chunk: Chunk, byte_order: str = HOST_ORDER) -> bytes:
    u64 = struct.Struct(byte_order + "Q")
    i64 = struct.Struct(byte_order + "q")
    if isinstance(chunk, CfgChunk):
        body = u64.pack(chunk.last_db_id) + bytes([int(chunk.shutdown), chunk.dbid_size]) + bytes(6)
        return _hdr(ChunkType.CFG, len(body)) + body
    if isinstance(chunk, MsgStoreChunk):
        sid = _raw(chunk.source_id) if chunk.source_id else b""
        user = _raw(chunk.source_username) if chunk.source_username else b""
        topic = _raw(chunk.topic)
        props = encode_properties(chunk.properties) if chunk.properties else b""
        fixed = u64.pack(chunk.store_id) + i64.pack(chunk.expiry_time) + _MSG_STORE_TAIL.pack(
            len(chunk.payload), chunk.source_mid, len(sid), len(user), len(topic), chunk.source_port,
            chunk.qos, int(chunk.retain))
        body = fixed + sid + user + topic + chunk.payload + props
        return _hdr(ChunkType.MSG_STORE, len(body)) + body
    if isinstance(chunk, ClientMsgChunk):
        cid = _raw(chunk.client_id)
        props = encode_properties(chunk.properties) if chunk.properties else b""
        rd = (int(chunk.retain) & 0x0F) << 4 | (int(chunk.dup) & 0x0F)
        body = u64.pack(chunk.store_id) + _CLIENT_MSG_TAIL.pack(
            chunk.mid, len(cid), chunk.qos, chunk.state, rd, chunk.direction) + cid + props
        return _hdr(ChunkType.CLIENT_MSG, len(body)) + body
    if isinstance(chunk, RetainChunk):
        body = u64.pack(chunk.store_id)
        return _hdr(ChunkType.RETAIN, len(body)) + body
    if isinstance(chunk, SubChunk):
        cid, topic = _raw(chunk.client_id), _raw(chunk.topic)
        body = _SUB.pack(chunk.identifier, len(cid), len(topic), chunk.qos, chunk.options) + cid + topic
        return _hdr(ChunkType.SUB, len(body)) + body
    if isinstance(chunk, ClientChunk):
        cid = _raw(chunk.client_id)
        user = chunk.username or b""
        body = i64.pack(chunk.session_expiry_time) + _CLIENT_V6_TAIL.pack(
            chunk.session_expiry_interval, chunk.last_mid, len(cid), chunk.listener_port, len(user)) + cid + user
        return _hdr(ChunkType.CLIENT, len(body)) + body
    if isinstance(chunk, UnknownChunk):
        return _HDR56.pack(chunk.chunk_type, len(chunk.data)) + chunk.data
    raise TypeError(f"not a Mosquitto chunk: {chunk!r}")


def order_chunks(chunks: list[Chunk]) -> list[Chunk]:
    """Mosquitto's write order: CFG, MSG_STOREs, each CLIENT then its CLIENT_MSGs, SUBs, RETAINs."""
    cfgs = [c for c in chunks if isinstance(c, CfgChunk)]
    stores = [c for c in chunks if isinstance(c, MsgStoreChunk)]
    clients = [c for c in chunks if isinstance(c, ClientChunk)]
    msgs = [c for c in chunks if isinstance(c, ClientMsgChunk)]
    out: list[Chunk] = [*cfgs[:1], *stores]
    for cl in clients:
        out.append(cl)
        out.extend(m for m in msgs if m.client_id == cl.client_id)
    known = {cl.client_id for cl in clients}
    out.extend(m for m in msgs if m.client_id not in known)
    out.extend(c for c in chunks if isinstance(c, SubChunk))
    out.extend(c for c in chunks if isinstance(c, RetainChunk))
    out.extend(c for c in chunks if isinstance(c, UnknownChunk))
    return out


def encode_db(chunks: list[Chunk], *, byte_order: str = HOST_ORDER, reorder: bool = True) -> bytes:
    """A version 6 file. A CFG chunk is added (last_db_id = highest store_id) if missing."""
    chunks = list(chunks)
    if not any(isinstance(c, CfgChunk) for c in chunks):
        last = max((c.store_id for c in chunks if isinstance(c, MsgStoreChunk)), default=0)
        chunks.insert(0, CfgChunk(last, True))
    if reorder:
        chunks = order_chunks(chunks)
    parts = [MAGIC, struct.pack(">II", 0, WRITE_VERSION)]
    parts += [encode_chunk(c, byte_order) for c in chunks]
    return b"".join(parts)


def write_db(path: str | os.PathLike[str], chunks: list[Chunk], *, byte_order: str = HOST_ORDER,
             overwrite: bool = False) -> int:
    """Write a v6 file atomically (``<path>.new`` then rename, as Mosquitto does); returns its size."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise ImportFormatError(f"{p}: already exists; refusing to overwrite")
    data = encode_db(chunks, byte_order=byte_order)
    tmp = p.with_name(p.name + ".new")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return len(data)

