"""Mosquitto's persistence file (``mosquitto.db``): the layout and its typed chunks (``reader`` and
``writer`` read and write them).

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
import struct
from dataclasses import dataclass, field
from typing import Iterator, Union, cast


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
        return cast("str | None", self.first(CONTENT_TYPE))

    @property
    def response_topic(self) -> str | None:
        return cast("str | None", self.first(RESPONSE_TOPIC))

    @property
    def correlation_data(self) -> bytes | None:
        return cast("bytes | None", self.first(CORRELATION_DATA))

    @property
    def payload_format_indicator(self) -> int | None:
        return cast("int | None", self.first(PAYLOAD_FORMAT_INDICATOR))

    @property
    def message_expiry_interval(self) -> int | None:
        return cast("int | None", self.first(MESSAGE_EXPIRY_INTERVAL))

    @property
    def user_properties(self) -> tuple[tuple[str, str], ...]:
        return tuple(cast("tuple[str, str]", v) for k, v in self.items if k == USER_PROPERTY)

    @property
    def subscription_identifiers(self) -> tuple[int, ...]:
        return tuple(cast(int, v) for k, v in self.items if k == SUBSCRIPTION_IDENTIFIER)

    def __bool__(self) -> bool:
        return bool(self.items)


NO_PROPERTIES = MqttProperties()


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


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
            body.append(int(cast(int, value)))
        elif t is PropType.U16:
            body += struct.pack(">H", value)
        elif t is PropType.U32:
            body += struct.pack(">I", value)
        elif t is PropType.VARINT:
            body += encode_varint(int(cast(int, value)))
        elif t is PropType.STRING:
            raw = _raw(cast(str, value))
            body += struct.pack(">H", len(raw)) + raw
        elif t is PropType.BINARY:
            data = cast(bytes, value)
            body += struct.pack(">H", len(data)) + bytes(data)
        else:
            k, v = cast("tuple[str, str]", value)
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


# Fixed-size parts of chunk bodies (16/32-bit big-endian; 64-bit fields are read separately in host order).
_HDR56 = struct.Struct(">II")
_HDR234 = struct.Struct(">HI")
# Fixed parts (16/32-bit big-endian; 64-bit fields read separately in host order).
_MSG_STORE_TAIL = struct.Struct(">IHHHHHBB")     # after store_id + expiry_time
_CLIENT_MSG_TAIL = struct.Struct(">HHBBBB")      # after store_id
_SUB = struct.Struct(">IHHBBxx")                 # 12 bytes incl. padding
_CLIENT_V6_TAIL = struct.Struct(">IHHHHxxxx")    # after session_expiry_time: 16 bytes
_CLIENT_V5_TAIL = struct.Struct(">IHH")          # 8 bytes
