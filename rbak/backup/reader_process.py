"""Classic queues read in worker processes, so a backup's reads use every core (issue 20).

pika decodes every frame in Python holding the GIL, and each queue costs a few ms of
channel and consumer round trips: as threads of one process, the reads of a backup never
used more than one core (8 workers reached 1.2-1.3x one worker on 2 cores) and a backup of
1,000 small queues spent its time switching the GIL between threads. Here each engine
worker thread borrows a child process, sends it one classic queue, and relays what comes
back; the child runs the same per-queue code (``pool.back_up_queue``: passive declare,
one channel, messages returned by closing it, segments stored atomically by its own
segment thread) with its own AMQP connection per vhost.

What stays in the parent, so every guarantee keeps one owner: the checkpoint (the child's
``save`` is replayed there once its segments are durable, exactly as the thread did), the
manifest, the delivery guard (quorum queues and streams never go to a child), the summary,
metrics and progress (the child's events come back on the same pipe, in order, before its
result), and the decision of which queues to read and what a failure means.

A child never outlives its parent: it dies with the forkserver (``PR_SET_PDEATHSIG``), which
exits as soon as the parent is gone, and a watchdog thread checks its parent once a second;
a dead child closes its connection, so the broker returns every message it held, and the
queue is recorded as failed (a rerun reads it again). Children are forked from one
forkserver that imports rbak once (no per-child import cost) and are reused across queues.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..errors import NoReaderProcess, RbakError, ReaderProcessError
from ..base.logsafe import install

if TYPE_CHECKING:
    from ..config import Config
    from ..format.manifest import QueueBackup
    from ..broker.management import QueueInfo
    from .checkpoint import QueueProgress

log = logging.getLogger(__name__)

Send = Callable[[tuple], None]
"""A child's locked ``pipe.send`` (``child_setup``)."""


class ChildMain(Protocol):
    """A child's main function (``engine.reader_child_main``, which runs ``serve``)."""

    def __call__(self, pipe: Any, cfg: Config, level: int, env: dict[str, str], codec: Any, /) -> None: ...

PRELOAD = ["rbak.backup.reader_process", "rbak.backup.engine"]
# A queue goes to a child only when the listing reported at least this many messages: a small
# queue's cost is its round trips, not decoding, so a child only adds its pipe and start-up to it
# (1,000 x 100 used ~10% more CPU in children than in threads); a big one is decoded beside the others.
MIN_MESSAGES = 1000


def worth_a_child(q: "QueueInfo") -> bool:
    return q.queue_type == "classic" and (q.messages or 0) >= MIN_MESSAGES


def available() -> bool:
    """Processes need the forkserver start method (Linux, macOS); elsewhere the reads stay threads."""
    import multiprocessing  # noqa: PLC0415 - lazy: 10 ms of every rbak command's start-up (measured), for backups with children

    return "forkserver" in multiprocessing.get_all_start_methods()


def process_count(workers: int) -> int:
    """One child per worker, so ``max_concurrent_queues`` queues are read at once as with threads (a read's
    channel close waits while the broker requeues what it took: fewer children than workers serialised
    those waits, 8 x 50,000 took 20-25 s with 4 children against 18 s with threads), bounded at 4 per core."""
    return max(1, min(workers, 4 * (os.cpu_count() or 1)))


@dataclass(slots=True)
class ChildResult:
    backup: "QueueBackup"
    saved: list["QueueProgress"] = field(default_factory=list)  # checkpoint rows to replay, in order
    resets: list[tuple[str, str]] = field(default_factory=list)
    connections: int = 0  # AMQP connections the child opened for this queue


# ---------------------------------------------------------------------- parent side
class _Child:
    def __init__(self, ctx, cfg: "Config", codec, target: ChildMain, ready_timeout: float = 120.0):
        self.conn, child_end = ctx.Pipe()
        level = logging.getLogger().getEffectiveLevel()
        # the forkserver keeps the environment of its start: this run's (storage credentials) goes along
        args = (child_end, cfg, level, dict(os.environ), codec)
        self.proc = ctx.Process(target=target, args=args, daemon=True, name="rbak-reader")
        try:
            self.proc.start()
        finally:
            child_end.close()
        # nothing is sent to a child before it says it is ready: one that cannot start costs no queue
        try:
            ok = self.conn.poll(ready_timeout) and self.conn.recv() == ("ready",)
        except (EOFError, OSError):
            ok = False
        if not ok:
            self.stop(timeout=1.0)
            raise OSError(f"the reader process did not start (exit code {self.proc.exitcode})")

    def stop(self, timeout: float = 5.0) -> float:
        """End the child; its CPU seconds (user + system) when it said goodbye, else 0."""
        cpu = 0.0
        try:
            self.conn.send(None)
            if self.conn.poll(timeout):
                kind, *rest = self.conn.recv()
                cpu = rest[0] if kind == "bye" else 0.0
        except (OSError, ValueError, EOFError):
            pass
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout)
        self.conn.close()
        return cpu


class ReaderProcesses:
    """A bounded set of child processes lent to the engine's worker threads, one queue at a time."""

    def __init__(self, cfg: "Config", limit: int, target: ChildMain, spare_dir: str | None = None,
                 codec=None):
        """``target(pipe, cfg, log level, environment, codec)``: a child's main function (the engine's
        ``reader_child_main``, which runs ``serve``)."""
        import multiprocessing  # noqa: PLC0415 - lazy: see available()

        try:  # the forkserver's socket lives in a temporary directory
            tempfile.gettempdir()
        except FileNotFoundError:  # read-only root filesystem (the operator's Job): use the writable state dir
            if spare_dir:
                tempfile.tempdir = spare_dir
        self.cfg = cfg
        self.codec = codec  # the parent's (encryption key included): every segment sealed as the manifest says
        self.target = target
        self.limit = limit
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(PRELOAD)
        self._idle: queue.LifoQueue[_Child | None] = queue.LifoQueue()  # None: a child died
        self._lock = threading.Lock()
        self._all: list[_Child] = []
        self._closed = False
        self.cpu_secs = 0.0  # the children's CPU, known once they are stopped (benchmarks)

    def _borrow(self) -> _Child:
        """An idle child, a new one while under the limit, else wait for one (None in the queue: one died)."""
        while True:
            try:
                child = self._idle.get_nowait()
            except queue.Empty:
                child = None
            if child is not None:
                return child
            with self._lock:
                if self._closed:
                    raise NoReaderProcess("the backup is stopping: no reader process")
                if len(self._all) < self.limit:
                    try:
                        child = _Child(self._ctx, self.cfg, self.codec, self.target)
                    except Exception as e:  # noqa: BLE001 - no temp dir, no fork, resource limits...
                        raise NoReaderProcess(f"cannot start a reader process: {type(e).__name__}: {e}") from None
                    self._all.append(child)
                    return child
            child = self._idle.get()
            if child is not None:
                return child

    def read(self, q: "QueueInfo", cluster: str, version: str | None,
             on_event: Callable[[str, dict[str, Any]], None]) -> ChildResult:
        """Back ``q`` up in a child; ``on_event(event, kw)`` gets its progress events in order."""
        child = self._borrow()
        healthy = False
        try:
            try:
                child.conn.send(("read", q, cluster, version))
            except (OSError, ValueError) as e:
                raise ReaderProcessError(f"queue {q.name!r} in vhost {q.vhost!r}: cannot reach its reader "
                                         f"process: {e!r}") from None
            while True:
                try:
                    kind, *rest = child.conn.recv()
                except (EOFError, OSError):
                    child.proc.join(1.0)
                    raise ReaderProcessError(
                        f"queue {q.name!r} in vhost {q.vhost!r}: its reader process died (exit code "
                        f"{child.proc.exitcode}); its connection closed, so the broker returned every message it "
                        f"held: rerun the backup to read the queue again") from None
                except Exception as e:  # noqa: BLE001 - a reply that does not unpickle (the child is then stopped)
                    raise ReaderProcessError(f"queue {q.name!r} in vhost {q.vhost!r}: unreadable reply from its "
                                             f"reader process: {type(e).__name__}: {e}") from None
                if kind == "event":
                    on_event(rest[0], rest[1])
                elif kind == "log":
                    logging.getLogger(rest[0]).log(rest[1], "%s", rest[2])
                elif kind == "ok":
                    healthy = True
                    return rest[0]
                elif kind == "error":
                    healthy = True
                    raise rest[0]
        finally:
            if healthy:
                self._idle.put(child)
            else:
                with self._lock:
                    if child in self._all:
                        self._all.remove(child)
                child.stop(timeout=1.0)
                self._idle.put(None)  # a worker waiting for a child may start a new one

    def close(self) -> None:
        with self._lock:
            self._closed = True
            children, self._all = self._all, []
        for c in children:
            self.cpu_secs += c.stop()


# ---------------------------------------------------------------------- child side
class RecordingCheckpoint:
    """The child's checkpoint: nothing is kept here; the parent replays the rows once the queue is done."""

    def __init__(self) -> None:
        self.saved: list = []
        self.resets: list[tuple[str, str]] = []

    def load(self, vhost: str, queue: str) -> None:
        return None  # the parent decided what to keep before sending the queue

    def save(self, p) -> None:
        self.saved.append(p)

    def reset(self, vhost: str, queue: str) -> None:
        self.resets.append((vhost, queue))


def _die_with_parent() -> None:
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # pragma: no cover - the parent went before the prctl took effect
        os._exit(70)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(70)

    threading.Thread(target=watch, name="rbak-reader-watchdog", daemon=True).start()


class _PipeLog(logging.Handler):
    def __init__(self, send: Callable[[tuple], None]):
        super().__init__(logging.DEBUG)
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.exc_info:
                msg += "\n" + logging.Formatter().formatException(record.exc_info)
            self._send(("log", record.name, record.levelno, msg))
        except Exception:  # noqa: BLE001 - logging must never fail a read
            pass


def child_setup(pipe: Any, level: int, env: dict[str, str]) -> Send:
    """A child's start: it dies with its parent, takes the run's environment, and sends every log
    record to the parent (which logs it through its own handlers). Returns the pipe's locked ``send``."""
    _die_with_parent()
    os.environ.clear()
    os.environ.update(env)
    lock = threading.Lock()

    def send(msg: tuple) -> None:
        with lock:
            pipe.send(msg)

    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(_PipeLog(send))
    root.setLevel(level)
    install()
    return send


def serve(pipe: Any, send: Callable[[tuple], None],
          read: Callable[["QueueInfo", str, str | None, RecordingCheckpoint], tuple["QueueBackup", int]]) -> None:
    """A child's loop: says it is ready, then backs up each queue the parent sends with
    ``read(q, cluster, version, checkpoint) -> (backup, connections opened)`` and sends the result
    or the error back, until the parent says stop (its CPU seconds go back with the goodbye)."""
    send(("ready",))
    while True:
        try:
            task = pipe.recv()
        except (EOFError, OSError):
            return
        if task is None:
            t = os.times()
            send(("bye", t.user + t.system))
            return
        _, q, cluster, version = task
        ckpt = RecordingCheckpoint()
        try:
            qb, opened = read(q, cluster, version, ckpt)
            send(("ok", ChildResult(qb, ckpt.saved, ckpt.resets, opened)))
        except BaseException as e:  # every failure goes back to the parent as it was
            try:
                send(("error", e))
            except Exception:  # noqa: BLE001 - an exception that does not pickle
                send(("error", RbakError(f"queue {q.name!r} in vhost {q.vhost!r}: {type(e).__name__}: {e}")))
            if not isinstance(e, Exception):
                raise
