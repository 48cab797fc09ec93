"""A message RabbitMQ 4.x received over AMQP 1.0 (``mc_amqp``), as an AMQP 0-9-1 consumer would get it.

On disk (classic queues, 4.0.x) the container is
``{mc, mc_amqp, #v1{}, Annotations}`` with
``#v1{message_annotations, bare_and_footer, bare_and_footer_properties_pos
(0 | []), bare_and_footer_application_properties_pos (N | []),
bare_and_footer_body_pos, body_code}``: the message annotations already
decoded into RabbitMQ's tagged Erlang terms, the bare message + footer still
AMQP 1.0-encoded exactly as the client sent it, the AMQP header dropped
(durable / priority / ttl / creation time live in the container annotations
``d``, ``p``, ``ttl``, ``ts``).

The mapping is RabbitMQ 4.0.5's own, ``mc_amqp:convert_to/3`` ->
``mc_amqpl:convert_from(mc_amqp, ...)`` followed by
``mc_amqpl:protocol_state/2`` (what ``rabbit_channel`` does on delivery),
so an imported and restored message equals what a 0-9-1 consumer of the
live broker would have received:

=========================== ==================================================
AMQP 1.0                    AMQP 0-9-1 (RBAK record)
=========================== ==================================================
data section(s)             body (the sections' bytes concatenated)
amqp-value / amqp-sequence  body = the encoded body sections and footer as
                            stored; ``type`` = ``amqp-1.0``
message-id, correlation-id  string < 256 bytes: ``message_id`` /
                            ``correlation_id``; uuid: ``urn:uuid:<hex>``;
                            ulong: its decimal text; binary: header
                            ``x-message-id`` / ``x-correlation-id`` (Bytes);
                            longer string: that header (LongString)
user-id                     ``user_id`` if valid UTF-8 without NUL, < 256
                            bytes; else dropped (as RabbitMQ)
reply-to, group-id          ``reply_to``, ``app_id`` if < 256 bytes; else
                            dropped (as RabbitMQ)
content-type/-encoding      ``content_type`` / ``content_encoding``
creation-time               ``timestamp`` (seconds; ms truncated)
to, subject, absolute-      dropped, as RabbitMQ drops them
expiry-time, group-sequence,
reply-to-group-id, footer
header durable / priority / ``delivery_mode`` 2 unless durable=false (then
ttl (annotations d p ttl)   unset), ``priority``, ``expiration`` (ms text)
application-properties      headers (keys < 256 bytes; longer keys dropped,
                            as RabbitMQ)
message annotations x-*     headers, except RabbitMQ's internal ``x-basic-*``
                            (which fill ``delivery_mode``, ``priority``,
                            ``expiration``, ``type``), ``x-exchange``,
                            ``x-routing-key``, ``x-death``; ``x-cc`` becomes
                            ``CC``; ``x-opt-rabbitmq-received-time`` becomes
                            ``timestamp_in_ms`` (Long);
                            ``x-opt-deaths`` becomes ``x-death``; non-``x-``
                            and numeric keys are dropped (as RabbitMQ)
=========================== ==================================================

Header values (``mc_amqpl:to_091``): string/symbol/binary -> LongString
(Bytes when not UTF-8, as for 0-9-1 messages); long, ulong, int, uint,
ushort -> Long (a ulong above 2^63-1 wraps to negative, as RabbitMQ's 64-bit
signed field does); byte, ubyte, short -> Short; float/double;
boolean -> Bool; null -> Void; timestamp -> Timestamp in seconds; list and
array -> Array; map -> Table. The headers are sorted by name with duplicate
names dropped (first kept), as ``protocol_state`` does.

Where RabbitMQ 4.0.5 itself fails (its conversion has no clause and the
0-9-1 delivery crashes the channel) rbak still exports the message: uuid
values become LongString ``urn:uuid:<hex>``, char values a one-character
LongString, described values their value (descriptor dropped). A decimal
value, a map key that is not a string, or a content type of 256+ bytes
cannot be expressed: :class:`~rbak.errors.MessageFormatError`,
which the importer reports with file and offset (``--skip-damaged`` skips
and lists the message).
"""

from __future__ import annotations

from typing import Any

from ...format.record import (
    VOID, Array, BackupProperties, Bool, Bytes, Double, Float, HeaderValue, Long, LongString, Short, Table,
    Timestamp,
)
from ...format.amqp10 import DATA, NULL, BareMessage, Value, decode_bare_message, decode_value
from .erlang_terms import Atom
from ...errors import Amqp10Error, MappingError

AMQP10_TYPE = "amqp-1.0"


# --------------------------------------------------------------------------
# RabbitMQ's tagged Erlang terms (stored message annotations) -> Value.
# --------------------------------------------------------------------------

_INT_TAGS = frozenset(("ubyte", "byte", "ushort", "short", "uint", "int", "ulong", "long", "timestamp"))
_BIN_TAGS = frozenset(("utf8", "symbol", "binary"))


def from_erlang(t: Any) -> Value:
    """A value as ``amqp10_binary_parser`` returns it, into :class:`Value`."""
    if isinstance(t, Atom):
        if t == "null" or t == "undefined":
            return NULL
        if t == "true" or t == "false":
            return Value("boolean", t == "true")
    elif isinstance(t, tuple) and t and isinstance(t[0], Atom):
        tag = str(t[0])
        if len(t) == 2:
            v = t[1]
            if tag in _BIN_TAGS and isinstance(v, bytes):
                return Value(tag, v)
            if tag in _INT_TAGS and isinstance(v, int):
                return Value(tag, v)
            if tag in ("float", "double") and isinstance(v, (float, int)):
                return Value(tag, float(v))
            if tag == "boolean" and isinstance(v, Atom) and v in ("true", "false"):
                return Value("boolean", v == "true")
            if tag == "char" and isinstance(v, int) and 0 <= v <= 0x10FFFF:
                return Value("char", chr(v))
            if tag == "uuid" and isinstance(v, bytes) and len(v) == 16:
                return Value("uuid", v)
            if tag == "list" and isinstance(v, list):
                return Value("list", tuple(from_erlang(x) for x in v))
            if tag == "map" and isinstance(v, list):
                pairs = []
                for kv in v:
                    if not (isinstance(kv, tuple) and len(kv) == 2):
                        raise MappingError(f"AMQP map entry is not a pair: {_kind(kv)}")
                    pairs.append((from_erlang(kv[0]), from_erlang(kv[1])))
                return Value("map", tuple(pairs))
        elif len(t) == 3:
            if tag == "array" and isinstance(t[2], list):
                return Value("array", tuple(from_erlang(x) for x in t[2]))
            if tag == "described":
                return Value("described", (from_erlang(t[1]), from_erlang(t[2])))
            if tag == "as_is" and isinstance(t[1], int) and 0 <= t[1] < 256 and isinstance(t[2], bytes):
                raw = bytes((t[1],)) + t[2]
                try:
                    v, end = decode_value(raw)
                except Amqp10Error as e:
                    raise MappingError(f"stored as_is value: {e}") from None
                if end != len(raw):
                    raise MappingError(f"stored as_is value has {len(raw) - end} extra bytes")
                return v
    raise MappingError(f"not an AMQP 1.0 value as RabbitMQ stores one: {_kind(t)}")


def _kind(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


# --------------------------------------------------------------------------
# Values -> AMQP 0-9-1 header values (mc_amqpl:to_091).
# --------------------------------------------------------------------------


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="surrogateescape")


def _longstr(b: bytes) -> HeaderValue:
    try:
        return LongString(b.decode("utf-8"))
    except UnicodeDecodeError:
        return Bytes(b)


def _div1000(ms: int) -> int:
    return -((-ms) // 1000) if ms < 0 else ms // 1000  # Erlang div truncates towards zero


def urn(u: bytes) -> str:
    h = u.hex()
    return f"urn:uuid:{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def to_091(v: Value, where: str) -> HeaderValue:
    t = v.type
    x = v.value
    if t in _BIN_TAGS:
        return _longstr(x)
    if t in ("long", "int", "uint", "ushort"):
        return Long(x)
    if t == "ulong":
        return Long(x - (1 << 64) if x >= 1 << 63 else x)
    if t in ("byte", "ubyte", "short"):
        return Short(x)
    if t == "double":
        return Double(x)
    if t == "float":
        return Float(x)
    if t == "boolean":
        return Bool(x)
    if t == "null":
        return VOID
    if t == "timestamp":
        return Timestamp(_div1000(x) % (1 << 64))
    if t in ("list", "array"):
        return Array(tuple(to_091(i, where) for i in x))
    if t == "map":
        return Table(tuple((_table_key(k, where), to_091(i, where)) for k, i in x))
    # RabbitMQ 4.0.5 has no clause for these (its 0-9-1 delivery would crash).
    if t == "uuid":
        return LongString(urn(x))
    if t == "char":
        return LongString(x)
    if t == "described":
        return to_091(x[1], where)
    raise MappingError(f"{where}: an AMQP {t} value has no AMQP 0-9-1 form")


def _table_key(k: Value, where: str) -> str:
    if k.type in _BIN_TAGS and len(k.value) < 256:
        return _text(k.value)
    raise MappingError(f"{where}: map key {k.type} {k.value!r} cannot be an AMQP 0-9-1 field-table name")


# --------------------------------------------------------------------------
# The conversion.
# --------------------------------------------------------------------------

_INTERNAL = (b"x-routing-key", b"x-exchange", b"x-death")


def _is_internal(k: bytes) -> bool:
    return k.startswith(b"x-basic-") or k in _INTERNAL


def _deaths(v: Value) -> HeaderValue | None:
    """``x-opt-deaths`` (an AMQP client republished a dead-lettered message) -> ``x-death``."""
    if not (v.type == "array" and all(i.type == "map" for i in v.value)):
        return None  # RabbitMQ ignores any other shape
    names = (b"queue", b"reason", b"count", b"first-time", b"last-time", b"exchange", b"routing-keys")
    types = ("utf8", "symbol", "ulong", "timestamp", "timestamp", "utf8", "array")
    tables = []
    for m in v.value:
        kv = list(m.value)
        ttl = None
        if kv and kv[0][0] == Value("symbol", b"ttl") and kv[0][1].type == "uint":
            ttl = kv[0][1].value
            kv = kv[1:]
        if [(k.type, k.value) for k, _ in kv] != [("symbol", n) for n in names] or \
                [i.type for _, i in kv] != list(types):
            raise MappingError(f"x-opt-deaths entry is not RabbitMQ's dead-letter record: {_kind(m)}")
        q, reason, count, first, _last, exchange, rks = (i.value for _, i in kv)
        row: list[tuple[str, HeaderValue]] = [
            ("count", Long(count)),
            ("reason", LongString(_text(reason))),
            ("queue", LongString(_text(q))),
            ("time", Timestamp(_div1000(first))),
            ("exchange", LongString(_text(exchange))),
            ("routing-keys", Array(tuple(LongString(_text(r.value)) for r in rks if r.type == "utf8"))),
        ]
        if ttl is not None:
            row.insert(0, ("original-expiration", LongString(str(ttl))))
        tables.append(Table(tuple(row)))
    return Array(tuple(tables))


def _id(v: Value | None, header: str, hs: list) -> str | None:
    if v is None:
        return None
    if v.type == "uuid":
        return urn(v.value)
    if v.type == "ulong":
        return str(v.value)
    if v.type == "binary":
        hs.insert(0, (header, Bytes(v.value)))
        return None
    if len(v.value) < 256:  # utf8
        return _text(v.value)
    hs.insert(0, (header, _longstr(v.value)))
    return None


def _shortstr(v: Value | None) -> str | None:
    if v is not None and v.type == "utf8" and len(v.value) < 256:
        return _text(v.value)
    return None


def _symbol(v: Value | None, name: str) -> str | None:
    if v is None:
        return None
    if len(v.value) >= 256:
        raise MappingError(f"{name} of {len(v.value)} bytes does not fit an AMQP 0-9-1 short string")
    return _text(v.value)


def valid_short_string(b: bytes) -> bool:
    """What RabbitMQ accepts as a 0-9-1 short string property: < 256 bytes, UTF-8, no NUL."""
    if len(b) >= 256 or b"\x00" in b:
        return False
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _ma_get(ma: list[tuple[Value, Value]], key: bytes) -> Value | None:
    for k, v in ma:
        if k.type == "symbol" and k.value == key:
            return v
    return None


def _octet(v: Value | None, name: str) -> int | None:
    if v is None or v.type == "null":
        return None
    if v.type in _INT_TAGS and 0 <= v.value <= 255:
        return v.value
    raise MappingError(f"message annotation {name} must be an integer 0-255, is {v.type} {v.value!r}")


def _ma_text(v: Value | None, name: str) -> str | None:
    if v is None or v.type == "null":
        return None
    if v.type in _BIN_TAGS and len(v.value) < 256:
        return _text(v.value)
    raise MappingError(f"message annotation {name} must be a short string, is {v.type} {_kind(v.value)}")


def usort_headers(hs: list[tuple[str, HeaderValue]]) -> tuple[tuple[str, HeaderValue], ...]:
    """Sorted by name (bytes), first of equal names kept: ``lists:usort/2`` in ``protocol_state``."""
    out = []
    last = None
    for h in sorted(hs, key=lambda h: h[0].encode("utf-8", "surrogateescape")):
        if h[0] != last:
            out.append(h)
            last = h[0]
    return tuple(out)


def convert(state: Any) -> tuple[BackupProperties, tuple, bytes, BareMessage]:
    """``#v1{}`` -> (properties, headers, body, the decoded bare message), before the
    container annotations are applied (``stored_message`` does that for every protocol)."""
    if not (isinstance(state, tuple) and len(state) == 7 and state[0] == "v1"):
        raise MappingError(f"mc_amqp state is not the 4.0 #v1{{}} record: {_kind(state)}")
    _, ma_raw, bare_bin, props_pos, app_pos, body_pos, body_code = state
    if not isinstance(bare_bin, bytes):
        raise MappingError(f"mc_amqp bare message must be a binary, got {_kind(bare_bin)}")
    if not (isinstance(body_pos, int) and isinstance(body_code, int)):
        raise MappingError(f"mc_amqp body position/code must be integers: {body_pos!r}, {body_code!r}")
    if not isinstance(ma_raw, list):
        raise MappingError(f"mc_amqp message annotations must be a list, got {_kind(ma_raw)}")
    try:
        bare = decode_bare_message(bare_bin, body_pos, body_code)
    except Amqp10Error as e:
        raise MappingError(str(e)) from None
    if (props_pos == 0) != (bare.properties is not None) or (props_pos != 0 and props_pos != []):
        raise MappingError(f"mc_amqp properties position {props_pos!r} does not match the bare message")
    want_app: Any = [] if bare.application_properties_pos is None else bare.application_properties_pos
    if app_pos != want_app:
        raise MappingError(f"mc_amqp application-properties position {app_pos!r} does not match the bare "
                           f"message ({want_app!r})")
    ma = []
    for kv in ma_raw:
        if not (isinstance(kv, tuple) and len(kv) == 2):
            raise MappingError(f"message annotation is not a key/value pair: {_kind(kv)}")
        ma.append((from_erlang(kv[0]), from_erlang(kv[1])))
    props, headers, body = map_message(bare, ma)
    return props, headers, body, bare


def map_message(bare: BareMessage, ma: list[tuple[Value, Value]]) -> tuple[BackupProperties, tuple, bytes]:
    """``mc_amqpl:convert_from(mc_amqp, ...)`` for a stored message (no AMQP header section)."""
    # Body.
    if bare.body_code == DATA:
        body = bare.data[0] if len(bare.data) == 1 else b"".join(bare.data)
        type_field = _ma_text(_ma_get(ma, b"x-basic-type"), "x-basic-type")
    else:
        body = bare.body_and_footer
        type_field = AMQP10_TYPE
    # Headers: x- message annotations first, then the ids, then application properties.
    x_headers: list[tuple[str, HeaderValue]] = []
    for k, v in ma:
        if k.type != "symbol":
            continue
        key = k.value
        if key == b"x-cc":
            x_headers.append(("CC", to_091(v, "message annotation x-cc")))
        elif key == b"x-opt-rabbitmq-received-time" and v.type == "timestamp":
            x_headers.append(("timestamp_in_ms", Long(v.value)))
        elif key == b"x-opt-deaths":
            d = _deaths(v)
            if d is not None:
                x_headers.append(("x-death", d))
        elif key.startswith(b"x-") and len(key) < 256 and not _is_internal(key):
            name = _text(key)
            x_headers.append((name, to_091(v, f"message annotation {name!r}")))
    app: list[tuple[str, HeaderValue]] = []
    for k, v in bare.application_properties or ():
        if k.type == "utf8" and len(k.value) < 256:
            name = _text(k.value)
            app.append((name, to_091(v, f"application property {name!r}")))
    p = bare.properties or _EMPTY
    message_id = _id(p.message_id, "x-message-id", app)
    correlation_id = _id(p.correlation_id, "x-correlation-id", app)
    user_id = p.user_id.value if p.user_id is not None and valid_short_string(p.user_id.value) else None
    props = BackupProperties(
        content_type=_symbol(p.content_type, "content-type"),
        content_encoding=_symbol(p.content_encoding, "content-encoding"),
        delivery_mode=_octet(_ma_get(ma, b"x-basic-delivery-mode"), "x-basic-delivery-mode"),
        priority=_octet(_ma_get(ma, b"x-basic-priority"), "x-basic-priority"),
        correlation_id=correlation_id,
        reply_to=_shortstr(p.reply_to),
        expiration=_ma_text(_ma_get(ma, b"x-basic-expiration"), "x-basic-expiration"),
        message_id=message_id,
        timestamp=_div1000(p.creation_time.value) % (1 << 64) if p.creation_time is not None else None,
        type_field=type_field,
        user_id=_text(user_id) if user_id is not None else None,
        app_id=_shortstr(p.group_id),
    )
    headers = usort_headers(x_headers + app)
    return props, headers, body


class _Empty:
    message_id = user_id = reply_to = correlation_id = content_type = content_encoding = None
    creation_time = group_id = None


_EMPTY = _Empty()
