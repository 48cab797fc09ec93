"""``rbak import mosquitto-db``: a ``mosquitto.db`` becomes an ordinary RBAK backup.

Why a separate step from the mapping: this is the part that touches storage.
It refuses an existing backup id (anything already under its key prefix),
writes every queue's segments through ``SegmentWriter`` and ``BackupLayout``,
and writes ``manifest.json`` last with ``completed_at``, so a crash leaves no
manifest (an incomplete backup) rather than a wrong one; on a failure it also
deletes the segments it wrote.
"""

from __future__ import annotations

import itertools
from functools import partial
import logging
import os
import time
from dataclasses import dataclass, field

from ...sealing.crypto import ObjectCodec
from ...errors import ConfigError
from ...format.compression import Compression
from ...format.manifest import QueueStatus
from ...format.segment_writer import DEFAULT_SEGMENT_MAX_BYTES
from ...format.record import BackupRecord
from ...format.layout import BackupLayout
from ...repo.progress import Tracker
from ...storage.base import Storage
from .chunks import DamagedRegion
from .reader import read_db
from .mapping import MappingStats, iter_records
from ..writer import WriteOptions, write_backup

log = logging.getLogger(__name__)


@dataclass(slots=True)
class MosquittoImportSummary:
    backup_id: str
    source: str
    db_version: int
    stats: MappingStats
    damaged: list[DamagedRegion] = field(default_factory=list)
    segments: int = 0
    bytes_written: int = 0
    manifest_key: str = ""
    partial: bool = False  # damage was skipped: the manifest's queue_status says so

    def lines(self) -> list[str]:
        s = self.stats
        out = [
            f"Imported {self.source} (Mosquitto db version {self.db_version}) as backup {self.backup_id!r}",
            f"  messages exported: {s.exported} (retained {s.retained}, queued for persistent clients "
            f"{s.queued}, unreleased incoming {s.incoming})",
            f"  queues: {len(s.queues)}, segments: {self.segments}, bytes written: {self.bytes_written}",
        ]
        for q, n in s.queues.items():
            out.append(f"    {q}: {n}")
        skipped = [
            (s.expired, "expired (Mosquitto would drop them on load)"),
            (s.client_owned, "QoS 2 already received by their client (PUBREC seen)"),
            (s.released_incoming, "incoming QoS 2 already released"),
            (s.dangling, "references to stored messages missing from the file"),
            (s.unreferenced, "stored messages no client or retained entry refers to"),
        ]
        for n, why in skipped:
            if n:
                out.append(f"  not exported: {n} {why}")
        if s.expired_sessions:
            out.append(f"  note: {s.expired_sessions} client sessions are past their session expiry; their messages "
                       "are exported anyway (Mosquitto would discard those sessions soon after loading)")
        if s.long_routing_keys:
            out.append(f"  WARNING: {s.long_routing_keys} messages have topics longer than 255 bytes; AMQP routing "
                       "keys cannot be that long, so restore them with publish_mode queue")
        for d in self.damaged:
            span = "to end of file" if d.length is None else f"{d.length} bytes"
            out.append(f"  SKIPPED damaged data at byte offset {d.offset} ({span}): {d.reason}")
        out.append(f"  manifest: {self.manifest_key}")
        return out


@dataclass(frozen=True, slots=True)
class MosquittoImportOptions:
    """How ``import_mosquitto_db`` reads the file and writes its backup (``rbak import mosquitto-db``'s flags).

    ``vhost``: where the messages' queues go; ``now_ms``: the time expiries are judged at (default: now)."""

    prefix: str = ""
    compression: Compression | str = Compression.ZSTD
    skip_damaged: bool = False
    vhost: str = "/"
    now_ms: int | None = None
    segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES


def import_mosquitto_db(path: str | os.PathLike[str], to: str | Storage, backup_id: str,
                        opts: MosquittoImportOptions = MosquittoImportOptions(), *, codec: ObjectCodec | None = None,
                        progress: Tracker | None = None) -> MosquittoImportSummary:
    vhost = opts.vhost
    layout = BackupLayout(backup_id, opts.prefix)
    comp = Compression.parse(opts.compression, "--compression")
    if not vhost:
        raise ConfigError("--vhost: must not be empty")
    src = os.fspath(path)
    db = read_db(src, skip_damaged=opts.skip_damaged)
    now = int(time.time() * 1000) if opts.now_ms is None else opts.now_ms
    stats = MappingStats()
    summary = MosquittoImportSummary(backup_id, src, db.header.version, stats, list(db.damaged))
    records = iter_records(db, vhost=vhost, now_ms=now, stats=stats)  # grouped by queue
    queues = ((vhost, name, "classic", recs)
              for name, recs in itertools.groupby(records, key=_source_queue))
    manifest = write_backup(to, backup_id, queues,
                            WriteOptions(prefix=opts.prefix, compression=comp,
                                         segment_max_bytes=opts.segment_max_bytes,
                                         source_cluster=f"mosquitto:{os.path.abspath(src)}"),
                            codec=codec, progress=progress, statuses=partial(_damage_status, vhost, src, db.damaged))
    summary.segments = manifest.total_segments
    summary.bytes_written = manifest.total_bytes
    summary.manifest_key = layout.manifest
    summary.partial = manifest.is_partial
    return summary


def _source_queue(r: BackupRecord) -> str:
    return r.source_queue


def _damage_status(vhost: str, src: str, damaged: list[DamagedRegion]) -> list[QueueStatus]:
    """Skipped damage makes the backup partial (which queues it cost is unknown: named by the file)."""
    if not damaged:
        return []
    regions = "; ".join(f"byte offset {d.offset} ({'to end of file' if d.length is None else f'{d.length} bytes'}): "
                        f"{d.reason}" for d in damaged[:3]) + (f" (and {len(damaged) - 3} more)" if len(damaged) > 3 else "")
    return [QueueStatus(vhost, os.path.basename(src), "partial",
                        f"damaged data skipped by --skip-damaged in {src}: {regions}")]

