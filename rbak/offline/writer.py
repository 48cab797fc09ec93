"""Write an ordinary RBAK backup from queues of records (shared by the offline importers).

Segments first, the manifest last with ``completed_at`` set, exactly like an
online backup, so ``rbak restore``/``validate`` need nothing special. An
existing backup id is refused (never overwritten); if writing fails the
segments already stored are deleted again, so no half backup is left.

Records are decoded and encoded in the caller's thread while one background
thread (``SegmentPipeline``) compresses, hashes and stores the finished
segments: those steps release the GIL, so on two cores the two overlap.
"""

from __future__ import annotations

import logging
import time
import itertools
from typing import Iterable

from .. import __version__
from ..errors import ConfigError, RbakError
from ..format.compression import Compression
from ..crypto import ObjectCodec
from ..format.manifest import BackupManifest, QueueBackup
from ..format.record import BackupRecord
from ..format.segment import DEFAULT_SEGMENT_MAX_BYTES, SegmentPipeline, SegmentWriter
from ..keys import BackupLayout
from ..storage import Storage, open_storage

log = logging.getLogger(__name__)

QueueRecords = tuple[str, str, str, Iterable[BackupRecord]]  # vhost, queue, queue_type, records


_BATCH = 512
#: Threads compressing/hashing/storing segments beside the decoding thread. Segments are
#: independent, so two compress at once (zstd import 1.6x faster than one thread on two
#: cores); memory is ``PIPELINE_WORKERS + 1`` segment buffers (one more queued measured no faster).
PIPELINE_WORKERS = 2


def _batches(records: Iterable[BackupRecord], size: int) -> Iterable[list[BackupRecord]]:
    it = iter(records)
    while batch := list(itertools.islice(it, size)):
        yield batch


def now_ms() -> int:
    return int(time.time() * 1000)


def write_backup(
    storage_url: str | Storage,
    backup_id: str,
    queues: Iterable[QueueRecords],
    prefix: str = "",
    compression: Compression | str = Compression.ZSTD,
    level: int | None = None,
    segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES,
    source_cluster: str | None = None,
    rabbitmq_version: str | None = None,
    codec: ObjectCodec | None = None,
    progress=None,
) -> BackupManifest:
    """Store every queue's records as segments, then the manifest; returns the manifest.

    ``codec`` (``crypto.import_codec``) seals every segment like an encrypted backup's; the manifest
    stays plaintext and names the key id. ``progress`` (an ``rbak.progress.Tracker``) counts queues,
    records and body bytes as they are read."""
    codec = codec or ObjectCodec(backup_id)
    if progress is not None:
        from ..progress import counted

        queues = counted(progress, queues, lambda r: len(r.body or b""))
    if isinstance(compression, str):
        compression = Compression.parse(compression)
    layout = BackupLayout(backup_id, prefix)
    storage = open_storage(storage_url) if isinstance(storage_url, str) else storage_url
    own_storage = isinstance(storage_url, str)
    written: list[str] = []
    # Decoding (Python) runs here; compressing, hashing and storing in the pipeline's threads.
    pipeline = SegmentPipeline(workers=PIPELINE_WORKERS, max_inflight=PIPELINE_WORKERS)
    try:
        if storage.exists(layout.manifest) or next(iter(storage.list(layout.root + "/")), None) is not None:
            raise ConfigError(f"backup_id: a backup {backup_id!r} already exists at {layout.root}/; refusing to overwrite it")
        manifest = BackupManifest(
            backup_id=backup_id,
            created_at=now_ms(),
            source_cluster=source_cluster,
            rabbitmq_version=rabbitmq_version,
            backup_tool_version=__version__,
            encryption=codec.info,
        )
        seen: set[tuple[str, str]] = set()
        writers: list[tuple[QueueBackup, SegmentWriter]] = []
        for vhost, name, queue_type, records in queues:
            if (vhost, name) in seen:
                raise ConfigError(f"queue {name!r} in vhost {vhost!r} appears twice in the import")
            seen.add((vhost, name))
            qb = QueueBackup(vhost=vhost, name=name, queue_type=queue_type)

            def sink(seq: int, data: memoryview, _v: str = vhost, _q: str = name) -> str | tuple[str, bytes]:
                key = layout.segment(_v, _q, seq, compression)
                stored = codec.put(storage, key, data)
                written.append(key)  # runs in the pipeline's thread; read only after abort()/close()
                return (key, stored) if codec.encrypted else key

            w = SegmentWriter(sink, compression, level, max_bytes=segment_max_bytes, max_interval_ms=2**62,
                              pipeline=pipeline)
            for batch in _batches(records, _BATCH):  # batches take the codec's fast path
                w.append_many(batch)
            w.flush()
            writers.append((qb, w))
            manifest.queues.append(qb)
        pipeline.close()  # every segment stored; raises the writer thread's error unchanged
        for qb, w in writers:
            for meta in w.written:
                qb.add_segment(meta)
            log.info("queue %r in vhost %r: %d message(s) in %d segment(s)",
                     qb.name, qb.vhost, qb.message_count, len(qb.segments))
        manifest.recompute_totals()
        manifest.completed_at = now_ms()
        storage.put(layout.manifest, manifest.to_json())
        return manifest
    except BaseException:
        pipeline.abort()  # the thread is idle from here on: nothing is written after the cleanup
        if written:
            log.warning("import failed; deleting %d segment(s) already written", len(written))
            for key in written:
                try:
                    storage.delete(key)
                except RbakError:  # pragma: no cover - best effort cleanup
                    log.error("could not delete %s", key)
        raise
    finally:
        if own_storage:
            storage.close()
