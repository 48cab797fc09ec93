"""The restore checkpoint: a local SQLite file at ``restore.checkpoint_state``.

Per backed-up queue and segment it stores ``next_index``: every record of the
segment before that index is either confirmed by the broker or outside the
PITR window. Progress is committed with ``synchronous=FULL`` (fsynced) after
each batch of confirms, so after a SIGKILL the file is never ahead of the
broker: the records it names as done were confirmed.

What the file cannot know is the in-flight tail: records the broker enqueued
whose confirms had not been checkpointed when the process died. The engine
closes that gap for queue-mode restores by comparing the target queue's depth
with ``initial_depth + confirmed`` (see ``engine.reconcile_in_flight``); the
file records ``initial_depth`` the first time a queue is started. For a
stream it records ``initial_offset``, the stream's next offset before the
first publish, and reads the gap back from the stream (``stream_resume``).

A fingerprint of what shapes the record stream (backup id, window, mappings,
publish mode) is stored too: resuming with a different configuration would
skip the wrong records, so it is refused with a clear error.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from typing import Protocol

from ..errors import CheckpointError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queue_progress (
    source_vhost TEXT NOT NULL, source_queue TEXT NOT NULL,
    target_vhost TEXT NOT NULL, target_queue TEXT NOT NULL,
    initial_depth INTEGER, confirmed INTEGER NOT NULL DEFAULT 0, done INTEGER NOT NULL DEFAULT 0,
    initial_offset INTEGER,
    PRIMARY KEY (source_vhost, source_queue));
CREATE TABLE IF NOT EXISTS segment_progress (
    source_vhost TEXT NOT NULL, source_queue TEXT NOT NULL, sequence INTEGER NOT NULL,
    next_index INTEGER NOT NULL, done INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (source_vhost, source_queue, sequence));
"""


@dataclass
class QueueState:
    initial_depth: int | None
    confirmed: int
    done: bool
    segments: dict[int, tuple[int, bool]]  # sequence -> (next_index, done)
    initial_offset: int | None = None  # a stream target's next offset before this restore published

    def resume_point(self) -> tuple[int, int]:
        """(segment sequence, record index) to continue from; (0, 0) when fresh.

        Records are confirmed in order, so the furthest position recorded is
        where the confirmed prefix ends.
        """
        if not self.segments:
            return 0, 0
        return max((seq, idx) for seq, (idx, _done) in self.segments.items())


class RestoreCheckpoint:
    """Thread-safe (one connection, a lock): the engine's queue workers share it."""

    def __init__(self, path: str, fingerprint: dict[str, object]):
        self.path = path
        self._lock = threading.Lock()
        try:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(queue_progress)")}
            if "initial_offset" not in cols:  # a file written before streams resumed exactly
                self._db.execute("ALTER TABLE queue_progress ADD COLUMN initial_offset INTEGER")
        except (sqlite3.Error, OSError) as e:
            raise CheckpointError(f"restore.checkpoint_state {path!r}: cannot open: {e}") from None
        fp = json.dumps(fingerprint, sort_keys=True)
        row = self._db.execute("SELECT value FROM meta WHERE key='fingerprint'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('fingerprint', ?)", (fp,))
        elif row[0] != fp:
            raise CheckpointError(
                f"restore.checkpoint_state {path!r} belongs to a different restore ({row[0]}); "
                f"this run is {fp}. Use the same configuration to resume, or another checkpoint file."
            )

    def load(self, source_vhost: str, source_queue: str) -> QueueState:
        with self._lock:
            row = self._db.execute(
                "SELECT initial_depth, confirmed, done, initial_offset FROM queue_progress "
                "WHERE source_vhost=? AND source_queue=?",
                (source_vhost, source_queue),
            ).fetchone()
            segs = self._db.execute(
                "SELECT sequence, next_index, done FROM segment_progress WHERE source_vhost=? AND source_queue=?",
                (source_vhost, source_queue),
            ).fetchall()
        if row is None:
            return QueueState(None, 0, False, {})
        return QueueState(row[0], row[1], bool(row[2]), {s: (i, bool(d)) for s, i, d in segs}, row[3])

    def start_queue(self, source_vhost: str, source_queue: str, target_vhost: str, target_queue: str,
                    initial_depth: int | None, initial_offset: int | None = None) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO queue_progress (source_vhost, source_queue, target_vhost, target_queue, "
                "initial_depth, initial_offset) VALUES (?, ?, ?, ?, ?, ?)",
                (source_vhost, source_queue, target_vhost, target_queue, initial_depth, initial_offset),
            )

    def record(self, source_vhost: str, source_queue: str, sequence: int, next_index: int, segment_done: bool,
               confirmed_total: int, previous_segments_done: tuple[int, ...] = ()) -> None:
        """One fsynced transaction: this segment's progress and the queue's confirmed count."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for seq in previous_segments_done:
                    self._db.execute(
                        "INSERT INTO segment_progress VALUES (?, ?, ?, 0, 1) ON CONFLICT DO UPDATE SET done=1",
                        (source_vhost, source_queue, seq),
                    )
                self._db.execute(
                    "INSERT INTO segment_progress VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT DO UPDATE SET next_index=excluded.next_index, done=excluded.done",
                    (source_vhost, source_queue, sequence, next_index, int(segment_done)),
                )
                self._db.execute(
                    "UPDATE queue_progress SET confirmed=? WHERE source_vhost=? AND source_queue=?",
                    (confirmed_total, source_vhost, source_queue),
                )
                self._db.execute("COMMIT")
            except sqlite3.Error as e:
                self._db.execute("ROLLBACK")
                raise CheckpointError(f"restore.checkpoint_state {self.path!r}: cannot write: {e}") from None

    def finish_queue(self, source_vhost: str, source_queue: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE queue_progress SET done=1 WHERE source_vhost=? AND source_queue=?", (source_vhost, source_queue)
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()


class NullCheckpoint:
    """No checkpoint configured: every run starts from the beginning."""

    path = None

    def load(self, source_vhost: str, source_queue: str) -> QueueState:
        return QueueState(None, 0, False, {})

    def start_queue(self, *a: object, **k: object) -> None:
        pass

    def record(self, *a: object, **k: object) -> None:
        pass

    def finish_queue(self, *a: object) -> None:
        pass

    def close(self) -> None:
        pass


class QueueCheckpoint(Protocol):
    """What restoring one queue (``queue_restore``) asks of its checkpoint: a ``RestoreCheckpoint``,
    the ``NullCheckpoint``, or the Spark restore's progress kept in backup storage."""

    def load(self, source_vhost: str, source_queue: str, /) -> QueueState: ...

    def start_queue(self, source_vhost: str, source_queue: str, target_vhost: str, target_queue: str,
                    initial_depth: int, initial_offset: int | None = None, /) -> None: ...

    def record(self, source_vhost: str, source_queue: str, sequence: int, next_index: int, segment_done: bool,
               confirmed: int, /) -> None: ...

    def finish_queue(self, source_vhost: str, source_queue: str, /) -> None: ...


def open_checkpoint(path: str | None, fingerprint: dict[str, object]) -> RestoreCheckpoint | NullCheckpoint:
    return RestoreCheckpoint(path, fingerprint) if path else NullCheckpoint()
