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

from dataclasses import dataclass

from ...format.record import BackupProperties
from ..amqp10 import (
    DELIVERY_ANNOTATIONS, HEADER, MESSAGE_ANNOTATIONS, Amqp10Error, Value, decode_bare_message, decode_sections,
)
from ..mc_amqp import MappingError, _ma_get, map_message


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
