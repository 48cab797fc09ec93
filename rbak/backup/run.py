"""One backup run (``BackupRun``): preflight, the pool of queue jobs, then the manifest, last.

The engine (``engine.RunServices``) holds what lasts across the run (configuration, storage,
codec: the ``QueueServices`` its jobs use); a run holds what one execution finds and decides:
the management client, the lease, the source's cluster and version, the checkpoint and the
manifest it writes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..broker.cluster import split_broker
from ..broker.connect import connect
from ..broker.wire import Connection
from ..sealing.envelope import write_wraps
from ..errors import BackupError, ConfigError, PartialBackupError
from ..format.manifest import PARTIAL_STATUSES, BackupManifest, QueueBackup, QueueStatus
from .checkpoint import Checkpoint, storage_scope
from .definitions import export_definitions, store_definitions
from .guard_store import GuardStore
from .lease import Lease
from .lease import acquire as acquire_lease
from .management import ManagementClient, QueueInfo
from .pool import QueuePool
from .reader_process import ChildMain
from .preflight import NackSupport, PolicyCache, check_read_permissions, probe_read_permissions
from .resume import check_existing, seed_checkpoint
from .selection import select_queues
from .stream_chain import stream_bases
from .summary import BackupSummary

if TYPE_CHECKING:
    from .services import RunServices

log = logging.getLogger("rbak.backup.engine")  # the run's log lines keep the engine's name (log filters, docs)


class BackupRun:
    """One execution of a backup engine: ``run()`` returns its summary, or raises (partial: with it)."""

    def __init__(self, eng: RunServices, child_main: ChildMain):
        self.eng, self.child_main = eng, child_main
        self.source = eng.source
        self.client = ManagementClient.for_connection(self.source, "source")
        self.t0 = time.monotonic()

    def run(self) -> BackupSummary:
        eng, lease = self.eng, None
        try:
            # nothing is written (or deleted) before the source has answered on every port with these
            # credentials, every vhost exists, and this run holds the lease on every vhost it reads
            ov, queues, lease = self.preflight()
            eng.lease = lease
            cluster = ov.get("cluster_name") or ov.get("node") or self.source.host
            version = ov.get("rabbitmq_version")
            # the checkpoint opens before anything is stored: a state path it cannot use fails the run with
            # the storage untouched (no in-progress manifest a next run would take for this one to resume)
            ckpt = Checkpoint(eng.cfg.offset_storage.path, eng.backup_id,
                              storage_scope(eng.storage, eng.cfg.storage.prefix))
            try:
                manifest, summary = self._begin(cluster, version, queues)
            except BaseException:
                ckpt.close()
                raise
            eng.client, eng.policies, eng.nack = self.client, PolicyCache(self.client), NackSupport(version)
            eng.guards = GuardStore(eng.storage, eng.cfg.storage.prefix or "", cluster)
            try:
                self._read(ckpt, cluster, version, queues, manifest, summary)
                self._finish(ckpt, cluster, manifest, summary)
            finally:
                ckpt.close()
        finally:
            if lease is not None:
                lease.release()  # after the manifest: a next backup of this source may start now
            self.client.close()
        summary.duration_secs = time.monotonic() - self.t0
        return summary

    def preflight(self) -> tuple[dict[str, Any], list[QueueInfo], Lease | None]:
        """Checks that touch nothing: the management API (URL, credentials), that every named vhost
        exists, the queue selection, the user's read permission where the API tells it, then the lease
        (whose AMQP connections prove the port, credentials and vhost access). Errors are one line."""
        eng, client, source = self.eng, self.client, self.source
        sel = source.queues
        ov = client.overview()
        self._refuse_split_source(ov)
        known = client.vhosts()
        missing = [v for v in sel.vhosts if v not in known]
        if missing:
            raise ConfigError(f"source.queues.vhosts: vhost {', '.join(map(repr, missing))} does not exist on "
                              f"{source.management_url} (vhosts user {source.mgmt_username!r} can see: "
                              f"{', '.join(map(repr, known[:10]))}{', ...' if len(known) > 10 else ''})")
        queues = select_queues(eng.cfg, client, eng.skipped)
        vhosts = sorted({q.vhost for q in queues} | set(sel.vhosts))
        if not vhosts:  # nothing selected: still prove the AMQP side of the configuration
            url_vhost = source.url_vhost
            vhosts = [url_vhost] if url_vhost in known else []
        check_read_permissions(client, source.username, queues, self._probe_read)
        if not eng.cfg.backup.lease:
            for v in vhosts:  # no lease: the AMQP port, credentials and vhost access are still proven
                connect(source, v).close()
            return ov, queues, None
        lease = acquire_lease(eng.cfg, client, vhosts, self._lease_connection)
        if lease.waited:  # the other backup ran meanwhile: what the source holds now
            try:
                eng.skipped.clear()
                queues = select_queues(eng.cfg, client, eng.skipped)
            except BaseException:
                lease.release()
                raise
        return ov, queues, lease

    def _refuse_split_source(self, ov: dict[str, Any]) -> None:
        """A ``source.management_url`` answering for another cluster than ``source.amqp_url`` is refused
        (exit 2): the queues listed on one broker would be read on the other, found missing, and the backup
        would be "complete" and empty. The first vhost the AMQP side opens tells its cluster (the configured
        ones, the URL's, then ``/``); none opening leaves it to the steps that need them, which name it."""
        problem = split_broker("source", self.source, ov.get("cluster_name"), self.source.queues.vhosts)
        if problem:
            raise ConfigError(f"{problem}; nothing was backed up")

    def _lease_connection(self, vhost: str, name: str) -> Connection:
        return connect(self.source, vhost, name=name)

    def _probe_read(self, vhost: str, queues: list[QueueInfo]) -> list[str]:
        conn = connect(self.source, vhost)
        try:
            return probe_read_permissions(conn, vhost, queues)
        finally:
            conn.close()

    def _begin(self, cluster: str, version: str | None,
               queues: list[QueueInfo]) -> tuple[BackupManifest, BackupSummary]:
        """The run's manifest, stored at once without ``completed_at`` (the id is in progress), and summary."""
        eng, storage, layout, cfg = self.eng, self.eng.storage, self.eng.layout, self.eng.cfg
        origin = eng.origin(cluster)
        created_at, eng.fresh = check_existing(eng, origin)
        if eng.codec.wraps:  # envelope: the wrapped data key is stored before anything it seals
            write_wraps(storage, layout, eng.codec.wraps)
            eng.codec.wraps = []
        log.info("backup %s of %s to %s", eng.backup_id, self.source.safe_amqp_url, storage.url)
        summary = BackupSummary(eng.backup_id, storage.url, layout.manifest, rabbitmq_version=version,
                                source_cluster=cluster,
                                vhosts=sorted({q.vhost for q in queues} | set(self.source.queues.vhosts)),
                                vhost_scope=list(origin.vhosts) if origin.vhosts is not None else None)
        manifest = BackupManifest(backup_id=eng.backup_id, created_at=created_at, source_cluster=cluster,
                                  rabbitmq_version=version, backup_tool_version=__version__,
                                  encryption=eng.codec.info, definitions_only=cfg.backup.definitions_only,
                                  origin=origin)
        if not eng.write_once:
            storage.put(layout.manifest, manifest.to_json())  # marks the id as in progress (completed_at null)
        return manifest, summary

    def _read(self, ckpt: Checkpoint, cluster: str, version: str | None, queues: list[QueueInfo],
              manifest: BackupManifest, summary: BackupSummary) -> None:
        """Definitions, then every queue through the pool; the manifest's queues and statuses follow."""
        eng, cfg = self.eng, self.eng.cfg
        if eng.fresh:
            ckpt.reset_all()
        seed_checkpoint(eng, ckpt, cluster)
        streams = {(q.vhost, q.name) for q in queues if q.queue_type == "stream"}
        if streams and cfg.backup.stream_incremental:
            eng.bases = stream_bases(eng.storage, cfg.storage.prefix or "", cluster, eng.backup_id, streams)
        if cfg.backup.include_definitions:
            manifest.definitions = store_definitions(export_definitions(self.client, self.source.queues),
                                                     eng.storage, eng.layout, eng.compression, eng.level, eng.codec)
            summary.definitions = manifest.definitions
        results = QueuePool(eng, ckpt, cluster, version, self.child_main).run(queues, summary)
        manifest.queues = sorted(results, key=lambda qb: (qb.vhost, qb.name))
        manifest.recompute_totals()
        manifest.queue_status = [
            QueueStatus(q.vhost, q.name, q.status, q.error or "", q.expected if q.status == "partial" else None,
                        q.messages if q.status == "partial" else None)
            for q in summary.queues if q.status in PARTIAL_STATUSES]
        manifest.queue_status += [QueueStatus(vhost, name, "skipped", reason) for vhost, name, reason in eng.skipped]
        manifest.queue_status.sort(key=lambda x: (x.vhost, x.name))

    def _finish(self, ckpt: Checkpoint, cluster: str, manifest: BackupManifest, summary: BackupSummary) -> None:
        """The checkpoint stored, every segment confirmed, then the manifest with ``completed_at``: LAST."""
        eng = self.eng
        if not eng.write_once or not summary.failed:
            eng.sync(ckpt)  # write-once: the state object once, only for a complete backup
        self._confirm_segments(manifest.queues)  # never a manifest naming what is not in this storage
        manifest.completed_at = int(time.time() * 1000)
        eng.storage.put(eng.layout.manifest, manifest.to_json())  # LAST: the backup is complete (or partial) now
        ckpt.commit_stream_offsets(cluster)
        summary.completed = True
        if manifest.content == "empty":
            log.warning("backup %s holds no message (its selection found none): listed as empty; a restore "
                        "without a backup id and prune's keep rules pass over it", eng.backup_id)
        failed = summary.failed
        if failed:
            summary.partial = True
            summary.duration_secs = time.monotonic() - self.t0
            lines = "\n  - ".join(f"{q.vhost}/{q.name} ({q.status}): {q.error}" for q in failed)
            err = PartialBackupError(
                f"{len(failed)} of {len(summary.queues)} queue(s) failed, were refused or read short; backup "
                f"{eng.backup_id!r} is PARTIAL (recorded in its manifest; rerun the same backup_id to retry "
                f"them):\n  - {lines}")
            err.summary = summary
            raise err

    def _confirm_segments(self, queues: list[QueueBackup]) -> None:
        """Every segment the manifest names is in this storage with its size, or the run fails naming it."""
        storage = self.eng.storage
        for q in queues:
            for seg in q.segments:
                size = storage.size(seg.key)
                if size != seg.size_bytes:
                    state = "missing" if size is None else f"{size} bytes, the manifest would say {seg.size_bytes}"
                    raise BackupError(f"queue {q.name!r} in vhost {q.vhost!r}: segment {seg.key} is {state} in "
                                      f"{storage.url}; the manifest was not written (rerun to read the queue again)")

