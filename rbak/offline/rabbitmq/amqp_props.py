"""AMQP 0-9-1 basic properties, as RabbitMQ keeps them on disk, into rbak's types.

A stored message carries its properties either as the wire binary (the
content header's property flags + fields, ``properties_bin``) or as the
decoded ``'P_basic'`` record (``properties``); both are handled. The binary
goes through the one codec, :mod:`rbak.format.amqp091` (its docstring has the
field-type -> variant table); the decoded record's ``{Name, Type, Value}``
entries are mapped to the same variants here.
"""

from __future__ import annotations

from typing import Any

from ...format.amqp091 import (  # noqa: F401 - the importer's names for the codec
    PROPERTY_FIELDS, VARIANT_OF_RABBIT_TYPE, decode_basic_properties, parse_table,
)
from ...format.record import (
    VOID, Array, BackupProperties, Bool, Bytes, Double, Float, HeaderValue, Headers, LongString, Table,
    decimal_header,
)
from .erlang_terms import Atom


def _text(raw: bytes) -> str:
    # Short strings are UTF-8 by spec; a non-UTF-8 one keeps its bytes readable.
    return raw.decode("utf-8", errors="surrogateescape")


def decode_properties(data: bytes | memoryview) -> tuple[BackupProperties, Headers]:
    """Decode a basic-class property binary (flags + fields); no headers is ``()``.

    Messages of one publisher mostly carry the same property bytes, so the last few hundred
    decoded are kept (the result depends on the bytes alone); each caller gets its own
    ``BackupProperties`` (callers adjust them), the header values are shared (immutable)."""
    key = data if type(data) is bytes else bytes(data)
    hit = _CACHE.get(key)
    if hit is None:
        props, headers = decode_basic_properties(key)
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.clear()
        hit = _CACHE[key] = (props, headers or ())
    p, headers = hit
    return BackupProperties(p.content_type, p.content_encoding, p.delivery_mode, p.priority, p.correlation_id,
                            p.reply_to, p.expiration, p.message_id, p.timestamp, p.type_field, p.user_id,
                            p.app_id, p.cluster_id), headers


_CACHE: dict[bytes, tuple[BackupProperties, Headers]] = {}
_CACHE_SIZE = 512


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
    for (_, name, kind), v in zip(PROPERTY_FIELDS, rec[1:]):
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
    numeric = VARIANT_OF_RABBIT_TYPE.get(str(typ))
    if numeric is Float or numeric is Double:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ValueError(f"{typ} must be a number, got {_short_repr(v)}")
        return numeric(float(v))
    if numeric is not None:  # the same variant as the binary's type octet
        return numeric(_int(v, typ))
    if typ == "bool":
        if v not in ("true", "false") or not isinstance(v, Atom):
            raise ValueError(f"bool must be true/false, got {_short_repr(v)}")
        return Bool(v == "true")
    if typ == "decimal":
        if not (isinstance(v, tuple) and len(v) == 2):
            raise ValueError(f"decimal must be {{Scale, Value}}, got {_short_repr(v)}")
        scale, value = _int(v[0], "decimal scale"), _int(v[1], "decimal value")
        if not 0 <= scale <= 255 or not -(2**31) <= value < 2**32:
            raise ValueError(f"decimal {{Scale, Value}} out of range: {_short_repr(v)}")
        return decimal_header(scale, value - 2**32 if value >= 2**31 else value)  # RabbitMQ keeps it unsigned
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
