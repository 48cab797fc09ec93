"""AMQP 0-9-1 basic properties and field tables <-> RBAK header variants.

The one codec for a content header's property list. The online backup decodes
each delivery's raw property bytes with it (pika folds field types together,
truncates floats to ints and fails on NaN), the offline importer decodes the
``properties_bin`` RabbitMQ stored, and the restore publisher encodes with it
(pika cannot send a float and picks integer widths itself), so one mapping
decides every header's variant and decode(encode(v)) gives v back.

Field tables follow RabbitMQ (``rabbit_binary_parser`` /
``rabbit_binary_generator``), which is what both brokers speak, not the 0-9-1
spec's letter table: ``s`` is a signed 16-bit integer (not a short string),
``l`` and ``L`` are both signed 64-bit, and ``U`` does not exist. rbak has
fewer variants than AMQP has types, so each wire type reads as ONE variant,
the narrowest that holds every value of the type; a header's variant never
depends on its value.

====  ======================  ===========================  ==================
wire  RabbitMQ type           read as                      restore writes
====  ======================  ===========================  ==================
S     longstr                 LongString if UTF-8,         LongString and
                              else Bytes                   ShortString as S
x     binary                  Bytes                        Bytes as x
b     byte (i8)               Short
B     unsignedbyte (u8)       Short
s     short (i16)             Short                        Short as s
u     unsignedshort (u16)     Long
I     signedint (i32)         Long
i     unsignedint (u32)       Long
l L   long (i64, both)        Long                         Long as l
t     bool (octet, 0 false)   Bool                         Bool as t 0/1
T     timestamp (u64 s)       Timestamp                    Timestamp as T
f     float (f32)             Float                        Float as f
d     double (f64)            Double                       Double as d
D     decimal (u8 scale,      Table ``{"rbak:decimal":     Table of that one
      i32 value)              [Short scale, Long value]}``  shape as D
V     void                    Void                         Void as V
F     table                   Table (order and repeated    Table as F
                              keys kept)
A     array                   Array                        Array as A
====  ======================  ===========================  ==================

What does not survive a backup and restore unchanged: ShortString (RabbitMQ
has no short-string field type) comes back as LongString, the integer widths
``b B u I i L`` come back as ``s`` or ``l``, a ``t`` octet other than 0/1
comes back as 1. A decimal ``D`` comes back as the same bytes: the format has
no decimal variant, so it is stored as a one-entry table (``record.decimal_header``);
its value is signed, as the Java client and pika read it.

Decoding is strict, like RabbitMQ's parser (which every stored or delivered
message has passed, since the broker decodes properties on publish): any
other type octet (``U``, the spec's short string, ...), a length running past
its table, a truncated value or bytes after the last property raise
:class:`PropertiesError` naming the field (``headers['k'][2]``) and the byte
offset. As in RabbitMQ, the two low bits of the property-flag word
(continuation, reserved) are ignored. Short strings that are not UTF-8 (field
names, properties) keep their bytes as surrogate escapes and encode back to
the same bytes.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from ..errors import PropertiesError, SerializationError
from .record import (
    DECIMAL_KEY,
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
    decimal_header,
    decimal_parts,
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

# Fixed-size field types: (type octet, RabbitMQ's type atom, payload layout, variant).
NUMERIC_TYPES = (
    ("b", "byte", ">b", Short),
    ("B", "unsignedbyte", ">B", Short),
    ("s", "short", ">h", Short),
    ("u", "unsignedshort", ">H", Long),
    ("I", "signedint", ">i", Long),
    ("i", "unsignedint", ">I", Long),
    ("l", "long", ">q", Long),
    ("L", "long", ">q", Long),
    ("T", "timestamp", ">Q", Timestamp),
    ("f", "float", ">f", Float),
    ("d", "double", ">d", Double),
)
_NUMERIC = {ord(c): (struct.Struct(layout), variant) for c, _, layout, variant in NUMERIC_TYPES}
# The variant of a value RabbitMQ already decoded to ``{Name, Type, Value}`` (stored 'P_basic').
VARIANT_OF_RABBIT_TYPE: dict[str, type] = {atom: variant for _, atom, _, variant in NUMERIC_TYPES}

_S, _X, _F, _A, _BOOL, _D, _V = (ord(c) for c in "SxFAtDV")
# Every type octet the decoder accepts (the tests check it against the docstring's table).
FIELD_TYPES = frozenset(chr(c) for c in _NUMERIC) | frozenset("SxFAtDV")

# Basic-class property flag bits, in wire order.
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

# (flag, BackupProperties attribute, kind) in wire order.
PROPERTY_FIELDS = (
    (FLAG_CONTENT_TYPE, "content_type", "shortstr"),
    (FLAG_CONTENT_ENCODING, "content_encoding", "shortstr"),
    (FLAG_HEADERS, "headers", "table"),
    (FLAG_DELIVERY_MODE, "delivery_mode", "octet"),
    (FLAG_PRIORITY, "priority", "octet"),
    (FLAG_CORRELATION_ID, "correlation_id", "shortstr"),
    (FLAG_REPLY_TO, "reply_to", "shortstr"),
    (FLAG_EXPIRATION, "expiration", "shortstr"),
    (FLAG_MESSAGE_ID, "message_id", "shortstr"),
    (FLAG_TIMESTAMP, "timestamp", "timestamp"),
    (FLAG_TYPE, "type_field", "shortstr"),
    (FLAG_USER_ID, "user_id", "shortstr"),
    (FLAG_APP_ID, "app_id", "shortstr"),
    (FLAG_CLUSTER_ID, "cluster_id", "shortstr"),
)


# --------------------------------------------------------------------------
# Decoding.
# --------------------------------------------------------------------------


class _Bad(Exception):
    """Raised inside a table; each enclosing table/array adds its step to ``path``."""

    def __init__(self, problem: str, offset: int):
        self.problem = problem
        self.offset = offset
        self.path: list[str] = []  # innermost first


def _type_name(t: int) -> str:
    return f"{chr(t)!r}" if 0x21 <= t < 0x7F else f"{t:#04x}"


def _value(data: bytes, pos: int, end: int) -> tuple[HeaderValue, int]:
    if pos >= end:
        raise _Bad("missing field type", pos)
    t = data[pos]
    p = pos + 1
    numeric = _NUMERIC.get(t)
    if numeric is not None:
        layout, variant = numeric
        if p + layout.size > end:
            raise _Bad(f"truncated {_type_name(t)} value: needs {layout.size} bytes, {end - p} left", pos)
        return variant(layout.unpack_from(data, p)[0]), p + layout.size
    if t == _S or t == _X or t == _F or t == _A:
        if p + 4 > end:
            raise _Bad(f"truncated {_type_name(t)} length: needs 4 bytes, {end - p} left", pos)
        (n,) = _U32.unpack_from(data, p)
        p += 4
        q = p + n
        if q > end:
            raise _Bad(f"{_type_name(t)} value of {n} bytes runs past its end: {end - p} left", pos)
        if t == _S:
            raw = data[p:q]
            try:
                return LongString(raw.decode("utf-8")), q
            except UnicodeDecodeError:
                return Bytes(raw), q
        if t == _X:
            return Bytes(data[p:q]), q
        if t == _F:
            return Table(_table(data, p, q)), q
        return Array(_array(data, p, q)), q
    if t == _BOOL:
        if p >= end:
            raise _Bad("truncated 't' value: needs 1 byte, 0 left", pos)
        return Bool(data[p] != 0), p + 1
    if t == _D:
        if p + 5 > end:
            raise _Bad(f"truncated 'D' value: needs 5 bytes, {end - p} left", pos)
        return decimal_header(data[p], _I32.unpack_from(data, p + 1)[0]), p + 5
    if t == _V:
        return VOID, p
    raise _Bad(f"unknown field type {_type_name(t)}", pos)


def _table(data: bytes, pos: int, end: int) -> Headers:
    out: list[tuple[str, HeaderValue]] = []
    while pos < end:
        n = data[pos]
        p = pos + 1 + n
        if p > end:
            raise _Bad(f"truncated field name: needs {n} bytes, {end - pos - 1} left", pos)
        name = data[pos + 1 : p].decode("utf-8", "surrogateescape")
        try:
            value, pos = _value(data, p, end)
        except _Bad as e:
            e.path.append(f"[{name!r}]")
            raise
        out.append((name, value))
    return tuple(out)


def _array(data: bytes, pos: int, end: int) -> tuple[HeaderValue, ...]:
    out: list[HeaderValue] = []
    while pos < end:
        try:
            value, pos = _value(data, pos, end)
        except _Bad as e:
            e.path.append(f"[{len(out)}]")
            raise
        out.append(value)
    return tuple(out)


def _error(e: _Bad, root: str, what: str) -> PropertiesError:
    return PropertiesError(e.problem, e.offset, root + "".join(reversed(e.path)), what)


def parse_table(data: bytes | memoryview, pos: int = 0, end: int | None = None) -> Headers:
    """The entries of a field table between ``pos`` and ``end`` (no length prefix)."""
    data = bytes(data) if type(data) is not bytes else data
    end = len(data) if end is None else end
    if not 0 <= pos <= end <= len(data):
        raise PropertiesError(f"table bounds {pos}..{end} outside {len(data)} bytes", pos, "table", "field table")
    try:
        return _table(data, pos, end)
    except _Bad as e:
        raise _error(e, "table", "field table") from None


def decode_table(data: bytes | memoryview) -> Headers:
    """A field table with its 4-byte length, and nothing after it."""
    data = bytes(data) if type(data) is not bytes else data
    if len(data) < 4:
        raise PropertiesError(f"table length needs 4 bytes, have {len(data)}", 0, "table", "field table")
    (n,) = _U32.unpack_from(data, 0)
    if 4 + n != len(data):
        raise PropertiesError(f"table length says {n} bytes, {len(data) - 4} follow", 0, "table", "field table")
    return parse_table(data, 4)


def _short_str_at(data: bytes, pos: int, name: str) -> tuple[str, int]:
    n = len(data)
    if pos >= n:
        raise PropertiesError("truncated: needs a length byte, 0 left", pos, name)
    ln = data[pos]
    if pos + 1 + ln > n:
        raise PropertiesError(f"truncated: needs {ln} bytes, {n - pos - 1} left", pos, name)
    return data[pos + 1 : pos + 1 + ln].decode("utf-8", "surrogateescape"), pos + 1 + ln


def decode_basic_properties(data: bytes | memoryview) -> tuple[BackupProperties, Headers | None]:
    """Property flags + property list of a basic content header (headers None when absent)."""
    data = bytes(data) if type(data) is not bytes else data
    n = len(data)
    if n < 2:
        raise PropertiesError(f"property flags need 2 bytes, have {n}", 0, "flags")
    (flags,) = _U16.unpack_from(data, 0)
    pos = 2
    props = BackupProperties()
    headers: Headers | None = None
    for flag, name, kind in PROPERTY_FIELDS:
        if not flags & flag:
            continue
        if kind == "shortstr":
            value, pos = _short_str_at(data, pos, name)
            setattr(props, name, value)
        elif kind == "octet":
            if pos >= n:
                raise PropertiesError("truncated: needs 1 byte, 0 left", pos, name)
            setattr(props, name, data[pos])
            pos += 1
        elif kind == "timestamp":
            if pos + 8 > n:
                raise PropertiesError(f"truncated: needs 8 bytes, {n - pos} left", pos, name)
            (props.timestamp,) = _U64.unpack_from(data, pos)
            pos += 8
        else:
            if pos + 4 > n:
                raise PropertiesError(f"truncated table length: needs 4 bytes, {n - pos} left", pos, name)
            (ln,) = _U32.unpack_from(data, pos)
            pos += 4
            if pos + ln > n:
                raise PropertiesError(f"table needs {ln} bytes, {n - pos} left", pos - 4, name)
            try:
                headers = _table(data, pos, pos + ln)
            except _Bad as e:
                raise _error(e, name, "properties") from None
            pos += ln
    if pos != n:
        raise PropertiesError(f"{n - pos} bytes left after the last property", pos)
    return props, headers


# --------------------------------------------------------------------------
# Encoding (what the restore publisher sends).
# --------------------------------------------------------------------------


def _utf8(s: str, where: str) -> bytes:
    try:
        return s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise SerializationError(f"{where}: {s[:40]!r} is not valid Unicode text") from None


def _short_str(out: bytearray, s: str, where: str) -> None:
    raw = _utf8(s, where)
    if len(raw) > 255:
        raise SerializationError(f"{where}: {len(raw)} bytes, an AMQP short string holds at most 255")
    out += _U8.pack(len(raw))
    out += raw


def _encode_value(out: bytearray, v: Any, where: str) -> None:  # v: a HeaderValue (Any: the dispatch on a saved type(v) is one a checker cannot follow)
    t = type(v)
    if t is LongString or t is ShortString:
        raw = _utf8(v.value, where)
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
        out += b"t\x01" if v.value else b"t\x00"
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
        dec = decimal_parts(v) if len(v.value) == 1 and v.value[0][0] == DECIMAL_KEY else None
        if dec is not None:
            out += b"D"
            out += _U8.pack(dec[0])
            out += _I32.pack(dec[1])
            return
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

    No headers property is sent for ``None`` or ``()``: the Rust tool's
    records cannot tell an empty table from an absent one.
    """
    flags = 0
    out = bytearray(b"\0\0")
    for flag, name, kind in PROPERTY_FIELDS:
        if kind == "table":
            if headers:
                flags |= flag
                _encode_table(out, headers, f"{where}: headers")
            continue
        value = getattr(p, name)
        if value is None:
            continue
        flags |= flag
        if kind == "shortstr":
            _short_str(out, value, f"{where}: {name}")
        elif kind == "octet":
            if not isinstance(value, int) or not 0 <= value <= 255:
                raise SerializationError(f"{where}: {name}: {value!r} is not an octet (0-255)")
            out += _U8.pack(value)
        else:
            if not isinstance(value, int) or not 0 <= value < (1 << 64):
                raise SerializationError(f"{where}: {name} {value!r} is not an unsigned 64-bit number")
            out += _U64.pack(value)
    out[0:2] = _U16.pack(flags)
    return bytes(out)


def read_back(v: Any) -> HeaderValue:  # v: a HeaderValue (Any: the dispatch on a saved type(v) is one a checker cannot follow)
    """What ``v`` decodes as once encoded: ShortString travels as a long string."""
    t = type(v)
    if t is ShortString:
        return LongString(v.value)
    if t is Table:
        return Table(tuple((k, read_back(x)) for k, x in v.value))
    if t is Array:
        return Array(tuple(read_back(x) for x in v.value))
    return v


def header_equal(a: Any, b: Any) -> bool:
    """Variant equality as on the wire: Float compared as its f32, NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if type(a) is Float:
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
