"""Live progress of a run: one tracker fed by every command, read by every display.

Backup, restore, import and validate report the same events to a
``Tracker`` (queues planned/started/done, records and bytes). A
``ProgressSession`` samples it on a background thread and hands snapshots
(``ProgressRecord``) to its sinks: a rich bar on a terminal, plain periodic
log lines otherwise, and optionally ``StorageReporter``, which stores each
snapshot as a new small object under ``{prefix}/_progress/{kind}/{run_id}/``
so the Kubernetes operator can show a running Job's progress without the
Job's pod needing any Kubernetes API rights. A new key per update keeps
write-once (Object Lock) storage intact; outside write-once mode the
reporter removes its older records as it goes and all of them at the end.
"""

from __future__ import annotations

import builtins
import json
import logging
import operator
import os
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Iterable, Iterator, Protocol

from ..base.units import human_bytes
from ..errors import ProgressError, RbakError, StorageError
from ..format.layout import check_backup_id, progress_key, progress_prefix

log = logging.getLogger("rbak.progress")

RUNNING, FINISHED, FAILED = "running", "finished", "failed"
STATES = (RUNNING, FINISHED, FAILED)
RATE_WINDOW_SECS = 30.0  # the rate shown is over the last half minute, not the whole run


@dataclass
class ProgressRecord:
    """One snapshot of a run, as stored (JSON) and as displayed."""

    kind: str
    run_id: str
    state: str
    started_at: float  # epoch seconds
    updated_at: float
    queues_total: int | None = None
    queues_done: int = 0
    records: int = 0
    records_total: int | None = None
    bytes: int = 0
    rate: float = 0.0  # records per second, recent
    current_queue: str | None = None
    seq: int = 0

    def to_json(self) -> builtins.bytes:  # builtins: `bytes` here is the field
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: builtins.bytes | str, where: str) -> "ProgressRecord":
        """Parse a stored record; a one-line ``ProgressError`` naming ``where`` and the field if bad."""
        try:
            obj = json.loads(data)
        except ValueError as e:
            raise ProgressError(f"{where}: not JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ProgressError(f"{where}: expected a JSON object")
        known = {f.name for f in fields(cls)}
        for req in ("kind", "run_id", "state", "started_at", "updated_at"):
            if req not in obj:
                raise ProgressError(f"{where}: field {req!r} missing")
        if obj["state"] not in STATES:
            raise ProgressError(f"{where}: state: {obj['state']!r} is not one of {', '.join(STATES)}")
        for name in ("queues_done", "records", "bytes", "seq"):
            if not isinstance(obj.get(name, 0), int) or obj.get(name, 0) < 0:
                raise ProgressError(f"{where}: {name}: expected a non-negative integer, got {obj.get(name)!r}")
        for name in ("queues_total", "records_total"):
            v = obj.get(name)
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ProgressError(f"{where}: {name}: expected a non-negative integer or null, got {v!r}")
        for name in ("started_at", "updated_at", "rate"):
            v = obj.get(name, 0.0)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise ProgressError(f"{where}: {name}: expected a number, got {v!r}")
        return cls(**{k: v for k, v in obj.items() if k in known})

    @property
    def elapsed(self) -> float:
        return max(0.0, self.updated_at - self.started_at)

    def line(self) -> str:
        """The plain one-line form (log lines, the operator's summary)."""
        q = f"{self.queues_done}/{self.queues_total}" if self.queues_total is not None else f"{self.queues_done}"
        recs = f"{self.records}/{self.records_total}" if self.records_total else f"{self.records}"
        cur = f", at {self.current_queue}" if self.current_queue and self.state == RUNNING else ""
        return (f"{self.kind} {self.run_id}: {q} queues, {recs} records, {human_bytes(self.bytes)}, "
                f"{self.rate:.0f} rec/s{cur} [{self.state}, {self.elapsed:.0f}s]")


class Tracker:
    """Thread-safe counters of one run (queue workers call it concurrently)."""

    def __init__(self, kind: str, run_id: str, clock: Callable[[], float] = time.time):
        self.kind, self.run_id, self._clock = kind, run_id, clock
        self._lock = threading.Lock()
        self.started_at = clock()
        self.queues_total: int | None = None
        self.records_total: int | None = None
        self.queues_done = 0
        self.records = 0
        self.bytes = 0
        self._current: list[str] = []  # queues in progress, oldest first
        self._samples: deque[tuple[float, int]] = deque([(self.started_at, 0)])
        self.state = RUNNING

    def plan(self, queues: int | None = None, records: int | None = None) -> None:
        with self._lock:
            if queues is not None:
                self.queues_total = queues
            if records is not None:
                self.records_total = records

    def start_queue(self, label: str) -> None:
        with self._lock:
            if label not in self._current:
                self._current.append(label)

    def advance(self, label: str | None, records: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.records += records
            self.bytes += nbytes
            if label and label not in self._current:
                self._current.append(label)

    def finish_queue(self, label: str) -> None:
        with self._lock:
            self.queues_done += 1
            if label in self._current:
                self._current.remove(label)

    def snapshot(self, state: str | None = None) -> ProgressRecord:
        with self._lock:
            now = self._clock()
            self._samples.append((now, self.records))
            while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_SECS:
                self._samples.popleft()
            t0, r0 = self._samples[0]
            rate = (self.records - r0) / (now - t0) if now - t0 > 0 else 0.0
            return ProgressRecord(
                kind=self.kind, run_id=self.run_id, state=state or self.state, started_at=self.started_at,
                updated_at=now, queues_total=self.queues_total, queues_done=self.queues_done,
                records=self.records, records_total=self.records_total, bytes=self.bytes, rate=round(rate, 1),
                current_queue=self._current[-1] if self._current else None)


class Sink(Protocol):
    interval: float

    def update(self, rec: ProgressRecord) -> None: ...

    def close(self, rec: ProgressRecord) -> None: ...


class PlainLines:
    """A log line every ``interval`` seconds (no terminal, CI logs, Job pods) and one at the end."""

    def __init__(self, interval: float = 10.0, logger: logging.Logger = log):
        self.interval, self.log = interval, logger

    def update(self, rec: ProgressRecord) -> None:
        self.log.info("progress %s", rec.line())

    def close(self, rec: ProgressRecord) -> None:
        if rec.state == FINISHED:  # a failed run says why in its one error line, nothing else
            self.log.info("progress %s", rec.line())


class RichBar:
    """One rich progress bar for the run: records against the planned total when known, else queues."""

    interval = 0.2

    def __init__(self, description: str, transient: bool = False):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415 - rich.progress takes ~0.2 s at every CLI start; only a terminal draws a bar

        self.p = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                          TimeElapsedColumn(), transient=transient)
        self.task = self.p.add_task(description, total=None, detail="")
        self.p.start()

    def update(self, rec: ProgressRecord) -> None:
        total, done = (rec.records_total, rec.records) if rec.records_total else (rec.queues_total, rec.queues_done)
        q = f"{rec.queues_done}/{rec.queues_total}" if rec.queues_total is not None else str(rec.queues_done)
        detail = f"{q} queues {rec.records} rec {human_bytes(rec.bytes)} {rec.rate:.0f} rec/s"
        if rec.current_queue and rec.state == RUNNING:
            detail += f" {rec.current_queue}"
        self.p.update(self.task, total=total, completed=done, detail=detail)

    def close(self, rec: ProgressRecord) -> None:
        self.update(rec)
        self.p.stop()


class StorageReporter:
    """Stores each snapshot as a new object ``{prefix}/_progress/{kind}/{run_id}/{ms}-{seq}.json``.

    Never rewrites a key (write-once storage); elsewhere it deletes the
    previous record after writing the next and every record at the end, so
    at most two exist at a time and none outlive the run. A failed put is
    logged, never fatal: progress must not fail a backup."""

    def __init__(self, storage: Any, prefix: str | None, interval: float = 5.0):
        self.storage, self.prefix, self.interval = storage, prefix, interval
        self.seq = 0
        self.keys: list[str] = []

    def update(self, rec: ProgressRecord) -> None:
        self.seq += 1
        rec.seq = self.seq
        key = progress_key(self.prefix, rec.kind, rec.run_id, int(rec.updated_at * 1000), self.seq)
        try:
            self.storage.put(key, rec.to_json())
        except (RbakError, OSError) as e:
            log.warning("cannot store progress record %s: %s", key, e)
            return
        self.keys.append(key)
        if not self.storage.write_once:
            for old in self.keys[:-1]:
                self._delete(old)
            self.keys = self.keys[-1:]

    def close(self, rec: ProgressRecord) -> None:
        self.update(rec)
        if not self.storage.write_once:
            for key in self.keys:
                self._delete(key)
            self.keys = []

    def _delete(self, key: str) -> None:
        try:
            self.storage.delete(key)
        except (RbakError, OSError) as e:
            log.warning("cannot delete progress record %s: %s", key, e)


def latest_progress(storage: Any, prefix: str | None, kind: str, run_id: str) -> ProgressRecord | None:
    """The newest stored record of a run, or None (not started, or finished and cleaned up)."""
    base = progress_prefix(prefix, kind, run_id)
    try:
        keys = [k for k in storage.list(base) if k.endswith(".json")]
    except StorageError:
        return None
    for key in reversed(keys):  # newest first; a record deleted meanwhile: take the one before
        try:
            return ProgressRecord.from_json(storage.get(key), key)
        except StorageError:
            continue
    return None


class ProgressSession:
    """A tracker plus a sampler thread feeding the sinks, each at its own interval.

    Use as a context manager; leaving it with an exception writes a final
    ``failed`` record, else ``finished``."""

    def __init__(self, tracker: Tracker, sinks: Iterable[Sink] = ()):
        self.tracker = tracker
        self.sinks = list(sinks)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ProgressSession":
        if self.sinks:
            self._thread = threading.Thread(target=self._loop, name="rbak-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, etype, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        state = FAILED if etype is not None else FINISHED
        self.tracker.state = state
        rec = self.tracker.snapshot(state)
        for s in self.sinks:
            try:
                s.close(rec)
            except Exception:  # a display must never mask the run's own outcome
                log.exception("progress sink failed")

    def _loop(self) -> None:
        due = [time.monotonic() + (0.0 if isinstance(s, StorageReporter) else s.interval) for s in self.sinks]
        while not self._stop.is_set():
            now = time.monotonic()
            rec = None
            for i, s in enumerate(self.sinks):
                if now >= due[i]:
                    rec = rec or self.tracker.snapshot()
                    try:
                        s.update(rec)
                    except Exception:
                        log.exception("progress sink failed")
                    due[i] = now + s.interval
            self._stop.wait(max(0.05, min(due) - time.monotonic()))


# --------------------------------------------------------------------------
# adapters: each engine's own callback -> the tracker
# --------------------------------------------------------------------------

def backup_events(tracker: Tracker) -> Callable[..., None]:
    """The backup engine's ``progress(event, **kw)``: plan, start, advance, done."""

    counted: dict[str, list[int]] = {}  # per queue: records and bytes advanced so far
    lock = threading.Lock()

    def on(event: str, **kw: Any) -> None:
        label = f"{kw.get('vhost')}/{kw.get('queue')}" if "queue" in kw else None
        if event == "plan":
            tracker.plan(queues=kw.get("queues"), records=kw.get("records"))
        elif event == "start" and label:
            tracker.start_queue(label)
        elif event == "advance":
            n, nbytes = kw.get("n", 0), kw.get("bytes", 0)
            if label:
                with lock:
                    c = counted.setdefault(label, [0, 0])
                    c[0], c[1] = c[0] + n, c[1] + nbytes
            tracker.advance(label, n, nbytes)
        elif event == "done" and label:
            with lock:
                n, nbytes = counted.pop(label, (0, 0))
            s = kw.get("summary")
            if s is not None:
                # The queue ends at what the backup holds of it, each record once: the records read
                # were counted as they came, so only the difference is added (a resumed queue's kept
                # records; minus a failed read's records, which are in no manifest). A read that
                # counted no bytes (a stream, a resumed queue) adds its stored bytes.
                tracker.advance(None, s.messages - n, s.bytes if nbytes == 0 else 0)
            tracker.finish_queue(label)

    return on


def restore_events(tracker: Tracker) -> tuple[Callable[[list], None], Callable[[Any], None]]:
    """``(on_plan, on_progress)`` for ``run_restore``: the plan's totals, then confirmed records and
    published body bytes per queue as they grow, and each queue's end."""
    seen: dict[str, tuple[int, int]] = {}
    ended: set[str] = set()
    lock = threading.Lock()

    def on_plan(plans: list) -> None:
        tracker.plan(queues=len(plans), records=sum(p.candidate_records for p in plans))

    def on_progress(r: Any) -> None:
        label = f"{r.source_vhost}/{r.source_queue}"
        with lock:
            n0, b0 = seen.get(label, (0, 0))
            seen[label] = (max(n0, r.confirmed), max(b0, r.bytes))
            final = r.status != "pending" and label not in ended
            if final:
                ended.add(label)
        tracker.advance(label, max(0, r.confirmed - n0), max(0, r.bytes - b0))
        if final:
            tracker.finish_queue(label)

    return on_plan, on_progress


def validate_events(tracker: Tracker, manifest: Any) -> Callable[[Any], None]:
    """``validate_backup``'s per-segment callback: records and stored bytes checked; a queue is done
    when its last segment was."""
    owner: dict[str, str] = {}
    left: dict[str, int] = {}
    for q in manifest.queues:
        label = f"{q.vhost}/{q.name}"
        left[label] = len(q.segments)
        for seg in q.segments:
            owner[seg.key] = label
    tracker.plan(queues=len(left), records=sum(seg.record_count for q in manifest.queues for seg in q.segments))
    lock = threading.Lock()
    for label in [k for k, n in left.items() if n == 0]:
        tracker.finish_queue(label)

    def on(check: Any) -> None:
        label = owner.get(check.key)
        tracker.advance(label, check.record_count, check.size_bytes)
        if label is None:
            return
        with lock:
            left[label] -= 1
            done = left[label] == 0
        if done:
            tracker.finish_queue(label)

    return on


def counted(tracker: Tracker, queues: Iterable[tuple], size: Callable[[Any], int] = lambda r: 0) -> Iterator[tuple]:
    """Wrap an importer's ``(vhost, name, type, records)`` stream so every record is counted."""
    for vhost, name, qtype, recs in queues:
        label = f"{vhost}/{name}"
        tracker.start_queue(label)

        yield vhost, name, qtype, _Counted(tracker, label, recs, size)


class _Counted:
    """One queue's records, counted in steps as they pass (a lock per record would cost the
    importer's throughput); keeps the source's ``__length_hint__`` (the writer uses it)."""

    __slots__ = ("_tracker", "_label", "_it", "_size", "_n", "_b", "_done")

    def __init__(self, tracker: Tracker, label: str, recs: Iterable[Any], size: Callable[[Any], int]):
        self._tracker, self._label, self._it, self._size = tracker, label, iter(recs), size
        self._n = self._b = 0
        self._done = False

    def __iter__(self) -> "_Counted":
        return self

    def __next__(self) -> Any:
        try:
            r = next(self._it)
        except StopIteration:
            if not self._done:
                self._done = True
                self._tracker.advance(self._label, self._n, self._b)
                self._tracker.finish_queue(self._label)
            raise
        self._n, self._b = self._n + 1, self._b + self._size(r)
        if self._n == 256:
            self._tracker.advance(self._label, self._n, self._b)
            self._n = self._b = 0
        return r

    def __length_hint__(self) -> int:
        left = operator.length_hint(self._it, -1)
        return left if left >= 0 else NotImplemented  # no hint from the source: none made up


# --------------------------------------------------------------------------
# the command line: one progress path for every command
# --------------------------------------------------------------------------

ENV_RUN_ID = "RBAK_PROGRESS_ID"  # set by the operator on its Jobs: store progress records under this run id
ENV_INTERVAL = "RBAK_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 5.0


def add_arguments(p: Any, *, no_progress: bool = True) -> None:
    """The progress flags every long-running command takes."""
    if no_progress:
        p.add_argument("--no-progress", action="store_true", help="plain periodic progress lines even on a terminal")
    p.add_argument("--store-progress", nargs="?", const="", default=None, metavar="RUN_ID",
                   help="also store progress records in the storage under _progress/ (what the operator shows "
                        f"in kubectl; default run id: the backup id; env {ENV_RUN_ID})")
    p.add_argument("--progress-interval", type=float, default=None, metavar="SECS",
                   help=f"seconds between progress updates (default {DEFAULT_INTERVAL:g}; env {ENV_INTERVAL})")


def interval_from(args: Any) -> float:
    v = getattr(args, "progress_interval", None)
    if v is None:
        raw = os.environ.get(ENV_INTERVAL)
        try:
            v = float(raw) if raw else DEFAULT_INTERVAL
        except ValueError:
            raise ProgressError(f"{ENV_INTERVAL}: {raw!r} is not a number of seconds") from None
    if v <= 0:
        raise ProgressError(f"--progress-interval: must be positive, got {v:g}")
    return v


def cli_session(kind: str, run_id: str, args: Any, *, storage: Any = None, prefix: str | None = "",
                terminal: bool | None = None, display: bool = True) -> ProgressSession:
    """The session a command runs under: a rich bar on a terminal (unless --no-progress), plain
    periodic log lines otherwise, plus the storage reporter when --store-progress (or the
    operator's env) asks for it. ``display=False`` (a dry run, a JSON-only output) keeps the bar off."""
    interval = interval_from(args)
    store = getattr(args, "store_progress", None)
    if store is None:
        store = os.environ.get(ENV_RUN_ID) or None
    sinks: list[Any] = []
    tty = sys.stderr.isatty() if terminal is None else terminal
    if display and tty and not getattr(args, "no_progress", False) and not getattr(args, "json", False):
        sinks.append(RichBar(f"{kind} {run_id}"))
    else:
        sinks.append(PlainLines(interval))
    tracker = Tracker(kind, run_id)
    if store is not None and storage is not None:
        if callable(storage):  # opened only when asked for (the importers open their own)
            storage = storage()

        tracker.run_id = check_backup_id(store or run_id, "--store-progress")
        sinks.append(StorageReporter(storage, prefix, interval))
    return ProgressSession(tracker, sinks)
