"""MQTT messages from a ``mosquitto.db`` as RBAK records, the way RabbitMQ's MQTT plugin maps them.

Why this mapping: restoring the backup into a RabbitMQ with the MQTT plugin
should look as if the MQTT clients had published there. So, like
``rabbit_mqtt_util:mqtt_to_amqp/1`` and ``mc_mqtt:convert_to(mc_amqpl, ...)``:

* exchange ``amq.topic``; routing key = topic with ``/`` -> ``.`` (and ``+`` ->
  ``*``, which cannot occur in a published topic). A ``.`` inside an MQTT
  topic level stays a ``.``, so the original topic is kept in ``x-mqtt-topic``.
* QoS 0 -> delivery_mode 1, QoS 1 and 2 -> 2 (persistent).
* v5 content type -> ``content_type`` (if <= 255 bytes, else header
  ``x-mqtt-content-type``); correlation data -> ``correlation_id`` when it is
  UTF-8 of <= 255 bytes, otherwise header ``x-correlation-id`` (as RabbitMQ
  does; a ``Bytes`` value when not UTF-8); response topic -> header
  ``x-reply-to-topic`` in AMQP form (as RabbitMQ) and also ``reply_to``
  verbatim (<= 255 bytes); user properties -> ``LongString`` headers (the
  first value of each name; when names repeat, clash with our headers or are
  too long for a field-table key, the full ordered list is also in
  ``x-mqtt-user-properties`` as an array of [name, value] arrays); message
  expiry -> ``expiration`` = milliseconds left at import time, plus
  ``x-mqtt-expiry-time`` (absolute, seconds); payload format indicator ->
  ``x-mqtt-payload-format-indicator``.
* ``x-mqtt-retain`` (Bool) marks retained messages, ``x-mqtt-qos`` the publish
  QoS, ``x-mqtt-source-client-id`` the publisher. ``x-mqtt-publish-qos`` is
  deliberately not used: RabbitMQ 3.x's plugin expects it as an AMQP byte,
  which RBAK headers cannot express.

Where messages go (``source_vhost`` = the chosen vhost):

* each retained message -> queue ``mosquitto-retained`` (a pseudo-queue);
* each persistent client's pending outgoing messages -> the queue the MQTT
  plugin would hold them in: ``mqtt-subscription-<clientid>qos1`` if the
  client's matching subscription has QoS 1/2 (always so when the message's
  delivery QoS is 1/2), else ``...qos0``; in Mosquitto's order (in flight, then queued);
  in-flight ones are ``redelivered``. QoS 2 messages whose PUBREC already came
  back (states resend_pubrel / wait_for_pubcomp) belong to the client and are
  skipped;
* incoming QoS 2 messages a publisher sent but never released (PUBREL) ->
  pseudo-queue ``mosquitto-incoming`` with ``x-mqtt-client-id``;
* expired messages (Mosquitto would drop them on load) and references to
  missing stored messages are skipped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator

from ...format.record import (
    Array,
    BackupProperties,
    BackupRecord,
    Bool,
    Bytes,
    HeaderValue,
    LongString,
    Short,
    Timestamp,
)
from .chunks import (
    ClientMsgChunk,
    Direction,
    MosquittoDb,
    MsgState,
    MsgStoreChunk,
)
from ..mqtt_topic import mqtt_to_amqp

EXCHANGE = "amq.topic"
RETAINED_QUEUE = "mosquitto-retained"
INCOMING_QUEUE = "mosquitto-incoming"
SHORTSTR_MAX = 255

# Outgoing QoS 2 messages the client has already received (PUBREC seen).
_CLIENT_OWNS = frozenset({MsgState.RESEND_PUBREL, MsgState.WAIT_FOR_PUBCOMP})
# Outgoing messages sent at least once.
_SENT = frozenset({MsgState.WAIT_FOR_PUBACK, MsgState.WAIT_FOR_PUBREC})
# Incoming QoS 2 messages already released to subscribers.
_RELEASED = frozenset({MsgState.RESEND_PUBCOMP})


def subscription_queue(client_id: str, qos: int) -> str:
    """The MQTT plugin's queue for a client session (``queue_name_bin/2``)."""
    return f"mqtt-subscription-{client_id}qos{0 if qos == 0 else 1}"


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching (``+`` one level, ``#`` the rest incl. the parent; ``$`` topics
    not matched by a leading wildcard; ``$share/<group>/`` stripped)."""
    if topic_filter.startswith("$share/"):
        parts = topic_filter.split("/", 2)
        topic_filter = parts[2] if len(parts) == 3 else ""
    f, t = topic_filter.split("/"), topic.split("/")
    if topic.startswith("$") and f[0] in ("+", "#"):
        return False
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


def _safe_text(s: str) -> str:
    """Text that JSON can hold: undecodable bytes (kept as surrogates) become U+FFFD."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _short(s: str | None) -> str | None:
    if s is None:
        return None
    s = _safe_text(s)
    return s if len(s.encode("utf-8")) <= SHORTSTR_MAX else None


_QOS = (Short(0), Short(1), Short(2))
_TRUE = Bool(True)


@lru_cache(maxsize=8192)
def _topic_parts(topic: str) -> tuple[str, LongString]:
    """(routing key, x-mqtt-topic value); topics repeat, so this is cached."""
    safe = _safe_text(topic)
    return mqtt_to_amqp(safe), LongString(safe)


@lru_cache(maxsize=8192)
def _long_string(s: str) -> LongString:
    return LongString(_safe_text(s))


@dataclass(slots=True)
class MappingStats:
    retained: int = 0
    queued: int = 0
    incoming: int = 0
    expired: int = 0
    client_owned: int = 0
    dangling: int = 0          # references to a store id that is not in the file
    unreferenced: int = 0      # stored messages nobody refers to
    released_incoming: int = 0
    expired_sessions: int = 0   # sessions past their expiry: still exported, Mosquitto would drop them soon
    long_routing_keys: int = 0  # exported, but > 255 bytes: AMQP cannot publish them with that key
    queues: dict[str, int] = field(default_factory=dict)

    @property
    def exported(self) -> int:
        return self.retained + self.queued + self.incoming


def message_to_record(
    msg: MsgStoreChunk,
    *,
    source_queue: str,
    vhost: str,
    now_ms: int,
    retain: bool,
    delivery_tag: int = 0,
    redelivered: bool = False,
    extra_headers: tuple[tuple[str, HeaderValue], ...] = (),
) -> BackupRecord:
    """One stored message as a BackupRecord (see the module docstring for the mapping)."""
    p = msg.properties
    props = BackupProperties(delivery_mode=2 if msg.qos >= 1 else 1)
    routing_key, topic_header = _topic_parts(msg.topic)
    ours: list[tuple[str, HeaderValue]] = [("x-mqtt-topic", topic_header), ("x-mqtt-qos", _QOS[msg.qos])]
    if retain:
        ours.append(("x-mqtt-retain", _TRUE))
    if msg.source_id:
        ours.append(("x-mqtt-source-client-id", _long_string(msg.source_id)))
    ours.extend(extra_headers)
    if msg.expiry_time > 0:
        left_ms = max(0, msg.expiry_time * 1000 - now_ms)
        props.expiration = str(left_ms)
        ours.append(("x-mqtt-expiry-time", Timestamp(msg.expiry_time)))
    if not p.items:
        return BackupRecord(msg.payload, props, tuple(ours), EXCHANGE, routing_key, delivery_tag, redelivered,
                            now_ms, source_queue, vhost)
    ct = p.content_type
    if ct is not None:
        props.content_type = _short(ct)
        if props.content_type is None:
            ours.append(("x-mqtt-content-type", LongString(_safe_text(ct))))
    corr = p.correlation_data
    if corr is not None:
        try:
            text = corr.decode("utf-8")
        except UnicodeDecodeError:
            ours.append(("x-correlation-id", Bytes(corr)))
        else:
            if len(corr) <= SHORTSTR_MAX:
                props.correlation_id = text
            else:
                ours.append(("x-correlation-id", LongString(text)))
    rt = p.response_topic
    if rt is not None:
        props.reply_to = _short(rt)
        ours.append(("x-reply-to-topic", LongString(mqtt_to_amqp(_safe_text(rt)))))
    pfi = p.payload_format_indicator
    if pfi is not None:
        ours.append(("x-mqtt-payload-format-indicator", Short(int(pfi))))
    taken = {k for k, _ in ours}
    user: list[tuple[str, HeaderValue]] = []
    need_list = False
    for name, value in p.user_properties:
        name, value = _safe_text(name), _safe_text(value)
        if name in taken or len(name.encode("utf-8")) > SHORTSTR_MAX:
            need_list = True
            continue
        taken.add(name)
        user.append((name, LongString(value)))
    if need_list:
        ours.append(("x-mqtt-user-properties", Array(tuple(
            Array((LongString(_safe_text(n)), LongString(_safe_text(v)))) for n, v in p.user_properties))))
    return BackupRecord(
        body=msg.payload,
        properties=props,
        headers=tuple(user + ours),
        exchange=EXCHANGE,
        routing_key=routing_key,
        delivery_tag=delivery_tag,
        redelivered=redelivered,
        backed_up_at=now_ms,
        source_queue=source_queue,
        source_vhost=vhost,
    )


def _expired(msg: MsgStoreChunk, now_ms: int) -> bool:
    return msg.expiry_time > 0 and msg.expiry_time * 1000 <= now_ms


def iter_records(db: MosquittoDb, *, vhost: str = "/", now_ms: int, stats: MappingStats | None = None
                 ) -> Iterator[BackupRecord]:
    """Every exportable message, grouped by queue in file order: retained first, then clients."""
    st = stats if stats is not None else MappingStats()
    stores = db.msg_stores
    referenced: set[int] = set()
    tags: dict[str, int] = {}

    def emit(msg: MsgStoreChunk, queue: str, **kw) -> BackupRecord:
        tags[queue] = tags.get(queue, 0) + 1
        st.queues[queue] = tags[queue]
        rec = message_to_record(msg, source_queue=queue, vhost=vhost, now_ms=now_ms, delivery_tag=tags[queue], **kw)
        if len(rec.routing_key.encode("utf-8")) > SHORTSTR_MAX:
            st.long_routing_keys += 1
        return rec

    for r in db.retains:
        msg = stores.get(r.store_id)
        if msg is None:
            st.dangling += 1
            continue
        referenced.add(r.store_id)
        if _expired(msg, now_ms):
            st.expired += 1
            continue
        st.retained += 1
        yield emit(msg, RETAINED_QUEUE, retain=True)

    st.expired_sessions = sum(1 for c in db.clients
                              if c.session_expiry_time > 0 and c.session_expiry_time * 1000 <= now_ms)
    # Mosquitto restores client messages whether or not a CLIENT chunk precedes them.
    subs: dict[str, list[tuple[str, int]]] = {}
    for sub in db.subs:
        subs.setdefault(sub.client_id, []).append((sub.topic, sub.qos))

    def queue_for(client_id: str, cm: ClientMsgChunk, topic: str) -> str:
        # The plugin picks the queue by the *subscription's* QoS: a QoS 0 message
        # for a QoS 1 subscription sits in the qos1 queue. Delivery QoS >= 1
        # implies such a subscription; for QoS 0, look at the client's filters.
        if cm.qos >= 1:
            return subscription_queue(client_id, 1)
        best = max((q for f, q in subs.get(client_id, ()) if topic_matches(f, topic)), default=0)
        return subscription_queue(client_id, best)

    by_client: dict[str, list[ClientMsgChunk]] = {}
    for cm in db.client_msgs:
        by_client.setdefault(cm.client_id, []).append(cm)
    for client_id, msgs in by_client.items():
        for cm in msgs:
            msg = stores.get(cm.store_id)
            if msg is None:
                st.dangling += 1
                continue
            referenced.add(cm.store_id)
            if _expired(msg, now_ms):
                st.expired += 1
                continue
            if cm.direction == Direction.IN:
                if cm.state in _RELEASED:
                    st.released_incoming += 1
                    continue
                st.incoming += 1
                yield emit(msg, INCOMING_QUEUE, retain=msg.retain,
                           extra_headers=(("x-mqtt-client-id", LongString(_safe_text(client_id))),))
                continue
            if cm.state in _CLIENT_OWNS:
                st.client_owned += 1
                continue
            st.queued += 1
            yield emit(msg, queue_for(client_id, cm, msg.topic), retain=cm.retain,
                       redelivered=cm.dup or cm.state in _SENT)
    st.unreferenced = sum(1 for sid in stores if sid not in referenced)


__all__ = [
    "EXCHANGE", "RETAINED_QUEUE", "INCOMING_QUEUE", "MappingStats", "iter_records", "message_to_record",
    "mqtt_to_amqp", "subscription_queue",
]
