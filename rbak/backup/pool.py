"""The run's pool: ``max_concurrent_queues`` worker threads, each backing up one queue at a time.

A worker keeps one AMQP connection per vhost (``Connections``) and reads one queue at a time on
fresh channels, so 1,000 queues need ``max_concurrent_queues`` connections. Classic queues of
1,000+ messages go to reader processes instead (``reader_process``: the reads use every core);
this process keeps the checkpoint, progress and everything below. Each queue's outcome (done,
resumed, partial, skipped, refused, failed) lands in the run's summary; one queue's failure never
loses the others.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import metrics
from ..broker.connect import connect
from ..broker.wire import Connection
from ..config import Config
from ..errors import (AmqpError, ConnectionLost, DeliveryLimitError, NoReaderProcess, QueueRefused, QueueSkipped,
                      RbakError, ShortRead)
from ..format.manifest import QueueBackup
from ..storage.fs import FilesystemStorage
from . import reader_process
from .checkpoint import Checkpoint, QueueProgress
from .management import QueueInfo
from .queue_backup import QueueJob, clear_previous
from .stream_backup import StreamJob, stream_info
from .summary import BackupSummary, QueueSummary

if TYPE_CHECKING:
    from .services import QueueServices, RunServices

log = logging.getLogger("rbak.backup.engine")  # the run's log lines keep the engine's name (log filters, docs)


class Connections:
    """One connection per (worker thread, vhost), reused across queues; all closed at the end."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._local = threading.local()
        self._all: list[Connection] = []
        self._lock = threading.Lock()

    def get(self, vhost: str) -> Connection:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        c = conns.get(vhost)
        if c is not None and c.is_open:
            return c
        assert self.cfg.source is not None  # a backup configuration (RunServices checked it)
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


def back_up_queue(svc: QueueServices, q: QueueInfo, ckpt: Checkpoint, conns: Connections, cluster: str,
                  version: str | None, prog: QueueProgress | None = None) -> tuple[QueueBackup, bool]:
    """Back ``q`` up on a connection of ``conns``: (its backup, whether it resumed an earlier read).

    The one per-queue entry point of a worker thread and of a reader process. A pooled connection
    the broker dropped while idle (heartbeat) costs one fresh try."""
    for attempt in (1, 2):
        job = (StreamJob if q.queue_type == "stream" else QueueJob)(svc, q, ckpt, cluster, version, prog)
        try:
            return job.run(conns.get(q.vhost)), job.resumed
        except ConnectionLost as e:
            conns.drop(q.vhost)
            if attempt == 2:
                raise AmqpError(f"queue {q.name!r} in vhost {q.vhost!r}: connection lost: {e}") from None
            prog = ckpt.load(q.vhost, q.name)
        except AmqpError:
            conns.drop(q.vhost)
            raise
    raise AssertionError("unreachable")  # pragma: no cover


class QueuePool:
    """One run's workers over its selected queues (``run``), with the reader processes they lend
    classic queues to, and the checkpoint's periodic sync meanwhile."""

    def __init__(self, eng: RunServices, ckpt: Checkpoint, cluster: str, version: str | None,
                 child_main: reader_process.ChildMain):
        self.eng, self.ckpt, self.cluster, self.version, self.child_main = eng, ckpt, cluster, version, child_main
        self.conns = Connections(eng.cfg)
        self.readers: reader_process.ReaderProcesses | None = None
        self.readers_failed = False
        self.child_connections = 0
        self._lock = threading.Lock()

    def run(self, queues: list[QueueInfo], summary: BackupSummary) -> list[QueueBackup]:
        eng, cfg = self.eng, self.eng.cfg
        results: list[QueueBackup] = []
        if self._use_processes(queues):
            self.readers = reader_process.ReaderProcesses(
                cfg, reader_process.process_count(cfg.backup.max_concurrent_queues), self.child_main,
                os.path.dirname(os.path.abspath(cfg.offset_storage.path)), eng.codec)
        stop_sync = threading.Event()
        syncer = threading.Thread(target=self._sync_loop, args=(stop_sync,), daemon=True)
        syncer.start()
        # No records total: the management API's depths lag, and a stream's length is not what a run reads.
        eng.progress("plan", queues=len(queues), records=None)
        try:
            with ThreadPoolExecutor(max_workers=cfg.backup.max_concurrent_queues,
                                    thread_name_prefix="rbak-backup") as pool:
                futs = {pool.submit(self.one_queue, q): q for q in queues}
                for fut in as_completed(futs):
                    q = futs[fut]
                    qs = self._outcome(fut, q, results)
                    summary.queues.append(qs)
                    eng.progress("done", vhost=q.vhost, queue=q.name, summary=qs)
        finally:
            if self.readers is not None:
                self.readers.close()
                eng.reader_cpu_secs = self.readers.cpu_secs
                self.readers = None
            stop_sync.set()
            syncer.join()
            eng.connections_opened = self.conns.opened + self.child_connections
            eng.child_connections, eng.readers_failed = self.child_connections, self.readers_failed
            self.conns.close_all()
        for vhost, name, reason in eng.skipped:
            if not any(x.vhost == vhost and x.name == name for x in summary.queues):
                summary.queues.append(QueueSummary(vhost, name, "classic", status="skipped", error=reason))
        summary.queues.sort(key=lambda s: (s.vhost, s.name))
        return results

    def _outcome(self, fut: Future[tuple[QueueBackup, bool]], q: QueueInfo,
                 results: list[QueueBackup]) -> QueueSummary:
        """One queue's summary line from its worker's result or error (its backup joins ``results``)."""
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
            self.eng.skip(q.vhost, q.name, str(e).split(": ", 2)[-1])
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
        return qs

    def _sync_loop(self, stop: threading.Event) -> None:
        interval = self.eng.cfg.offset_storage.sync_interval_secs
        if interval <= 0 or self.eng.write_once:  # write-once: the local checkpoint only, stored once at the end
            return
        while not stop.wait(interval):
            try:
                self.eng.sync(self.ckpt)
            except RbakError as e:
                log.warning("checkpoint sync failed: %s", e)

    def one_queue(self, q: QueueInfo) -> tuple[QueueBackup, bool]:
        """A worker's queue: kept from an earlier run, read by a reader process, or read here."""
        ckpt = self.ckpt
        prog = self._kept_progress(q)
        if prog is not None and prog.completed:
            qb = QueueBackup(q.vhost, q.name, prog.queue_type,
                             expected_messages=prog.target_count if prog.queue_type != "stream" else None)
            for s in prog.segments:
                qb.add_segment(s)
            if prog.queue_type == "stream":
                qb.stream = stream_info(self.eng.storage, ckpt, q.vhost, q.name, prog, None)
            return qb, True
        if self.readers is not None and not self.readers_failed and reader_process.worth_a_child(q):
            try:
                return self._in_child(q, prog), False
            except NoReaderProcess as e:  # decided before a child saw the queue
                if not self.readers_failed:
                    self.readers_failed = True
                    log.warning("%s: classic queues are read by threads in this process", e)
                prog = None  # cleared above
        return back_up_queue(self.eng, q, ckpt, self.conns, self.cluster, self.version, prog)

    def _use_processes(self, queues: list[QueueInfo]) -> bool:
        """Classic queues go to reader processes when several are read at once and a child can
        open the same storage itself (not a storage object handed in, e.g. memory or a test's)."""
        b = self.eng.cfg.backup
        if not b.reader_processes or b.max_concurrent_queues < 2 or self.eng.throttle is not None:
            return False
        if sum(1 for q in queues if reader_process.worth_a_child(q)) < 2 or not reader_process.available():
            return False
        return self._storage_reopenable()

    def _storage_reopenable(self) -> bool:
        st, sc = self.eng.storage, self.eng.cfg.storage
        if sc.backend == "filesystem" and type(st) is FilesystemStorage:
            return st.root == Path(os.path.expanduser(sc.path or ".")).resolve()
        if sc.backend == "s3" and type(st).__name__ == "S3Storage" and type(st).__module__ == "rbak.storage.s3":
            return getattr(st, "bucket", None) == sc.bucket
        return False

    def _in_child(self, q: QueueInfo, prog: QueueProgress | None) -> QueueBackup:
        """One classic queue read by a reader process; its checkpoint rows, metrics and progress land here."""
        assert self.readers is not None
        eng, ckpt = self.eng, self.ckpt
        clear_previous(eng, ckpt, q.vhost, q.name, prog)
        labels = dict(vhost=q.vhost, queue=q.name, queue_type=q.queue_type)

        def on_event(event: str, kw: dict[str, Any]) -> None:
            if event == "advance":
                metrics.messages_read().labels(**labels).inc(kw.get("n", 0))
                metrics.bytes_read().labels(**labels).inc(kw.get("bytes", 0))
            eng.progress(event, **kw)

        started = time.monotonic()
        res = self.readers.read(q, self.cluster, self.version, on_event)
        with self._lock:
            self.child_connections += res.connections
        for vhost, name in res.resets:
            ckpt.reset(vhost, name)
        for p in res.saved:  # after its segments are durable, as in the thread
            ckpt.save(p)
        segs = res.backup.segments
        metrics.segments_written().labels(**labels).inc(len(segs))
        metrics.segment_bytes().labels(**labels).inc(sum(s.size_bytes for s in segs))
        risk = eng.lease_risk(q.vhost, started, time.monotonic())  # the child measured its depth in between
        if risk:
            ckpt.reset(q.vhost, q.name)  # a rerun reads it again
            raise ShortRead(res.backup, risk)
        return res.backup

    def _kept_progress(self, q: QueueInfo) -> QueueProgress | None:
        """This storage's progress for a queue, if every segment it keeps is still here (else read it again)."""
        ckpt, storage = self.ckpt, self.eng.storage
        prog = ckpt.load(q.vhost, q.name)
        if prog is None:
            return None
        for seg in prog.segments:
            size = storage.size(seg.key)
            if size != seg.size_bytes:
                log.warning("queue %r in vhost %r: kept segment %s is %s in %s; reading the queue again", q.name,
                            q.vhost, seg.key, "missing" if size is None else f"{size} bytes, not {seg.size_bytes}",
                            storage.url)
                ckpt.reset(q.vhost, q.name)
                return None
        return prog
