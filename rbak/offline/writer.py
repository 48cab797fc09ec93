"""Write an ordinary RBAK backup from queues of records (shared by the offline importers).

Segments first, the manifest last with ``completed_at`` set, exactly like an
online backup, so ``rbak restore``/``validate`` need nothing special. An
existing backup id is refused (never overwritten); if writing fails the
segments already stored are deleted again, so no half backup is left.

Records are decoded in the caller's thread; one encoder thread writes them
into segments (``SegmentWriter.append_from``: the C helper writes the bodies'
JSON with the GIL released, so it overlaps with the decoding), and the
``SegmentPipeline``'s threads compress, hash and store the finished segments
(GIL-free too). The output is the same as encoding in the caller's thread.
"""

from __future__ import annotations

import logging
import operator
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .. import __version__
from ..errors import ConfigError, RbakError
from ..format.compression import Compression
from ..sealing.crypto import ObjectCodec
from ..sealing.envelope import write_wraps
from ..format.manifest import BackupManifest, QueueBackup, QueueStatus
from ..format.record import BackupRecord
from ..format.segment_writer import DEFAULT_SEGMENT_MAX_BYTES, SegmentPipeline, SegmentWriter
from ..format.layout import BackupLayout
from ..repo.progress import Tracker, counted
from ..storage import Storage, open_storage
from ..storage.base import Spool

log = logging.getLogger(__name__)

QueueRecords = tuple[str, str, str, Iterable[BackupRecord]]  # vhost, queue, queue_type, records


_BATCH = 512
#: Batches decoded ahead of the encoder thread (memory: this many batches of records).
ENCODE_AHEAD = 2
#: Threads compressing/hashing/storing segments beside the decoding thread. Segments are
#: independent, so two compress at once (zstd import 1.6x faster than one thread on two
#: cores); memory is ``PIPELINE_WORKERS + 1`` segment buffers (one more queued measured no faster).
PIPELINE_WORKERS = 2


def _batches(records: Iterable[BackupRecord], size: int, max_body_bytes: int = 4 << 20
             ) -> Iterable[list[BackupRecord]]:
    """Up to ``size`` records, fewer once their bodies reach ``max_body_bytes`` (so the encoder's
    last batch, which runs after the decoding ends, stays short)."""
    batch: list[BackupRecord] = []
    body = 0
    for r in records:
        batch.append(r)
        body += len(r.body or b"")
        if len(batch) >= size or body >= max_body_bytes:
            yield batch
            batch, body = [], 0
    if batch:
        yield batch


def _body_len(r: BackupRecord) -> int:
    return len(r.body or b"")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """Where and how an import's backup is written, and the source its manifest names."""

    prefix: str = ""
    compression: Compression | str = Compression.ZSTD
    level: int | None = None
    segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES
    source_cluster: str | None = None
    rabbitmq_version: str | None = None


def write_backup(storage_url: str | Storage, backup_id: str, queues: Iterable[QueueRecords],
                 opts: WriteOptions = WriteOptions(), *, codec: ObjectCodec | None = None,
                 progress: Tracker | None = None, statuses: Callable[[], list[QueueStatus]] | None = None,
                 ) -> BackupManifest:
    """Store every queue's records as segments, then the manifest; returns the manifest.

    ``codec`` (``commands.secrets.import_codec``) seals every segment like an encrypted backup's; the manifest
    stays plaintext and names the key id (envelope: the data key, whose wraps are stored first and
    deleted with the segments when the import fails). ``progress`` counts queues, records and body
    bytes as they are read. ``statuses`` is asked, once every queue is read, for what the import
    could not recover (``ImportContext.queue_statuses``): the manifest records it, so ``list``,
    ``describe`` and ``validate`` call the backup partial, never complete."""
    codec = codec or ObjectCodec(backup_id)
    if progress is not None:
        queues = counted(progress, queues, _body_len)
    compression = Compression.parse(opts.compression) if isinstance(opts.compression, str) else opts.compression
    layout = BackupLayout(backup_id, opts.prefix)
    storage = open_storage(storage_url) if isinstance(storage_url, str) else storage_url
    own_storage = isinstance(storage_url, str)
    # Decoding (Python) runs here; compressing, hashing and storing in the pipeline's threads.
    run = _ImportRun(storage, layout, compression, opts.level, opts.segment_max_bytes, codec,
                     SegmentPipeline(workers=PIPELINE_WORKERS, max_inflight=PIPELINE_WORKERS), _Encoder())
    try:
        if storage.exists(layout.manifest) or next(iter(storage.list(layout.root + "/")), None) is not None:
            raise ConfigError(f"backup_id: a backup {backup_id!r} already exists at {layout.root}/; refusing to overwrite it")
        if codec.wraps:  # envelope: the wrapped data key is stored before anything it seals, as a backup does
            run.written += write_wraps(storage, layout, codec.wraps)
            codec.wraps = []
        manifest = BackupManifest(backup_id=backup_id, created_at=now_ms(), source_cluster=opts.source_cluster,
                                  rabbitmq_version=opts.rabbitmq_version, backup_tool_version=__version__,
                                  encryption=codec.info)
        seen: set[tuple[str, str]] = set()
        for vhost, name, queue_type, records in queues:
            if (vhost, name) in seen:
                raise ConfigError(f"queue {name!r} in vhost {vhost!r} appears twice in the import")
            seen.add((vhost, name))
            manifest.queues.append(run.write_queue(vhost, name, queue_type, records))
        run.finish()  # every segment stored; raises the writer thread's error unchanged
        manifest.recompute_totals()
        if statuses is not None:
            manifest.queue_status = statuses()
        manifest.completed_at = now_ms()
        storage.put(layout.manifest, manifest.to_json())
        return manifest
    except BaseException:
        run.abort()
        raise
    finally:
        if own_storage:
            storage.close()


class _ImportRun:
    """The segments of one import: written through the pipeline, described in the manifest once all are
    stored, deleted again if the import fails (the manifest is never written then)."""

    def __init__(self, storage: Storage, layout: BackupLayout, compression: Compression, level: int | None,
                 segment_max_bytes: int, codec: ObjectCodec, pipeline: SegmentPipeline, encoder: "_Encoder"):
        self.storage, self.layout, self.compression, self.level = storage, layout, compression, level
        self.segment_max_bytes, self.codec, self.pipeline = segment_max_bytes, codec, pipeline
        self.encoder = encoder
        self.written: list[str] = []  # appended in the pipeline's thread; read only after abort()/finish()
        self.spools: list[Spool] = []  # segments written as they are built (``SegmentStream``)
        self.writers: list[tuple[QueueBackup, SegmentWriter]] = []

    def write_queue(self, vhost: str, name: str, queue_type: str, records: Iterable[BackupRecord]) -> QueueBackup:
        qb = QueueBackup(vhost=vhost, name=name, queue_type=queue_type)

        def sink(seq: int, data: memoryview) -> str | tuple[str, bytes | bytearray | memoryview]:
            key = self.layout.segment(vhost, name, seq, self.compression)
            stored = self.codec.put(self.storage, key, data)
            self.written.append(key)
            return (key, stored) if self.codec.encrypted else key

        def spool(seq: int) -> Spool | None:
            # Unencrypted segments go to their files as they are built where the storage can (a local
            # directory): the same bytes, stored by the spool's commit instead of ``put``.
            if self.codec.encrypted:
                return None
            sp = self.storage.open_spool(self.layout.segment(vhost, name, seq, self.compression))
            if sp is not None:
                self.spools.append(sp)
            return sp

        w = SegmentWriter(sink, self.compression, self.level, max_bytes=self.segment_max_bytes,
                          max_interval_ms=2**62, pipeline=self.pipeline, spool=spool)
        self.writers.append((qb, w))
        it = iter(records)
        if operator.length_hint(it, -1) >= 0:  # a source that will know its count: it decodes first
            self.encoder.submit(w.warm)  # while the first records are decoded (a replay may take a while)
        for batch in _batches(it, _BATCH):  # decoded here, encoded in the encoder thread
            left = operator.length_hint(it, -1)  # an importer that knows its count says how many are left
            self.encoder.submit(_append_all, w, batch, len(batch) + left if left >= 0 else None)
        self.encoder.submit(w.flush)
        return qb

    def finish(self) -> None:
        self.encoder.close()  # every record in a segment; raises the encoder thread's error unchanged
        self.pipeline.close()
        for qb, w in self.writers:
            for meta in w.written:
                qb.add_segment(meta)
            log.info("queue %r in vhost %r: %d message(s) in %d segment(s)",
                     qb.name, qb.vhost, qb.message_count, len(qb.segments))

    def abort(self) -> None:
        self.encoder.abort()
        self.pipeline.abort()  # the thread is idle from here on: nothing is written after the cleanup
        for sp in self.spools:
            sp.discard()  # an uncommitted one leaves nothing; a committed one is deleted with the rest
            if sp.key not in self.written:
                self.written.append(sp.key)
        if self.written:
            log.warning("import failed; deleting %d segment(s) already written", len(self.written))
            for key in self.written:
                try:
                    self.storage.delete(key)
                except RbakError:  # pragma: no cover - best effort cleanup
                    log.error("could not delete %s", key)


def _append_all(w: SegmentWriter, batch: Sequence[BackupRecord], expect: int | None = None) -> None:
    """``expect``: the records left in the queue from this batch on (``SegmentWriter.append_from``)."""
    i = 0
    while i < len(batch):
        i = w.append_from(batch, i, expect - i if expect is not None else None)


class _Encoder:
    """The one thread that appends decoded batches to their segments, in submission order.

    At most ``ENCODE_AHEAD`` batches wait; ``submit`` and ``close`` re-raise the thread's first
    error unchanged (nothing after it runs). Only this thread touches the segment writers and
    submits to the pipeline until ``close`` returns."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rbak-import-encode")
        self._pending: deque[Future] = deque()

    def submit(self, fn, *args) -> None:
        self._pending.append(self._pool.submit(fn, *args))
        while self._pending and (len(self._pending) > ENCODE_AHEAD or self._pending[0].done()):
            self._pending.popleft().result()

    def close(self) -> None:
        try:
            while self._pending:
                self._pending.popleft().result()
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop batches not started; returns once the thread is idle (the caller cleans up)."""
        for f in self._pending:
            f.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
