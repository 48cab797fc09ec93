"""Restore progress kept in backup storage, so a restarted Spark application resumes.

The CLI's checkpoint is a local SQLite file; a Spark restore's tasks run on
executors that a restarted application does not get back, so progress lives
next to the backup instead:

    {backup}/state/spark-restore/{progress_id}/{vhost}/{queue}/run-NNNN.json

one object per *run* (a queue's whole segment list under ``ordering:
strict``; a contiguous slice of it under ``relaxed``), written only by the
task publishing that run, holding per-segment ``next_index``/``done`` and the
confirmed count. It implements the interface ``rbak.restore.engine.
restore_queue_segments`` expects of a checkpoint (``load``, ``start_queue``,
``record``, ``finish_queue``), and the engine only records what the broker
confirmed, so the stored progress is never ahead of the broker.

On load, every run object of the queue is read and merged (a restart may
split a queue differently) and cut down to a safe resume point: the
segments of this run done in order, then the first unfinished one. Progress
past a gap is ignored (republished: never lost).

``progress_id`` defaults to a hash of what shapes the record stream and where
it goes (backup, window, mappings, publish mode, target broker host), so a
rerun of the same restore finds its progress and a different one does not.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any
from urllib.parse import urlsplit

import orjson

from rbak.errors import CheckpointError, NotFoundError
from rbak.format.layout import BackupLayout, encode_name, encode_vhost
from rbak.restore.checkpoint import QueueState
from rbak.restore.engine import checkpoint_fingerprint

PROGRESS_DIR = "spark-restore"
DONE_INDEX = 2**62  # "past the last record": a segment known done only by implication


def default_progress_id(options) -> str:
    u = urlsplit(options.target.amqp_url)
    fp = dict(checkpoint_fingerprint(options), target=f"{u.hostname}:{u.port or ''}")
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def queue_progress_prefix(layout: BackupLayout, progress_id: str, vhost: str, queue: str) -> str:
    return layout.state(f"{PROGRESS_DIR}/{progress_id}/{encode_vhost(vhost)}/{encode_name(queue)}") + "/"


def run_key(layout: BackupLayout, progress_id: str, vhost: str, queue: str, first_sequence: int) -> str:
    return f"{queue_progress_prefix(layout, progress_id, vhost, queue)}run-{first_sequence:04d}.json"


class StorageProgress:
    """The checkpoint of one run (``sequences``: its segments, in order)."""

    def __init__(self, storage, layout: BackupLayout, progress_id: str, vhost: str, queue: str,
                 sequences: list[int], whole_queue: bool, fingerprint: dict):
        self.storage = storage
        self.layout = layout
        self.progress_id = progress_id
        self.vhost, self.queue = vhost, queue
        self.sequences = list(sequences)
        self.whole_queue = whole_queue
        self.fingerprint = fingerprint
        self.key = run_key(layout, progress_id, vhost, queue, sequences[0] if sequences else 0)
        self._lock = threading.Lock()
        self._obj: dict[str, Any] = {"fingerprint": fingerprint, "source_vhost": vhost, "source_queue": queue,
                     "sequences": self.sequences, "whole_queue": whole_queue, "initial_depth": None,
                     "initial_offset": None,
                     "confirmed": 0, "done": False, "segments": {}}

    # -- reading ---------------------------------------------------------

    def _runs(self) -> list[tuple[str, dict[str, Any]]]:
        """(key, run object) of every run of the queue."""
        prefix = queue_progress_prefix(self.layout, self.progress_id, self.vhost, self.queue)
        out: list[tuple[str, dict[str, Any]]] = []
        for key in self.storage.list(prefix):
            if not key.endswith(".json"):
                continue
            try:
                obj = orjson.loads(self.storage.get(key))
            except NotFoundError:
                continue
            except orjson.JSONDecodeError as e:
                raise CheckpointError(f"{key}: restore progress is not valid JSON ({e}); delete it to start over") from None
            if obj.get("fingerprint") != self.fingerprint:
                raise CheckpointError(
                    f"{key}: restore progress was written by a restore with different settings "
                    f"({obj.get('fingerprint')} vs {self.fingerprint}); use another --progress-id or --reset-progress"
                )
            out.append((key, obj))
        return out

    def load(self, source_vhost: str, source_queue: str) -> QueueState:
        runs = self._runs()
        merged: dict[int, tuple[int, bool]] = {}
        for _key, obj in runs:
            segs = {int(s): (int(i), bool(d)) for s, (i, d) in obj.get("segments", {}).items()}
            if not segs:
                continue
            # A run confirms in order, and the engine records only the segment its confirmed
            # prefix ends in: every segment of the run before that one is done.
            last_seq, (last_idx, last_done) = max(segs.items())
            implied = {s: (DONE_INDEX, True) for s in obj.get("sequences", []) if s < last_seq}
            implied[last_seq] = (last_idx, last_done)
            for seq, (idx, done) in implied.items():
                old = merged.get(seq, (0, False))
                merged[seq] = (max(old[0], idx), old[1] or done)
        own = next((obj for key, obj in runs if key == self.key and obj.get("sequences") == self.sequences), None)
        safe: dict[int, tuple[int, bool]] = {}
        for seq in self.sequences:  # the done prefix, then the first unfinished segment
            idx, done = merged.get(seq, (0, False))
            if done:
                safe[seq] = (idx, True)
                continue
            if idx:
                safe[seq] = (idx, False)
            break
        if own is not None:
            self._obj.update(initial_depth=own.get("initial_depth"), initial_offset=own.get("initial_offset"),
                             confirmed=own.get("confirmed", 0), done=bool(own.get("done")))
        self._obj["segments"] = {str(s): list(v) for s, v in safe.items()}
        # Only a whole-queue run's depth (or stream offset) bookkeeping is exact (queue mode reconciles with it).
        initial = self._obj["initial_depth"] if self.whole_queue else None
        offset = self._obj["initial_offset"] if self.whole_queue else None
        return QueueState(initial, int(self._obj["confirmed"]), bool(self._obj["done"]) and own is not None, safe,
                          offset)

    # -- writing (the engine calls these) --------------------------------

    def _put(self) -> None:
        self.storage.put(self.key, orjson.dumps(self._obj))

    def start_queue(self, source_vhost: str, source_queue: str, target_vhost: str, target_queue: str,
                    initial_depth: int, initial_offset: int | None = None) -> None:
        with self._lock:
            self._obj.update(target_vhost=target_vhost, target_queue=target_queue,
                             initial_depth=initial_depth if self.whole_queue else None,
                             initial_offset=initial_offset if self.whole_queue else None)
            self._put()

    def record(self, source_vhost: str, source_queue: str, sequence: int, next_index: int, segment_done: bool,
               confirmed: int) -> None:
        with self._lock:
            self._obj["segments"][str(sequence)] = [next_index, bool(segment_done)]
            self._obj["confirmed"] = confirmed
            self._put()

    def finish_queue(self, source_vhost: str, source_queue: str) -> None:
        with self._lock:
            self._obj["done"] = True
            self._put()

    def close(self) -> None:
        pass


def reset_progress(storage, layout: BackupLayout, progress_id: str) -> int:
    """Delete a restore's stored progress (``--reset-progress``)."""
    return storage.delete_prefix(layout.state(f"{PROGRESS_DIR}/{progress_id}") + "/")
