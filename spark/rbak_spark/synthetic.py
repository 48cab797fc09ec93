"""Synthetic backups written with rbak's own segment writer (tests, benchmarks).

Records carry a queue-local sequence number in the ``seq`` header and in
``message_id`` so a restore test can check order and exactly-once delivery.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from rbak.format.compression import Compression
from rbak.format.layout import BackupLayout
from rbak.format.manifest import BackupManifest, QueueBackup
from rbak.format.record import BackupProperties, BackupRecord, Long, LongString
from rbak.format.segment_writer import SegmentWriter


@dataclass(frozen=True)
class QueueSpec:
    vhost: str
    name: str
    messages: int
    body_size: int = 64
    queue_type: str = "classic"


def make_record(spec: QueueSpec, i: int, ts: int, body: bytes | None = None) -> BackupRecord:
    if body is None:
        tag = f"{spec.name}:{i}:".encode()
        body = (tag * (spec.body_size // len(tag) + 1))[: max(spec.body_size, len(tag))]
    return BackupRecord(
        body=body,
        properties=BackupProperties(content_type="text/plain", delivery_mode=2, message_id=f"{spec.name}-{i}"),
        headers=(("seq", Long(i)), ("origin", LongString("synthetic"))),
        exchange="",
        routing_key=spec.name,
        delivery_tag=i + 1,
        backed_up_at=ts,
        source_queue=spec.name,
        source_vhost=spec.vhost,
    )


def write_backup(
    storage,
    backup_id: str,
    queues: list[QueueSpec],
    prefix: str = "",
    compression: Compression = Compression.ZSTD,
    level: int | None = None,
    segment_max_bytes: int = 64 * 1024,
    start_ms: int = 1_700_000_000_000,
    step_ms: int = 1000,
    random_bodies: bool = False,
) -> BackupManifest:
    """Write a complete backup (segments, then the manifest last) and return its manifest.

    Record ``i`` of every queue has ``backed_up_at = start_ms + i * step_ms``.
    ``random_bodies`` uses incompressible bytes (realistic sizes for benchmarks).
    """
    layout = BackupLayout(backup_id, prefix)
    manifest = BackupManifest(backup_id=backup_id, created_at=start_ms, backup_tool_version="rbak-synthetic")
    for spec in queues:
        qb = QueueBackup(vhost=spec.vhost, name=spec.name, queue_type=spec.queue_type)

        def sink(seq: int, data: memoryview, spec: QueueSpec = spec) -> str:
            key = layout.segment(spec.vhost, spec.name, seq, compression)
            storage.put(key, data)
            return key

        w = SegmentWriter(sink, compression, level, max_bytes=segment_max_bytes, max_interval_ms=10**12)
        for i in range(spec.messages):
            body = os.urandom(spec.body_size) if random_bodies else None
            meta = w.append(make_record(spec, i, start_ms + i * step_ms, body))
            if meta:
                qb.add_segment(meta)
        meta = w.flush()
        if meta:
            qb.add_segment(meta)
        manifest.queues.append(qb)
    manifest.completed_at = int(time.time() * 1000)
    manifest.recompute_totals()
    storage.put(layout.manifest, manifest.to_json())
    return manifest
