"""The backup run: queues -> segments, definitions, checkpoint, manifest last.

Order of a run (and why):

1. Refuse to touch a backup id whose manifest is complete (unless
   ``backup.overwrite``); an incomplete one is resumed from the checkpoint.
2. Management API: cluster name and version, the queue list; definitions.
3. A bounded pool of ``max_concurrent_queues`` workers; each worker keeps one
   AMQP connection per vhost and reads one queue at a time on fresh
   channels, so 1,000 queues need ``max_concurrent_queues`` connections. Classic queues of
   1,000+ messages go to reader processes instead (``reader_process``: the reads use every
   core); this process keeps the checkpoint, progress and everything below.
4. Per queue, an ``AsyncSegmentWriter`` (compress + store in a background thread) rotating on size/age (memory is bounded by
   ``segment_max_bytes`` per worker, never by queue depth).
5. The checkpoint is synced to ``state/offsets.db``; every segment the
   manifest will name is confirmed in this storage (present, right size); the
   manifest (with ``completed_at``) is written last. A queue refused or failed
   by the run is recorded in ``queue_status`` and the backup is *partial*: a
   rerun of the same id retries those queues and keeps the others.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable

from .. import __version__
from ..config import Config, ConnectionConfig
from ..sealing.crypto import codec_for
from ..sealing.envelope import writer_codec
from ..errors import (AmqpError, BackupError, ConfigError, ConnectionLost, DeliveryLimitError, NotFoundError,
                      NoReaderProcess, PartialBackupError, QueueRefused, QueueSkipped, RbakError, ShortRead)
from ..format.compression import Compression
from ..format.manifest import (PARTIAL_STATUSES, BackupManifest, BackupOrigin, BackupOwner, QueueBackup, QueueStatus,
                               SegmentMetadata)
from ..format.layout import BackupLayout
from ..storage.base import Storage
from .. import metrics
from ..broker.connect import connect
from .checkpoint import Checkpoint, QueueProgress, storage_scope
from .definitions import export_definitions, store_definitions
from .guard_store import GuardStore
from .limits import resolve_delivery_limit
from ..broker.management import ManagementClient, QueueInfo
from .lease import ARCHIVE_LEASE_QUEUE, LEASE_QUEUE, Lease
from .lease import acquire as acquire_lease
from .preflight import (PROBE_QUEUE_PREFIX, NackSupport, PolicyCache, check_read_permissions,
                        probe_read_permissions)
from .queue_backup import backup_queue, clear_previous
from . import reader_process
from .pipeline import SegmentStore
from .segments import AsyncSegmentWriter
from .stream_backup import StreamBackup
from .stream_chain import StreamBase, stream_bases
from .summary import BackupSummary, QueueSummary

log = logging.getLogger(__name__)


Progress = Callable[..., None]
"""``progress(event, **kw)``: ``plan`` (queues, records or None), ``start`` (vhost, queue, total),
``advance`` (vhost, queue, n, bytes), ``done`` (vhost, queue, summary); see ``rbak.repo.progress.backup_events``."""


def _noop(event: str, **kw: Any) -> None:
    pass


def effective_delivery_limit(q: QueueInfo, version: str | None) -> int | None:
    """The limit from what the management API reported for ``q`` (None: unlimited); the engine
    itself resolves it from the policy lists too (``preflight.quorum_settings``)."""
    pol = [{"name": q.policy or "effective", "definition": q.effective_policy}] if q.effective_policy else []
    return resolve_delivery_limit(q.arguments, pol, [], version).value


class _Connections:
    """One connection per (worker thread, vhost), reused across queues; all closed at the end."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._local = threading.local()
        self._all: list = []
        self._lock = threading.Lock()

    def get(self, vhost: str):
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        c = conns.get(vhost)
        if c is not None and c.is_open:
            return c
        assert self.cfg.source is not None  # a backup configuration (BackupEngine checked it)
        c = connect(self.cfg.source, vhost)
        conns[vhost] = c
        with self._lock:
            self._all.append(c)
            metrics.active_connections().set(sum(1 for x in self._all if x.is_open))
        return c

    def drop(self, vhost: str) -> None:
        conns = getattr(self._local, "conns", {}) or {}
        c = conns.pop(vhost, None)
        if c is not None:
            try:
                if c.is_open:
                    c.close()
            except Exception:  # noqa: BLE001
                pass

    @property
    def opened(self) -> int:
        return len(self._all)

    def close_all(self) -> None:
        with self._lock:
            for c in self._all:
                try:
                    if c.is_open:
                        c.close()
                except Exception:  # noqa: BLE001
                    pass
            metrics.active_connections().set(0)


def _describe_encryption(info) -> str:
    if info is None:
        return "no encryption"
    return "envelope encryption" if info.envelope else f"key id {info.key_id!r}"


class BackupEngine(StreamBackup):
    def __init__(self, cfg: Config, storage: Storage | None = None, progress: Progress | None = None,
                 throttle: Callable[[int], None] | None = None):
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
        self.progress = progress or _noop
        self.throttle = throttle  # test hook: called after each message read
        self.compression = Compression.parse(cfg.backup.compression)
        self.level = cfg.backup.compression_level
        self.connections_opened = 0
        self._bases: dict[tuple[str, str], StreamBase] = {}
        self._fresh = False  # no usable manifest of this id in this storage: local progress is stale
        self.skipped: list[tuple[str, str, str]] = []  # (vhost, queue, reason), noted in the manifest
        self.codec = writer_codec(cfg.backup_id, cfg.encryption)
        self.write_once = self.storage.write_once  # S3 Object Lock: no object is ever put twice
        self._readers: reader_process.ReaderProcesses | None = None
        self._child_connections = 0
        self._readers_failed = False
        self.lease: Lease | None = None
        self.reader_cpu_secs = 0.0  # CPU seconds of the reader processes (not in this process's own times)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------
    def run(self) -> BackupSummary:
        cfg, layout, storage = self.cfg, self.layout, self.storage
        t0 = time.monotonic()
        client = ManagementClient.for_connection(self.source, "source")
        lease: Lease | None = None
        try:
            # nothing is written (or deleted) before the source has answered on every port with these
            # credentials, every vhost exists, and this run holds the lease on every vhost it reads
            ov, queues, lease = self._preflight(client)
            self.lease = lease
            cluster = ov.get("cluster_name") or ov.get("node") or self.source.host
            origin = self.origin(cluster)
            created_at = self._check_existing(origin)
            if self.codec.wraps:  # envelope: the wrapped data key is stored before anything it seals
                from ..sealing.envelope import write_wraps

                write_wraps(storage, layout, self.codec.wraps)
                self.codec.wraps = []
            log.info("backup %s of %s to %s", self.backup_id, self.source.safe_amqp_url, storage.url)
            version = ov.get("rabbitmq_version")
            summary = BackupSummary(self.backup_id, storage.url, layout.manifest, rabbitmq_version=version,
                                    source_cluster=cluster, vhosts=sorted({q.vhost for q in queues} | set(self.source.queues.vhosts)),
                                    vhost_scope=list(origin.vhosts) if origin.vhosts is not None else None)
            manifest = BackupManifest(backup_id=self.backup_id, created_at=created_at, source_cluster=cluster,
                                      rabbitmq_version=version, backup_tool_version=__version__,
                                      encryption=self.codec.info, definitions_only=cfg.backup.definitions_only,
                                      origin=origin)
            if not self.write_once:
                storage.put(layout.manifest, manifest.to_json())  # marks the id as in progress (completed_at null)

            ckpt = Checkpoint(cfg.offset_storage.path, self.backup_id, storage_scope(storage, cfg.storage.prefix))
            self.client, self.policies, self.nack = client, PolicyCache(client), NackSupport(version)
            self.guards = GuardStore(storage, cfg.storage.prefix or "", cluster)
            try:
                if self._fresh:
                    ckpt.reset_all()
                self._seed_checkpoint(ckpt, cluster)
                streams = {(q.vhost, q.name) for q in queues if q.queue_type == "stream"}
                if streams and cfg.backup.stream_incremental:
                    self._bases = stream_bases(storage, cfg.storage.prefix or "", cluster, self.backup_id, streams)
                if cfg.backup.include_definitions:
                    manifest.definitions = store_definitions(export_definitions(client, self.source.queues), storage, layout,
                                                             self.compression, self.level, self.codec)
                    summary.definitions = manifest.definitions
                results = self._run_pool(queues, ckpt, cluster, version, summary)
                manifest.queues = sorted(results, key=lambda qb: (qb.vhost, qb.name))
                manifest.recompute_totals()
                manifest.queue_status = [
                    QueueStatus(q.vhost, q.name, q.status, q.error or "", q.expected if q.status == "partial" else None,
                                q.messages if q.status == "partial" else None)
                    for q in summary.queues if q.status in PARTIAL_STATUSES]
                manifest.queue_status += [QueueStatus(vhost, name, "skipped", reason)
                                          for vhost, name, reason in self.skipped]
                manifest.queue_status.sort(key=lambda x: (x.vhost, x.name))
                if not self.write_once or not summary.failed:
                    self._sync(ckpt)  # write-once: the state object once, only for a complete backup
                self._confirm_segments(manifest)  # never a manifest naming what is not in this storage
                manifest.completed_at = int(time.time() * 1000)
                storage.put(layout.manifest, manifest.to_json())  # LAST: the backup is complete (or partial) now
                ckpt.commit_stream_offsets(cluster)
                summary.completed = True
                if manifest.content == "empty":
                    log.warning("backup %s holds no message (its selection found none): listed as empty; a restore "
                                "without a backup id and prune's keep rules pass over it", self.backup_id)
                failed = summary.failed
                if failed:
                    summary.partial = True
                    summary.duration_secs = time.monotonic() - t0
                    lines = "\n  - ".join(f"{q.vhost}/{q.name} ({q.status}): {q.error}" for q in failed)
                    err = PartialBackupError(
                        f"{len(failed)} of {len(summary.queues)} queue(s) failed, were refused or read short; backup "
                        f"{self.backup_id!r} is PARTIAL (recorded in its manifest; rerun the same backup_id to retry "
                        f"them):\n  - {lines}")
                    err.summary = summary
                    raise err
            finally:
                ckpt.close()
        finally:
            if lease is not None:
                lease.release()  # after the manifest: a next backup of this source may start now
            client.close()
        summary.duration_secs = time.monotonic() - t0
        return summary

    def _preflight(self, client: ManagementClient) -> tuple[dict[str, Any], list[QueueInfo], Lease | None]:
        """Checks that touch nothing: the management API (URL, credentials), that every named vhost
        exists, the queue selection, the user's read permission where the API tells it, then the lease
        (whose AMQP connections prove the port, credentials and vhost access). Errors are one line."""
        cfg, sel = self.cfg, self.source.queues
        ov = client.overview()
        known = client.vhosts()
        missing = [v for v in sel.vhosts if v not in known]
        if missing:
            raise ConfigError(f"source.queues.vhosts: vhost {', '.join(map(repr, missing))} does not exist on "
                              f"{self.source.management_url} (vhosts user {self.source.mgmt_username!r} can see: "
                              f"{', '.join(map(repr, known[:10]))}{', ...' if len(known) > 10 else ''})")
        queues = self._select_queues(client)
        vhosts = sorted({q.vhost for q in queues} | set(sel.vhosts))
        if not vhosts:  # nothing selected: still prove the AMQP side of the configuration
            url_vhost = self.source.url_vhost
            vhosts = [url_vhost] if url_vhost in known else []
        check_read_permissions(client, self.source.username, queues, self._probe_read)
        if not cfg.backup.lease:
            for v in vhosts:  # no lease: the AMQP port, credentials and vhost access are still proven
                connect(self.source, v).close()
            return ov, queues, None
        lease = acquire_lease(cfg, client, vhosts, lambda v, name: connect(self.source, v, name=name))
        if lease.waited:  # the other backup ran meanwhile: what the source holds now
            try:
                self.skipped.clear()
                queues = self._select_queues(client)
            except BaseException:
                lease.release()
                raise
        return ov, queues, lease

    def _probe_read(self, vhost: str, queues: list[QueueInfo]) -> list[str]:
        conn = connect(self.source, vhost)
        try:
            return probe_read_permissions(conn, vhost, queues)
        finally:
            conn.close()

    # ------------------------------------------------------------------
    def _keyring(self) -> dict[str, bytes]:
        """Keys for reading earlier backups; a keyring that cannot be read only costs incremental offsets."""
        try:
            return self.cfg.encryption.keyring()
        except ConfigError as e:
            log.warning("cannot read the encryption keyring: %s", e)
            return {}

    def origin(self, cluster: str) -> BackupOrigin:
        """This run's source (the cluster, its vhost scope) and owner, as its manifest records them."""
        sel, owner = self.source.queues, self.cfg.backup.owner
        return BackupOrigin(cluster, tuple(sorted(set(sel.vhosts))) if sel.vhosts else None,
                            BackupOwner(owner.namespace, owner.name, owner.uid or None) if owner else None)

    def _check_origin(self, old: BackupManifest, origin: BackupOrigin) -> None:
        """One backup holds one source's messages: a run of another cluster, vhost set or owner never
        resumes, completes or replaces it (two objects sharing a storage and an id would mix clusters)."""
        if old.origin is not None:
            if old.origin == origin:
                return
            was = old.origin.describe()
        elif old.source_cluster is None or old.source_cluster == origin.cluster:
            return  # written before origins were recorded: its cluster is all there is to compare
        else:
            was = f"cluster {old.source_cluster!r}"
        raise ConfigError(f"backup_id: the {old.state} backup {self.backup_id!r} in {self.storage.url} is of {was}; "
                          f"this run is of {origin.describe()}: choose another backup_id")

    def _check_existing(self, origin: BackupOrigin) -> int:
        layout, storage = self.layout, self.storage
        now = int(time.time() * 1000)
        if self.write_once:
            used = next(iter(storage.list(layout.root + "/")), None)
            if used is not None:
                raise ConfigError(
                    f"backup_id: {self.backup_id!r} already has objects in {storage.url} ({used}); with "
                    f"storage.object_lock_mode every object is written once, so a backup id cannot be resumed or "
                    f"reused: choose another backup_id")
            return now
        try:
            data = storage.get(layout.manifest)
        except NotFoundError:
            self._fresh = True  # whatever local progress says, nothing of this id is in THIS storage
            return now
        old = BackupManifest.from_json(data, layout.manifest)
        self._check_origin(old, origin)
        retry = old.is_partial and not self.cfg.backup.overwrite  # its failed queues are backed up again
        if not old.is_complete or retry:
            self._adopt_data_key(old)
            if old.encryption != self.codec.info:  # one backup's objects are never sealed two ways
                was, has = _describe_encryption(old.encryption), _describe_encryption(self.codec.info)
                raise ConfigError(f"encryption: the {old.state} backup {self.backup_id!r} was started with {was}, "
                                  f"this configuration has {has}; resume it with the same encryption settings or use "
                                  "another backup_id")
        if retry:
            log.warning("backup %s is partial: retrying its refused/failed queues (%s)", self.backup_id,
                        ", ".join(f"{q.vhost}/{q.name}" for q in old.queue_status if q.status != "skipped"))
            return old.created_at
        if old.is_complete:
            if not self.cfg.backup.overwrite:
                raise ConfigError(
                    f"backup_id: backup {self.backup_id!r} already exists and is complete in {storage.url} "
                    f"({layout.manifest}); choose another backup_id (backup.overwrite: true replaces it)")
            log.warning("overwriting the complete backup %s (backup.overwrite)", self.backup_id)
            storage.delete_prefix(layout.root + "/")
            self._fresh = True
            return now
        log.info("resuming the incomplete backup %s", self.backup_id)
        return old.created_at

    def _adopt_data_key(self, old: BackupManifest) -> None:
        """Resuming (or retrying) an envelope backup: seal with ITS data key, unwrapped with this config's
        keys, and store no new wraps; one backup never mixes two data keys."""
        if not (old.encryption and old.encryption.envelope and self.codec.info and self.codec.info.envelope):
            return
        from ..sealing.crypto import ObjectCodec
        from ..sealing.envelope import data_key

        dek, _ = data_key(self.storage, self.layout, old.encryption, self.cfg.encryption.key_sources())
        self.codec = ObjectCodec(self.backup_id, old.encryption, dek)

    def _seed_checkpoint(self, ckpt: Checkpoint, cluster: str) -> None:
        """Another machine's progress for this id, and the newest complete backup's stream offsets/guards."""
        if not ckpt.has_backup():
            ckpt.seed_from_storage(self.storage, self.layout.offsets_db, own_backup=True, cross=True, codec=self.codec)
        try:
            from ..repo.catalog import latest_complete

            entry = latest_complete(self.storage, self.cfg.storage.prefix or "")
        except RbakError as e:
            log.warning("cannot list earlier backups for incremental stream offsets: %s", e)
            return
        if entry is None or entry.backup_id == self.backup_id:
            return
        previous = entry.manifest
        assert previous is not None  # latest_complete: a complete backup, so with its manifest
        if previous.source_cluster != cluster:
            return
        prev = BackupLayout(entry.backup_id, self.cfg.storage.prefix or "")
        try:
            from ..sealing.envelope import with_data_key

            ring = with_data_key(self.storage, self.cfg.storage.prefix or "", entry.backup_id,
                                 previous.encryption, self._keyring(), self.cfg.encryption.kms(), required=False)
            codec = codec_for(entry.backup_id, previous.encryption, ring, required=False)
            if not codec.can_open:
                assert previous.encryption is not None  # an unencrypted backup's codec can always open
                log.warning("no key for the previous backup %r (key id %r): streams are read from the start",
                            entry.backup_id, previous.encryption.key_id)
                return
            data = codec.get(self.storage, prev.offsets_db)
        except NotFoundError:
            return
        ckpt.merge_from_bytes(data, own_backup=False, cross=True, completed_backup=entry.backup_id, source=cluster)

    def _select_queues(self, client: ManagementClient) -> list[QueueInfo]:
        """The queues to read; an ``include`` pattern that matches no queue is a configuration error
        (a nightly job with a typo would otherwise "succeed" with nothing, every night)."""
        sel = self.source.queues
        if self.cfg.backup.definitions_only:
            return []
        if sel.vhosts:
            infos: list[QueueInfo] = []
            for v in sel.vhosts:
                infos.extend(client.queues(v))
        else:
            infos = client.queues()
        out = []
        for q in infos:
            if q.name in (LEASE_QUEUE, ARCHIVE_LEASE_QUEUE) or q.name.startswith(PROBE_QUEUE_PREFIX):  # rbak's own
                continue
            if not sel.matches(q.vhost, q.name, q.queue_type):
                continue
            if q.queue_type == "stream" and not self.cfg.backup.stream_enabled:
                continue
            if q.queue_type not in ("classic", "quorum", "stream"):
                log.warning("skipping %s/%s: queue type %r is not supported", q.vhost, q.name, q.queue_type)
                continue
            if q.exclusive:  # only its owning connection can read it (405 RESOURCE_LOCKED)
                self._skip(q.vhost, q.name, "exclusive queue: only its owning connection can read it")
                continue
            out.append(q)
        if sel.include:
            check_include(sel, [(q.vhost, q.name) for q in infos if q.name != LEASE_QUEUE
                                and not q.name.startswith(PROBE_QUEUE_PREFIX)], bool(out),
                          self.source.management_url)
        return sorted(out, key=lambda q: (q.vhost, q.name))

    def _run_pool(self, queues: list[QueueInfo], ckpt: Checkpoint, cluster: str, version: str | None,
                  summary: BackupSummary) -> list[QueueBackup]:
        conns = _Connections(self.cfg)
        results: list[QueueBackup] = []
        if self._use_processes(queues):
            self._readers = reader_process.ReaderProcesses(
                self.cfg, reader_process.process_count(self.cfg.backup.max_concurrent_queues), reader_child_main,
                os.path.dirname(os.path.abspath(self.cfg.offset_storage.path)), self.codec)
        stop_sync = threading.Event()
        syncer = threading.Thread(target=self._sync_loop, args=(ckpt, stop_sync), daemon=True)
        syncer.start()
        # No records total: the management API's depths lag, and a stream's length is not what a run reads.
        self.progress("plan", queues=len(queues), records=None)
        try:
            with ThreadPoolExecutor(max_workers=self.cfg.backup.max_concurrent_queues,
                                    thread_name_prefix="rbak-backup") as pool:
                futs = {pool.submit(self._one_queue, q, ckpt, conns, cluster, version): q for q in queues}
                for fut in as_completed(futs):
                    q = futs[fut]
                    qs = QueueSummary(q.vhost, q.name, q.queue_type)
                    held = q.unacked if q.queue_type != "stream" and q.unacked else 0
                    try:
                        qb, resumed = fut.result()
                        qb.held_by_consumers, qs.held_by_consumers = held or None, held
                        results.append(qb)
                        qs.messages, qs.segments, qs.bytes = qb.message_count, len(qb.segments), qb.size_bytes
                        qs.status, qs.expected = "resumed" if resumed else "done", qb.expected_messages
                    except ShortRead as e:  # what was read is kept; the queue is partial, never complete
                        qb = e.backup
                        qb.held_by_consumers, qs.held_by_consumers = held or None, held
                        results.append(qb)
                        qs.messages, qs.segments, qs.bytes = qb.message_count, len(qb.segments), qb.size_bytes
                        qs.status, qs.error, qs.expected = "partial", e.reason, qb.expected_messages
                        metrics.errors().labels(error_type="partial").inc()
                    except QueueSkipped as e:
                        qs.status, qs.error = "skipped", str(e)
                        self._skip(q.vhost, q.name, str(e).split(": ", 2)[-1])
                    except (DeliveryLimitError, QueueRefused) as e:  # decided before taking anything
                        qs.status, qs.error = "refused", str(e)
                        metrics.errors().labels(error_type=metrics.error_type(e)).inc()
                        log.error("%s", e)
                    except RbakError as e:
                        qs.status, qs.error = "failed", str(e)
                        metrics.errors().labels(error_type=metrics.error_type(e)).inc()
                        log.error("%s", e)
                    except Exception as e:  # one queue's bug must not lose the others
                        qs.status, qs.error = "failed", f"{type(e).__name__}: {e}"
                        metrics.errors().labels(error_type="other").inc()
                        log.exception("queue %s/%s failed", q.vhost, q.name)
                    if qs.held_by_consumers:
                        log.warning("queue %r in vhost %r: %d message(s) held unacknowledged by consumers are not in "
                                    "the backup", q.name, q.vhost, qs.held_by_consumers)
                    summary.queues.append(qs)
                    self.progress("done", vhost=q.vhost, queue=q.name, summary=qs)
        finally:
            if self._readers is not None:
                self._readers.close()
                self.reader_cpu_secs = self._readers.cpu_secs
                self._readers = None
            stop_sync.set()
            syncer.join()
            self.connections_opened = conns.opened + self._child_connections
            conns.close_all()
        for vhost, name, reason in self.skipped:
            if not any(x.vhost == vhost and x.name == name for x in summary.queues):
                summary.queues.append(QueueSummary(vhost, name, "classic", status="skipped", error=reason))
        summary.queues.sort(key=lambda s: (s.vhost, s.name))
        return results

    def _skip(self, vhost: str, name: str, reason: str) -> None:
        log.warning("skipping queue %r in vhost %r: %s", name, vhost, reason)
        self.skipped.append((vhost, name, reason))

    def _sync_loop(self, ckpt: Checkpoint, stop: threading.Event) -> None:
        interval = self.cfg.offset_storage.sync_interval_secs
        if interval <= 0 or self.write_once:  # write-once: the local checkpoint only, stored once at the end
            return
        while not stop.wait(interval):
            try:
                self._sync(ckpt)
            except RbakError as e:
                log.warning("checkpoint sync failed: %s", e)

    def _sync(self, ckpt: Checkpoint) -> None:
        key = self.cfg.offset_storage.s3_key or self.layout.offsets_db
        ckpt.sync_to(self.storage, key, self.codec)
        metrics.checkpoint_syncs().inc()

    # ------------------------------------------------------------------
    def _one_queue(self, q: QueueInfo, ckpt: Checkpoint, conns: _Connections, cluster: str,
                   version: str | None) -> tuple[QueueBackup, bool]:
        prog = self._kept_progress(ckpt, q)
        if prog is not None and prog.completed:
            qb = QueueBackup(q.vhost, q.name, prog.queue_type,
                             expected_messages=prog.target_count if prog.queue_type != "stream" else None)
            for s in prog.segments:
                qb.add_segment(s)
            if prog.queue_type == "stream":
                qb.stream = self._stream_info(ckpt, q.vhost, q.name, prog, None)
            return qb, True
        if self._readers is not None and not self._readers_failed and reader_process.worth_a_child(q):
            try:
                return self._in_child(q, ckpt, cluster, version, prog), False
            except NoReaderProcess as e:  # decided before a child saw the queue
                if not self._readers_failed:
                    self._readers_failed = True
                    log.warning("%s: classic queues are read by threads in this process", e)
                prog = None  # cleared above
        for attempt in (1, 2):
            try:
                conn = conns.get(q.vhost)
                if q.queue_type == "stream":
                    return self._stream(q, ckpt, conn, cluster, prog), prog is not None
                return backup_queue(self, q, ckpt, conn, cluster, version, prog), False
            except ConnectionLost as e:
                # an idle pooled connection the broker dropped (heartbeat): one fresh try
                conns.drop(q.vhost)
                if attempt == 2:
                    raise AmqpError(f"queue {q.name!r} in vhost {q.vhost!r}: connection lost: {e}") from None
                prog = ckpt.load(q.vhost, q.name)
            except AmqpError:
                conns.drop(q.vhost)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _use_processes(self, queues: list[QueueInfo]) -> bool:
        """Classic queues go to reader processes when several are read at once and a child can
        open the same storage itself (not a storage object handed in, e.g. memory or a test's)."""
        b = self.cfg.backup
        if not b.reader_processes or b.max_concurrent_queues < 2 or self.throttle is not None:
            return False
        if sum(1 for q in queues if reader_process.worth_a_child(q)) < 2 or not reader_process.available():
            return False
        return self._storage_reopenable()

    def _storage_reopenable(self) -> bool:
        from pathlib import Path

        from ..storage.fs import FilesystemStorage

        st, sc = self.storage, self.cfg.storage
        if sc.backend == "filesystem" and type(st) is FilesystemStorage:
            return st.root == Path(os.path.expanduser(sc.path or ".")).resolve()
        if sc.backend == "s3" and type(st).__name__ == "S3Storage" and type(st).__module__ == "rbak.storage.s3":
            return getattr(st, "bucket", None) == sc.bucket
        return False

    def _in_child(self, q: QueueInfo, ckpt: Checkpoint, cluster: str, version: str | None,
                  prog: QueueProgress | None) -> QueueBackup:
        """One classic queue read by a reader process; its checkpoint rows, metrics and progress land here."""
        assert self._readers is not None
        clear_previous(self, ckpt, q.vhost, q.name, prog)
        labels = dict(vhost=q.vhost, queue=q.name, queue_type=q.queue_type)

        def on_event(event: str, kw: dict[str, Any]) -> None:
            if event == "advance":
                metrics.messages_read().labels(**labels).inc(kw.get("n", 0))
                metrics.bytes_read().labels(**labels).inc(kw.get("bytes", 0))
            self.progress(event, **kw)

        started = time.monotonic()
        res = self._readers.read(q, cluster, version, on_event)
        with self._lock:
            self._child_connections += res.connections
        for vhost, name in res.resets:
            ckpt.reset(vhost, name)
        for p in res.saved:  # after its segments are durable, as in the thread
            ckpt.save(p)
        segs = res.backup.segments
        metrics.segments_written().labels(**labels).inc(len(segs))
        metrics.segment_bytes().labels(**labels).inc(sum(s.size_bytes for s in segs))
        risk = self.lease_risk(q.vhost, started, time.monotonic())  # the child measured its depth in between
        if risk:
            ckpt.reset(q.vhost, q.name)  # a rerun reads it again
            raise ShortRead(res.backup, risk)
        return res.backup

    def lease_risk(self, vhost: str, started: float, ended: float | None = None) -> str | None:
        """Why a read whose depth was measured at ``started`` (up to ``ended``) may miss messages
        another backup held: this run had lost its lease on the vhost then (``Lease.at_risk``)."""
        lease = self.lease
        return lease.at_risk(vhost, started, ended) if lease is not None else None

    def _kept_progress(self, ckpt: Checkpoint, q: QueueInfo) -> QueueProgress | None:
        """This storage's progress for a queue, if every segment it keeps is still here (else read it again)."""
        prog = ckpt.load(q.vhost, q.name)
        if prog is None:
            return None
        for seg in prog.segments:
            size = self.storage.size(seg.key)
            if size != seg.size_bytes:
                log.warning("queue %r in vhost %r: kept segment %s is %s in %s; reading the queue again", q.name,
                            q.vhost, seg.key, "missing" if size is None else f"{size} bytes, not {seg.size_bytes}",
                            self.storage.url)
                ckpt.reset(q.vhost, q.name)
                return None
        return prog

    def _confirm_segments(self, manifest: BackupManifest) -> None:
        """Every segment the manifest names is in this storage with its size, or the run fails naming it."""
        for q in manifest.queues:
            for seg in q.segments:
                size = self.storage.size(seg.key)
                if size != seg.size_bytes:
                    state = "missing" if size is None else f"{size} bytes, the manifest would say {seg.size_bytes}"
                    raise BackupError(f"queue {q.name!r} in vhost {q.vhost!r}: segment {seg.key} is {state} in "
                                      f"{self.storage.url}; the manifest was not written (rerun to read the queue again)")

    def segment_writer(self, vhost: str, queue: str, queue_type: str, first_sequence: int,
                       on_durable: Callable[[SegmentMetadata, Any], None] | None = None) -> AsyncSegmentWriter:
        store = SegmentStore(self.storage, self.layout, self.codec, self.compression, vhost, queue, queue_type)
        b = self.cfg.backup
        return AsyncSegmentWriter(store, self.compression, self.level, b.segment_max_bytes, b.segment_max_interval_ms,
                                  first_sequence, on_durable)

    def deadline(self) -> float | None:
        d = self.cfg.backup.max_duration_secs
        return time.monotonic() + d if d else None


def reader_child_main(pipe: Any, cfg: Config, level: int, env: dict[str, str], codec: Any) -> None:
    """A reader process's main function (``reader_process.ReaderProcesses`` starts it): an engine of
    its own reads each queue the parent lends it, with the same per-queue code as a worker thread."""
    send = reader_process.child_setup(pipe, level, env)
    eng = BackupEngine(cfg, progress=lambda event, **kw: send(("event", event, kw)))
    if codec is not None:
        eng.codec = codec
    # A queue's read may ask the management API (a single-active-consumer queue whose arguments
    # the listing lacked); the parent's client stays in the parent.
    eng.client = ManagementClient.for_connection(cfg.source, "source")
    conns = _Connections(cfg)

    def read(q: QueueInfo, cluster: str, version: str | None, ckpt: Any) -> tuple[QueueBackup, int]:
        before = conns.opened
        qb, _resumed = eng._one_queue(q, ckpt, conns, cluster, version)
        return qb, conns.opened - before

    try:
        reader_process.serve(pipe, send, read)
    finally:
        conns.close_all()
        eng.client.close()


def check_include(sel: Any, queues: list[tuple[str, str]], selected: bool, where: str) -> None:
    """Refuse (exit 2) a ``source.queues.include`` pattern that matches no queue of the source, naming
    the closest names, and an include that selects nothing once types and excludes apply."""
    import difflib

    from ..config import queue_selected

    names = sorted({n for _, n in queues} | {f"{v}/{n}" for v, n in queues})
    scope = f" in vhost(s) {', '.join(map(repr, sel.vhosts))}" if sel.vhosts else ""
    for pat in sel.include:
        if not any(queue_selected(v, n, None, [pat], [], [], []) for v, n in queues):
            near = difflib.get_close_matches(pat, names, n=3, cutoff=0.5)
            raise ConfigError(f"source.queues.include: {pat!r} matches no queue on {where}{scope}"
                              + (f" (closest: {', '.join(map(repr, near))})" if near else "")
                              + "; nothing was written (backup.definitions_only: true backs up definitions alone)")
    for pat in sel.exclude:
        # not refused: a nightly exclude of queues that come and go (tmp.*) may match nothing some nights,
        # and matching nothing only backs up more; but a typo must not pass unseen
        if not any(queue_selected(v, n, None, [pat], [], [], []) for v, n in queues):
            near = difflib.get_close_matches(pat, names, n=3, cutoff=0.5)
            log.warning("source.queues.exclude: %r matches no queue on %s%s%s: it excludes nothing", pat, where,
                        scope, f" (closest: {', '.join(map(repr, near))})" if near else "")
    if not selected:
        raise ConfigError(f"source.queues: include {sel.include} selects no queue on {where}{scope} once "
                          f"types {sel.types} and exclude {sel.exclude} apply; nothing was written")


def run_backup(cfg: Config, storage: Storage | None = None, progress: Progress | None = None) -> BackupSummary:
    return BackupEngine(cfg, storage, progress).run()
