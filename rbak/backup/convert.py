"""A pika delivery -> ``BackupRecord``, keeping every header's AMQP type.

pika's own table decoder truncates floats (``f``/``d``) to ints, fails on NaN
and folds the integer widths together, so the backup's reads take each content
header's raw bytes (``broker.deliveries.KeptProperties``) and headers are decoded by ``rbak.format.amqp091.decode_basic_properties``,
the exact inverse of the restore side's encoder. Messages without headers take the
fast path (pika's already-decoded fields).
"""

from __future__ import annotations

import time

from ..broker.deliveries import KeptProperties
from ..format.record import BackupProperties, BackupRecord
from ..format.amqp091 import decode_basic_properties

# Headers the broker adds on delivery and that are not part of the message.
BROKER_HEADERS = frozenset({"x-stream-offset", "x-stream-chunk-timestamp"})


# The typed decode of a content header, by its raw bytes: a pure function of them, and the messages
# of a queue mostly carry the same header bytes (the broker's x-delivery-count / x-acquired-count on a
# quorum queue read before, the publisher's fixed properties), so the Python decoder (~5 us) runs once
# per distinct header instead of once per message. Bounded; cleared when full (unique headers, e.g. a
# message_id each, then cost one dict insert per message). Records share the decoded objects, which
# nothing mutates: a record built here is encoded and dropped. Raw bytes that fail to decode raise
# each time, never cached. Header-less properties are memoised the same way (key (raw, None)): the
# 13-field construction from pika's values was ~0.7 us a message.
DECODED_CACHE = 512
_DECODED: dict[tuple[bytes, frozenset | None], tuple[BackupProperties, tuple]] = {}


def to_record(method, props, body: bytes, vhost: str, queue: str, now_ms: int | None = None,
              drop_headers: frozenset[str] = frozenset(), stream_offset: int | None = None) -> BackupRecord:
    """One delivery as a record. ``stream_offset``: for stream queues the spec's ``delivery_tag``
    is the message's stream offset, not the channel's delivery tag."""
    kept = isinstance(props, KeptProperties)
    raw = props.raw if kept else None
    failed = kept and props.undecodable
    h = props.headers
    if h is not None and drop_headers and not failed and h.keys() <= drop_headers:
        h = None  # only the broker's own headers (a stream's offset): nothing of the message's to keep typed
    if raw is not None and (h is not None or failed):
        key: tuple[bytes, frozenset | None] = (raw, drop_headers)
        hit = _DECODED.get(key)
        if hit is None:
            p, headers = decode_basic_properties(raw)
            hdrs = tuple(headers or ())
            if drop_headers:
                hdrs = tuple(kv for kv in hdrs if kv[0] not in drop_headers)
            if len(_DECODED) >= DECODED_CACHE:
                _DECODED.clear()
            _DECODED[key] = hit = (p, hdrs)
        p, hdrs = hit
    else:
        # no headers at all: the same raw bytes always give the same fields (pika decoded them), so
        # the properties object is shared too; a stream's dropped headers (an offset each) are not memoised
        bare = (raw, None) if raw is not None and props.headers is None else None
        hit = _DECODED.get(bare) if bare is not None else None
        if hit is not None:
            p, hdrs = hit
            return _record(method, body, p, hdrs, vhost, queue, now_ms, stream_offset)
        p = BackupProperties(
            content_type=props.content_type,
            content_encoding=props.content_encoding,
            delivery_mode=props.delivery_mode,
            priority=props.priority,
            correlation_id=props.correlation_id,
            reply_to=props.reply_to,
            expiration=props.expiration,
            message_id=props.message_id,
            timestamp=props.timestamp,
            type_field=props.type,
            user_id=props.user_id,
            app_id=props.app_id,
            cluster_id=props.cluster_id,
        )
        hdrs = ()
        if bare is not None:
            if len(_DECODED) >= DECODED_CACHE:
                _DECODED.clear()
            _DECODED[bare] = (p, hdrs)
    return _record(method, body, p, hdrs, vhost, queue, now_ms, stream_offset)


def _record(method, body: bytes, p: BackupProperties, hdrs: tuple, vhost: str, queue: str, now_ms: int | None,
            stream_offset: int | None) -> BackupRecord:
    return BackupRecord(
        body=bytes(body) if body else b"",
        properties=p,
        headers=hdrs,
        exchange=method.exchange or "",
        routing_key=method.routing_key or "",
        delivery_tag=method.delivery_tag if stream_offset is None else stream_offset,
        redelivered=bool(method.redelivered),
        backed_up_at=now_ms if now_ms is not None else int(time.time() * 1000),
        source_queue=queue,
        source_vhost=vhost,
    )


def delivery_count(props) -> int:
    """``x-delivery-count`` of a delivery (0 when absent: never returned before)."""
    h = props.headers
    if not h:
        return 0
    v = h.get("x-delivery-count")
    try:
        return int(v) if v is not None else 0
    except (TypeError, ValueError):
        return 0

