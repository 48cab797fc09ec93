"""A backed-up AMQP 0-9-1 message as AMQP 1.0 sections, when 1.0 can carry it exactly.

RabbitMQ 4.x stores a message published over AMQP 1.0 as 1.0 and converts it
for AMQP 0-9-1 consumers (``mc_amqpl:convert_from(mc_amqp, ...)``). A record
goes over 1.0 only when that conversion gives back exactly the properties and
headers a 0-9-1 publish of the same record would give, so a restore is the same
whichever protocol carried it (the round trip is tested against 4.0.5 and 4.3.6).
Everything else returns ``None`` and is published over 0-9-1. What rules a
record out, and why:

- ``delivery_mode`` 1 (or anything but 2 or unset): a 1.0 header's ``durable =
  false`` reads back as no delivery mode at all (4.0.5 and 4.3.6 alike), so
  unset maps to ``durable = false`` and only 2 to ``true``. The header is
  always sent: 4.0 and 4.1 take a message without one as durable;
- an expiration that is not a canonical decimal of at most 32 bits (it travels
  as the header's ``ttl`` integer and comes back as its decimal text);
- ``cluster_id`` (no 1.0 field); a content type or encoding that is not ASCII
  (1.0 symbols); a ``reply_to`` starting ``/queues/`` (4.1+ decode it as an
  address) or ``amq.rabbitmq.reply-to`` (0-9-1 refuses it without a direct
  reply-to consumer, 1.0 would take it); ids, ``user_id``, ``app_id`` or ``type`` that are not UTF-8 or
  longer than a short string (they would move into headers or be dropped);
- headers of type ``x`` (binary comes back as a long string), tables and
  arrays (not allowed in application properties), names that are not UTF-8,
  repeated names, ``CC``/``BCC`` (0-9-1 routes them) and the ``x-`` names the
  broker reserves or rewrites; and an ``x-`` header after a plain one (the
  broker lists ``x-`` headers first, so the order would change).
"""

from __future__ import annotations

from typing import Any, overload

from ..format.amqp10 import (
    APPLICATION_PROPERTIES,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    encode_binary,
    encode_bool,
    encode_double,
    encode_float,
    encode_long,
    encode_null,
    encode_short,
    encode_symbol,
    encode_timestamp,
    encode_ubyte,
    encode_uint,
    encode_utf8,
    list_section,
    map_section,
)
from ..format.record import (
    BackupProperties,
    BackupRecord,
    Bool,
    Double,
    Float,
    Headers,
    Long,
    LongString,
    Short,
    ShortString,
    Timestamp,
    Void,
    properties_key,
)

_RESERVED_X = frozenset({"x-routing-key", "x-exchange", "x-death", "x-cc", "x-opt-deaths",
                         "x-opt-rabbitmq-received-time"})
_ROUTING = frozenset({"CC", "BCC"})
_MAX_TTL = 0xFFFFFFFF
_MAX_TS_SECONDS = (2**63 - 1) // 1000


class _NotExact(Exception):
    """This record cannot be carried over 1.0 exactly (internal: becomes ``None``)."""


# -- the checks and the mapping ---------------------------------------------
@overload
def _short_text(v: str) -> str: ...
@overload
def _short_text(v: str | None) -> str | None: ...
def _short_text(v: str | None) -> str | None:
    """A shortstr property that 1.0 carries as utf8 and converts back unchanged."""
    if v is None:
        return None
    try:
        b = v.encode("utf-8")  # surrogate escapes (non-UTF-8 bytes) raise here
    except UnicodeEncodeError:
        raise _NotExact from None
    if len(b) > 255:
        raise _NotExact
    return v


def _ascii(v: str | None) -> str | None:
    if v is not None and not v.isascii():
        raise _NotExact
    return v


def _value(v: Any) -> bytes:  # v: a HeaderValue (Any: the dispatch on a saved type(v) is one a checker cannot follow)
    t = type(v)
    if t is LongString or t is ShortString:
        try:
            return encode_utf8(v.value)
        except UnicodeEncodeError:  # non-UTF-8 bytes kept as surrogates: binary converts back to longstr
            return encode_binary(v.value.encode("utf-8", "surrogateescape"))
    if t is Long:
        return encode_long(v.value)
    if t is Short:
        return encode_short(v.value)
    if t is Bool:
        return encode_bool(v.value)
    if t is Timestamp:
        if not 0 <= v.value <= _MAX_TS_SECONDS:
            raise _NotExact
        return encode_timestamp(v.value * 1000)
    if t is Float:
        return encode_float(v.value)
    if t is Double:
        return encode_double(v.value)
    if t is Void:
        return encode_null()
    raise _NotExact  # Bytes, Table, Array


def _headers(headers: Headers) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    annotations: list[tuple[bytes, bytes]] = []
    app: list[tuple[bytes, bytes]] = []
    seen: set[str] = set()
    for name, value in headers:
        if name in seen or name in _ROUTING:
            raise _NotExact
        seen.add(name)
        _short_text(name)
        if name.startswith("x-"):
            if app or not name.isascii() or name.startswith("x-basic-") or name in _RESERVED_X:
                raise _NotExact
            annotations.append((encode_symbol(name), _value(value)))
        else:
            app.append((encode_utf8(name), _value(value)))
    return annotations, app


def _header_section(p: BackupProperties) -> bytes:
    if p.delivery_mode not in (None, 2):
        raise _NotExact
    ttl = None
    if p.expiration is not None:
        e = p.expiration
        if not (e.isascii() and e.isdigit()) or str(int(e)) != e or int(e) > _MAX_TTL:
            raise _NotExact
        ttl = encode_uint(int(e))
    priority = None
    if p.priority is not None:
        if not 0 <= p.priority <= 255:
            raise _NotExact
        priority = encode_ubyte(p.priority)
    return list_section(HEADER, [encode_bool(p.delivery_mode == 2), priority, ttl])


def _properties_section(p: BackupProperties) -> bytes | None:
    if p.reply_to is not None and p.reply_to.startswith(("/queues/", "amq.rabbitmq.reply-to")):
        raise _NotExact
    if p.timestamp is not None and not 0 <= p.timestamp <= _MAX_TS_SECONDS:
        raise _NotExact
    mid, uid, rto, cid = (_short_text(p.message_id), _short_text(p.user_id), _short_text(p.reply_to),
                          _short_text(p.correlation_id))
    app_id = _short_text(p.app_id)
    ct, ce = _ascii(p.content_type), _ascii(p.content_encoding)
    fields: list[bytes | None] = [
        None if mid is None else encode_utf8(mid),
        None if uid is None else encode_binary(uid.encode("utf-8")),
        None,  # to: the link's target address says where
        None,  # subject
        None if rto is None else encode_utf8(rto),
        None if cid is None else encode_utf8(cid),
        None if ct is None else encode_symbol(ct),
        None if ce is None else encode_symbol(ce),
        None,  # absolute-expiry-time
        None if p.timestamp is None else encode_timestamp(p.timestamp * 1000),
        None if app_id is None else encode_utf8(app_id),
    ]
    if all(f is None for f in fields):
        return None
    return list_section(PROPERTIES, fields)


def encode_sections(p: BackupProperties, headers: Headers) -> bytes | None:
    """Every section before the body, or ``None`` when 1.0 cannot carry this record exactly."""
    try:
        if p.cluster_id is not None:
            raise _NotExact
        header = _header_section(p)
        annotations, app = _headers(headers)
        if p.type_field is not None:
            annotations.append((encode_symbol("x-basic-type"), encode_utf8(_short_text(p.type_field))))
        props = _properties_section(p)
    except _NotExact:
        return None
    parts = [header]
    if annotations:
        parts.append(map_section(MESSAGE_ANNOTATIONS, annotations))
    parts.append(props or b"")
    if app:
        parts.append(map_section(APPLICATION_PROPERTIES, app))
    return b"".join(parts)


class SectionsCache:
    """``encode_sections`` by value: consecutive records usually share properties and headers."""

    def __init__(self) -> None:
        self._cache: dict[tuple, bytes | None] = {}

    def __call__(self, r: BackupRecord) -> bytes | None:
        p = r.properties
        key = properties_key(p, r.headers)
        try:
            return self._cache[key]
        except KeyError:
            pass
        sections = encode_sections(p, r.headers)
        if len(self._cache) >= 4096:
            self._cache.clear()
        self._cache[key] = sections
        return sections

