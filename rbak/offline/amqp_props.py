"""AMQP 0-9-1 basic properties, as RabbitMQ keeps them on disk, into rbak's types.

A stored message carries its properties either as the wire binary (the
content header's property flags + fields, ``properties_bin``) or as the
decoded ``'P_basic'`` record (``properties``); both are handled.

Field tables follow RabbitMQ's parser (``rabbit_binary_parser``), not the
0-9-1 spec's letters: ``s`` is a signed 16-bit int, ``u`` unsigned 16,
``I``/``i`` signed/unsigned 32, ``l``/``L`` signed 64, ``b``/``B`` signed and
unsigned 8, ``D`` decimal, ``x`` byte array. rbak's header variants are
fewer than AMQP's types, so integers go to the narrowest variant that holds
every value of the wire type (``b B s`` -> Short; ``u I i l L`` -> Long), a
long string that is not UTF-8 becomes Bytes, and a decimal (no rbak variant)
becomes the LongString of its exact decimal text (e.g. ``"123.45"``).
"""

from __future__ import annotations

import struct
from decimal import Decimal
from typing import Any

from ..format.record import (
    VOID, Array, BackupProperties, Bool, Bytes, Double, Float, HeaderValue, Headers, Long,
    LongString, Short, Table, Timestamp,
)
from .erlang_terms import Atom


class PropertiesError(ValueError):
    """Malformed property bytes; ``offset`` is relative to the property binary."""

    def __init__(self, message: str, offset: int):
        self.offset = offset
        super().__init__(f"{message} (at byte {offset} of the properties)")


_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

# (flag bit, field name, kind) in wire order.
_FIELDS = (
    (15, "content_type", "shortstr"),
    (14, "content_encoding", "shortstr"),
    (13, "headers", "table"),
    (12, "delivery_mode", "octet"),
    (11, "priority", "octet"),
    (10, "correlation_id", "shortstr"),
    (9, "reply_to", "shortstr"),
    (8, "expiration", "shortstr"),
    (7, "message_id", "shortstr"),
    (6, "timestamp", "timestamp"),
    (5, "type_field", "shortstr"),
    (4, "user_id", "shortstr"),
    (3, "app_id", "shortstr"),
    (2, "cluster_id", "shortstr"),
)


def _text(raw: bytes) -> str:
    # Short strings are UTF-8 by spec; a non-UTF-8 one keeps its bytes readable.
    return raw.decode("utf-8", errors="surrogateescape")


def decode_properties(data: bytes | memoryview) -> tuple[BackupProperties, Headers]:
    """Decode a basic-class property binary (flags + fields)."""
    mv = data if type(data) is bytes else bytes(data)
    n = len(mv)
    if n < 2:
        raise PropertiesError(f"property flags need 2 bytes, have {n}", 0)
    (flags,) = _U16.unpack_from(mv, 0)
    if flags & 1:
        raise PropertiesError("continuation flag set: basic has only 14 properties", 0)
    if flags & 0b10:
        raise PropertiesError("unknown property flag bit 1 set", 0)
    pos = 2
    props = BackupProperties()
    headers: Headers = ()
    for bit, name, kind in _FIELDS:
        if not flags & (1 << bit):
            continue
        if kind == "shortstr":
            if pos >= n:
                raise PropertiesError(f"truncated {name}", pos)
            ln = mv[pos]
            if pos + 1 + ln > n:
                raise PropertiesError(f"truncated {name}: needs {ln} bytes", pos)
            setattr(props, name, _text(bytes(mv[pos + 1 : pos + 1 + ln])))
            pos += 1 + ln
        elif kind == "octet":
            if pos >= n:
                raise PropertiesError(f"truncated {name}", pos)
            setattr(props, name, mv[pos])
            pos += 1
        elif kind == "timestamp":
            if pos + 8 > n:
                raise PropertiesError(f"truncated {name}", pos)
            props.timestamp = _U64.unpack_from(mv, pos)[0]
            pos += 8
        else:  # table
            if pos + 4 > n:
                raise PropertiesError("truncated headers length", pos)
            (ln,) = _U32.unpack_from(mv, pos)
            pos += 4
            if pos + ln > n:
                raise PropertiesError(f"truncated headers: table needs {ln} bytes, {n - pos} left", pos)
            headers = parse_table(mv, pos, pos + ln)
            pos += ln
    if pos != n:
        raise PropertiesError(f"{n - pos} bytes left after the last property", pos)
    return props, headers


def parse_table(mv: memoryview, pos: int, end: int) -> Headers:
    out: list[tuple[str, HeaderValue]] = []
    while pos < end:
        ln = mv[pos]
        if pos + 1 + ln >= end:
            raise PropertiesError("truncated field name", pos)
        name = _text(bytes(mv[pos + 1 : pos + 1 + ln]))
        value, pos = _field_value(mv, pos + 1 + ln, end)
        out.append((name, value))
    return tuple(out)


def _parse_array(mv: memoryview, pos: int, end: int) -> tuple[HeaderValue, ...]:
    out: list[HeaderValue] = []
    while pos < end:
        value, pos = _field_value(mv, pos, end)
        out.append(value)
    return tuple(out)


def _field_value(mv: memoryview, pos: int, end: int) -> tuple[HeaderValue, int]:
    if pos >= end:
        raise PropertiesError("missing field type", pos)
    t = mv[pos]
    p = pos + 1

    def need(k: int) -> None:
        if p + k > end:
            raise PropertiesError(f"truncated field value of type {chr(t)!r}", pos)

    if t == 0x53 or t == 0x78 or t == 0x46 or t == 0x41:  # S x F A: u32 length
        need(4)
        (ln,) = _U32.unpack_from(mv, p)
        p += 4
        need(ln)
        if t == 0x53:
            raw = bytes(mv[p : p + ln])
            try:
                return LongString(raw.decode("utf-8")), p + ln
            except UnicodeDecodeError:
                return Bytes(raw), p + ln
        if t == 0x78:
            return Bytes(bytes(mv[p : p + ln])), p + ln
        if t == 0x46:
            return Table(parse_table(mv, p, p + ln)), p + ln
        return Array(_parse_array(mv, p, p + ln)), p + ln
    if t == 0x54:  # T
        need(8)
        return Timestamp(_U64.unpack_from(mv, p)[0]), p + 8
    if t == 0x62:  # b
        need(1)
        return Short(_I8.unpack_from(mv, p)[0]), p + 1
    if t == 0x42:  # B
        need(1)
        return Short(mv[p]), p + 1
    if t == 0x73:  # s
        need(2)
        return Short(_I16.unpack_from(mv, p)[0]), p + 2
    if t == 0x75:  # u
        need(2)
        return Long(_U16.unpack_from(mv, p)[0]), p + 2
    if t == 0x49:  # I
        need(4)
        return Long(_I32.unpack_from(mv, p)[0]), p + 4
    if t == 0x69:  # i
        need(4)
        return Long(_U32.unpack_from(mv, p)[0]), p + 4
    if t == 0x6C or t == 0x4C:  # l L (both signed 64, as RabbitMQ reads them)
        need(8)
        return Long(_I64.unpack_from(mv, p)[0]), p + 8
    if t == 0x64:  # d
        need(8)
        return Double(_F64.unpack_from(mv, p)[0]), p + 8
    if t == 0x66:  # f
        need(4)
        return Float(_F32.unpack_from(mv, p)[0]), p + 4
    if t == 0x74:  # t
        need(1)
        return Bool(mv[p] != 0), p + 1
    if t == 0x44:  # D: scale octet, unsigned 32-bit value
        need(5)
        return LongString(decimal_text(mv[p], _U32.unpack_from(mv, p + 1)[0])), p + 5
    if t == 0x56:  # V
        return VOID, p
    raise PropertiesError(f"unknown field type {t:#04x}", pos)


def decimal_text(scale: int, value: int) -> str:
    return str(Decimal(value).scaleb(-scale))


# --------------------------------------------------------------------------
# The decoded form: {'P_basic', ContentType, ..., ClusterId} with 'undefined'.
# --------------------------------------------------------------------------

P_BASIC_ARITY = 15


def from_p_basic(rec: tuple) -> tuple[BackupProperties, Headers]:
    """Properties and headers from a decoded ``#'P_basic'{}`` tuple."""
    if not (isinstance(rec, tuple) and len(rec) == P_BASIC_ARITY and rec[0] == "P_basic"):
        raise ValueError(f"not a 'P_basic' record: {_short_repr(rec)}")
    props = BackupProperties()
    headers: Headers = ()
    for (_, name, kind), v in zip(_FIELDS, rec[1:]):
        if _undef(v):
            continue
        if kind == "shortstr":
            setattr(props, name, _text(_as_bytes(v, name)))
        elif kind in ("octet", "timestamp"):
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"'P_basic' {name} must be an integer, got {_short_repr(v)}")
            setattr(props, name, v)
        else:
            headers = table_from_terms(v)
    return props, headers


def _undef(v: Any) -> bool:
    return isinstance(v, Atom) and v == "undefined"


def _as_bytes(v: Any, what: str) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, list) and all(isinstance(c, int) for c in v):  # an Erlang string
        return bytes(v)
    raise ValueError(f"{what} must be a binary, got {_short_repr(v)}")


def table_from_terms(items: Any) -> Headers:
    """A decoded table: ``[{Name, Type, Value}]``."""
    if not isinstance(items, list):
        raise ValueError(f"headers must be a list, got {_short_repr(items)}")
    out = []
    for it in items:
        if not (isinstance(it, tuple) and len(it) == 3):
            raise ValueError(f"table entry must be {{Name, Type, Value}}, got {_short_repr(it)}")
        out.append((_text(_as_bytes(it[0], "field name")), _typed_value(it[1], it[2])))
    return tuple(out)


def _typed_value(typ: Any, v: Any) -> HeaderValue:
    if not isinstance(typ, Atom):
        raise ValueError(f"field type must be an atom, got {_short_repr(typ)}")
    if typ == "longstr":
        raw = _as_bytes(v, "longstr")
        try:
            return LongString(raw.decode("utf-8"))
        except UnicodeDecodeError:
            return Bytes(raw)
    if typ == "binary":
        return Bytes(_as_bytes(v, "binary"))
    if typ in ("byte", "unsignedbyte", "short"):
        return Short(_int(v, typ))
    if typ in ("unsignedshort", "signedint", "unsignedint", "long"):
        return Long(_int(v, typ))
    if typ == "timestamp":
        return Timestamp(_int(v, typ))
    if typ in ("double", "float"):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ValueError(f"{typ} must be a number, got {_short_repr(v)}")
        return (Double if typ == "double" else Float)(float(v))
    if typ == "bool":
        if v not in ("true", "false") or not isinstance(v, Atom):
            raise ValueError(f"bool must be true/false, got {_short_repr(v)}")
        return Bool(v == "true")
    if typ == "decimal":
        if not (isinstance(v, tuple) and len(v) == 2):
            raise ValueError(f"decimal must be {{Scale, Value}}, got {_short_repr(v)}")
        return LongString(decimal_text(_int(v[0], "decimal scale"), _int(v[1], "decimal value")))
    if typ == "table":
        return Table(table_from_terms(v))
    if typ == "array":
        if not isinstance(v, list):
            raise ValueError(f"array must be a list, got {_short_repr(v)}")
        vals = []
        for it in v:
            if not (isinstance(it, tuple) and len(it) == 2):
                raise ValueError(f"array item must be {{Type, Value}}, got {_short_repr(it)}")
            vals.append(_typed_value(it[0], it[1]))
        return Array(tuple(vals))
    if typ == "void":
        return VOID
    raise ValueError(f"unknown field type {str(typ)!r}")


def _int(v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{what} must be an integer, got {_short_repr(v)}")
    return v


def _short_repr(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."
