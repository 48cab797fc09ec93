"""A message as RabbitMQ stores it (``term_to_binary``) into a BackupRecord.

Two record shapes exist:

* 3.10-3.12 (and 3.13 before the ``message_containers`` flag)::

    {basic_message, {resource, VHost, exchange, XName}, [RoutingKey | CCs],
     {content, 60, Props, PropsBin, Protocol, PayloadFragmentsRev}, Id, IsPersistent}

* 3.13+/4.x message containers: ``{mc, Protocol, Data, Annotations}`` where,
  for AMQP 0-9-1 messages, ``Protocol = mc_amqpl``, ``Data`` is the same
  ``#content{}`` and the annotations map holds ``x`` (exchange) and ``rk``
  (routing keys). Messages published over AMQP 1.0 are ``mc_amqp``
  containers whose data is the AMQP 1.0 bare message, MQTT ones ``mc_mqtt``
  with an ``#mqtt_msg{}``; ``mc_amqp.py`` and ``mc_mqtt.py`` map them to
  AMQP 0-9-1 as RabbitMQ's own conversion does. Other protocols (STOMP
  stores ``mc_amqpl``; anything else) are reported as unsupported rather
  than guessed at.

Whatever the protocol, ``_apply_annotations`` then does what
``mc_amqpl:protocol_state/2`` does on delivery.

``Props``/``PropsBin``: usually ``none`` + the property binary; sometimes the
decoded ``'P_basic'`` record + ``none``. Either one is used.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ...format.record import (
    Array, BackupProperties, BackupRecord, Bool, HeaderValue, Headers, Long, LongString, Table, Timestamp,
)
from . import mc_amqp, mc_mqtt
from .amqp_props import decode_properties, from_p_basic
from .erlang_terms import Atom, decode, decode_bare
from ...errors import MappingError, MessageFormatError, MqttMappingError, PropertiesError, TermError


@dataclass(slots=True)
class StoredMessage:
    exchange: str
    routing_keys: list[str]
    properties: BackupProperties
    headers: Headers
    body: bytes
    msg_id: bytes | None
    persistent: bool | None
    vhost: str | None  # only the old record names it


def decode_stored_message(data: bytes | memoryview, allow_trailing: bool = False) -> StoredMessage:
    """Decode one stored term; ``allow_trailing`` accepts padding after it (v2 ``.qs``)."""
    if type(data) is not bytes:
        data = bytes(data)
    fast = fast_decode(data)
    if fast is not None:
        m, end = fast
    else:
        try:
            term, end = decode(data, 0)
        except TermError as e:
            raise MessageFormatError(f"not an Erlang term: {e}") from None
        m = None
    if end != len(data):
        tail = bytes(memoryview(data)[end:])
        if not allow_trailing or tail.strip(b"\x00"):
            raise MessageFormatError(f"{len(data) - end} unexpected bytes after the message term (at byte {end})")
    return m if m is not None else message_from_term(term)


# --------------------------------------------------------------------------
# Fast path: the usual shapes, read straight from the bytes. Anything unusual
# (decoded 'P_basic' properties, other protocols, odd encodings) returns None
# and goes through the general decoder, which also produces the errors.
# --------------------------------------------------------------------------

_u16 = struct.Struct(">H").unpack_from
_u32 = struct.Struct(">I").unpack_from


def _atom_end(data: bytes, p: int, name: bytes | None) -> int:
    """End of the atom at ``p`` (-1 if none, or not ``name``)."""
    t = data[p]
    if t == 119 or t == 115:
        s = p + 2
        e = s + data[p + 1]
    elif t == 100 or t == 118:
        s = p + 3
        e = s + _u16(data, p + 1)[0]
    else:
        return -1
    if name is not None and data[s:e] != name:
        return -1
    return e


def _bin(data: bytes, p: int) -> tuple[bytes, int]:
    if data[p] != 109:
        raise _NotFast
    e = p + 5 + _u32(data, p + 1)[0]
    if e > len(data):
        raise _NotFast
    return data[p + 5 : e], e


def _bin_list(data: bytes, p: int) -> tuple[list[bytes], int]:
    t = data[p]
    if t == 106:
        return [], p + 1
    if t != 108:
        raise _NotFast
    count = _u32(data, p + 1)[0]
    p += 5
    out = []
    for _ in range(count):
        b, p = _bin(data, p)
        out.append(b)
    if data[p] != 106:
        raise _NotFast
    return out, p + 1


class _NotFast(Exception):
    pass


def _fast_content(data: bytes, p: int) -> tuple[BackupProperties, Headers, bytes, int]:
    if data[p] != 104 or data[p + 1] != 6:
        raise _NotFast
    p = _atom_end(data, p + 2, b"content")
    if p < 0 or data[p] != 97 or data[p + 1] != 60:
        raise _NotFast
    p = _atom_end(data, p + 2, b"none")
    if p < 0:
        raise _NotFast
    props_bin, p = _bin(data, p)
    p = _atom_end(data, p, None)  # the protocol module
    if p < 0:
        raise _NotFast
    frags, p = _bin_list(data, p)
    try:
        props, headers = decode_properties(props_bin)
    except PropertiesError:
        raise _NotFast from None
    body = frags[0] if len(frags) == 1 else b"".join(reversed(frags))
    return props, headers, body, p


def fast_decode(data: bytes) -> tuple[StoredMessage, int] | None:
    """(message, end of the term) for the common record shapes, else None."""
    try:
        if len(data) < 8 or data[0] != 131 or data[1] != 104:
            return None
        arity = data[2]
        if arity == 6:
            p = _atom_end(data, 3, b"basic_message")
            if p < 0 or data[p] != 104 or data[p + 1] != 4:
                return None
            p = _atom_end(data, p + 2, b"resource")
            if p < 0:
                return None
            vhost, p = _bin(data, p)
            p = _atom_end(data, p, b"exchange")
            if p < 0:
                return None
            xname, p = _bin(data, p)
            rks, p = _bin_list(data, p)
            props, headers, body, p = _fast_content(data, p)
            msg_id, p = _bin(data, p)
            e = _atom_end(data, p, None)
            if e < 0:
                return None
            persistent = data[e - 4 : e] == b"true"
            dec = _dec
            return StoredMessage(dec(xname), [dec(k) for k in rks], props, headers, body, msg_id,
                                 persistent, dec(vhost)), e
        if arity == 4:
            p = _atom_end(data, 3, b"mc")
            if p < 0:
                return None
            p = _atom_end(data, p, b"mc_amqpl")
            if p < 0:
                return None
            props, headers, body, p = _fast_content(data, p)
            anns, e = decode_bare(data, p)
            if not isinstance(anns, dict):
                return None
            headers = _apply_annotations(props, headers, anns)
            x = anns.get(Atom("x"), b"")
            durable = anns.get(Atom("d"))
            return StoredMessage(
                exchange=_str(x, "exchange annotation") if x != "undefined" else "",
                routing_keys=_keys(anns.get(Atom("rk"), [])),
                properties=props, headers=headers, body=body, msg_id=None,
                persistent=(durable == "true") if isinstance(durable, Atom) else None, vhost=None,
            ), e
        return None
    except (_NotFast, IndexError, struct.error, TermError, MessageFormatError):
        return None


def _dec(b: bytes) -> str:
    return b.decode("utf-8", errors="surrogateescape")


def message_from_term(term: Any) -> StoredMessage:
    if not isinstance(term, tuple) or not term or not isinstance(term[0], Atom):
        raise MessageFormatError(f"expected a basic_message or mc record, got {_kind(term)}")
    tag = term[0]
    if tag == "basic_message":
        return _from_basic_message(term)
    if tag == "mc":
        return _from_mc(term)
    raise MessageFormatError(f"unknown message record {str(tag)!r}")


def _from_basic_message(t: tuple) -> StoredMessage:
    if len(t) != 6:
        raise MessageFormatError(f"basic_message has {len(t) - 1} fields, expected 5")
    _, xname, rks, content, msg_id, persistent = t
    if not (isinstance(xname, tuple) and len(xname) == 4 and xname[0] == "resource" and xname[2] == "exchange"):
        raise MessageFormatError(f"basic_message exchange is not a #resource{{kind=exchange}}: {_kind(xname)}")
    vhost = _str(xname[1], "vhost")
    exchange = _str(xname[3], "exchange name")
    props, headers, body = _from_content(content)
    return StoredMessage(
        exchange=exchange,
        routing_keys=_keys(rks),
        properties=props,
        headers=headers,
        body=body,
        msg_id=msg_id if isinstance(msg_id, bytes) else None,
        persistent=(persistent == "true") if isinstance(persistent, Atom) else None,
        vhost=vhost,
    )


def _from_mc(t: tuple) -> StoredMessage:
    if len(t) != 4:
        raise MessageFormatError(f"mc record has {len(t) - 1} fields, expected 3")
    _, proto, data, anns = t
    if not isinstance(anns, dict):
        raise MessageFormatError(f"mc annotations must be a map, got {_kind(anns)}")
    if proto == "mc_amqpl":
        props, headers, body = _from_content(data)
    elif proto == "mc_amqp":
        try:
            props, headers, body, _ = mc_amqp.convert(data)
        except MappingError as e:
            raise MessageFormatError(f"AMQP 1.0 message: {e}") from None
    elif proto == "mc_mqtt":
        try:
            props, headers, body = mc_mqtt.convert(data)
        except MqttMappingError as e:
            raise MessageFormatError(f"MQTT message: {e}") from None
    else:
        raise MessageFormatError(
            f"message container of protocol {str(proto)!r} (not AMQP 0-9-1, AMQP 1.0 or MQTT) is not supported "
            "by the importer"
        )
    headers = _apply_annotations(props, headers, anns)
    x = anns.get(Atom("x"), b"")
    durable = anns.get(Atom("d"))
    return StoredMessage(
        exchange=_str(x, "exchange annotation") if x != "undefined" else "",
        routing_keys=_keys(anns.get(Atom("rk"), [])),
        properties=props,
        headers=headers,
        body=body,
        msg_id=None,
        persistent=(durable == "true") if isinstance(durable, Atom) else None,
        vhost=None,
    )


def _apply_annotations(props: BackupProperties, headers: Headers, anns: dict) -> Headers:
    """What RabbitMQ 4.x puts into the properties when it delivers the message
    over AMQP 0-9-1 (``mc_amqpl:protocol_state/2``): dead-letter history as
    ``x-death``, ``x-*`` annotations as headers, the TTL a dead-lettering
    publish reset, the timestamp/priority/durability kept in annotations."""
    hs = list(headers)
    changed = False
    deaths = anns.get(Atom("deaths"))
    if deaths is not None:
        tables = _death_tables(deaths)
        if tables is not None:
            hs = [h for h in hs if h[0] != "x-death"] + [("x-death", Array(tuple(tables)))]
            hs.sort(key=lambda h: h[0].encode("utf-8", "surrogateescape"))
            changed = True
    extra: list[tuple[str, HeaderValue]] = []
    for k, v in anns.items():
        if not isinstance(k, bytes) or isinstance(k, Atom):
            continue
        if not (k.startswith(b"x-") or k == b"timestamp_in_ms"):
            continue
        if isinstance(v, Atom) and v in ("true", "false"):
            if k == b"timestamp_in_ms":
                continue
            val: HeaderValue = Bool(v == "true")
        elif isinstance(v, int) and not isinstance(v, bool):
            val = Long(v)
        elif isinstance(v, bytes) and k != b"timestamp_in_ms":
            val = LongString(v.decode("utf-8", "surrogateescape"))
        else:
            continue
        extra.append((k.decode("utf-8", "surrogateescape"), val))
    if extra:
        names = {n for n, _ in extra}
        hs = extra + [h for h in hs if h[0] not in names]
        hs.sort(key=lambda h: h[0].encode("utf-8", "surrogateescape"))
        changed = True
    if Atom("ttl") in anns:
        ttl = anns[Atom("ttl")]
        props.expiration = str(ttl) if isinstance(ttl, int) and not isinstance(ttl, bool) else None
    ts = anns.get(Atom("ts"))
    if isinstance(ts, int) and not isinstance(ts, bool):
        props.timestamp = ts // 1000
    if props.priority is None:
        p = anns.get(Atom("p"))
        if isinstance(p, int) and not isinstance(p, bool):
            props.priority = p
    if props.delivery_mode is None and anns.get(Atom("d")) != "false":
        props.delivery_mode = 2
    return tuple(hs) if changed else headers


def _death_tables(deaths: Any) -> list[Table] | None:
    if isinstance(deaths, tuple) and len(deaths) == 4 and deaths[0] == "deaths" and isinstance(deaths[3], dict):
        items = list(deaths[3].items())

        def last_time(item: Any) -> int:
            d = item[1]
            a = d[4] if isinstance(d, tuple) and len(d) == 5 and isinstance(d[4], dict) else {}
            lt = a.get(Atom("last_time"), 0)
            return lt if isinstance(lt, int) else 0

        items.sort(key=last_time)
        items.reverse()  # most recent first, as RabbitMQ folds them
    elif isinstance(deaths, list):
        items = deaths
    else:
        return None
    out = []
    for key, d in items:
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(d, tuple) and len(d) == 5 and d[0] == "death"):
            raise MessageFormatError(f"unexpected dead-letter record {_kind(d)}")
        qname, reason = key
        _, exchange, rks, count, dann = d
        first = dann.get(Atom("first_time"), 0) if isinstance(dann, dict) else 0
        row: list[tuple[str, HeaderValue]] = [
            ("count", Long(count)),
            ("reason", LongString(str(reason) if isinstance(reason, Atom) else _str(reason, "death reason"))),
            ("queue", LongString(_str(qname, "death queue"))),
            ("time", Timestamp(first // 1000)),
            ("exchange", LongString(_str(exchange, "death exchange"))),
            ("routing-keys", Array(tuple(LongString(k) for k in _keys(rks)))),
        ]
        ttl = dann.get(Atom("ttl")) if isinstance(dann, dict) else None
        if isinstance(ttl, int) and not isinstance(ttl, bool):
            row.insert(0, ("original-expiration", LongString(str(ttl))))
        out.append(Table(tuple(row)))
    return out


def _from_content(c: Any) -> tuple[BackupProperties, Headers, bytes]:
    if not (isinstance(c, tuple) and len(c) == 6 and c[0] == "content"):
        raise MessageFormatError(f"expected a #content{{}} record, got {_kind(c)}")
    _, class_id, props, props_bin, _protocol, frags = c
    if class_id != 60:
        raise MessageFormatError(f"content class {class_id!r} is not basic (60)")
    try:
        if isinstance(props_bin, bytes):
            p, h = decode_properties(props_bin)
        elif isinstance(props, tuple):
            p, h = from_p_basic(props)
        else:
            raise MessageFormatError("content has neither a property binary nor decoded properties")
    except PropertiesError as e:
        raise MessageFormatError(f"bad AMQP properties: {e}") from None
    except ValueError as e:
        if isinstance(e, MessageFormatError):
            raise
        raise MessageFormatError(f"bad decoded properties: {e}") from None
    if not isinstance(frags, list) or not all(isinstance(f, bytes) for f in frags):
        raise MessageFormatError(f"payload fragments must be a list of binaries, got {_kind(frags)}")
    body = frags[0] if len(frags) == 1 else b"".join(reversed(frags))
    return p, h, body


def _keys(v: Any) -> list[str]:
    if not isinstance(v, list):
        raise MessageFormatError(f"routing keys must be a list, got {_kind(v)}")
    return [_str(k, "routing key") for k in v]


def _str(v: Any, what: str) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="surrogateescape")
    if isinstance(v, list) and all(isinstance(c, int) for c in v):
        return bytes(v).decode("utf-8", errors="surrogateescape")
    raise MessageFormatError(f"{what} must be a binary, got {_kind(v)}")


def _kind(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def to_record(
    m: StoredMessage, vhost: str, queue: str, seq_id: int, backed_up_at: int
) -> BackupRecord:
    return BackupRecord(
        body=m.body,
        properties=m.properties,
        headers=m.headers,
        exchange=m.exchange,
        routing_key=m.routing_keys[0] if m.routing_keys else "",
        delivery_tag=seq_id,
        redelivered=False,
        backed_up_at=backed_up_at,
        source_queue=queue,
        source_vhost=vhost,
    )
