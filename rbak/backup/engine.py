"""The backup run: queues -> segments, definitions, checkpoint, manifest last.

Order of a run (and why):

1. Refuse to touch a backup id whose manifest is complete (unless
   ``backup.overwrite``); an incomplete one is resumed from the checkpoint.
2. Management API: cluster name and version, the queue list; definitions.
3. A bounded pool of ``max_concurrent_queues`` workers; each worker keeps one
   AMQP connection per vhost and reads one queue at a time on fresh
   channels, so 1,000 queues need ``max_concurrent_queues`` connections.
4. Per queue, an ``AsyncSegmentWriter`` (compress + store in a background thread) rotating on size/age (memory is bounded by
   ``segment_max_bytes`` per worker, never by queue depth).
5. The checkpoint is synced to ``state/offsets.db``; the manifest (with
   ``completed_at``) is written last, only when every queue succeeded.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable

import pika.exceptions

from .. import __version__
from ..config import Config
from ..crypto import codec_for, writer_codec
from ..errors import AmqpError, ConfigError, NotFoundError, RbakError
from ..format.compression import Compression
from ..format.manifest import BackupManifest, DefinitionsBackup, QueueBackup, SegmentMetadata
from ..keys import BackupLayout
from ..storage.base import Storage
from . import metrics
from .amqp import connect
from .checkpoint import Checkpoint, Guard, QueueProgress
from .convert import BROKER_HEADERS, delivery_count, encode_delivery
from .definitions import export_definitions, store_definitions
from .management import ManagementClient, QueueInfo
from .segments import AsyncSegmentWriter
from .queue_reader import DeliveryLimitError, describe_message, passive_depth, read_queue
from .stream_reader import read_stream

log = logging.getLogger(__name__)

DEFAULT_LIMIT_4X = 20  # RabbitMQ 4.0 quorum queues: delivery-limit when none is set


class BackupError(RbakError):
    """Some queues failed; the manifest stays incomplete so a rerun resumes them."""

    prefix = "Backup error"


@dataclass(slots=True)
class QueueSummary:
    vhost: str
    name: str
    queue_type: str
    messages: int = 0
    segments: int = 0
    bytes: int = 0
    status: str = "done"  # done | resumed | failed | skipped
    error: str | None = None

    def to_json_obj(self) -> dict[str, Any]:
        return {"vhost": self.vhost, "name": self.name, "queue_type": self.queue_type, "messages": self.messages,
                "segments": self.segments, "bytes": self.bytes, "status": self.status, "error": self.error}


@dataclass(slots=True)
class BackupSummary:
    backup_id: str
    storage: str
    manifest_key: str
    queues: list[QueueSummary] = field(default_factory=list)
    definitions: DefinitionsBackup | None = None
    completed: bool = False
    duration_secs: float = 0.0
    rabbitmq_version: str | None = None
    source_cluster: str | None = None

    @property
    def total_messages(self) -> int:
        return sum(q.messages for q in self.queues)

    @property
    def total_bytes(self) -> int:
        return sum(q.bytes for q in self.queues)

    @property
    def failed(self) -> list[QueueSummary]:
        return [q for q in self.queues if q.status == "failed"]

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "backup_id": self.backup_id, "storage": self.storage, "manifest": self.manifest_key,
            "completed": self.completed, "source_cluster": self.source_cluster,
            "rabbitmq_version": self.rabbitmq_version, "duration_secs": round(self.duration_secs, 3),
            "total_messages": self.total_messages, "total_bytes": self.total_bytes,
            "total_segments": sum(q.segments for q in self.queues),
            "definitions": self.definitions.to_json_obj() if self.definitions else None,
            "queues": [q.to_json_obj() for q in self.queues],
        }


Progress = Callable[..., None]
"""``progress(event, **kw)``: ``start`` (vhost, queue, total), ``advance`` (vhost, queue, n), ``done`` (summary)."""


def _noop(event: str, **kw: Any) -> None:
    pass


def effective_delivery_limit(q: QueueInfo, version: str | None) -> int | None:
    """The limit the broker applies to a quorum queue (None: unlimited)."""
    values = []
    for v in (q.arguments.get("x-delivery-limit"), q.effective_policy.get("delivery-limit")):
        if isinstance(v, int) and not isinstance(v, bool):
            values.append(v)
    major = _major(version)
    if not values:
        return DEFAULT_LIMIT_4X if major >= 4 else None
    limit = min(values)
    if limit < 0:
        return None  # 4.x: a negative limit disables it
    return limit


def _major(version: str | None) -> int:
    try:
        return int((version or "0").split(".")[0])
    except ValueError:
        return 0


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


class BackupEngine:
    def __init__(self, cfg: Config, storage: Storage | None = None, progress: Progress | None = None,
                 throttle: Callable[[int], None] | None = None):
        if cfg.mode != "backup":
            raise ConfigError(f"mode: this is a {cfg.mode!r} configuration; rbak backup needs mode: backup")
        if cfg.source is None:
            raise ConfigError("source: required for a backup")
        self.cfg = cfg
        self.layout: BackupLayout = cfg.layout()
        self.storage = storage or cfg.storage.open()
        self.progress = progress or _noop
        self.throttle = throttle  # test hook: called after each message read
        self.compression = Compression.parse(cfg.backup.compression)
        self.level = cfg.backup.compression_level
        self.connections_opened = 0
        self.codec = writer_codec(cfg.backup_id, cfg.encryption)
        self.write_once = self.storage.write_once  # S3 Object Lock: no object is ever put twice

    # ------------------------------------------------------------------
    def run(self) -> BackupSummary:
        cfg, layout, storage = self.cfg, self.layout, self.storage
        t0 = time.monotonic()
        created_at = self._check_existing()
        client = ManagementClient(cfg.source)
        try:
            ov = client.overview()
            cluster = ov.get("cluster_name") or ov.get("node") or cfg.source.host
            version = ov.get("rabbitmq_version")
            summary = BackupSummary(cfg.backup_id, storage.url, layout.manifest, rabbitmq_version=version,
                                    source_cluster=cluster)
            manifest = BackupManifest(backup_id=cfg.backup_id, created_at=created_at, source_cluster=cluster,
                                      rabbitmq_version=version, backup_tool_version=__version__,
                                      encryption=self.codec.info)
            if not self.write_once:
                storage.put(layout.manifest, manifest.to_json())  # marks the id as in progress (completed_at null)

            ckpt = Checkpoint(cfg.offset_storage.path, cfg.backup_id)
            try:
                self._seed_checkpoint(ckpt, cluster)
                queues = self._select_queues(client)
                if cfg.backup.include_definitions:
                    manifest.definitions = store_definitions(export_definitions(client), storage, layout,
                                                             self.compression, self.level, self.codec)
                    summary.definitions = manifest.definitions
                results = self._run_pool(queues, ckpt, cluster, version, summary)
                manifest.queues = sorted(results, key=lambda qb: (qb.vhost, qb.name))
                manifest.recompute_totals()
                failed = summary.failed
                if not self.write_once or not failed:
                    self._sync(ckpt)  # write-once: the state object once, only for a complete backup
                if failed:
                    summary.duration_secs = time.monotonic() - t0
                    if not self.write_once:
                        storage.put(layout.manifest, manifest.to_json())  # still incomplete: a rerun resumes
                    lines = "\n  - ".join(f"{q.vhost}/{q.name}: {q.error}" for q in failed)
                    err = BackupError(f"{len(failed)} of {len(summary.queues)} queue(s) failed; backup "
                                      f"{cfg.backup_id!r} is incomplete (rerun to resume):\n  - {lines}")
                    err.summary = summary  # type: ignore[attr-defined]
                    raise err
                manifest.completed_at = int(time.time() * 1000)
                storage.put(layout.manifest, manifest.to_json())  # LAST: the backup is complete now
                ckpt.commit_stream_offsets(cluster)
                summary.completed = True
            finally:
                ckpt.close()
        finally:
            client.close()
        summary.duration_secs = time.monotonic() - t0
        return summary

    # ------------------------------------------------------------------
    def _keyring(self) -> dict[str, bytes]:
        """Keys for reading earlier backups; a keyring that cannot be read only costs incremental offsets."""
        try:
            return self.cfg.encryption.keyring()
        except ConfigError as e:
            log.warning("cannot read the encryption keyring: %s", e)
            return {}

    def _check_existing(self) -> int:
        layout, storage = self.layout, self.storage
        now = int(time.time() * 1000)
        if self.write_once:
            used = next(iter(storage.list(layout.root + "/")), None)
            if used is not None:
                raise ConfigError(
                    f"backup_id: {self.cfg.backup_id!r} already has objects in {storage.url} ({used}); with "
                    f"storage.object_lock_mode every object is written once, so a backup id cannot be resumed or "
                    f"reused: choose another backup_id")
            return now
        try:
            data = storage.get(layout.manifest)
        except NotFoundError:
            return now
        old = BackupManifest.from_json(data, layout.manifest)
        if not old.is_complete and old.encryption != self.codec.info:
            was = f"key id {old.encryption.key_id!r}" if old.encryption else "no encryption"
            now = f"key id {self.codec.info.key_id!r}" if self.codec.info else "no encryption"
            raise ConfigError(f"encryption: the incomplete backup {self.cfg.backup_id!r} was started with {was}, this "
                              f"configuration has {now}; resume it with the same encryption settings or use another "
                              "backup_id")
        if old.is_complete:
            if not self.cfg.backup.overwrite:
                raise ConfigError(
                    f"backup_id: backup {self.cfg.backup_id!r} already exists and is complete in {storage.url} "
                    f"({layout.manifest}); choose another backup_id (backup.overwrite: true replaces it)")
            log.warning("overwriting the complete backup %s (backup.overwrite)", self.cfg.backup_id)
            storage.delete_prefix(layout.root + "/")
            return now
        log.info("resuming the incomplete backup %s", self.cfg.backup_id)
        return old.created_at

    def _seed_checkpoint(self, ckpt: Checkpoint, cluster: str) -> None:
        """Another machine's progress for this id, and the newest complete backup's stream offsets/guards."""
        if not ckpt.has_backup():
            ckpt.seed_from_storage(self.storage, self.layout.offsets_db, own_backup=True, cross=True, codec=self.codec)
        try:
            from ..catalog import latest_complete

            entry = latest_complete(self.storage, self.cfg.storage.prefix or "")
        except RbakError as e:
            log.warning("cannot list earlier backups for incremental stream offsets: %s", e)
            return
        if entry is None or entry.backup_id == self.cfg.backup_id or entry.manifest.source_cluster != cluster:
            return
        prev = BackupLayout(entry.backup_id, self.cfg.storage.prefix or "")
        try:
            codec = codec_for(entry.backup_id, entry.manifest.encryption, self._keyring(), required=False)
            if not codec.can_open:
                log.warning("no key for the previous backup %r (key id %r): streams are read from the start",
                            entry.backup_id, entry.manifest.encryption.key_id)
                return
            data = codec.get(self.storage, prev.offsets_db)
        except NotFoundError:
            return
        ckpt.merge_from_bytes(data, own_backup=False, cross=True, completed_backup=entry.backup_id, source=cluster)

    def _select_queues(self, client: ManagementClient) -> list[QueueInfo]:
        sel = self.cfg.source.queues
        if sel.vhosts:
            infos: list[QueueInfo] = []
            for v in sel.vhosts:
                infos.extend(client.queues(v))
        else:
            infos = client.queues()
        out = []
        for q in infos:
            if not sel.matches(q.vhost, q.name, q.queue_type):
                continue
            if q.queue_type == "stream" and not self.cfg.backup.stream_enabled:
                continue
            if q.queue_type not in ("classic", "quorum", "stream"):
                log.warning("skipping %s/%s: queue type %r is not supported", q.vhost, q.name, q.queue_type)
                continue
            if q.queue_type != "stream" and sel.min_messages and q.messages is not None and q.messages < sel.min_messages:
                continue
            out.append(q)
        return sorted(out, key=lambda q: (q.vhost, q.name))

    def _run_pool(self, queues: list[QueueInfo], ckpt: Checkpoint, cluster: str, version: str | None,
                  summary: BackupSummary) -> list[QueueBackup]:
        conns = _Connections(self.cfg)
        results: list[QueueBackup] = []
        stop_sync = threading.Event()
        syncer = threading.Thread(target=self._sync_loop, args=(ckpt, stop_sync), daemon=True)
        syncer.start()
        try:
            with ThreadPoolExecutor(max_workers=self.cfg.backup.max_concurrent_queues,
                                    thread_name_prefix="rbak-backup") as pool:
                futs = {pool.submit(self._one_queue, q, ckpt, conns, cluster, version): q for q in queues}
                for fut in as_completed(futs):
                    q = futs[fut]
                    qs = QueueSummary(q.vhost, q.name, q.queue_type)
                    try:
                        qb, resumed = fut.result()
                        results.append(qb)
                        qs.messages, qs.segments, qs.bytes = qb.message_count, len(qb.segments), qb.size_bytes
                        qs.status = "resumed" if resumed else "done"
                    except RbakError as e:
                        qs.status, qs.error = "failed", str(e)
                        metrics.errors().labels(error_type=metrics.error_type(e)).inc()
                        log.error("%s", e)
                    except Exception as e:  # noqa: BLE001 - one queue's bug must not lose the others
                        qs.status, qs.error = "failed", f"{type(e).__name__}: {e}"
                        metrics.errors().labels(error_type="other").inc()
                        log.exception("queue %s/%s failed", q.vhost, q.name)
                    summary.queues.append(qs)
                    self.progress("done", vhost=q.vhost, queue=q.name, summary=qs)
        finally:
            stop_sync.set()
            syncer.join()
            self.connections_opened = conns.opened
            conns.close_all()
        summary.queues.sort(key=lambda s: (s.vhost, s.name))
        return results

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
        prog = ckpt.load(q.vhost, q.name)
        if prog is not None and prog.completed:
            qb = QueueBackup(q.vhost, q.name, prog.queue_type)
            for s in prog.segments:
                qb.add_segment(s)
            return qb, True
        for attempt in (1, 2):
            try:
                conn = conns.get(q.vhost)
                if q.queue_type == "stream":
                    return self._stream(q, ckpt, conn, cluster, prog), prog is not None
                return self._queue(q, ckpt, conn, cluster, version, prog), False
            except (pika.exceptions.ConnectionClosed, pika.exceptions.StreamLostError) as e:
                # an idle pooled connection the broker dropped (heartbeat): one fresh try
                conns.drop(q.vhost)
                if attempt == 2:
                    raise AmqpError(f"queue {q.name!r} in vhost {q.vhost!r}: connection lost: {e!r}") from None
                prog = ckpt.load(q.vhost, q.name)
            except AmqpError:
                conns.drop(q.vhost)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _writer(self, vhost: str, queue: str, queue_type: str, first_sequence: int,
                on_durable: Callable[[SegmentMetadata, Any], None] | None = None) -> AsyncSegmentWriter:
        layout, storage, comp = self.layout, self.storage, self.compression
        labels = metrics.segments_written().labels(vhost=vhost, queue=queue, queue_type=queue_type)
        seg_bytes = metrics.segment_bytes().labels(vhost=vhost, queue=queue, queue_type=queue_type)

        codec = self.codec

        def sink(seq: int, data: bytes) -> str | tuple[str, bytes]:
            key = layout.segment(vhost, queue, seq, comp)
            stored = codec.put(storage, key, data)
            labels.inc()
            seg_bytes.inc(len(stored))
            return (key, stored) if codec.encrypted else key

        b = self.cfg.backup
        return AsyncSegmentWriter(sink, comp, self.level, b.segment_max_bytes, b.segment_max_interval_ms,
                                  first_sequence, on_durable)

    def _deadline(self) -> float | None:
        d = self.cfg.backup.max_duration_secs
        return time.monotonic() + d if d else None

    def _queue(self, q: QueueInfo, ckpt: Checkpoint, conn, cluster: str, version: str | None,
               prog: QueueProgress | None) -> QueueBackup:
        """Classic / quorum: all or nothing per run (an interrupted read is redone from the head)."""
        vhost, name, qtype = q.vhost, q.name, q.queue_type
        if prog is not None or self.storage.exists(self.layout.segment(vhost, name, 1, self.compression)):
            self.storage.delete_prefix(self.layout.queue_dir(vhost, name) + "/")
            ckpt.reset(vhost, name)
        limit = effective_delivery_limit(q, version) if qtype == "quorum" else None
        depth = passive_depth(conn, vhost, name)
        if qtype == "quorum" and depth == 0:
            ckpt.set_guard(cluster, vhost, name, Guard(0, limit, ""))  # seen empty: no count of ours remains
        elif limit is not None:
            self._check_guard(q, ckpt, cluster, limit)
        self.progress("start", vhost=vhost, queue=name, total=depth)
        read_c = metrics.messages_read().labels(vhost=vhost, queue=name, queue_type=qtype)
        bytes_c = metrics.bytes_read().labels(vhost=vhost, queue=name, queue_type=qtype)
        writer = self._writer(vhost, name, qtype, 1)
        progress = self.progress
        state = {"n": 0, "b": 0}

        state.update(max=0, nearest="")
        quorum = qtype == "quorum"

        def sink(method, props, body) -> None:
            if quorum:
                c = delivery_count(props)
                if c > state["max"] or not state["nearest"]:
                    state["max"], state["nearest"] = c, describe_message(state["n"] + 1, props)
            now = int(time.time() * 1000)
            writer.append_encoded(encode_delivery(method, props, body, vhost, name, now), now)
            state["b"] += len(body)
            state["n"] += 1
            if state["n"] % 500 == 0:  # metrics and progress in steps: a lock per message costs throughput
                read_c.inc(500)
                bytes_c.inc(state["b"])
                state["b"] = 0
                progress("advance", vhost=vhost, queue=name, n=500)

        try:
            read_queue(conn, vhost, name, qtype, depth, sink, delivery_limit=limit,
                       read_timeout=self.cfg.backup.read_timeout_secs, deadline=self._deadline(),
                       throttle=self.throttle)
        except BaseException:
            writer.abort()
            raise
        finally:
            if quorum and state["n"]:
                # every message taken went back with one more delivery on its count
                ckpt.set_guard(cluster, vhost, name, Guard(state["max"] + 1, limit, state["nearest"]))
        segments = writer.close()
        read_c.inc(state["n"] % 500)
        bytes_c.inc(state["b"])
        progress("advance", vhost=vhost, queue=name, n=state["n"] % 500)
        qb = QueueBackup(vhost, name, qtype)
        for s in segments:
            qb.add_segment(s)
        ckpt.save(QueueProgress(vhost, name, qtype, depth, qb.message_count, writer.next_sequence, segments, True))
        return qb

    def _check_guard(self, q: QueueInfo, ckpt: Checkpoint, cluster: str, limit: int) -> None:
        g = ckpt.guard(cluster, q.vhost, q.name)
        margin = self.cfg.backup.delivery_limit_margin
        if g is not None and g.max_count + margin > limit:
            raise DeliveryLimitError(
                f"queue {q.name!r} in vhost {q.vhost!r}: refused before reading: its delivery limit is {limit} and "
                f"an earlier backup left {g.message or 'a message'} at x-delivery-count {g.max_count}; one more "
                f"backup (every read returns each message once, which counts as a delivery on quorum queues) "
                f"could push it past the limit and drop or dead-letter it. Consume or move those messages, or "
                f"raise the limit (policy delivery-limit / x-delivery-limit); rbak forgets this once it sees the "
                f"queue empty")

    def _stream(self, q: QueueInfo, ckpt: Checkpoint, conn, cluster: str, prog: QueueProgress | None) -> QueueBackup:
        """Streams: resumable per segment; the next backup starts after the last offset stored."""
        vhost, name = q.vhost, q.name
        layout, storage = self.layout, self.storage
        if prog is not None:
            keep = {s.key for s in prog.segments}
            for key in list(storage.list(layout.queue_dir(vhost, name) + "/")):
                if key not in keep:  # written after the last checkpoint: will be read again
                    storage.delete(key)
            start: int | str = prog.stream_last_offset + 1 if prog.stream_last_offset is not None else (
                self._stream_start(ckpt, cluster, vhost, name))
        else:
            for key in list(storage.list(layout.queue_dir(vhost, name) + "/")):
                storage.delete(key)
            prog = QueueProgress(vhost, name, "stream")
            start = self._stream_start(ckpt, cluster, vhost, name)
        self.progress("start", vhost=vhost, queue=name, total=None)
        read_c = metrics.messages_read().labels(vhost=vhost, queue=name, queue_type="stream")
        bytes_c = metrics.bytes_read().labels(vhost=vhost, queue=name, queue_type="stream")
        progress = self.progress
        state = {"n": 0, "b": 0}

        def durable(meta: SegmentMetadata, last_offset: int) -> None:
            """Runs in the segment thread once the segment is stored: checkpoint it."""
            prog.segments.append(meta)
            prog.records += meta.record_count
            prog.next_sequence = meta.sequence + 1
            prog.stream_last_offset = last_offset
            ckpt.save(prog)

        writer = self._writer(vhost, name, "stream", prog.next_sequence, durable)

        def sink(method, props, body, offset: int) -> None:
            now = int(time.time() * 1000)
            writer.append_encoded(encode_delivery(method, props, body, vhost, name, now, BROKER_HEADERS), now, offset)
            state["b"] += len(body)
            state["n"] += 1
            if self.throttle is not None:
                self.throttle(state["n"])
            if state["n"] % 500 == 0:
                read_c.inc(500)
                bytes_c.inc(state["b"])
                state["b"] = 0
                progress("advance", vhost=vhost, queue=name, n=500)

        try:
            read_stream(conn, vhost, name, start, sink, prefetch=self.cfg.backup.prefetch_count,
                        deadline=self._deadline())
        except BaseException:
            writer.abort()
            raise
        writer.close()
        read_c.inc(state["n"] % 500)
        bytes_c.inc(state["b"])
        progress("advance", vhost=vhost, queue=name, n=state["n"] % 500)
        prog.completed = True
        if prog.stream_last_offset is None and isinstance(start, int):
            prog.stream_last_offset = start - 1  # nothing new: keep the previous position
        ckpt.save(prog)
        qb = QueueBackup(vhost, name, "stream")
        for s in prog.segments:
            qb.add_segment(s)
        return qb

    def _stream_start(self, ckpt: Checkpoint, cluster: str, vhost: str, name: str) -> int | str:
        if self.cfg.backup.stream_incremental:
            last = ckpt.stream_offset(cluster, vhost, name)
            if last is not None:
                return last + 1
        return "first"


def run_backup(cfg: Config, storage: Storage | None = None, progress: Progress | None = None) -> BackupSummary:
    return BackupEngine(cfg, storage, progress).run()
