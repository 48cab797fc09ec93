"""manifest.json: the backup's table of contents, written last.

Field names and order follow ``storage-format.md``. A manifest whose
``completed_at`` is null (or that is missing) marks an incomplete backup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import ManifestError
from .manifest_archive import ArchiveInfo
from .manifest_fields import optional, required

ENCRYPTION_ALGORITHM = "AES-256-GCM"


@dataclass(frozen=True, slots=True)
class EncryptionInfo:
    """The manifest's ``encryption`` field: how the backup's objects are sealed.

    ``dek_fingerprint`` set: envelope encryption. ``key_id`` then names the backup's own data key
    (``dek-...``), which is stored only wrapped, in ``keys/*.wrap.json`` next to the manifest; the
    fingerprint (never the key) lets a reader check that an unwrapped key is this backup's."""

    key_id: str
    algorithm: str = ENCRYPTION_ALGORITHM
    dek_fingerprint: str | None = None

    @property
    def envelope(self) -> bool:
        return self.dek_fingerprint is not None

    def to_json_obj(self) -> dict:
        out: dict = {"algorithm": self.algorithm, "key_id": self.key_id}
        if self.dek_fingerprint is not None:  # only for envelope backups: direct-key manifests keep their bytes
            out["envelope"] = {"dek_fingerprint": self.dek_fingerprint}
        return out

    @classmethod
    def from_json_obj(cls, d: object, where: str) -> "EncryptionInfo":
        if not isinstance(d, dict) or not isinstance(d.get("key_id"), str) or not d["key_id"]:
            raise ManifestError(f"{where}: 'encryption' must be an object with a non-empty 'key_id'")
        alg = d.get("algorithm", ENCRYPTION_ALGORITHM)
        if alg != ENCRYPTION_ALGORITHM:
            raise ManifestError(f"{where}: encryption algorithm {alg!r} is not supported (only {ENCRYPTION_ALGORITHM})")
        env = d.get("envelope")
        fp = None
        if env is not None:
            fp = env.get("dek_fingerprint") if isinstance(env, dict) else None
            if not isinstance(fp, str) or not fp:
                raise ManifestError(f"{where}: 'encryption.envelope' must be an object with a non-empty "
                                    "'dek_fingerprint'")
        return cls(key_id=d["key_id"], algorithm=alg, dek_fingerprint=fp)


@dataclass(slots=True)
class SegmentMetadata:
    key: str
    sequence: int
    record_count: int
    size_bytes: int
    uncompressed_bytes: int
    first_timestamp: int | None
    last_timestamp: int | None
    checksum: str
    # rbak extension, written last and only when known (readers of the format ignore unknown fields):
    # the largest record body in the segment, which a restore compares with the target's max_message_size
    max_body_bytes: int | None = None

    def to_json_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "sequence": self.sequence,
            "record_count": self.record_count,
            "size_bytes": self.size_bytes,
            "uncompressed_bytes": self.uncompressed_bytes,
            "first_timestamp": self.first_timestamp,
            "last_timestamp": self.last_timestamp,
            "checksum": self.checksum,
        }
        if self.max_body_bytes is not None:
            out["max_body_bytes"] = self.max_body_bytes
        return out

    @classmethod
    def from_json_obj(cls, d: dict[str, Any], where: str = "segment") -> "SegmentMetadata":
        return cls(
            key=required(d, "key", str, where),
            sequence=required(d, "sequence", int, where),
            record_count=required(d, "record_count", int, where),
            size_bytes=required(d, "size_bytes", int, where),
            uncompressed_bytes=optional(d, "uncompressed_bytes", int, where) or 0,
            first_timestamp=optional(d, "first_timestamp", int, where),
            last_timestamp=optional(d, "last_timestamp", int, where),
            checksum=optional(d, "checksum", str, where) or "",
            max_body_bytes=optional(d, "max_body_bytes", int, where),
        )


@dataclass(frozen=True, slots=True)
class StreamGap:
    """Offsets a stream's retention removed before a backup could read them."""

    from_offset: int
    to_offset: int  # inclusive
    # rbak archive (written only when known): the lost records lie between these broker timestamps (ms)
    after_timestamp: int | None = None  # of the last record kept before the gap
    before_timestamp: int | None = None  # of the first record kept after it

    @property
    def count(self) -> int:
        return self.to_offset - self.from_offset + 1

    def to_json_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from_offset": self.from_offset, "to_offset": self.to_offset, "count": self.count}
        if self.after_timestamp is not None or self.before_timestamp is not None:
            out["after_timestamp"], out["before_timestamp"] = self.after_timestamp, self.before_timestamp
        return out

    @classmethod
    def from_json_obj(cls, d: dict[str, Any], where: str = "gap") -> "StreamGap":
        a, b = required(d, "from_offset", int, where), required(d, "to_offset", int, where)
        if b < a:
            raise ManifestError(f"{where}: to_offset {b} is before from_offset {a}")
        return cls(a, b, optional(d, "after_timestamp", int, where), optional(d, "before_timestamp", int, where))


@dataclass(frozen=True, slots=True)
class TapOf:
    """The queue a tap stream records (rbak extension, ``rbak archive`` with ``archive.taps``): what was
    published to that classic or quorum queue through its bindings, so a restore targets it by default."""

    queue: str
    queue_type: str  # "classic" or "quorum"

    def to_json_obj(self) -> dict[str, Any]:
        return {"queue": self.queue, "queue_type": self.queue_type}

    @classmethod
    def from_json_obj(cls, d: Any, where: str) -> "TapOf":
        return cls(required(d, "queue", str, where), required(d, "queue_type", str, where))


@dataclass(slots=True)
class StreamInfo:
    """Where a stream backup sits in its stream (rbak's extra ``stream`` field of a queue).

    ``previous_backup`` names the backup this one continues (an incremental
    link, proven by re-reading the record at ``previous_last_offset``); None
    for a full backup of the stream. ``last_offset`` is the position the next
    backup continues from (unchanged when no record was new);
    ``last_record_sha256``/``last_chunk_timestamp`` identify that record.
    """

    first_offset: int | None = None
    last_offset: int | None = None
    previous_backup: str | None = None
    previous_last_offset: int | None = None
    last_record_sha256: str | None = None
    last_chunk_timestamp: int | None = None
    recreated: bool = False
    gaps: list[StreamGap] = field(default_factory=list)
    tap: TapOf | None = None  # rbak extension: this stream taps a classic or quorum queue

    @property
    def gap_count(self) -> int:
        return sum(g.count for g in self.gaps)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "previous_backup": self.previous_backup,
            "previous_last_offset": self.previous_last_offset,
            "last_record_sha256": self.last_record_sha256,
            "last_chunk_timestamp": self.last_chunk_timestamp,
            "recreated": self.recreated,
            "gaps": [g.to_json_obj() for g in self.gaps],
            **({"tap": self.tap.to_json_obj()} if self.tap is not None else {}),
        }

    @classmethod
    def from_json_obj(cls, d: Any, where: str = "stream") -> "StreamInfo":
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: must be a JSON object")
        gaps = d.get("gaps") or []
        if not isinstance(gaps, list):
            raise ManifestError(f"{where}: 'gaps' must be a list")
        rec = d.get("recreated")
        return cls(
            first_offset=optional(d, "first_offset", int, where),
            last_offset=optional(d, "last_offset", int, where),
            previous_backup=optional(d, "previous_backup", str, where),
            previous_last_offset=optional(d, "previous_last_offset", int, where),
            last_record_sha256=optional(d, "last_record_sha256", str, where),
            last_chunk_timestamp=optional(d, "last_chunk_timestamp", int, where),
            recreated=bool(rec) if isinstance(rec, bool) else False,
            gaps=[StreamGap.from_json_obj(g, f"{where} gap {i}") for i, g in enumerate(gaps)],
            tap=TapOf.from_json_obj(d["tap"], f"{where} tap") if d.get("tap") is not None else None,
        )


@dataclass(frozen=True, slots=True)
class BackupOwner:
    """The object that made a backup (a RabbitMQBackup: its namespace, name and uid)."""

    namespace: str
    name: str
    uid: str | None = None

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" + (f" (uid {self.uid})" if self.uid else "")

    def to_json_obj(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}

    @classmethod
    def from_json_obj(cls, d: Any, where: str) -> "BackupOwner":
        return cls(required(d, "namespace", str, where), required(d, "name", str, where), optional(d, "uid", str, where))


@dataclass(frozen=True, slots=True)
class BackupOrigin:
    """Where a backup's messages come from and who made it (rbak's extra ``origin`` field, written from
    the first, in-progress manifest on): a run never resumes, completes or replaces a backup of
    another origin. ``vhosts`` is the run's vhost scope (None: every vhost of the cluster)."""

    cluster: str
    vhosts: tuple[str, ...] | None = None
    owner: BackupOwner | None = None

    def describe(self) -> str:
        scope = f"vhosts {', '.join(self.vhosts)}" if self.vhosts is not None else "every vhost"
        return f"cluster {self.cluster!r}, {scope}" + (f", made by {self.owner}" if self.owner else "")

    def to_json_obj(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "vhosts": list(self.vhosts) if self.vhosts is not None else None,
                "owner": self.owner.to_json_obj() if self.owner else None}

    @classmethod
    def from_json_obj(cls, d: Any, where: str) -> "BackupOrigin":
        where = f"{where} origin"
        vh = d.get("vhosts") if isinstance(d, dict) else None
        if vh is not None and (not isinstance(vh, list) or not all(isinstance(v, str) for v in vh)):
            raise ManifestError(f"{where}: 'vhosts' must be a list of strings or null")
        owner = d.get("owner")
        return cls(required(d, "cluster", str, where), tuple(vh) if vh is not None else None,
                   BackupOwner.from_json_obj(owner, f"{where} owner") if owner is not None else None)


QUEUE_STATUSES = ("refused", "failed", "partial", "skipped")
"""Per-queue outcomes recorded in ``queue_status``."""
PARTIAL_STATUSES = ("refused", "failed", "partial")
"""The outcomes that make a backup partial (``partial``: the read fell short of the depth the queue
had when it started, the entry carries ``expected`` and ``read``); ``skipped`` is a note (a queue left
out on purpose, e.g. exclusive, or with consumers under ``backup.skip_queues_with_consumers``)."""


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """A queue a run did not back up (fully), and why (rbak's extra ``queue_status`` list)."""

    vhost: str
    name: str
    status: str  # one of QUEUE_STATUSES
    reason: str
    expected: int | None = None  # partial: the depth when the read started (passive declare)
    read: int | None = None  # partial: the messages the backup holds

    def to_json_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {"vhost": self.vhost, "name": self.name, "status": self.status, "reason": self.reason}
        if self.expected is not None:
            out["expected"], out["read"] = self.expected, self.read
        return out

    @classmethod
    def from_json_obj(cls, d: dict[str, Any], where: str = "queue_status") -> "QueueStatus":
        status = required(d, "status", str, where)
        if status not in QUEUE_STATUSES:
            raise ManifestError(f"{where}: status {status!r} is not one of {', '.join(QUEUE_STATUSES)}")
        return cls(required(d, "vhost", str, where), required(d, "name", str, where), status,
                   optional(d, "reason", str, where) or "", optional(d, "expected", int, where), optional(d, "read", int, where))


@dataclass(slots=True)
class QueueBackup:
    vhost: str
    name: str
    queue_type: str = "classic"
    segments: list[SegmentMetadata] = field(default_factory=list)
    message_count: int = 0
    first_message_timestamp: int | None = None
    last_message_timestamp: int | None = None
    stream: StreamInfo | None = None  # rbak extension, written only for streams
    # rbak extension (classic/quorum): the exact depth when the read started; message_count is what was read
    expected_messages: int | None = None
    # rbak extension, only when some: messages consumers held unacknowledged when the backup listed the queue
    # (not in the queue's ready depth, so not backed up)
    held_by_consumers: int | None = None
    chain: tuple[str, ...] = ()  # restore-time only, never written: backups whose segments this entry holds
    # restore-time only, never written: the backup each segment of an earlier chain link belongs to (by
    # storage key), and each link's encryption: a link's objects are sealed for that backup alone
    link_of: dict[str, str] = field(default_factory=dict)
    link_encryption: dict[str, "EncryptionInfo | None"] = field(default_factory=dict)

    def add_segment(self, seg: SegmentMetadata) -> None:
        self.segments.append(seg)
        self.message_count += seg.record_count
        if seg.record_count:
            if self.first_message_timestamp is None:
                self.first_message_timestamp = seg.first_timestamp
            self.last_message_timestamp = seg.last_timestamp

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    @property
    def uncompressed_bytes(self) -> int:
        return sum(s.uncompressed_bytes for s in self.segments)

    @property
    def max_body_bytes(self) -> int | None:
        """The queue's largest record body, from its segments' (None when one of them does not say:
        a backup written before rbak recorded it, or by another tool)."""
        sizes = [s.max_body_bytes for s in self.segments]
        if any(v is None for v in sizes):
            return None
        return max((v for v in sizes if v is not None), default=0)

    def to_json_obj(self) -> dict[str, Any]:
        out = {
            "vhost": self.vhost,
            "name": self.name,
            "queue_type": self.queue_type,
            "segments": [s.to_json_obj() for s in self.segments],
            "message_count": self.message_count,
            "first_message_timestamp": self.first_message_timestamp,
            "last_message_timestamp": self.last_message_timestamp,
        }
        if self.expected_messages is not None:  # extra fields last, only when present: the spec's bytes otherwise
            out["expected_messages"] = self.expected_messages
        if self.segments and (largest := self.max_body_bytes) is not None:
            out["max_body_bytes"] = largest  # informational: restores read the segments' own
        if self.held_by_consumers:
            out["held_by_consumers"] = self.held_by_consumers
        if self.stream is not None:
            out["stream"] = self.stream.to_json_obj()
        return out

    @classmethod
    def from_json_obj(cls, d: dict[str, Any], where: str = "queue") -> "QueueBackup":
        vhost = required(d, "vhost", str, where)
        name = required(d, "name", str, where)
        here = f"{where} {vhost!r}/{name!r}"
        segs = d.get("segments")
        segs = [] if segs is None else segs
        if not isinstance(segs, list):
            raise ManifestError(f"{here}: 'segments' must be a list")
        return cls(
            vhost=vhost,
            name=name,
            queue_type=optional(d, "queue_type", str, here) or "classic",
            segments=[SegmentMetadata.from_json_obj(s, f"{here} segment {i}") for i, s in enumerate(segs)],
            message_count=optional(d, "message_count", int, here) or 0,
            first_message_timestamp=optional(d, "first_message_timestamp", int, here),
            last_message_timestamp=optional(d, "last_message_timestamp", int, here),
            stream=StreamInfo.from_json_obj(d["stream"], f"{here} stream") if d.get("stream") is not None else None,
            expected_messages=optional(d, "expected_messages", int, here),
            held_by_consumers=optional(d, "held_by_consumers", int, here),
        )


@dataclass(slots=True)
class DefinitionsBackup:
    key: str
    vhost_count: int = 0
    queue_count: int = 0
    exchange_count: int = 0
    user_count: int = 0
    size_bytes: int = 0

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "vhost_count": self.vhost_count,
            "queue_count": self.queue_count,
            "exchange_count": self.exchange_count,
            "user_count": self.user_count,
            "size_bytes": self.size_bytes,
        }

    @classmethod
    def from_json_obj(cls, d: dict[str, Any], where: str = "definitions") -> "DefinitionsBackup":
        return cls(
            key=required(d, "key", str, where),
            vhost_count=optional(d, "vhost_count", int, where) or 0,
            queue_count=optional(d, "queue_count", int, where) or 0,
            exchange_count=optional(d, "exchange_count", int, where) or 0,
            user_count=optional(d, "user_count", int, where) or 0,
            size_bytes=optional(d, "size_bytes", int, where) or 0,
        )


@dataclass(slots=True)
class BackupManifest:
    backup_id: str
    created_at: int
    completed_at: int | None = None
    source_cluster: str | None = None
    rabbitmq_version: str | None = None
    backup_tool_version: str = ""
    definitions: DefinitionsBackup | None = None
    queues: list[QueueBackup] = field(default_factory=list)
    total_messages: int = 0
    total_bytes: int = 0
    total_segments: int = 0
    queue_status: list[QueueStatus] = field(default_factory=list)  # rbak extension: refused/failed/skipped queues
    encryption: EncryptionInfo | None = None  # rbak's extension; absent (not null) in unencrypted manifests
    definitions_only: bool = False  # rbak's extension (written only when true): no queue, by the config's intent
    origin: BackupOrigin | None = None  # rbak's extension, last; absent in manifests written without one
    archive: ArchiveInfo | None = None  # rbak's extension: a generation of a continuous archive

    @property
    def is_complete(self) -> bool:
        return self.completed_at is not None

    @property
    def is_partial(self) -> bool:
        """Complete, but some queue was refused or failed (see ``queue_status``)."""
        return self.is_complete and any(q.status in PARTIAL_STATUSES for q in self.queue_status)

    @property
    def state(self) -> str:
        """complete | partial | incomplete: what ``list``, ``describe`` and the operator show."""
        if not self.is_complete:
            return "incomplete"
        return "partial" if self.is_partial else "complete"

    @property
    def holds_data(self) -> bool:
        """Whether it holds what its selection asked for: a message, or definitions by intent.

        A backup whose selection found no message (``empty``) never displaces one that holds data:
        ``rbak restore`` without an id and retention's keep rules pass over it."""
        return self.total_messages > 0 or any(q.message_count for q in self.queues) or self.definitions_only

    @property
    def content(self) -> str:
        """``definitions-only`` (by intent), ``empty`` (no message) or ``""``: what ``list`` shows."""
        if self.definitions_only:
            return "definitions-only"
        return "" if self.holds_data else "empty"

    @property
    def gaps(self) -> list[tuple[QueueBackup, StreamGap]]:
        return [(q, g) for q in self.queues if q.stream for g in q.stream.gaps]

    @property
    def depends_on(self) -> set[str]:
        """Backups this one's incremental streams continue (restoring them needs those too)."""
        return {q.stream.previous_backup for q in self.queues if q.stream and q.stream.previous_backup}

    @property
    def uncompressed_bytes(self) -> int:
        return sum(q.uncompressed_bytes for q in self.queues)

    @property
    def held_by_consumers(self) -> int:
        """Messages consumers held unacknowledged when the backup listed their queues: not in the backup."""
        return sum(q.held_by_consumers or 0 for q in self.queues)

    def recompute_totals(self) -> None:
        """Derive the totals from the queues (one source of truth)."""
        self.total_messages = sum(q.message_count for q in self.queues)
        self.total_segments = sum(len(q.segments) for q in self.queues)
        self.total_bytes = sum(q.size_bytes for q in self.queues)

    def find_queue(self, vhost: str, name: str) -> QueueBackup | None:
        for q in self.queues:
            if q.vhost == vhost and q.name == name:
                return q
        return None

    def to_json_obj(self) -> dict[str, Any]:
        d = {
            "backup_id": self.backup_id,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "source_cluster": self.source_cluster,
            "rabbitmq_version": self.rabbitmq_version,
            "backup_tool_version": self.backup_tool_version,
            "definitions": self.definitions.to_json_obj() if self.definitions else None,
            "queues": [q.to_json_obj() for q in self.queues],
            "total_messages": self.total_messages,
            "total_bytes": self.total_bytes,
            "total_segments": self.total_segments,
            **({"queue_status": [q.to_json_obj() for q in self.queue_status]} if self.queue_status else {}),
            **({"encryption": self.encryption.to_json_obj()} if self.encryption else {}),
            **({"definitions_only": True} if self.definitions_only else {}),
            **({"origin": self.origin.to_json_obj()} if self.origin else {}),
            **({"archive": self.archive.to_json_obj()} if self.archive else {}),
        }
        return d

    def to_json(self) -> bytes:
        """Pretty JSON (2-space indent, as serde_json's pretty printer) in spec order."""
        return orjson.dumps(self.to_json_obj(), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json_obj(cls, d: Any, where: str = "manifest.json") -> "BackupManifest":
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: must be a JSON object")
        defs = d.get("definitions")
        queues = d.get("queues")
        queues = [] if queues is None else queues
        if not isinstance(queues, list):
            raise ManifestError(f"{where}: 'queues' must be a list")
        m = cls(
            backup_id=required(d, "backup_id", str, where),
            created_at=required(d, "created_at", int, where),
            completed_at=optional(d, "completed_at", int, where),
            source_cluster=optional(d, "source_cluster", str, where),
            rabbitmq_version=optional(d, "rabbitmq_version", str, where),
            backup_tool_version=optional(d, "backup_tool_version", str, where) or "",
            definitions=DefinitionsBackup.from_json_obj(defs, f"{where} definitions") if defs else None,
            queues=[QueueBackup.from_json_obj(q, f"{where} queue {i}") for i, q in enumerate(queues)],
            encryption=EncryptionInfo.from_json_obj(d["encryption"], where) if d.get("encryption") is not None else None,
            origin=BackupOrigin.from_json_obj(d["origin"], where) if d.get("origin") is not None else None,
            archive=ArchiveInfo.from_json_obj(d["archive"], f"{where} archive") if d.get("archive") is not None else None,
        )
        m.total_messages = optional(d, "total_messages", int, where) or 0
        m.total_bytes = optional(d, "total_bytes", int, where) or 0
        m.total_segments = optional(d, "total_segments", int, where) or 0
        qs = d.get("queue_status") or []
        if not isinstance(qs, list):
            raise ManifestError(f"{where}: 'queue_status' must be a list")
        m.definitions_only = d.get("definitions_only") is True
        m.queue_status = [QueueStatus.from_json_obj(x, f"{where} queue_status {i}") for i, x in enumerate(qs)]
        return m

    @classmethod
    def from_json(cls, data: bytes | str, where: str = "manifest.json") -> "BackupManifest":
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise ManifestError(f"{where}: not valid JSON: {e}") from None
        return cls.from_json_obj(obj, where)
