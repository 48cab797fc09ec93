"""AMQP 0-9-1 basic properties and field tables <-> the spec's header variants.

pika cannot publish every variant faithfully: it has no encoding for a float
at all, sends a Python ``int`` as 32-bit ``I`` or 64-bit ``l`` depending on its
size, and its decoder truncates ``f``/``d`` to ints (and fails on NaN). So the
restore publisher encodes the whole property list itself
(:func:`encode_basic_properties`) and hands pika the finished bytes; tests and
the backup side can read deliveries back with :func:`decode_basic_properties`.

Field type mapping (RabbitMQ's dialect of 0-9-1, which is what both brokers
speak; ``s`` is a signed 16-bit integer there, not a short string):

=========================  =========================  =========================
header variant             published as (restore)     read back as (decode)
=========================  =========================  =========================
LongString                 ``S`` long string (UTF-8)  ``S`` valid UTF-8
ShortString                ``S`` long string          LongString (see note 1)
Long (i64)                 ``l`` signed 64-bit        ``I`` ``i`` ``l`` ``L``
Short (i16)                ``s`` signed 16-bit        ``b`` ``B`` ``s`` ``U``, ``u`` <= 32767
Bool                       ``t``                      ``t``
Bytes                      ``x`` byte array           ``x``; ``S`` not UTF-8
Timestamp (seconds)        ``T`` u64                  ``T``
Float (f32)                ``f``                      ``f``
Double (f64)               ``d``                      ``d``
Void                       ``V``                      ``V``
Table (ordered pairs)      ``F`` (order kept)         ``F``
Array                      ``A``                      ``A``
(none)                     --                         ``D`` decimal -> LongString
                                                      of its exact text (note 2)
=========================  =========================  =========================

1. RabbitMQ has no short-string field type in tables, so ShortString is sent
   as ``S``; the same text comes back, as LongString.
2. ``u`` above 32767 reads as Long; ``D`` has no variant and is kept as text.
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal
from typing import Any

from ..errors import SerializationError
from ..format.record import (
    VOID,
    Array,
    BackupProperties,
    Bool,
    Bytes,
    Double,
    Float,
    HeaderValue,
    Headers,
    Long,
    LongString,
    Short,
    ShortString,
    Table,
    Timestamp,
    Void,
)

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1

# Property flag bits of basic properties, in wire order.
FLAG_CONTENT_TYPE = 1 << 15
FLAG_CONTENT_ENCODING = 1 << 14
FLAG_HEADERS = 1 << 13
FLAG_DELIVERY_MODE = 1 << 12
FLAG_PRIORITY = 1 << 11
FLAG_CORRELATION_ID = 1 << 10
FLAG_REPLY_TO = 1 << 9
FLAG_EXPIRATION = 1 << 8
FLAG_MESSAGE_ID = 1 << 7
FLAG_TIMESTAMP = 1 << 6
FLAG_TYPE = 1 << 5
FLAG_USER_ID = 1 << 4
FLAG_APP_ID = 1 << 3
FLAG_CLUSTER_ID = 1 << 2


# --------------------------------------------------------------------------
# Encoding.
# --------------------------------------------------------------------------


def _short_str(out: bytearray, s: str, where: str) -> None:
    raw = s.encode("utf-8")
    if len(raw) > 255:
        raise SerializationError(f"{where}: {len(raw)} bytes, an AMQP short string holds at most 255")
    out += _U8.pack(len(raw))
    out += raw


def _encode_value(out: bytearray, v: HeaderValue, where: str) -> None:
    t = type(v)
    if t is LongString or t is ShortString:
        raw = v.value.encode("utf-8")
        out += b"S"
        out += _U32.pack(len(raw))
        out += raw
    elif t is Long:
        if not I64_MIN <= v.value <= I64_MAX:
            raise SerializationError(f"{where}: Long {v.value} does not fit in 64 bits")
        out += b"l"
        out += _I64.pack(v.value)
    elif t is Short:
        if not -32768 <= v.value <= 32767:
            raise SerializationError(f"{where}: Short {v.value} does not fit in 16 bits")
        out += b"s"
        out += _I16.pack(v.value)
    elif t is Bool:
        out += b"t"
        out += b"\x01" if v.value else b"\x00"
    elif t is Bytes:
        out += b"x"
        out += _U32.pack(len(v.value))
        out += v.value
    elif t is Timestamp:
        if not 0 <= v.value < (1 << 64):
            raise SerializationError(f"{where}: Timestamp {v.value} is not an unsigned 64-bit number of seconds")
        out += b"T"
        out += _U64.pack(v.value)
    elif t is Float:
        try:
            packed = _F32.pack(v.value)
        except OverflowError:
            raise SerializationError(f"{where}: Float {v.value} does not fit in 32 bits") from None
        out += b"f"
        out += packed
    elif t is Double:
        out += b"d"
        out += _F64.pack(v.value)
    elif t is Void:
        out += b"V"
    elif t is Table:
        out += b"F"
        _encode_table(out, v.value, where)
    elif t is Array:
        out += b"A"
        pos = len(out)
        out += b"\0\0\0\0"
        for i, x in enumerate(v.value):
            _encode_value(out, x, f"{where}[{i}]")
        out[pos : pos + 4] = _U32.pack(len(out) - pos - 4)
    else:
        raise SerializationError(f"{where}: not a header value: {v!r}")


def _encode_table(out: bytearray, pairs: Headers, where: str) -> None:
    pos = len(out)
    out += b"\0\0\0\0"
    for k, x in pairs:
        _short_str(out, k, f"{where} key {k[:40]!r}")
        _encode_value(out, x, f"{where}.{k}")
    out[pos : pos + 4] = _U32.pack(len(out) - pos - 4)


def encode_table(headers: Headers, where: str = "headers") -> bytes:
    """A field table (4-byte length and the pairs, order kept)."""
    out = bytearray()
    _encode_table(out, headers, where)
    return bytes(out)


def encode_basic_properties(p: BackupProperties, headers: Headers | None, where: str = "record") -> bytes:
    """The property flags and property list of a content header frame.

    ``headers`` of ``()`` is sent as an empty table only when ``None`` is not
    given: a record with no headers publishes no headers property, as the Rust
    tool's records cannot tell an empty table from an absent one.
    """
    flags = 0
    out = bytearray(b"\0\0")
    if p.content_type is not None:
        flags |= FLAG_CONTENT_TYPE
        _short_str(out, p.content_type, f"{where}: content_type")
    if p.content_encoding is not None:
        flags |= FLAG_CONTENT_ENCODING
        _short_str(out, p.content_encoding, f"{where}: content_encoding")
    if headers:
        flags |= FLAG_HEADERS
        _encode_table(out, headers, f"{where}: headers")
    if p.delivery_mode is not None:
        flags |= FLAG_DELIVERY_MODE
        out += _octet(p.delivery_mode, f"{where}: delivery_mode")
    if p.priority is not None:
        flags |= FLAG_PRIORITY
        out += _octet(p.priority, f"{where}: priority")
    for flag, value, name in (
        (FLAG_CORRELATION_ID, p.correlation_id, "correlation_id"),
        (FLAG_REPLY_TO, p.reply_to, "reply_to"),
        (FLAG_EXPIRATION, p.expiration, "expiration"),
        (FLAG_MESSAGE_ID, p.message_id, "message_id"),
    ):
        if value is not None:
            flags |= flag
            _short_str(out, value, f"{where}: {name}")
    if p.timestamp is not None:
        if not 0 <= p.timestamp < (1 << 64):
            raise SerializationError(f"{where}: timestamp {p.timestamp} is not an unsigned 64-bit number")
        flags |= FLAG_TIMESTAMP
        out += _U64.pack(p.timestamp)
    for flag, value, name in (
        (FLAG_TYPE, p.type_field, "type_field"),
        (FLAG_USER_ID, p.user_id, "user_id"),
        (FLAG_APP_ID, p.app_id, "app_id"),
        (FLAG_CLUSTER_ID, p.cluster_id, "cluster_id"),
    ):
        if value is not None:
            flags |= flag
            _short_str(out, value, f"{where}: {name}")
    out[0:2] = _U16.pack(flags)
    return bytes(out)


def _octet(v: int, where: str) -> bytes:
    if not isinstance(v, int) or not 0 <= v <= 255:
        raise SerializationError(f"{where}: {v!r} is not an octet (0-255)")
    return _U8.pack(v)


# --------------------------------------------------------------------------
# Decoding.
# --------------------------------------------------------------------------


def _decode_short_str(data: bytes, pos: int) -> tuple[str, int]:
    n = data[pos]
    raw = data[pos + 1 : pos + 1 + n]
    return raw.decode("utf-8", errors="surrogateescape"), pos + 1 + n


def _decode_value(data: bytes, pos: int) -> tuple[HeaderValue, int]:
    kind = data[pos : pos + 1]
    pos += 1
    if kind == b"S":
        (n,) = _U32.unpack_from(data, pos)
        raw = data[pos + 4 : pos + 4 + n]
        pos += 4 + n
        try:
            return LongString(raw.decode("utf-8")), pos
        except UnicodeDecodeError:
            return Bytes(bytes(raw)), pos
    if kind == b"x":
        (n,) = _U32.unpack_from(data, pos)
        return Bytes(bytes(data[pos + 4 : pos + 4 + n])), pos + 4 + n
    if kind in (b"l", b"L"):
        return Long(_I64.unpack_from(data, pos)[0]), pos + 8
    if kind == b"I":
        return Long(_I32.unpack_from(data, pos)[0]), pos + 4
    if kind == b"i":
        return Long(_U32.unpack_from(data, pos)[0]), pos + 4
    if kind in (b"s", b"U"):
        return Short(_I16.unpack_from(data, pos)[0]), pos + 2
    if kind == b"u":
        v = _U16.unpack_from(data, pos)[0]
        return (Short(v) if v <= 32767 else Long(v)), pos + 2
    if kind == b"b":
        return Short(struct.unpack_from(">b", data, pos)[0]), pos + 1
    if kind == b"B":
        return Short(data[pos]), pos + 1
    if kind == b"t":
        return Bool(data[pos] != 0), pos + 1
    if kind == b"T":
        return Timestamp(_U64.unpack_from(data, pos)[0]), pos + 8
    if kind == b"f":
        return Float(_F32.unpack_from(data, pos)[0]), pos + 4
    if kind == b"d":
        return Double(_F64.unpack_from(data, pos)[0]), pos + 8
    if kind == b"D":
        scale = data[pos]
        (raw,) = _I32.unpack_from(data, pos + 1)
        return LongString(str(Decimal(raw).scaleb(-scale))), pos + 5
    if kind == b"V":
        return VOID, pos
    if kind == b"F":
        table, pos = _decode_table(data, pos)
        return Table(table), pos
    if kind == b"A":
        (n,) = _U32.unpack_from(data, pos)
        pos += 4
        end = pos + n
        items: list[HeaderValue] = []
        while pos < end:
            x, pos = _decode_value(data, pos)
            items.append(x)
        return Array(tuple(items)), pos
    raise SerializationError(f"unknown AMQP field type {kind!r} at byte {pos - 1}")


def _decode_table(data: bytes, pos: int) -> tuple[Headers, int]:
    (n,) = _U32.unpack_from(data, pos)
    pos += 4
    end = pos + n
    pairs: list[tuple[str, HeaderValue]] = []
    while pos < end:
        k, pos = _decode_short_str(data, pos)
        v, pos = _decode_value(data, pos)
        pairs.append((k, v))
    return tuple(pairs), pos


def decode_table(data: bytes) -> Headers:
    """A field table (with its 4-byte length) as ordered (key, variant) pairs."""
    try:
        return _decode_table(data, 0)[0]
    except (struct.error, IndexError) as e:
        raise SerializationError(f"truncated AMQP field table: {e}") from None


def decode_basic_properties(data: bytes) -> tuple[BackupProperties, Headers | None]:
    """Inverse of :func:`encode_basic_properties` (headers None when absent)."""
    try:
        (flags,) = _U16.unpack_from(data, 0)
        pos = 2
        word = flags
        while word & 1:  # continuation flag words (never used by basic, skipped)
            (word,) = _U16.unpack_from(data, pos)
            pos += 2
        p = BackupProperties()
        headers: Headers | None = None
        if flags & FLAG_CONTENT_TYPE:
            p.content_type, pos = _decode_short_str(data, pos)
        if flags & FLAG_CONTENT_ENCODING:
            p.content_encoding, pos = _decode_short_str(data, pos)
        if flags & FLAG_HEADERS:
            headers, pos = _decode_table(data, pos)
        if flags & FLAG_DELIVERY_MODE:
            p.delivery_mode = data[pos]
            pos += 1
        if flags & FLAG_PRIORITY:
            p.priority = data[pos]
            pos += 1
        if flags & FLAG_CORRELATION_ID:
            p.correlation_id, pos = _decode_short_str(data, pos)
        if flags & FLAG_REPLY_TO:
            p.reply_to, pos = _decode_short_str(data, pos)
        if flags & FLAG_EXPIRATION:
            p.expiration, pos = _decode_short_str(data, pos)
        if flags & FLAG_MESSAGE_ID:
            p.message_id, pos = _decode_short_str(data, pos)
        if flags & FLAG_TIMESTAMP:
            (p.timestamp,) = _U64.unpack_from(data, pos)
            pos += 8
        if flags & FLAG_TYPE:
            p.type_field, pos = _decode_short_str(data, pos)
        if flags & FLAG_USER_ID:
            p.user_id, pos = _decode_short_str(data, pos)
        if flags & FLAG_APP_ID:
            p.app_id, pos = _decode_short_str(data, pos)
        if flags & FLAG_CLUSTER_ID:
            p.cluster_id, pos = _decode_short_str(data, pos)
        return p, headers
    except (struct.error, IndexError) as e:
        raise SerializationError(f"truncated AMQP basic properties: {e}") from None


def header_equal(a: Any, b: Any) -> bool:
    """Variant equality with NaN equal to NaN (dataclass == says NaN != NaN)."""
    if type(a) is not type(b):
        return False
    if type(a) is Float:  # compare as the f32 that goes on the wire
        return _F32.pack(a.value) == _F32.pack(b.value) or (math.isnan(a.value) and math.isnan(b.value))
    if type(a) is Double:
        return _F64.pack(a.value) == _F64.pack(b.value) or (math.isnan(a.value) and math.isnan(b.value))
    if type(a) is Table:
        return len(a.value) == len(b.value) and all(
            ka == kb and header_equal(va, vb) for (ka, va), (kb, vb) in zip(a.value, b.value)
        )
    if type(a) is Array:
        return len(a.value) == len(b.value) and all(header_equal(x, y) for x, y in zip(a.value, b.value))
    return a == b
