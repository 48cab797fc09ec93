"""Shared helpers of the restore tests: build backups with the core writer, read deliveries back typed."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace


from rbak.format.compression import Compression
from rbak.format.manifest import BackupManifest, QueueBackup
from rbak.format.record import (
    VOID, Array, BackupProperties, BackupRecord, Bool, Bytes, Double, Float, Long, LongString, Short,
    ShortString, Table, Timestamp,
)
from rbak.format.segment_writer import SegmentWriter
from rbak.format.layout import BackupLayout
from rbak.format.amqp091 import decode_basic_properties, header_equal, read_back
from rbak.config import ConnectionConfig
from rbak.restore.options import RestoreOptions

EVERY_HEADER = (
    ("long-string", LongString("héllo wörld")),
    ("short-string", ShortString("short")),
    ("long-min", Long(-(2**63))),
    ("long-max", Long(2**63 - 1)),
    ("short-min", Short(-32768)),
    ("short-max", Short(32767)),
    ("bool-true", Bool(True)),
    ("bool-false", Bool(False)),
    ("bytes", Bytes(bytes(range(256)))),
    ("empty-bytes", Bytes(b"")),
    ("timestamp", Timestamp(1_700_000_000)),
    ("float", Float(1.5)),
    ("float-max", Float(3.4028234663852886e38)),
    ("double", Double(3.141592653589793)),
    ("double-neg-zero", Double(-0.0)),
    ("void", VOID),
    ("empty-string", LongString("")),
    ("ключ 🐇", LongString("значение")),
    ("table", Table((
        ("a", Long(1)),
        ("nested", Table((("deep", Array((LongString("x"), Short(2), Array(()), Table(()), VOID))),))),
        ("f", Float(-0.25)),
    ))),
    ("array", Array((Long(1), LongString("two"), Bool(False), VOID, Bytes(b"\x00"), Double(2.5),
                     Timestamp(0), Table((("k", Bool(True)),)), Array((Short(-1),))))),
    ("empty-table", Table(())),
    ("empty-array", Array(())),
)

EVERY_PROPERTY = BackupProperties(
    content_type="application/octet-stream", content_encoding="identity", delivery_mode=2, priority=5,
    correlation_id="corr-1", reply_to="reply.queue", expiration="3600000", message_id="msg-1",
    timestamp=1_700_000_123, type_field="order.created", user_id="guest", app_id="rbak-test", cluster_id="c1",
)

# What a stream keeps: both brokers store stream messages as AMQP 1.0, whose
# application-properties hold scalars only, so nested tables/arrays are dropped
# by the broker, cluster_id is lost, an empty byte array reads back as an empty
# string on 4.0, and x-stream-offset is added on delivery.
STREAM_HEADERS = tuple((k, v) for k, v in EVERY_HEADER
                       if type(v) not in (Table, Array) and k != "empty-bytes")
STREAM_PROPERTY = replace(EVERY_PROPERTY, cluster_id=None)

HOSTILE_NAMES = ("a/b c%d", "..", "ünïcödé 🐇", "_default", "q" * 200, "with\ttab")


def expected_after_restore(headers):
    """What a restored header table reads back as: ShortString travels as a long string."""
    return tuple((k, read_back(v)) for k, v in headers)


def headers_equal(got, expected, ignore=("x-stream-offset",)) -> bool:
    """Same entries with equal variants (nested tables compared in order). The top-level
    order is not compared: RabbitMQ 4.0 re-sorts the header table of a 0-9-1 message."""
    g = {k: v for k, v in got or () if k not in ignore}
    e = dict(expected)
    return g.keys() == e.keys() and all(header_equal(g[k], e[k]) for k in e)


def make_records(vhost: str, queue: str, bodies, start_ts: int = 1_700_000_000_000, step_ms: int = 1,
                 exchange: str = "", routing_key: str | None = None, every_type: bool = True, stream: bool = False):
    out = []
    base_props, base_headers = (STREAM_PROPERTY, STREAM_HEADERS) if stream else (EVERY_PROPERTY, EVERY_HEADER)
    for i, body in enumerate(bodies):
        props = replace(base_props, message_id=f"m-{i}") if every_type else BackupProperties(message_id=f"m-{i}")
        headers = (base_headers + (("seq", Long(i)),)) if every_type else (("seq", Long(i)),)
        out.append(BackupRecord(
            body=body, properties=props, headers=headers, exchange=exchange,
            routing_key=queue if routing_key is None else routing_key, delivery_tag=i + 1,
            backed_up_at=start_ts + i * step_ms, source_queue=queue, source_vhost=vhost,
        ))
    return out


def build_backup(storage, backup_id, queues, prefix="", compression=Compression.ZSTD, max_bytes=1 << 20,
                 complete=True) -> BackupManifest:
    """``queues``: iterable of (vhost, name, queue_type, records). Written with the core SegmentWriter."""
    layout = BackupLayout(backup_id, prefix)
    now = int(time.time() * 1000)
    manifest = BackupManifest(backup_id=backup_id, created_at=now, backup_tool_version="test")
    for vhost, name, qtype, records in queues:
        qb = QueueBackup(vhost=vhost, name=name, queue_type=qtype)

        def sink(seq, data, vhost=vhost, name=name):
            key = layout.segment(vhost, name, seq, compression)
            storage.put(key, data)
            return key

        w = SegmentWriter(sink, compression, max_bytes=max_bytes, max_interval_ms=10**9)
        for r in records:
            meta = w.append(r)
            if meta:
                qb.add_segment(meta)
        meta = w.flush()
        if meta:
            qb.add_segment(meta)
        manifest.queues.append(qb)
    manifest.completed_at = now if complete else None
    manifest.recompute_totals()
    storage.put(layout.manifest, manifest.to_json())
    return manifest


def options_for(broker, backup_id, **kw) -> RestoreOptions:
    target = ConnectionConfig(amqp_url=broker.server_url(), management_url=broker.management_url,
                              management_username=broker.user, management_password=broker.password,
                              stream_port=broker.stream_port)
    kw.setdefault("publish_mode", "queue")
    return RestoreOptions(backup_id=backup_id, target=target, **kw)


@dataclass
class Delivery:
    body: bytes
    properties: BackupProperties
    headers: tuple | None
    exchange: str
    routing_key: str


def consume_all(broker, vhost, queue, expected: int, stream: bool = False, timeout: float = 60.0,
                extra_wait: float = 0.5) -> list[Delivery]:
    """Read every message of ``queue`` (acking: tests own their vhosts), waiting ``extra_wait`` for surplus.

    The read ends only after ``extra_wait`` seconds without a delivery once ``expected`` have come (a
    stream read from the first offset on a loaded machine may pause longer than the 0.2 s poll)."""
    from rbak.broker.deliveries import receive

    out: list[Delivery] = []
    with broker.wire(vhost) as conn:  # each delivery keeps its header's bytes: decoded typed (pika's loses types)
        ch = conn.channel()
        ch.qos(2000)
        args = {"x-stream-offset": "first"} if stream else {}
        deadline = time.monotonic() + timeout
        surplus_deadline = time.monotonic() + extra_wait if expected == 0 else float("inf")
        acked = last_tag = 0
        tag = ch.consume(queue, args)
        for method, props, body in receive(conn, ch, tag, 0.2):
            if method is None:
                if time.monotonic() > deadline or (len(out) >= expected and time.monotonic() > surplus_deadline):
                    break
                continue
            if len(out) >= expected:  # a surplus delivery: wait a full extra_wait of silence again
                surplus_deadline = time.monotonic() + extra_wait
            p, h = decode_basic_properties(props.raw)
            out.append(Delivery(body, p, h, method.exchange, method.routing_key))
            last_tag = method.delivery_tag
            if len(out) % 500 == 0 or len(out) >= expected:
                ch.ack(last_tag, multiple=True)
                acked = last_tag
            if len(out) == expected:
                surplus_deadline = time.monotonic() + extra_wait
        if out and acked != last_tag:
            ch.ack(last_tag, multiple=True)
        ch.cancel(tag)
    return out


def storage_for(tmp_path, name="store"):
    from rbak.storage import open_storage

    d = tmp_path / name
    os.makedirs(d, exist_ok=True)
    return open_storage(f"file://{d}")


def declare(broker, vhost, name, qtype="classic", arguments=None):
    """Declare over AMQP (the management API cannot address names like '..')."""
    args = {"x-queue-type": qtype}
    args.update(arguments or {})
    with broker.connect(vhost) as conn:
        conn.channel().queue_declare(name, durable=True, arguments=args)
