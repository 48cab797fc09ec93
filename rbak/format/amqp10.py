"""The AMQP 1.0 type system and message sections (OASIS AMQP 1.0, part 1.6 and 3.2): a strict decoder
and the encoders the restore needs.

RabbitMQ 4.x keeps a message published over AMQP 1.0 in its AMQP 1.0
encoding: the *bare message* (properties, application-properties, body,
footer) as the client sent it (``mc_amqp``'s ``#v1{}`` record, see
``offline/rabbitmq/mc_amqp.py``). The importer reads that encoding; the
restore writes the sections of a record it publishes over AMQP 1.0
(``restore/amqp10_message.py``, with the encoders at the end of this module),
so both halves of the codec live here, below both.

Values decode to :class:`Value` (AMQP type name + Python value), keeping the
AMQP type because the AMQP 0-9-1 mapping depends on it (a ``uint`` and a
``long`` become different field-table types). Type names are the ones
RabbitMQ's ``amqp10_binary_parser`` uses (``utf8`` for string, ``list``,
``map``, ``array``, ``described``), so a value decoded here and a value
RabbitMQ already decoded into an Erlang term (the stored message
annotations) meet in one model.

Strict: every length, count and size is checked against the bytes actually
present, compound sizes must match what their elements consume, booleans
must be 0/1, a map needs an even count, and an unknown format code is an
error. Every error is an :class:`Amqp10Error` naming the byte offset within
the decoded buffer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import Amqp10Error
from .backend import speedups


@dataclass(frozen=True, slots=True)
class Value:
    """One AMQP value: ``type`` as in RabbitMQ's parser, ``value`` as below.

    null: None; boolean: bool; ubyte ushort uint ulong byte short int long:
    int; float double: float; char: str (one code point); timestamp: int
    (ms since the epoch); uuid: 16 bytes; binary utf8 symbol: bytes (raw, so
    invalid UTF-8 survives to the mapping); decimal32/64/128: the raw bytes;
    list: tuple of Value; map: tuple of (Value, Value); array: tuple of Value
    (all of one type); described: (descriptor Value, Value).
    """

    type: str
    value: Any


NULL = Value("null", None)

# Section descriptors (part 3.2): numeric code and symbolic name.
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS = 0x70, 0x71, 0x72
PROPERTIES, APPLICATION_PROPERTIES = 0x73, 0x74
DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x75, 0x76, 0x77, 0x78
SECTION_NAMES = {
    HEADER: "header", DELIVERY_ANNOTATIONS: "delivery-annotations", MESSAGE_ANNOTATIONS: "message-annotations",
    PROPERTIES: "properties", APPLICATION_PROPERTIES: "application-properties", DATA: "data",
    AMQP_SEQUENCE: "amqp-sequence", AMQP_VALUE: "amqp-value", FOOTER: "footer",
}
_SYMBOLIC = {
    b"amqp:header:list": HEADER, b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS, b"amqp:properties:list": PROPERTIES,
    b"amqp:application-properties:map": APPLICATION_PROPERTIES, b"amqp:data:binary": DATA,
    b"amqp:amqp-sequence:list": AMQP_SEQUENCE, b"amqp:amqp-value:*": AMQP_VALUE, b"amqp:footer:map": FOOTER,
}
BODY_CODES = (DATA, AMQP_SEQUENCE, AMQP_VALUE)

_FIXED = {  # code: (type, width, struct or None)
    0x50: ("ubyte", 1, struct.Struct(">B")),
    0x51: ("byte", 1, struct.Struct(">b")),
    0x52: ("uint", 1, struct.Struct(">B")),
    0x53: ("ulong", 1, struct.Struct(">B")),
    0x54: ("int", 1, struct.Struct(">b")),
    0x55: ("long", 1, struct.Struct(">b")),
    0x60: ("ushort", 2, struct.Struct(">H")),
    0x61: ("short", 2, struct.Struct(">h")),
    0x70: ("uint", 4, struct.Struct(">I")),
    0x71: ("int", 4, struct.Struct(">i")),
    0x72: ("float", 4, struct.Struct(">f")),
    0x80: ("ulong", 8, struct.Struct(">Q")),
    0x81: ("long", 8, struct.Struct(">q")),
    0x82: ("double", 8, struct.Struct(">d")),
    0x83: ("timestamp", 8, struct.Struct(">q")),
}
_CONSTANTS = {
    0x40: NULL, 0x41: Value("boolean", True), 0x42: Value("boolean", False),
    0x43: Value("uint", 0), 0x44: Value("ulong", 0), 0x45: Value("list", ()),
}
_VARIABLE = {0xA0: ("binary", 1), 0xA1: ("utf8", 1), 0xA3: ("symbol", 1),
             0xB0: ("binary", 4), 0xB1: ("utf8", 4), 0xB3: ("symbol", 4)}
_VAR8 = {0xA0: "binary", 0xA1: "utf8", 0xA3: "symbol"}
_DECIMALS = {0x74: ("decimal32", 4), 0x84: ("decimal64", 8), 0x94: ("decimal128", 16)}
_U32 = struct.Struct(">I")
MAX_DEPTH = 200
#: Elements of one array whose constructor takes no bytes per element (null, true, 0, ...): the
#: only count its size does not bound, so a damaged one could ask for billions.
MAX_ZERO_WIDTH_ELEMENTS = 1 << 20


def decode_value(data: bytes, pos: int = 0, end: int | None = None) -> tuple[Value, int]:
    """Decode one value at ``pos``; returns (value, offset after it)."""
    return _value(data, pos, len(data) if end is None else end)


def decode_all(data: bytes) -> list[tuple[int, Value]]:
    """Every top-level value of ``data`` as (offset, value), which must end exactly at its end."""
    out = []
    pos, n = 0, len(data)
    while pos < n:
        v, e = _value(data, pos, n)
        out.append((pos, v))
        pos = e
    return out


def _value(data: bytes, pos: int, end: int) -> tuple[Value, int]:
    """The C helper's decoding when it takes the value; else (and for every error, so messages and
    offsets are this module's) the Python decoder's. Both give equal values."""
    if _fast is not None:
        r = _fast(data, pos, end)
        if r is not None:
            return r
    try:
        return _Decoder(data, end).value(pos, 0)
    except RecursionError:  # Python's own stack ends before MAX_DEPTH: the same verdict
        raise Amqp10Error("value nested too deeply", pos) from None


class _Decoder:
    __slots__ = ("data", "end")

    def __init__(self, data: bytes, end: int):
        self.data = data
        self.end = end

    def need(self, pos: int, k: int, what: str) -> None:
        if pos + k > self.end:
            raise Amqp10Error(f"truncated {what}: needs {k} bytes, {max(self.end - pos, 0)} left", pos)

    def value(self, pos: int, depth: int) -> tuple[Value, int]:
        if depth > MAX_DEPTH:
            raise Amqp10Error("value nested too deeply", pos)
        if pos >= self.end:
            self.need(pos, 1, "format code")
        code = self.data[pos]
        c = _CONSTANTS.get(code)  # fast paths: null, booleans, zeros, and short strings/binaries
        if c is not None:
            return c, pos + 1
        v8 = _VAR8.get(code)
        if v8 is not None and pos + 2 <= self.end:
            ln = self.data[pos + 1]
            q = pos + 2 + ln
            if q <= self.end:
                return Value(v8, bytes(self.data[pos + 2 : q])), q
        if code == 0x00:
            desc, p = self.value(pos + 1, depth + 1)
            if desc.type == "described":
                raise Amqp10Error("a descriptor must not itself be described", pos + 1)
            v, p = self.value(p, depth + 1)
            return Value("described", (desc, v)), p
        return self.primitive(code, pos + 1, depth, pos)

    def primitive(self, code: int, p: int, depth: int, at: int) -> tuple[Value, int]:
        """The value of format ``code`` whose payload starts at ``p`` (``at``: where its code was)."""
        data = self.data
        c = _CONSTANTS.get(code)
        if c is not None:
            return c, p
        f = _FIXED.get(code)
        if f is not None:
            t, w, s = f
            self.need(p, w, t)
            return Value(t, s.unpack_from(data, p)[0]), p + w
        v = _VARIABLE.get(code)
        if v is not None:
            t, w = v
            self.need(p, w, f"{t} length")
            ln = data[p] if w == 1 else _U32.unpack_from(data, p)[0]
            p += w
            self.need(p, ln, t)
            return Value(t, bytes(data[p : p + ln])), p + ln
        if code == 0x56:
            self.need(p, 1, "boolean")
            b = data[p]
            if b > 1:
                raise Amqp10Error(f"boolean byte {b} is neither 0 nor 1", p)
            return Value("boolean", b == 1), p + 1
        if code == 0x73:
            self.need(p, 4, "char")
            cp = _U32.unpack_from(data, p)[0]
            if cp > 0x10FFFF:
                raise Amqp10Error(f"char U+{cp:X} is not a Unicode code point", p)
            return Value("char", chr(cp)), p + 4
        if code == 0x98:
            self.need(p, 16, "uuid")
            return Value("uuid", bytes(data[p : p + 16])), p + 16
        d = _DECIMALS.get(code)
        if d is not None:
            t, w = d
            self.need(p, w, t)
            return Value(t, bytes(data[p : p + w])), p + w
        if code in (0xC0, 0xC1, 0xD0, 0xD1, 0xE0, 0xF0):
            return self.compound(code, p, depth, at)
        raise Amqp10Error(f"unknown format code 0x{code:02x}", at)

    def compound(self, code: int, p: int, depth: int, at: int) -> tuple[Value, int]:
        data = self.data
        w = 1 if code in (0xC0, 0xC1, 0xE0) else 4
        kind = {0xC0: "list", 0xD0: "list", 0xC1: "map", 0xD1: "map", 0xE0: "array", 0xF0: "array"}[code]
        self.need(p, 2 * w, f"{kind} size and count")
        if w == 1:
            size, count = data[p], data[p + 1]
        else:
            size, count = _U32.unpack_from(data, p)[0], _U32.unpack_from(data, p + 4)[0]
        if size < w:
            raise Amqp10Error(f"{kind} size {size} is smaller than its count field", p)
        body_end = p + w + size
        if body_end > self.end:
            raise Amqp10Error(f"truncated {kind}: size {size}, {self.end - p - w} bytes left", at)
        q = p + 2 * w
        inner = _Decoder(data, body_end)
        items: list[Value] = []
        if kind == "array":
            if count == 0 and q == body_end:
                return Value("array", ()), body_end
            inner.need(q, 1, "array constructor")
            desc = None
            ccode_at = q
            if data[q] == 0x00:
                desc, q = inner.value(q + 1, depth + 1)
                ccode_at = q
                inner.need(q, 1, "array element constructor")
            ccode = data[q]
            q += 1
            if ccode == 0x00:
                raise Amqp10Error("nested descriptor in an array constructor", ccode_at)
            if ccode in _CONSTANTS and count > MAX_ZERO_WIDTH_ELEMENTS:  # no bytes bound them: a bad count
                raise Amqp10Error(f"array of {count} zero-width elements (at most {MAX_ZERO_WIDTH_ELEMENTS} "
                                  "are accepted)", p)
            for _ in range(count):
                if ccode in _CONSTANTS:  # zero-width elements
                    item = _CONSTANTS[ccode]
                else:
                    if q >= body_end:
                        raise Amqp10Error(f"array holds fewer than its {count} elements", q)
                    item, q = inner.primitive(ccode, q, depth + 1, ccode_at)
                items.append(item if desc is None else Value("described", (desc, item)))
        else:
            for _ in range(count):
                if q >= body_end:
                    raise Amqp10Error(f"{kind} holds fewer than its {count} elements", q)
                item, q = inner.value(q, depth + 1)
                items.append(item)
        if q != body_end:
            raise Amqp10Error(f"{kind} of {count} elements ends at byte {q}, its size says {body_end}", at)
        if kind == "map":
            if count % 2:
                raise Amqp10Error(f"map has an odd element count {count}", at)
            return Value("map", tuple(zip(items[0::2], items[1::2]))), body_end
        return Value(kind, tuple(items)), body_end


def _load_fast() -> Callable[..., Any] | None:
    """``amqp_value`` of the optional C helper (``rbak/format/_amqp10.c``), given this module's
    ``Value`` and constants; None with ``RBAK_SPEEDUPS=0`` or an install without it."""
    fn = getattr(speedups, "amqp_value", None)
    if fn is None:
        return None
    speedups.amqp_configure(Value, dict(_CONSTANTS))  # type: ignore[union-attr]  # fn is None without speedups
    return fn


_fast = _load_fast()


# --------------------------------------------------------------------------
# Message sections.
# --------------------------------------------------------------------------

_PROPERTY_FIELDS = (
    ("message_id", None), ("user_id", ("binary",)), ("to", ("utf8",)), ("subject", ("utf8",)),
    ("reply_to", ("utf8",)), ("correlation_id", None), ("content_type", ("symbol",)),
    ("content_encoding", ("symbol",)), ("absolute_expiry_time", ("timestamp",)),
    ("creation_time", ("timestamp",)), ("group_id", ("utf8",)), ("group_sequence", ("uint",)),
    ("reply_to_group_id", ("utf8",)),
)
_ID_TYPES = ("ulong", "uuid", "binary", "utf8")


@dataclass(frozen=True, slots=True)
class Properties:
    """The properties section (3.2.4); absent fields are None."""

    message_id: Value | None = None
    user_id: Value | None = None
    to: Value | None = None
    subject: Value | None = None
    reply_to: Value | None = None
    correlation_id: Value | None = None
    content_type: Value | None = None
    content_encoding: Value | None = None
    absolute_expiry_time: Value | None = None
    creation_time: Value | None = None
    group_id: Value | None = None
    group_sequence: Value | None = None
    reply_to_group_id: Value | None = None


@dataclass(frozen=True, slots=True)
class BareMessage:
    """A bare message + footer as RabbitMQ stores it (no header, no annotations).

    ``body_code`` is DATA, AMQP_SEQUENCE or AMQP_VALUE; ``data`` the contents
    of the data sections (DATA only); ``body_and_footer`` the encoded bytes
    from the first body section to the end, which is what RabbitMQ hands an
    AMQP 0-9-1 consumer as the body of a non-data message.
    """

    properties: Properties | None
    application_properties: tuple[tuple[Value, Value], ...] | None
    body_code: int
    data: tuple[bytes, ...]
    body_values: tuple[Value, ...]
    footer: tuple[tuple[Value, Value], ...] | None
    application_properties_pos: int | None
    body_pos: int
    body_and_footer: bytes


def _section_code(desc: Value, at: int) -> int:
    if desc.type == "ulong" and desc.value in SECTION_NAMES:
        return desc.value
    if desc.type == "symbol" and desc.value in _SYMBOLIC:
        return _SYMBOLIC[desc.value]
    raise Amqp10Error(f"not a message section descriptor: {desc.type} {desc.value!r}", at)


def decode_sections(data: bytes) -> list[tuple[int, int, Value]]:
    """Every section of an encoded message as (offset, section code, section value)."""
    out = []
    for pos, v in decode_all(data):
        if v.type != "described":
            raise Amqp10Error(f"expected a described section, found a {v.type}", pos)
        desc, inner = v.value
        out.append((pos, _section_code(desc, pos + 1), inner))
    return out


def _properties(v: Value, at: int) -> Properties:
    if v.type != "list":
        raise Amqp10Error(f"properties section must be a list, is a {v.type}", at)
    if len(v.value) > len(_PROPERTY_FIELDS):
        raise Amqp10Error(f"properties list has {len(v.value)} fields, at most 13 exist", at)
    fields = {}
    for (name, types), item in zip(_PROPERTY_FIELDS, v.value):
        if item.type == "null":
            continue
        allowed = types or _ID_TYPES
        if item.type not in allowed:
            raise Amqp10Error(f"property {name.replace('_', '-')} must be {' or '.join(allowed)}, is a {item.type}", at)
        fields[name] = item
    return Properties(**fields)


def _map(v: Value, what: str, at: int) -> tuple[tuple[Value, Value], ...]:
    if v.type == "null":
        return ()
    if v.type != "map":
        raise Amqp10Error(f"{what} section must be a map, is a {v.type}", at)
    return v.value


def decode_bare_message(data: bytes, body_pos: int | None = None, body_code: int | None = None) -> BareMessage:
    """Decode and check a bare message (+ footer): optional properties, then
    optional application-properties, then one amqp-value, or one or more
    amqp-sequence, or one or more data sections, then an optional footer.
    ``body_pos``/``body_code`` (what RabbitMQ recorded) must agree."""
    props = None
    app: tuple | None = None
    footer = None
    data_parts: list[bytes] = []
    values: list[Value] = []
    first_body: tuple[int, int] | None = None
    app_pos = None
    order = 0  # 0 before properties, 1 after, 2 after app-props, 3 in body, 4 after footer
    for pos, code, v in decode_sections(data):
        name = SECTION_NAMES[code]
        if code == PROPERTIES and order == 0:
            props = _properties(v, pos)
            order = 1
        elif code == APPLICATION_PROPERTIES and order <= 1:
            app = _map(v, name, pos)
            app_pos = pos
            order = 2
        elif code in BODY_CODES and order <= 3:
            if first_body is None:
                first_body = (pos, code)
            elif code != first_body[1] or code == AMQP_VALUE:
                raise Amqp10Error(f"{name} section after a {SECTION_NAMES[first_body[1]]} body section", pos)
            if code == DATA:
                if v.type != "binary":
                    raise Amqp10Error(f"data section must hold a binary, holds a {v.type}", pos)
                data_parts.append(v.value)
            elif code == AMQP_SEQUENCE:
                if v.type != "list":
                    raise Amqp10Error(f"amqp-sequence section must hold a list, holds a {v.type}", pos)
                values.append(v)
            else:
                values.append(v)
            order = 3
        elif code == FOOTER and order == 3:
            footer = _map(v, name, pos)
            order = 4
        else:
            raise Amqp10Error(f"unexpected {name} section in a bare message", pos)
    if first_body is None:
        raise Amqp10Error("bare message has no body section", len(data))
    if body_pos is not None and body_pos != first_body[0]:
        raise Amqp10Error(f"body starts at byte {first_body[0]}, RabbitMQ recorded {body_pos}", first_body[0])
    if body_code is not None and body_code != first_body[1]:
        raise Amqp10Error(f"body is {SECTION_NAMES[first_body[1]]}, RabbitMQ recorded descriptor 0x{body_code:x}",
                          first_body[0])
    return BareMessage(props, app, first_body[1], tuple(data_parts), tuple(values), footer, app_pos,
                       first_body[0], bytes(data[first_body[0]:]))


# --------------------------------------------------------------------------
# Encoding (the primitives the restore's sections are built of; the decoder above reads them back).
# --------------------------------------------------------------------------


def encode_null() -> bytes:
    return b"\x40"


def encode_bool(v: bool) -> bytes:
    return b"\x41" if v else b"\x42"


def encode_ubyte(v: int) -> bytes:
    return b"\x50" + struct.pack(">B", v)


def encode_uint(v: int) -> bytes:
    return b"\x70" + struct.pack(">I", v)


def encode_short(v: int) -> bytes:
    return b"\x61" + struct.pack(">h", v)


def encode_long(v: int) -> bytes:
    return b"\x81" + struct.pack(">q", v)


def encode_float(v: float) -> bytes:
    return b"\x72" + struct.pack(">f", v)


def encode_double(v: float) -> bytes:
    return b"\x82" + struct.pack(">d", v)


def encode_timestamp(ms: int) -> bytes:
    return b"\x83" + struct.pack(">q", ms)


def _vbin(code8: int, code32: int, data: bytes) -> bytes:
    n = len(data)
    if n < 256:
        return bytes((code8, n)) + data
    return bytes((code32,)) + struct.pack(">I", n) + data


def encode_binary(b: bytes) -> bytes:
    return _vbin(0xA0, 0xB0, b)


def encode_utf8(s: str) -> bytes:
    return _vbin(0xA1, 0xB1, s.encode("utf-8"))


def encode_symbol(s: str) -> bytes:
    """An ASCII symbol (``UnicodeEncodeError`` for anything else: the caller decides what that means)."""
    return _vbin(0xA3, 0xB3, s.encode("ascii"))


def encode_compound(code8: int, code32: int, count: int, items: bytes) -> bytes:
    """A list (0xC0/0xD0) or map (0xC1/0xD1) of ``count`` encoded ``items``, in the narrow form when it fits."""
    if len(items) + 1 < 256 and count < 256:
        return bytes((code8, len(items) + 1, count)) + items
    return bytes((code32,)) + struct.pack(">II", len(items) + 4, count) + items


def encode_described(code: int, value: bytes) -> bytes:
    """``value`` described by the small-ulong section ``code`` (HEADER ... FOOTER)."""
    return b"\x00\x53" + bytes((code,)) + value


def list_section(code: int, fields: list[bytes | None]) -> bytes:
    """A list section (header, properties) of encoded fields, None for null; trailing nulls are omitted."""
    while fields and fields[-1] is None:
        fields.pop()
    body = b"".join(encode_null() if f is None else f for f in fields)
    return encode_described(code, encode_compound(0xC0, 0xD0, len(fields), body))


def map_section(code: int, pairs: list[tuple[bytes, bytes]]) -> bytes:
    """A map section (annotations, application properties) of encoded (key, value) pairs."""
    return encode_described(code, encode_compound(0xC1, 0xD1, 2 * len(pairs), b"".join(k + v for k, v in pairs)))


def data_section(body: bytes) -> bytes:
    """The body as one ``data`` section (what a 0-9-1 consumer gets back byte for byte)."""
    n = len(body)
    if n < 256:
        return b"\x00\x53\x75\xa0" + bytes((n,)) + body
    return b"\x00\x53\x75\xb0" + struct.pack(">I", n) + body
