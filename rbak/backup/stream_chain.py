"""Incremental streams: where the previous backup IN THIS STORAGE stopped, and whether the stream continues.

An incremental stream backup starts after the last offset of the newest
complete backup in the same storage (and prefix) that holds the stream, never
from state written for another storage. Before trusting that position the
engine re-reads the record at it (``stream_reader.probe_offset``) and
``decide`` compares it with what the previous backup stored (body SHA-256,
chunk timestamp), which works the same on 3.10, 4.0 and 4.3:

- same record: the stream continues; read from the next offset;
- the record is gone and a later one is first: retention removed the
  offsets in between before a backup could read them, a gap is recorded;
- a different record, or nothing at or after that offset (a stream's offsets
  never go backwards): the stream was deleted and declared again; it is backed
  up from its first offset, with a warning naming it.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass, field

from ..errors import NotFoundError, RbakError
from ..format.manifest import StreamGap, StreamInfo
from ..format.layout import BackupLayout
from ..storage.base import Storage
from ..broker.stream_reader import ProbedRecord

log = logging.getLogger(__name__)

NON_MESSAGE_SLACK = 1
"""Offsets are not only messages: each of a stream's segment files starts with a bookkeeping
(tracking) chunk that takes an offset and is never delivered (measured on 3.10, 4.0 and 4.3:
offsets 0-4, 6-10 with 5-message segments). A hole of one offset is that, never a lost message;
retention removes whole segment files, so a real gap is always wider. A gap's ``count`` is the
number of offsets it spans: at most that many messages were lost."""


@dataclass(frozen=True, slots=True)
class StreamBase:
    """The previous backup of a stream: its id and where it stopped."""

    backup_id: str
    info: StreamInfo


@dataclass(slots=True)
class ChainDecision:
    """Where this run reads a stream from, and what its manifest says about the link."""

    start: int | str  # an offset, or "first"
    previous_backup: str | None = None
    previous_last_offset: int | None = None
    gaps: list[StreamGap] = field(default_factory=list)
    recreated: bool = False
    warning: str | None = None
    previous_sha256: str | None = None  # the previous last record, carried when nothing is new
    previous_chunk_timestamp: int | None = None
    first_offset: int | None = None  # of the first record this backup stored (set while reading)

    def to_json_obj(self) -> dict:
        return {"start": self.start, "previous_backup": self.previous_backup,
                "previous_last_offset": self.previous_last_offset, "recreated": self.recreated,
                "gaps": [[g.from_offset, g.to_offset] for g in self.gaps],
                "previous_sha256": self.previous_sha256, "previous_chunk_timestamp": self.previous_chunk_timestamp,
                "first_offset": self.first_offset}

    @classmethod
    def from_json_obj(cls, d: dict) -> "ChainDecision":
        return cls(d["start"], d.get("previous_backup"), d.get("previous_last_offset"),
                   [StreamGap(a, b) for a, b in d.get("gaps") or []], bool(d.get("recreated")), None,
                   d.get("previous_sha256"), d.get("previous_chunk_timestamp"), d.get("first_offset"))

    def add_gap(self, first_missing: int, last_missing: int) -> bool:
        """Record offsets the stream no longer holds (a one-offset hole is bookkeeping, not a gap)."""
        if last_missing - first_missing + 1 > NON_MESSAGE_SLACK:
            self.gaps.append(StreamGap(first_missing, last_missing))
            return True
        return False


def decide(name: str, vhost: str, base: StreamBase | None, probe: ProbedRecord | None) -> ChainDecision:
    """Pure: the continuity verdict from the previous backup's position and the probed record."""
    if base is None or base.info.last_offset is None:
        return ChainDecision("first")
    n = base.info.last_offset
    where = f"stream {name!r} in vhost {vhost!r}"
    recreated = probe is None or (probe.offset == n and (
        (base.info.last_record_sha256 is not None and probe.body_sha256 != base.info.last_record_sha256)
        or (base.info.last_chunk_timestamp is not None and probe.chunk_timestamp is not None
            and probe.chunk_timestamp != base.info.last_chunk_timestamp)))
    if recreated:
        why = (f"it holds no record at or after offset {n}" if probe is None
               else f"its record at offset {n} is not the one backup {base.backup_id!r} stored")
        return ChainDecision("first", recreated=True, warning=(
            f"{where} was deleted and declared again since backup {base.backup_id!r} ({why}): backing it up "
            f"from its first offset, as a new stream"))
    d = ChainDecision(n + 1, base.backup_id, n, previous_sha256=base.info.last_record_sha256,
                      previous_chunk_timestamp=base.info.last_chunk_timestamp)
    if probe is not None and probe.offset > n + 1 + NON_MESSAGE_SLACK:
        d.gaps.append(StreamGap(n + 1, probe.offset - 1))
        d.start = probe.offset
        d.warning = (f"{where}: offsets {n + 1}..{probe.offset - 1} (at most {probe.offset - 1 - n} message(s)) were "
                     f"removed by the stream's retention after backup {base.backup_id!r} and before this one; "
                     f"recorded as a gap")
    return d


def stream_bases(storage: Storage, prefix: str, cluster: str, exclude: str,
                 wanted: set[tuple[str, str]] | None = None) -> dict[tuple[str, str], StreamBase]:
    """(vhost, stream) -> the newest complete backup in this storage holding it (same source cluster).

    Backups whose last validation failed are skipped. Manifests written before
    rbak recorded stream positions fall back to that backup's stored
    ``state/offsets.db`` (its own rows: it lives in this storage too).
    """
    from ..repo.catalog import latest_validation, list_backups, validation_failed

    try:
        entries = [e for e in list_backups(storage, prefix) if e.complete and e.backup_id != exclude]
    except RbakError as err:
        log.warning("cannot list earlier backups for incremental stream offsets: %s", err)
        return {}
    entries.sort(key=lambda e: (e.completed_at, e.backup_id), reverse=True)
    out: dict[tuple[str, str], StreamBase] = {}
    for e in entries:
        if wanted is not None and wanted <= out.keys():
            break  # every stream of this run has its newest backup
        m = e.manifest
        assert m is not None  # a complete backup has its manifest
        if m.archive is not None:
            continue  # a generation of `rbak archive`: its own chain, which an open one still extends
        if m.source_cluster != cluster or (wanted is not None and not any(
                (q.vhost, q.name) in wanted and (q.vhost, q.name) not in out for q in m.queues)):
            continue
        found = latest_validation(storage, e.backup_id, prefix)
        if found is not None and validation_failed(found[1]):
            continue
        legacy: dict[tuple[str, str], int] | None = None
        for q in m.queues:
            key = (q.vhost, q.name)
            if q.queue_type != "stream" or key in out:
                continue
            info = q.stream
            if info is None:
                if legacy is None:
                    legacy = _legacy_offsets(storage, BackupLayout(e.backup_id, prefix).offsets_db, e.backup_id)
                info = StreamInfo(last_offset=legacy.get(key))
            out[key] = StreamBase(e.backup_id, info)
    return out


def _legacy_offsets(storage: Storage, key: str, backup_id: str) -> dict[tuple[str, str], int]:
    try:
        data = storage.get(key)
    except (NotFoundError, RbakError):
        return {}
    db = sqlite3.connect(":memory:")
    try:
        db.deserialize(data)
        rows = db.execute("SELECT backup_id, vhost, queue, stream_last_offset FROM queue_progress "
                          "WHERE completed=1 AND stream_last_offset IS NOT NULL").fetchall()
    except sqlite3.Error:
        return {}
    finally:
        db.close()
    return {(v, q): off for k, v, q, off in rows if k.rsplit("|", 1)[-1] == backup_id}
