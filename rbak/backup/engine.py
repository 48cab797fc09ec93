"""The backup engine: queues -> segments, definitions, checkpoint, manifest last.

Order of a run (``run.BackupRun``, and why):

1. Refuse to touch a backup id whose manifest is complete (unless
   ``backup.overwrite``); an incomplete one is resumed from the checkpoint (``resume``).
2. Management API: cluster name and version, the queue list (``selection``); definitions.
3. A bounded pool of ``max_concurrent_queues`` workers (``pool``); each worker keeps one
   AMQP connection per vhost and reads one queue at a time on fresh
   channels, so 1,000 queues need ``max_concurrent_queues`` connections. Classic queues of
   1,000+ messages go to reader processes instead (``reader_process``: the reads use every
   core); this process keeps the checkpoint, progress and everything below.
4. Per queue, a job of one shape (``jobs``: ``queue_backup.QueueJob``, ``stream_backup.StreamJob``)
   on this engine's ``QueueServices``, and an ``AsyncSegmentWriter`` (compress + store in a
   background thread) rotating on size/age (memory is bounded by ``segment_max_bytes`` per worker,
   never by queue depth).
5. The checkpoint is synced to ``state/offsets.db``; every segment the
   manifest will name is confirmed in this storage (present, right size); the
   manifest (with ``completed_at``) is written last. A queue refused or failed
   by the run is recorded in ``queue_status`` and the backup is *partial*: a
   rerun of the same id retries those queues and keeps the others.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import metrics
from ..config import Config, ConnectionConfig
from ..sealing.envelope import writer_codec
from ..errors import ConfigError
from ..format.compression import Compression
from ..format.manifest import BackupOrigin, BackupOwner, QueueBackup
from ..format.layout import BackupLayout
from ..storage.base import Storage
from . import reader_process
from .checkpoint import Checkpoint
from .guard_store import GuardStore
from .lease import Lease
from .limits import resolve_delivery_limit
from .management import ManagementClient, QueueInfo
from .pipeline import SegmentStore
from .pool import Connections, back_up_queue
from .preflight import NackSupport, PolicyCache
from .run import BackupRun
from .segments import AsyncSegmentWriter
from .selection import Skipped, note_skip
from .stages import OnDurable, Progress, Throttle
from .stream_chain import StreamBase
from .summary import BackupSummary

log = logging.getLogger(__name__)


def _noop(event: str, /, **kw: Any) -> None:
    pass


def effective_delivery_limit(q: QueueInfo, version: str | None) -> int | None:
    """The limit from what the management API reported for ``q`` (None: unlimited); the engine
    itself resolves it from the policy lists too (``preflight.quorum_settings``)."""
    pol = [{"name": q.policy or "effective", "definition": q.effective_policy}] if q.effective_policy else []
    return resolve_delivery_limit(q.arguments, pol, [], version).value


class BackupEngine:
    """A backup's configuration, storage and codec: the ``QueueServices`` of its queue jobs.
    ``run()`` runs the backup once (``run.BackupRun``)."""

    client: ManagementClient
    policies: PolicyCache
    nack: NackSupport
    guards: GuardStore

    def __init__(self, cfg: Config, storage: Storage | None = None, progress: Progress | None = None,
                 throttle: Throttle | None = None):
        if cfg.mode != "backup":
            raise ConfigError(f"mode: this is a {cfg.mode!r} configuration; rbak backup needs mode: backup")
        if cfg.source is None:
            raise ConfigError("source: required for a backup")
        if not cfg.backup_id:
            raise ConfigError("backup_id: required for a backup")
        self.source: ConnectionConfig = cfg.source
        self.backup_id: str = cfg.backup_id
        if cfg.backup.max_connections is not None:
            log.warning("backup.max_connections: not used; each worker opens its own connection per vhost, so at most "
                        "backup.max_concurrent_queues (%d) per vhost: lower that to open fewer",
                        cfg.backup.max_concurrent_queues)
        self.cfg = cfg
        self.layout: BackupLayout = cfg.layout()
        self.storage = storage or cfg.storage.open()
        self.progress: Progress = progress or _noop
        self.throttle = throttle  # test hook: called after each message read
        self.compression = Compression.parse(cfg.backup.compression)
        self.level = cfg.backup.compression_level
        self.connections_opened = 0
        self.bases: dict[tuple[str, str], StreamBase] = {}
        self.fresh = False  # no usable manifest of this id in this storage: local progress is stale
        self.skipped: Skipped = []  # (vhost, queue, reason), noted in the manifest
        self.codec = writer_codec(cfg.backup_id, cfg.encryption)
        self.write_once = self.storage.write_once  # S3 Object Lock: no object is ever put twice
        self.lease: Lease | None = None
        self.reader_cpu_secs = 0.0  # CPU seconds of the reader processes (not in this process's own times)
        self.child_connections = 0  # AMQP connections the reader processes opened
        self.readers_failed = False  # no reader process could start: classic queues were read by threads

    def run(self) -> BackupSummary:
        return BackupRun(self, reader_child_main).run()

    def origin(self, cluster: str) -> BackupOrigin:
        """This run's source (the cluster, its vhost scope) and owner, as its manifest records them."""
        sel, owner = self.source.queues, self.cfg.backup.owner
        return BackupOrigin(cluster, tuple(sorted(set(sel.vhosts))) if sel.vhosts else None,
                            BackupOwner(owner.namespace, owner.name, owner.uid or None) if owner else None)

    def skip(self, vhost: str, name: str, reason: str) -> None:
        note_skip(self.skipped, vhost, name, reason)

    def sync(self, ckpt: Checkpoint) -> None:
        """Store the checkpoint beside the backup (another machine resumes from it)."""
        key = self.cfg.offset_storage.s3_key or self.layout.offsets_db
        ckpt.sync_to(self.storage, key, self.codec)
        metrics.checkpoint_syncs().inc()

    # QueueServices ------------------------------------------------------
    def segment_writer(self, vhost: str, queue: str, queue_type: str, first_sequence: int,
                       on_durable: OnDurable | None = None) -> AsyncSegmentWriter:
        store = SegmentStore(self.storage, self.layout, self.codec, self.compression, vhost, queue, queue_type)
        b = self.cfg.backup
        return AsyncSegmentWriter(store, self.compression, self.level, b.segment_max_bytes, b.segment_max_interval_ms,
                                  first_sequence, on_durable)

    def deadline(self) -> float | None:
        d = self.cfg.backup.max_duration_secs
        return time.monotonic() + d if d else None

    def lease_risk(self, vhost: str, started: float, ended: float | None = None) -> str | None:
        """Why a read whose depth was measured at ``started`` (up to ``ended``) may miss messages
        another backup held: this run had lost its lease on the vhost then (``Lease.at_risk``)."""
        lease = self.lease
        return lease.at_risk(vhost, started, ended) if lease is not None else None

    def stream_base(self, vhost: str, name: str) -> StreamBase | None:
        return self.bases.get((vhost, name))


class _ChildProgress:
    """A reader process's progress events, sent to the parent on the pipe."""

    def __init__(self, send: reader_process.Send):
        self.send = send

    def __call__(self, event: str, /, **kw: Any) -> None:
        self.send(("event", event, kw))


def reader_child_main(pipe: Any, cfg: Config, level: int, env: dict[str, str], codec: Any) -> None:
    """A reader process's main function (``reader_process.ReaderProcesses`` starts it): an engine of
    its own reads each queue the parent lends it with ``pool.back_up_queue``, as a worker thread does."""
    send = reader_process.child_setup(pipe, level, env)
    eng = BackupEngine(cfg, progress=_ChildProgress(send))
    if codec is not None:
        eng.codec = codec
    # A queue's read may ask the management API (a single-active-consumer queue whose arguments
    # the listing lacked); the parent's client stays in the parent.
    eng.client = ManagementClient.for_connection(eng.source, "source")
    conns = Connections(cfg)

    def read(q: QueueInfo, cluster: str, version: str | None, ckpt: Any) -> tuple[QueueBackup, int]:
        before = conns.opened
        qb, _resumed = back_up_queue(eng, q, ckpt, conns, cluster, version)
        return qb, conns.opened - before

    try:
        reader_process.serve(pipe, send, read)
    finally:
        conns.close_all()
        eng.client.close()


def run_backup(cfg: Config, storage: Storage | None = None, progress: Progress | None = None) -> BackupSummary:
    return BackupEngine(cfg, storage, progress).run()
