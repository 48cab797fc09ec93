"""Checking a stored backup against its manifest.

``check_segment`` is the unit of deep validation; ``rbak validate --deep``
runs it in one process and ``spark/validate.py`` distributes it over
executors, so both report exactly the same findings.
"""

from __future__ import annotations

import datetime
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping

import orjson

from ..errors import EncryptionError, NotFoundError, RbakError, SegmentError
from ..format.compression import Compression, decompress
from ..format.layout import BackupLayout
from ..format.manifest import BackupManifest, SegmentMetadata
from ..format.reader import SegmentStats, fetch_segment, iter_record_chunks
from ..format.segment import sha256_hex
from ..sealing.crypto import ObjectCodec, codec_for
from ..sealing.envelope import KeySources, KmsSettings, data_key
from ..storage.base import Storage
from ..storage.memory import MemoryStorage
from .catalog import load_manifest

VALID, INVALID, UNVERIFIED = "valid", "invalid", "unverified"


@dataclass(slots=True)
class SegmentCheck:
    key: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    record_count: int = 0
    size_bytes: int = 0
    uncompressed_bytes: int = 0
    contents_checked: bool = False  # the records were read (an encrypted segment: decrypted first)
    max_body_bytes: int | None = None  # the largest body read (deep): what a restore compares with max_message_size

    def to_json_obj(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class ValidationReport:
    backup_id: str
    deep: bool
    complete: bool
    segments: list[SegmentCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # not errors: gaps, queues not backed up (partial)
    gaps: int = 0  # messages a stream's retention removed before a backup could read them
    partial: bool = False
    unverified: str | None = None  # deep, encrypted, and the contents could not be decrypted: why

    @property
    def result(self) -> str:
        """``invalid`` (something is wrong), ``unverified`` (a deep check that decrypted nothing: no
        proof either way, never a pass) or ``valid``."""
        if not (self.complete and not self.problems and all(s.ok for s in self.segments)):
            return INVALID
        return UNVERIFIED if self.unverified else VALID

    @property
    def ok(self) -> bool:
        return self.result == VALID

    @property
    def bad_segments(self) -> list[SegmentCheck]:
        return [s for s in self.segments if not s.ok]

    def all_problems(self) -> list[str]:
        return self.problems + [f"{s.key}: {p}" for s in self.segments for p in s.problems]

    def to_json_obj(self) -> dict:
        return {
            "backup_id": self.backup_id,
            "deep": self.deep,
            "complete": self.complete,
            "ok": self.ok,
            "result": self.result,
            "unverified": self.unverified,
            "problems": self.problems,
            "partial": self.partial,
            "gaps": self.gaps,
            "notes": self.notes,
            "segments": [s.to_json_obj() for s in self.segments],
        }


def check_segment_bytes(data: bytes, seg: SegmentMetadata, codec: ObjectCodec | None = None) -> SegmentCheck:
    """Every deep check of one segment's stored bytes (already fetched) against its manifest entry."""
    mem = MemoryStorage()
    mem._data[seg.key] = bytes(data)  # noqa: SLF001 - a private one-object store, no copy semantics needed
    return check_segment(mem, seg, codec)


def check_segment(storage: Storage, seg: SegmentMetadata, codec: ObjectCodec | None = None) -> SegmentCheck:
    """Every deep check of one stored segment, through the one bounded reader (``read_segment``'s steps).

    Size and SHA-256 describe the stored object (an encrypted backup's sealed bytes), so they are
    checked without a key; with ``codec`` able to open it (the GCM tag proves it unaltered) the
    RBAK frame and records are checked too. Without the key: size and checksum only."""
    if codec is not None and codec.encrypted and not codec.can_open:
        return _stored_object_check(storage, seg)
    c = SegmentCheck(key=seg.key, ok=True, contents_checked=True)
    p = c.problems
    st = SegmentStats()
    try:
        fetched = fetch_segment(storage, seg, verify_checksum=True, problems=p, codec=codec)
        c.size_bytes = fetched.size
        largest = 0
        for _first, records in iter_record_chunks(fetched, seg, 0, st):
            if records:
                largest = max(largest, max(len(r.body) for r in records))
        c.max_body_bytes = largest
    except SegmentError as e:
        p.append(e.problem)
        c.size_bytes = c.size_bytes or st.size_bytes
        c.record_count, c.uncompressed_bytes = st.records, st.uncompressed_bytes
        c.ok = False
        return c
    except RbakError as e:
        p.append(f"cannot read: {e}")
        c.ok = False
        return c
    header = st.header
    c.record_count, c.uncompressed_bytes = st.records, st.uncompressed_bytes
    if st.records and header is not None:
        first, last = st.first_timestamp, st.last_timestamp
        if (header.first_timestamp, header.last_timestamp) != (first, last):
            p.append(
                f"header timestamps {header.first_timestamp}..{header.last_timestamp} "
                f"do not match records {first}..{last}"
            )
        if seg.first_timestamp is not None and seg.first_timestamp != first:
            p.append(f"manifest first_timestamp {seg.first_timestamp}, first record {first}")
        if seg.last_timestamp is not None and seg.last_timestamp != last:
            p.append(f"manifest last_timestamp {seg.last_timestamp}, last record {last}")
    if seg.max_body_bytes is not None and c.max_body_bytes != seg.max_body_bytes:
        p.append(f"manifest max_body_bytes {seg.max_body_bytes}, largest body read {c.max_body_bytes}")
    c.ok = not p
    return c


def _stored_object_check(storage: Storage, seg: SegmentMetadata) -> SegmentCheck:
    """An encrypted segment without its key: the stored object's size and SHA-256 only."""
    try:
        data = storage.get(seg.key)
    except RbakError as e:
        return SegmentCheck(key=seg.key, ok=False, problems=[f"cannot read: {e}"])
    c = SegmentCheck(key=seg.key, ok=True, size_bytes=len(data))
    if len(data) != seg.size_bytes:
        c.problems.append(f"size {len(data)} bytes, manifest says {seg.size_bytes}")
    if not seg.checksum:
        c.problems.append("manifest has no checksum for this segment")
    elif (digest := sha256_hex(data)) != seg.checksum.lower():
        c.problems.append(f"SHA-256 mismatch: manifest {seg.checksum}, computed {digest}")
    c.ok = not c.problems
    return c


def shallow_check(storage: Storage, seg: SegmentMetadata) -> SegmentCheck:
    """Present and the right size: what plain ``validate`` asks of each segment."""
    try:
        size = storage.size(seg.key)
    except RbakError as e:
        return SegmentCheck(key=seg.key, ok=False, problems=[f"cannot stat: {e}"])
    if size is None:
        return SegmentCheck(key=seg.key, ok=False, problems=["missing from storage"])
    if size != seg.size_bytes:
        return SegmentCheck(key=seg.key, ok=False, size_bytes=size,
                            problems=[f"size {size} bytes, manifest says {seg.size_bytes}"])
    return SegmentCheck(key=seg.key, ok=True, record_count=seg.record_count, size_bytes=size)


def manifest_problems(m: BackupManifest) -> list[str]:
    """Consistency of the manifest with itself (totals, sequences)."""
    out = []
    if m.completed_at is None:
        out.append("backup is incomplete: manifest has completed_at null")
    seen: dict[str, str] = {}
    for q in m.queues:
        for s in q.segments:
            where = f"queue {q.vhost!r}/{q.name!r}"
            if s.key in seen:
                out.append(f"{s.key}: listed twice in the manifest ({seen[s.key]} and {where})")
            seen.setdefault(s.key, where)
    for q in m.queues:
        seqs = [s.sequence for s in q.segments]
        if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
            out.append(f"queue {q.vhost!r}/{q.name!r}: segment sequences are not strictly increasing: {seqs}")
        counted = sum(s.record_count for s in q.segments)
        if counted != q.message_count:
            out.append(f"queue {q.vhost!r}/{q.name!r}: message_count {q.message_count}, segments hold {counted}")
    totals = (
        sum(q.message_count for q in m.queues),
        sum(len(q.segments) for q in m.queues),
        sum(s.size_bytes for q in m.queues for s in q.segments),
    )
    if totals != (m.total_messages, m.total_segments, m.total_bytes):
        out.append(
            f"manifest totals (messages, segments, bytes) = {(m.total_messages, m.total_segments, m.total_bytes)}, "
            f"queues add up to {totals}"
        )
    return out


def backup_problems(storage: Storage, m: BackupManifest) -> list[str]:
    """Everything wrong with a backup apart from its segments' contents."""
    out = manifest_problems(m)
    if m.definitions is not None and not storage.exists(m.definitions.key):
        out.append(f"{m.definitions.key}: definitions file missing from storage")
    return out


def preflight_problems(storage: Storage, m: BackupManifest, segments: Iterable[SegmentMetadata],
                       need_checksums: bool = True) -> list[str]:
    """What restore checks before publishing anything: validate's manifest checks (duplicate
    segments, counts, totals, sequences), and each segment it will read present, of the size the
    manifest says, with a checksum to verify it by."""
    out = manifest_problems(m)
    for seg in segments:
        c = shallow_check(storage, seg)
        out.extend(f"{seg.key}: {p}" for p in c.problems)
        if need_checksums and not seg.checksum:
            out.append(f"{seg.key}: manifest has no checksum for this segment")
    return out


def definitions_problems(storage: Storage, m: BackupManifest, codec: ObjectCodec) -> list[str]:
    """An encrypted backup's definitions open with its key and decompress."""
    if m.definitions is None:
        return []
    key = m.definitions.key
    try:
        raw = codec.get(storage, key)
        decompress(raw, next((c for c in (Compression.ZSTD, Compression.LZ4) if key.endswith(c.extension)),
                             Compression.NONE))
    except NotFoundError:
        return []  # already reported by backup_problems
    except RbakError as e:
        return [e.args[0] if e.args else str(e)]
    return []


def iter_segments(m: BackupManifest) -> Iterable[SegmentMetadata]:
    for q in m.queues:
        yield from q.segments


def validate_backup(
    storage: Storage,
    backup_id: str,
    prefix: str | None = "",
    deep: bool = False,
    workers: int = 4,
    progress: Callable[[SegmentCheck], None] | None = None,
    keyring: Mapping[str, bytes] | None = None,
    kms: Any = None,
) -> ValidationReport:
    """Validate every segment (never stopping at the first bad one). An encrypted backup is checked
    completely with its key in ``keyring``, by stored sizes and checksums without it."""
    m = load_manifest(storage, backup_id, prefix)
    report = ValidationReport(backup_id, deep, m.is_complete, problems=backup_problems(storage, m))
    report.partial = m.is_partial
    report.gaps = sum(g.count for _, g in m.gaps)
    report.notes = [f"{s.vhost}/{s.name} not backed up ({s.status}): {s.reason}" for s in m.queue_status] + [
        f"gap in stream {q.vhost}/{q.name}: offsets {g.from_offset}..{g.to_offset} (at most {g.count} message(s)) removed "
        f"by the stream's retention before this backup" for q, g in m.gaps]
    unwrap_error = None
    if deep and m.encryption is not None and m.encryption.envelope:
        try:
            dek, _ = data_key(storage, BackupLayout(backup_id, prefix), m.encryption,
                              KeySources(dict(keyring or {}), kms or KmsSettings()))
            keyring = {**(keyring or {}), m.encryption.key_id: dek}
        except EncryptionError as e:
            unwrap_error = e.args[0]
    codec = codec_for(backup_id, m.encryption, keyring, required=False)
    if deep and codec.encrypted:
        if codec.can_open:
            report.problems += definitions_problems(storage, m, codec)
        elif unwrap_error:
            report.unverified = unwrap_error
        else:
            assert m.encryption is not None  # the codec is encrypted
            report.unverified = f"encrypted with key id {m.encryption.key_id!r}, which is not in the keyring"
    check = (lambda s: check_segment(storage, s, codec)) if deep else (lambda s: shallow_check(storage, s))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for result in pool.map(check, iter_segments(m)):
            report.segments.append(result)
            if progress:
                progress(result)
    return report


def unverified_line(reason: str) -> str:
    """How an unverified deep validation is named everywhere (CLI, Spark, the operator's status)."""
    return (f"unverified: not decrypted ({reason}); only the stored objects' sizes and SHA-256 were checked, "
            "which proves nothing about whether the contents can be restored")


def utc_stamp(now: datetime.datetime | None = None) -> str:
    """Report timestamps: sortable as text, millisecond resolution."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"


def store_report(storage: Storage, report: dict, backup_id: str, prefix: str | None = "",
                 key: str | None = None) -> str:
    """Store a validation report next to its backup (``validation/report-<ts>.json``).

    The newest report decides whether the backup counts as usable
    (``catalog.latest_complete`` skips one whose last validation failed).
    """
    key = key or BackupLayout(backup_id, prefix).validation_report(utc_stamp())
    storage.put(key, orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return key
