"""A message RabbitMQ 4.x received over MQTT (``mc_mqtt``), as an AMQP 0-9-1 consumer would get it.

On disk the container is ``{mc, mc_mqtt, #mqtt_msg{}, Annotations}`` with
``#mqtt_msg{retain, qos, topic, dup, packet_id, payload, props, timestamp}``
(``rabbit_mqtt_packet.hrl``, 4.0.x): ``props`` is the MQTT 5 PUBLISH
property map with atom keys (``'Content-Type'``, ``'Correlation-Data'``,
``'Response-Topic'``, ``'User-Property'`` as a list of name/value pairs,
``'Message-Expiry-Interval'``, ``'Payload-Format-Indicator'``).

The mapping is RabbitMQ 4.0.5's ``mc_mqtt:convert_to(mc_amqpl, ...)`` (then
``mc_amqpl:protocol_state/2``, shared with the other protocols in
``stored_message``):

============================ ==============================================
MQTT                         AMQP 0-9-1 (RBAK record)
============================ ==============================================
payload                      body
QoS 0 / 1                    ``delivery_mode`` 1 / 2 (RabbitMQ stores QoS 2
                             publishes as QoS 1)
topic                        routing key (annotation ``rk``: ``/`` -> ``.``,
                             ``+`` -> ``*``), exchange from annotation ``x``
Content-Type                 ``content_type`` if ASCII and < 256 bytes, else
                             dropped (as RabbitMQ)
Correlation-Data             ``correlation_id`` if valid UTF-8 without NUL
                             and < 256 bytes, else header
                             ``x-correlation-id`` (LongString, or Bytes when
                             not UTF-8)
Response-Topic               header ``x-reply-to-topic``, in AMQP form
User-Property                one LongString header per name (names of 256+
                             bytes dropped; a repeated name keeps its first
                             value), as RabbitMQ
Message-Expiry-Interval      ``expiration`` (ms); ``timestamp`` = publish
                             time (annotation ``ts``)
Payload-Format-Indicator,    dropped, as RabbitMQ
retain, dup, packet id
============================ ==============================================

Headers are sorted by name, first of equal names kept (``lists:usort/2``).
"""

from __future__ import annotations

from typing import Any

from ...format.record import BackupProperties, Bytes, HeaderValue, LongString
from .erlang_terms import Atom
from .mc_amqp import usort_headers, valid_short_string
from ..mqtt_topic import mqtt_to_amqp
from ...errors import MqttMappingError


def _kind(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _iolist(v: Any, depth: int = 0) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, list) and depth < 100:
        out = []
        for x in v:
            if isinstance(x, int) and 0 <= x < 256:
                out.append(bytes((x,)))
            else:
                out.append(_iolist(x, depth + 1))
        return b"".join(out)
    raise MqttMappingError(f"MQTT payload is not iodata: {_kind(v)}")


def _longstr(b: bytes) -> HeaderValue:
    try:
        return LongString(b.decode("utf-8"))
    except UnicodeDecodeError:
        return Bytes(b)


def _bin(v: Any, what: str) -> bytes:
    if isinstance(v, bytes):
        return v
    raise MqttMappingError(f"MQTT {what} must be a binary, got {_kind(v)}")


def convert(state: Any) -> tuple[BackupProperties, tuple, bytes]:
    """``#mqtt_msg{}`` -> (properties, headers, body), before the container annotations."""
    if not (isinstance(state, tuple) and len(state) == 9 and state[0] == "mqtt_msg"):
        raise MqttMappingError(f"mc_mqtt state is not the 4.0 #mqtt_msg{{}} record: {_kind(state)}")
    _, _retain, qos, _topic, _dup, _packet_id, payload, props, _ts = state
    if qos not in (0, 1):
        raise MqttMappingError(f"MQTT QoS {qos!r} (RabbitMQ stores 0 or 1)")
    if not isinstance(props, dict):
        raise MqttMappingError(f"MQTT properties must be a map, got {_kind(props)}")
    body = _iolist(payload)
    content_type = None
    ct = props.get(Atom("Content-Type"))
    if ct is not None:
        ct = _bin(ct, "Content-Type")
        if len(ct) < 256 and ct.isascii():
            content_type = ct.decode("ascii")
    hs: list[tuple[str, HeaderValue]] = []
    up = props.get(Atom("User-Property"), [])
    if not isinstance(up, list):
        raise MqttMappingError(f"MQTT User-Property must be a list, got {_kind(up)}")
    for pair in up:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise MqttMappingError(f"MQTT User-Property entry is not a pair: {_kind(pair)}")
        name, value = _bin(pair[0], "User-Property name"), _bin(pair[1], "User-Property value")
        if len(name) < 256:
            hs.append((name.decode("utf-8", "surrogateescape"), _longstr(value)))
    rt = props.get(Atom("Response-Topic"))
    if rt is not None:
        hs.insert(0, ("x-reply-to-topic", _longstr(mqtt_to_amqp(_bin(rt, "Response-Topic")))))
    correlation_id = None
    corr = props.get(Atom("Correlation-Data"))
    if corr is not None:
        corr = _bin(corr, "Correlation-Data")
        if valid_short_string(corr):
            correlation_id = corr.decode("utf-8")
        else:
            hs.insert(0, ("x-correlation-id", _longstr(corr)))
    expiration = None
    exp = props.get(Atom("Message-Expiry-Interval"))
    if exp is not None:
        if not (isinstance(exp, int) and exp >= 0):
            raise MqttMappingError(f"MQTT Message-Expiry-Interval must be a non-negative integer, got {_kind(exp)}")
        expiration = str(exp * 1000)
    p = BackupProperties(content_type=content_type, delivery_mode=2 if qos == 1 else 1,
                         correlation_id=correlation_id, expiration=expiration)
    return p, usort_headers(hs), body
