"""The backup checkpoint: a local SQLite ``offsets.db``, synced to ``{backup}/state/offsets.db``.

Three tables:

- ``queue_progress`` (per storage, backup id, vhost, queue): the segments already
  durable in storage, the next segment sequence, whether the queue is done,
  and for streams the last offset stored. A rerun of the same backup id after
  a SIGKILL keeps finished queues, continues streams after their last durable
  offset, and re-reads an unfinished classic/quorum queue from scratch (its
  messages went back to the queue when the connection died).
- ``stream_offsets`` (per source cluster, vhost, stream): the last offset of
  the last COMPLETED backup, where the next backup starts (incremental).
- ``delivery_guard`` (per source cluster, vhost, quorum queue): the highest
  ``x-delivery-count`` a backup left behind, so the next backup can refuse a
  queue BEFORE taking a message that a return would push past its limit.

The local file survives across backup ids on one machine; a fresh machine
seeds the two cross-backup tables from the newest complete backup in storage.

Progress belongs to ONE storage: its rows are keyed by ``scope|backup_id``
(``storage_scope``: the storage's location and prefix), so the same backup id
pointed at another, empty storage starts from nothing instead of "resuming"
with segments that only exist elsewhere. ``stream_chain`` (same key) keeps
each stream's continuity decision of a run (previous backup, gaps,
recreated), so a resumed run writes the same chain into its manifest.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field

from ..sealing.crypto import ObjectCodec
from ..errors import CheckpointError, NotFoundError, StorageError
from ..format.manifest import SegmentMetadata
from ..storage.base import Storage

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS queue_progress (
  backup_id TEXT NOT NULL, vhost TEXT NOT NULL, queue TEXT NOT NULL,
  queue_type TEXT NOT NULL, target_count INTEGER, records INTEGER NOT NULL DEFAULT 0,
  next_sequence INTEGER NOT NULL DEFAULT 1, segments TEXT NOT NULL DEFAULT '[]',
  completed INTEGER NOT NULL DEFAULT 0, stream_last_offset INTEGER,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (backup_id, vhost, queue));
CREATE TABLE IF NOT EXISTS stream_offsets (
  source TEXT NOT NULL, vhost TEXT NOT NULL, queue TEXT NOT NULL,
  last_offset INTEGER NOT NULL, backup_id TEXT NOT NULL, updated_at INTEGER NOT NULL,
  PRIMARY KEY (source, vhost, queue));
CREATE TABLE IF NOT EXISTS stream_chain (
  backup_id TEXT NOT NULL, vhost TEXT NOT NULL, queue TEXT NOT NULL, info TEXT NOT NULL,
  PRIMARY KEY (backup_id, vhost, queue));
CREATE TABLE IF NOT EXISTS delivery_guard (
  source TEXT NOT NULL, vhost TEXT NOT NULL, queue TEXT NOT NULL,
  max_count INTEGER NOT NULL, delivery_limit INTEGER, message TEXT,
  backup_id TEXT NOT NULL, updated_at INTEGER NOT NULL,
  PRIMARY KEY (source, vhost, queue));
"""


@dataclass(slots=True)
class QueueProgress:
    vhost: str
    queue: str
    queue_type: str
    target_count: int | None = None
    records: int = 0
    next_sequence: int = 1
    segments: list[SegmentMetadata] = field(default_factory=list)
    completed: bool = False
    stream_last_offset: int | None = None


@dataclass(slots=True)
class Guard:
    max_count: int
    delivery_limit: int | None
    message: str
    updated_at: int = 0  # ms since the epoch; set when saved (newest wins when merging copies)


def _now() -> int:
    return int(time.time() * 1000)


def storage_scope(storage: Storage, prefix: str | None) -> str:
    """Where a backup lives: the storage's location (an fs root resolved, an S3 URL) and the prefix."""
    where = getattr(storage, "root", None)
    loc = f"file://{where}" if where is not None else storage.url
    return f"{loc}#{(prefix or '').strip('/')}".replace("|", "%7C")


def _plain_id(key: str) -> str:
    """The backup id of a ``queue_progress`` key (``scope|id`` or, from older files, ``id``)."""
    return key.rsplit("|", 1)[-1]


class Checkpoint:
    def __init__(self, path: str, backup_id: str, scope: str = ""):
        self.path = path
        self.backup_id = backup_id
        self.key = f"{scope}|{backup_id}" if scope else backup_id  # queue_progress rows of this storage's backup
        try:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise CheckpointError(
                f"offset_storage.path {path}: cannot open the checkpoint database: {e}; set offset_storage.path "
                "to a file in a writable directory (in the container image: ${RBAK_STATE_DIR}/offsets.db, with "
                "RBAK_STATE_DIR a writable volume; its working directory is read-only)") from None
        self._lock = threading.Lock()
        self._dirty = False

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- per backup ---------------------------------------------------------
    def load(self, vhost: str, queue: str) -> QueueProgress | None:
        with self._lock:
            row = self._db.execute(
                "SELECT queue_type, target_count, records, next_sequence, segments, completed, stream_last_offset "
                "FROM queue_progress WHERE backup_id=? AND vhost=? AND queue=?",
                (self.key, vhost, queue)).fetchone()
        if row is None:
            return None
        segs = [SegmentMetadata.from_json_obj(s, f"checkpoint {vhost}/{queue}") for s in json.loads(row[4])]
        return QueueProgress(vhost, queue, row[0], row[1], row[2], row[3], segs, bool(row[5]), row[6])

    def save(self, p: QueueProgress) -> None:
        segs = json.dumps([s.to_json_obj() for s in p.segments])
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO queue_progress VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (self.key, p.vhost, p.queue, p.queue_type, p.target_count, p.records, p.next_sequence,
                 segs, int(p.completed), p.stream_last_offset, _now()))
            self._dirty = True

    def reset(self, vhost: str, queue: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM queue_progress WHERE backup_id=? AND vhost=? AND queue=?",
                             (self.key, vhost, queue))
            self._db.execute("DELETE FROM stream_chain WHERE backup_id=? AND vhost=? AND queue=?",
                             (self.key, vhost, queue))
            self._dirty = True

    def reset_all(self) -> None:
        """Forget this backup's progress in this storage (its manifest was overwritten or is gone)."""
        with self._lock:
            for table in ("queue_progress", "stream_chain"):
                self._db.execute(f"DELETE FROM {table} WHERE backup_id=?", (self.key,))
            self._dirty = True

    def chain(self, vhost: str, queue: str) -> dict | None:
        """The stream continuity decision saved by this backup's first run (a JSON object)."""
        with self._lock:
            row = self._db.execute("SELECT info FROM stream_chain WHERE backup_id=? AND vhost=? AND queue=?",
                                   (self.key, vhost, queue)).fetchone()
        return None if row is None else json.loads(row[0])

    def save_chain(self, vhost: str, queue: str, info: dict) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO stream_chain VALUES (?,?,?,?)",
                             (self.key, vhost, queue, json.dumps(info)))
            self._dirty = True

    def has_backup(self) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM queue_progress WHERE backup_id=? LIMIT 1",
                                    (self.key,)).fetchone() is not None

    # -- across backups -----------------------------------------------------
    def stream_offset(self, source: str, vhost: str, queue: str) -> int | None:
        with self._lock:
            row = self._db.execute("SELECT last_offset FROM stream_offsets WHERE source=? AND vhost=? AND queue=?",
                                   (source, vhost, queue)).fetchone()
        return None if row is None else row[0]

    def commit_stream_offsets(self, source: str) -> None:
        """After the manifest is written: streams of this backup become the next backup's start."""
        with self._lock:
            rows = self._db.execute(
                "SELECT vhost, queue, stream_last_offset FROM queue_progress "
                "WHERE backup_id=? AND completed=1 AND stream_last_offset IS NOT NULL", (self.key,)).fetchall()
            for vhost, queue, off in rows:
                self._db.execute("INSERT OR REPLACE INTO stream_offsets VALUES (?,?,?,?,?,?)",
                                 (source, vhost, queue, off, self.backup_id, _now()))
            self._dirty = True

    def guard(self, source: str, vhost: str, queue: str) -> Guard | None:
        with self._lock:
            row = self._db.execute(
                "SELECT max_count, delivery_limit, message, updated_at FROM delivery_guard "
                "WHERE source=? AND vhost=? AND queue=?", (source, vhost, queue)).fetchone()
        return None if row is None else Guard(row[0], row[1], row[2] or "", row[3])

    def set_guard(self, source: str, vhost: str, queue: str, g: Guard) -> Guard:
        """Record ``g`` (stamped now, or at its own time if it came from storage); returns it stamped."""
        g = Guard(g.max_count, g.delivery_limit, g.message, g.updated_at or _now())
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO delivery_guard VALUES (?,?,?,?,?,?,?,?)",
                             (source, vhost, queue, g.max_count, g.delivery_limit, g.message, self.backup_id,
                              g.updated_at))
            self._dirty = True
        return g

    # -- storage sync -------------------------------------------------------
    def snapshot(self) -> bytes:
        """A self-contained copy of the database (WAL folded in, marked as a rollback-journal file)."""
        with self._lock:
            mem = sqlite3.connect(":memory:")
            try:
                self._db.backup(mem)
                data = bytearray(mem.serialize())
            finally:
                mem.close()
        if data[18:20] == b"\x02\x02":  # header bytes 18-19: 2 = WAL; 1 = legacy (openable anywhere, in memory too)
            data[18:20] = b"\x01\x01"
        return bytes(data)

    def sync_to(self, storage: Storage, key: str, codec: ObjectCodec | None = None) -> None:
        data = self.snapshot()
        if codec is not None:
            codec.put(storage, key, data)  # sealed when the backup is encrypted
        else:
            storage.put(key, data)
        self._dirty = False

    def merge_from_bytes(self, data: bytes, own_backup: bool, cross: bool,
                         completed_backup: str | None = None, source: str | None = None) -> None:
        """Merge another copy (from storage): this backup's progress and/or the cross-backup tables.

        ``completed_backup``: that copy belongs to a backup whose manifest is complete, so its
        streams' last offsets are where the next backup starts.
        """
        other = sqlite3.connect(":memory:")
        try:
            other.deserialize(data)
            other.executescript(SCHEMA)
            with self._lock:
                if own_backup:  # the copy stored IN this storage: this storage's progress, whatever its scope said
                    for row in other.execute("SELECT * FROM queue_progress"):
                        if _plain_id(row[0]) == self.backup_id:
                            self._db.execute("INSERT OR IGNORE INTO queue_progress VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                                             (self.key, *row[1:]))
                    for row in other.execute("SELECT * FROM stream_chain"):
                        if _plain_id(row[0]) == self.backup_id:
                            self._db.execute("INSERT OR IGNORE INTO stream_chain VALUES (?,?,?,?)", (self.key, *row[1:]))
                if completed_backup and source:
                    for key, vhost, queue, off, upd in other.execute(
                            "SELECT backup_id, vhost, queue, stream_last_offset, updated_at FROM queue_progress "
                            "WHERE completed=1 AND stream_last_offset IS NOT NULL"):
                        if _plain_id(key) != completed_backup:
                            continue
                        cur = self._db.execute("SELECT updated_at FROM stream_offsets WHERE source=? AND vhost=? AND queue=?",
                                               (source, vhost, queue)).fetchone()
                        if cur is None or cur[0] < upd:
                            self._db.execute("INSERT OR REPLACE INTO stream_offsets VALUES (?,?,?,?,?,?)",
                                             (source, vhost, queue, off, completed_backup, upd))
                if cross:
                    for table in ("stream_offsets", "delivery_guard"):
                        cols = [r[1] for r in other.execute(f"PRAGMA table_info({table})")]
                        for row in other.execute(f"SELECT * FROM {table}"):
                            d = dict(zip(cols, row))
                            cur = self._db.execute(
                                f"SELECT updated_at FROM {table} WHERE source=? AND vhost=? AND queue=?",
                                (d["source"], d["vhost"], d["queue"])).fetchone()
                            if cur is None or cur[0] < d["updated_at"]:
                                self._db.execute(f"INSERT OR REPLACE INTO {table} VALUES ({','.join('?' * len(row))})", row)
        except sqlite3.Error as e:
            raise CheckpointError(f"checkpoint copy from storage is not a usable SQLite database: {e}") from None
        finally:
            other.close()

    def seed_from_storage(self, storage: Storage, key: str, own_backup: bool, cross: bool,
                          codec: ObjectCodec | None = None) -> bool:
        try:
            data = codec.get(storage, key) if codec is not None else storage.get(key)
        except NotFoundError:
            return False
        except StorageError as e:
            log.warning("cannot read checkpoint %s: %s", key, e)
            return False
        self.merge_from_bytes(data, own_backup, cross)
        return True
