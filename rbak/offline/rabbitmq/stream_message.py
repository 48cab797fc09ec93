"""One stream record (a whole AMQP 1.0 message) as an AMQP 0-9-1 consumer of 4.x receives it.

RabbitMQ 4.x writes every message it appends to a stream as an AMQP 1.0
message: header, message annotations (``x-exchange``, ``x-routing-key``,
``x-basic-*`` for 0-9-1 properties without an AMQP 1.0 field), then the bare
message. Delivering it over AMQP 0-9-1 (``mc_amqp:init`` +
``mc_amqpl:convert_from``) maps the bare message and annotations exactly as
for a stored ``mc_amqp`` container (``mc_amqp.map_message``, shared), the
header's ``durable``/``priority``/``ttl`` standing in for the container
annotations ``d``/``p``/``ttl``, and the exchange and routing key of the
delivery being the ``x-exchange`` / ``x-routing-key`` annotations. 4.1+ stores
a 0-9-1 ``reply_to`` as the AMQP 1.0 address ``/queues/<quoted name>`` and
gives the name back on delivery; so does this module.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from ...format.amqp091 import VARIANT_OF_RABBIT_TYPE
from ...format.record import VOID, BackupProperties, Bool, Bytes, LongString, Timestamp
from ...format.amqp10 import (APPLICATION_PROPERTIES, DATA, DELIVERY_ANNOTATIONS, FOOTER, HEADER, MESSAGE_ANNOTATIONS, NULL, PROPERTIES, SECTION_NAMES, Value, decode_bare_message, decode_sections)
from .mc_amqp import _ma_get, map_message, usort_headers
from ...errors import Amqp10Error, MappingError


@dataclass(slots=True)
class StreamMessage:
    exchange: str
    routing_key: str
    properties: BackupProperties
    headers: tuple
    body: bytes


def _text(v: Value | None) -> str:
    if v is None or v.type == "null":
        return ""
    if v.type in ("utf8", "symbol", "binary"):
        return v.value.decode("utf-8", "surrogateescape")
    raise MappingError(f"routing annotation must be a string, is a {v.type}")


_HEX = frozenset("0123456789abcdefABCDEF")


def _queue_address(quoted: str) -> str | None:
    """``/queues/<percent-encoded name>`` -> the name (``cow_uri:urldecode``; undecodable: dropped).
    RabbitMQ 4.1+ writes a 0-9-1 ``reply_to`` so and reads it back so; 4.0 keeps it as sent."""
    raw = quoted.encode("utf-8", "surrogateescape")
    out = bytearray()
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x25:  # %
            hx = raw[i + 1: i + 3].decode("latin-1")
            if len(hx) != 2 or not set(hx) <= _HEX:
                return None
            out.append(int(hx, 16))
            i += 3
        else:
            out.append(c)
            i += 1
    return out.decode("utf-8", "surrogateescape")


def decode_stream_message(data: bytes) -> StreamMessage:
    """Raises ``Amqp10Error`` / ``MappingError`` (with the byte offset in the record) on bad input."""
    header: list[Value] = []
    ma: list[tuple[Value, Value]] = []
    bare_pos = len(data)
    for pos, code, v in decode_sections(data):
        if code == HEADER:
            if v.type != "list":
                raise Amqp10Error(f"header section must be a list, is a {v.type}", pos)
            header = list(v.value)
        elif code == MESSAGE_ANNOTATIONS:
            if v.type not in ("map", "null"):
                raise Amqp10Error(f"message-annotations section must be a map, is a {v.type}", pos)
            ma = list(v.value or ())
        elif code == DELIVERY_ANNOTATIONS:
            continue
        else:
            bare_pos = pos
            break
    bare = decode_bare_message(data[bare_pos:])
    props, headers, body = map_message(bare, ma)
    durable = header[0] if header else None
    priority = header[1] if len(header) > 1 else None
    ttl = header[2] if len(header) > 2 else None
    if props.delivery_mode is None:
        transient = durable is not None and durable.type == "boolean" and not durable.value
        props.delivery_mode = 1 if transient else 2
    if props.priority is None and priority is not None and priority.type == "ubyte":
        props.priority = priority.value
    if props.expiration is None and ttl is not None and ttl.type == "uint":
        props.expiration = str(ttl.value)
    if props.reply_to is not None and props.reply_to.startswith("/queues/"):
        props.reply_to = _queue_address(props.reply_to[len("/queues/"):])
    return StreamMessage(_text(_ma_get(ma, b"x-exchange")), _text(_ma_get(ma, b"x-routing-key")), props, headers,
                         body)


# --------------------------------------------------------------------------
# 3.x (before message containers): rabbit_msg_record:to_amqp091/1
# --------------------------------------------------------------------------

#: AMQP 1.0 type -> RabbitMQ 0-9-1 field type atom, as 3.x's ``rabbit_msg_record:to_091/2``.
_V3_NUMERIC = {"long": "long", "byte": "byte", "ubyte": "unsignedbyte", "short": "short",
               "ushort": "unsignedshort", "uint": "unsignedint", "int": "signedint", "double": "double",
               "float": "float"}


def _v3_value(v: Value, where: str):
    if v.type in _V3_NUMERIC:
        return VARIANT_OF_RABBIT_TYPE[_V3_NUMERIC[v.type]](v.value)
    if v.type == "utf8":
        try:
            return LongString(v.value.decode("utf-8"))
        except UnicodeDecodeError:
            return Bytes(v.value)
    if v.type == "timestamp":
        return Timestamp(v.value // 1000)
    if v.type == "binary":
        return Bytes(v.value)
    if v.type == "boolean":
        return Bool(v.value)
    if v.type == "null":
        return VOID
    raise MappingError(f"{where}: a {v.type} value, which RabbitMQ 3.x cannot deliver over AMQP 0-9-1")


def _v3_id(v: Value | None, key: str, headers: list) -> str | None:
    if v is None or v.type == "null":
        return None
    if v.type == "uuid":
        h = v.value.hex()
        headers.insert(0, (key, LongString("uuid")))
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    if v.type == "ulong":
        headers.insert(0, (key, LongString("ulong")))
        return str(v.value)
    if v.type in ("binary", "utf8"):
        enc = base64.b64encode(v.value) if v.type == "binary" else v.value
        if len(enc) > 256:
            headers.insert(0, (key[: -len("-type")], _v3_value(Value("utf8", v.value), key)))
            return None
        if v.type == "binary":
            headers.insert(0, (key, LongString("binary")))
        return enc.decode("utf-8", "surrogateescape")
    return _text(v) or None


def is_v3_message(data: bytes) -> bool:
    """No header section and 3.x's ``x-basic-*`` keys: written by ``rabbit_msg_record`` (3.9-3.12)."""
    if data[:3] == b"\x00Sp":
        return False
    return b"x-basic-" in data[:4096]


def decode_v3_stream_message(data: bytes, queue: str) -> StreamMessage:
    """A stream record as a 3.x node delivers it over AMQP 0-9-1 (``rabbit_stream_queue:binary_to_msg/2``)."""
    ma: list[tuple[Value, Value]] = []
    ap: list[tuple[Value, Value]] = []
    props_v: Value | None = None
    body: list[bytes] = []
    for pos, code, v in decode_sections(data):
        if code == MESSAGE_ANNOTATIONS:
            ma = list(v.value or ())
        elif code == APPLICATION_PROPERTIES:
            ap = list(v.value or ())
        elif code == PROPERTIES:
            props_v = v
        elif code == DATA:
            body.append(v.value)
        elif code in (HEADER, DELIVERY_ANNOTATIONS, FOOTER):
            continue
        else:
            raise MappingError(f"a {SECTION_NAMES[code]} body, which RabbitMQ 3.x cannot deliver over AMQP 0-9-1")
    if len(body) != 1:
        raise MappingError(f"{len(body)} data sections; RabbitMQ 3.x delivers exactly one")
    fields = list(props_v.value) if props_v is not None and props_v.type == "list" else []
    fields += [NULL] * (13 - len(fields))
    msg_id, user_id, _to, _subj, reply_to, corr_id, ctype, cenc, _abs, ctime = fields[:10]

    def take(lst, key: bytes, ktype: str) -> Value | None:
        for i, (k, v) in enumerate(lst):
            if k.type == ktype and k.value == key:
                del lst[i]
                return v
        return None

    type_f, app_id = take(ap, b"x-basic-type", "utf8"), take(ap, b"x-basic-app-id", "utf8")
    prio, dmode = take(ma, b"x-basic-priority", "symbol"), take(ma, b"x-basic-delivery-mode", "symbol")
    expiration = take(ma, b"x-basic-expiration", "symbol")
    headers = [(k.value.decode("utf-8", "surrogateescape"), _v3_value(v, "application property"))
               for k, v in ap]
    mid = _v3_id(msg_id, "x-message-id-type", headers)
    cid = _v3_id(corr_id, "x-correlation-id-type", headers)
    props = BackupProperties(
        content_type=_text(ctype) or None, content_encoding=_text(cenc) or None,
        delivery_mode=dmode.value if dmode is not None and dmode.type != "null" else None,
        priority=prio.value if prio is not None and prio.type != "null" else None,
        correlation_id=cid, reply_to=_text(reply_to) or None,
        expiration=_text(expiration) or None, message_id=mid,
        timestamp=ctime.value // 1000 if ctime.type == "timestamp" else None,
        type_field=_text(type_f) or None, user_id=_text(user_id) or None, app_id=_text(app_id) or None,
    )
    exchange = take(ma, b"x-exchange", "symbol")
    rk = take(ma, b"x-routing-key", "symbol")
    # The 0-9-1 delivery carries the table sorted by name (as the reference consumers saw on 3.10.8).
    return StreamMessage(_text(exchange), queue if rk is None else _text(rk), props, usort_headers(headers),
                         body[0])
