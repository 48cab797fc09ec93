"""BackupRecord and its JSON form, byte-compatible with the Rust tool.

The JSON layout (field names and order, header variants as externally tagged
enums, ``body`` as an array of u8 or ``null``) is fixed by
``segment-format.md``. Writers emit exactly that, compact, in spec order;
readers accept any key order, ignore unknown keys and take ``body`` as
``[]`` or ``null``.

Speed matters here (a backup is mostly bodies): encoding hands orjson a NumPy
``uint8`` view of the body, which it serialises as an integer array in C;
decoding lets orjson parse the record and turns the integer list back into
``bytes`` in C too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Union

import numpy as np
import orjson

from ..errors import SerializationError

_ORJSON_OPTS = orjson.OPT_SERIALIZE_NUMPY


# --------------------------------------------------------------------------
# Header values: one dataclass per variant of the Rust BackupHeaderValue enum.
# Treat them as immutable. They are not ``frozen=True`` because a frozen
# dataclass costs 2.4x more to construct, and decoding builds millions.
# --------------------------------------------------------------------------

@dataclass(slots=True, unsafe_hash=True)
class LongString:
    value: str


@dataclass(slots=True, unsafe_hash=True)
class ShortString:
    value: str


@dataclass(slots=True, unsafe_hash=True)
class Long:
    """A 64-bit signed integer."""

    value: int


@dataclass(slots=True, unsafe_hash=True)
class Short:
    """A 16-bit signed integer."""

    value: int


@dataclass(slots=True, unsafe_hash=True)
class Bool:
    value: bool


@dataclass(slots=True, unsafe_hash=True)
class Bytes:
    value: bytes


@dataclass(slots=True, unsafe_hash=True)
class Timestamp:
    """An AMQP timestamp: seconds since the epoch."""

    value: int


@dataclass(slots=True, unsafe_hash=True)
class Float:
    """A 32-bit float; serialised with the shortest repr that round-trips f32."""

    value: float


@dataclass(slots=True, unsafe_hash=True)
class Double:
    value: float


@dataclass(slots=True, unsafe_hash=True)
class Void:
    pass


@dataclass(slots=True, unsafe_hash=True)
class Table:
    value: tuple[tuple[str, "HeaderValue"], ...]


@dataclass(slots=True, unsafe_hash=True)
class Array:
    value: tuple["HeaderValue", ...]


HeaderValue = Union[
    LongString, ShortString, Long, Short, Bool, Bytes, Timestamp, Float, Double, Void, Table, Array
]
Headers = tuple[tuple[str, HeaderValue], ...]

VOID = Void()

# An AMQP 0-9-1 decimal (``D``: u8 scale, 32-bit value) has no variant of its own in the RBAK format,
# and a new variant would make the Rust tool's readers fail on the whole segment. It is stored as a
# one-entry table the spec's readers all accept, ``{"rbak:decimal": [Short scale, Long value]}``, which
# rbak's encoder turns back into the same ``D`` bytes. The value is signed, as the Java client and pika
# write and read it: ``Decimal("-0.001")`` is scale 3, value -1 (bytes ``ff ff ff ff``).
DECIMAL_KEY = "rbak:decimal"


def decimal_header(scale: int, value: int) -> "Table":
    """The stored form of a ``D`` value (``value`` as a signed 32-bit integer)."""
    return Table(((DECIMAL_KEY, Array((Short(scale), Long(value)))),))


def decimal_parts(v: Any) -> tuple[int, int] | None:
    """(scale, signed value) when ``v`` is a stored decimal, else None."""
    if type(v) is not Table or len(v.value) != 1:
        return None
    k, a = v.value[0]
    if k != DECIMAL_KEY or type(a) is not Array or len(a.value) != 2:
        return None
    s, n = a.value
    if type(s) is not Short or type(n) is not Long or not 0 <= s.value <= 255 or not -(2**31) <= n.value < 2**31:
        return None
    return s.value, n.value


# --------------------------------------------------------------------------
# Properties and record.
# --------------------------------------------------------------------------


@dataclass(slots=True)
class BackupProperties:
    """AMQP 0-9-1 basic properties minus headers, in the spec's field order."""

    content_type: str | None = None
    content_encoding: str | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type_field: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


PROPERTY_NAMES: tuple[str, ...] = tuple(f.name for f in fields(BackupProperties))


def properties_key(p: BackupProperties, headers: "Headers") -> tuple:
    """A hashable value of a record's properties and headers (``BackupProperties`` is mutable):
    the key of the restore's per-queue caches of encoded properties."""
    return (p.content_type, p.content_encoding, p.delivery_mode, p.priority, p.correlation_id, p.reply_to,
            p.expiration, p.message_id, p.timestamp, p.type_field, p.user_id, p.app_id, p.cluster_id, headers)


@dataclass(slots=True)
class BackupRecord:
    """One captured message; ``backed_up_at`` drives PITR."""

    body: bytes = b""
    properties: BackupProperties = field(default_factory=BackupProperties)
    headers: Headers = ()
    exchange: str = ""
    routing_key: str = ""
    delivery_tag: int = 0
    redelivered: bool = False
    backed_up_at: int = 0
    source_queue: str = ""
    source_vhost: str = "/"


RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(BackupRecord))


# --------------------------------------------------------------------------
# Encoding.
# --------------------------------------------------------------------------


def _u8_view(data: bytes) -> Any:
    return np.frombuffer(data, dtype=np.uint8)


def header_value_to_json(v: Any) -> Any:  # v: a HeaderValue (Any: the dispatch on a saved type(v) is one a checker cannot follow)
    t = type(v)
    if t is LongString:
        return {"LongString": v.value}
    if t is Long:
        return {"Long": v.value}
    if t is Bool:
        return {"Bool": v.value}
    if t is ShortString:
        return {"ShortString": v.value}
    if t is Short:
        return {"Short": v.value}
    if t is Bytes:
        return {"Bytes": _u8_view(v.value)}
    if t is Timestamp:
        return {"Timestamp": v.value}
    if t is Float:
        return {"Float": _f32_json(v.value)}
    if t is Double:
        return {"Double": _f64_json(v.value)}
    if t is Void:
        return "Void"
    if t is Table:
        return {"Table": [[k, header_value_to_json(x)] for k, x in v.value]}
    if t is Array:
        return {"Array": [header_value_to_json(x) for x in v.value]}
    raise SerializationError(f"not a header value: {v!r}")


def _f32_json(x: float) -> Any:
    # serde_json writes f32 with the shortest repr that round-trips f32, and
    # non-finite floats as null. orjson does the same for np.float32.
    if not math.isfinite(x):
        return None
    return np.float32(x)


def _f64_json(x: float) -> Any:
    return x if math.isfinite(x) else None


def _properties_to_json(p: BackupProperties) -> dict[str, Any]:
    return {
        "content_type": p.content_type,
        "content_encoding": p.content_encoding,
        "delivery_mode": p.delivery_mode,
        "priority": p.priority,
        "correlation_id": p.correlation_id,
        "reply_to": p.reply_to,
        "expiration": p.expiration,
        "message_id": p.message_id,
        "timestamp": p.timestamp,
        "type_field": p.type_field,
        "user_id": p.user_id,
        "app_id": p.app_id,
        "cluster_id": p.cluster_id,
    }


def record_rest_obj(r: BackupRecord) -> dict[str, Any]:
    """Every field after ``body``, in spec order."""
    return {
        "properties": _properties_to_json(r.properties),
        "headers": [[k, header_value_to_json(v)] for k, v in r.headers],
        "exchange": r.exchange,
        "routing_key": r.routing_key,
        "delivery_tag": r.delivery_tag,
        "redelivered": r.redelivered,
        "backed_up_at": r.backed_up_at,
        "source_queue": r.source_queue,
        "source_vhost": r.source_vhost,
    }


def record_to_json_obj(r: BackupRecord) -> dict[str, Any]:
    """The record as a JSON-ready dict in spec order (bodies as NumPy views)."""
    return {"body": _u8_view(r.body) if r.body else None, **record_rest_obj(r)}


def encode_record(r: BackupRecord) -> bytes:
    """Compact JSON of one record, exactly as the Rust tool writes it."""
    try:
        if _c is not None:
            data = _c.encode_record(r)  # None: a value only orjson writes (floats, nested headers)
            if data is not None:
                return data
            return _c.join_record(r.body, orjson.dumps(record_rest_obj(r), option=_ORJSON_OPTS))
        return orjson.dumps(record_to_json_obj(r), option=_ORJSON_OPTS)
    except (TypeError, ValueError, orjson.JSONEncodeError) as e:
        raise SerializationError(
            f"cannot encode record from queue {r.source_queue!r} in vhost {r.source_vhost!r}: {e}"
        ) from e


# --------------------------------------------------------------------------
# Decoding (lenient).
# --------------------------------------------------------------------------

_SCALAR_VARIANTS: dict[str, type] = {
    "LongString": LongString,
    "ShortString": ShortString,
    "Long": Long,
    "Short": Short,
    "Bool": Bool,
    "Timestamp": Timestamp,
}


def header_value_from_json(obj: Any) -> HeaderValue:
    if type(obj) is dict and len(obj) == 1:
        for tag, val in obj.items():
            cls = _SCALAR_VARIANTS.get(tag)
            if cls is not None:
                return cls(val)
            conv = _COMPOUND_VARIANTS.get(tag)
            if conv is not None:
                return conv(val)
    elif obj == "Void" or obj is None:
        return VOID
    raise SerializationError(f"unknown header value {obj!r}")


_COMPOUND_VARIANTS: dict[str, Any] = {
    "Bytes": lambda v: Bytes(_bytes_from_json(v)),
    "Float": lambda v: Float(float("nan") if v is None else float(v)),
    "Double": lambda v: Double(float("nan") if v is None else float(v)),
    "Void": lambda v: VOID,
    "Table": lambda v: Table(_headers_from_json(v)),
    "Array": lambda v: Array(tuple(map(header_value_from_json, v))),
}


def _headers_from_json(items: Any) -> Headers:
    if items is None:
        return ()
    if isinstance(items, dict):  # lenient: a map instead of a list of pairs
        items = list(items.items())
    out: list[tuple[str, HeaderValue]] = []
    append = out.append
    scalars = _SCALAR_VARIANTS
    for k, v in items:
        if type(k) is not str:
            k = str(k)
        if type(v) is dict and len(v) == 1:
            ((tag, val),) = v.items()
            cls = scalars.get(tag)
            if cls is not None:  # the common case, inline
                append((k, cls(val)))
                continue
        append((k, header_value_from_json(v)))
    return tuple(out)


def _bytes_from_json(val: Any) -> bytes:
    if not val:
        return b""
    if isinstance(val, str):  # lenient: some writers use a string for bytes
        return val.encode("utf-8")
    return bytes(val)




def _properties_from_json(p: Any) -> BackupProperties:
    if not p:
        return BackupProperties()
    if len(p) == 13 and tuple(p) == PROPERTY_NAMES:  # exactly as written: no lookups
        return BackupProperties(*p.values())
    get = p.get
    return BackupProperties(
        get("content_type"),
        get("content_encoding"),
        get("delivery_mode"),
        get("priority"),
        get("correlation_id"),
        get("reply_to"),
        get("expiration"),
        get("message_id"),
        get("timestamp"),
        get("type_field", get("type")),
        get("user_id"),
        get("app_id"),
        get("cluster_id"),
    )


_REST_FIELDS = RECORD_FIELDS[1:]


def record_from_json_obj(d: dict[str, Any], body: bytes | None = None) -> BackupRecord:
    """A record from parsed JSON; ``body`` given when a fast path parsed it already."""
    if body is not None and len(d) == 9 and tuple(d) == _REST_FIELDS:
        # Exactly as written (rbak and the Rust tool): take the values in order.
        props, headers, exchange, rk, tag, redelivered, ts, queue, vhost = d.values()
        if None not in (exchange, rk, tag, redelivered, ts, queue, vhost):
            return BackupRecord(
                body, _properties_from_json(props), _headers_from_json(headers) if headers else (),
                exchange, rk, tag, redelivered, ts, queue, vhost,
            )
    get = d.get
    if body is None:
        raw = get("body")
        body = bytes(raw) if raw else b""
    headers = get("headers")
    vhost = get("source_vhost")
    return BackupRecord(
        body,
        _properties_from_json(get("properties")),
        _headers_from_json(headers) if headers else (),
        get("exchange") or "",
        get("routing_key") or "",
        get("delivery_tag") or 0,
        bool(get("redelivered")),
        get("backed_up_at") or 0,
        get("source_queue") or "",
        "/" if vhost is None else vhost,
    )


def decode_record(data: bytes | memoryview) -> BackupRecord:
    try:
        obj = orjson.loads(data)
        if not isinstance(obj, dict):
            raise SerializationError("a record must be a JSON object")
        return record_from_json_obj(obj)
    except orjson.JSONDecodeError as e:
        raise SerializationError(f"record is not valid JSON: {e}") from e
    except (TypeError, ValueError) as e:
        raise SerializationError(f"record has a malformed field: {e}") from e


# The optional C codec (see batch.py) fills these classes' slots directly, so
# it is handed them once, here, where they are defined.
from .backend import speedups as _c  # noqa: E402 - after the classes it is handed

if _c is not None:
    _c.configure(
        BackupRecord, RECORD_FIELDS, BackupProperties, PROPERTY_NAMES,
        (LongString, ShortString, Long, Short, Bool, Timestamp),  # the scalar header tags, in C's order
    )
