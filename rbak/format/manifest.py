"""manifest.json: the backup's table of contents, written last.

Field names and order follow ``storage-format.md``. A manifest whose
``completed_at`` is null (or that is missing) marks an incomplete backup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ..crypto import EncryptionInfo
from ..errors import ManifestError


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

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "sequence": self.sequence,
            "record_count": self.record_count,
            "size_bytes": self.size_bytes,
            "uncompressed_bytes": self.uncompressed_bytes,
            "first_timestamp": self.first_timestamp,
            "last_timestamp": self.last_timestamp,
            "checksum": self.checksum,
        }

    @classmethod
    def from_json_obj(cls, d: dict[str, Any], where: str = "segment") -> "SegmentMetadata":
        return cls(
            key=_req(d, "key", str, where),
            sequence=_req(d, "sequence", int, where),
            record_count=_req(d, "record_count", int, where),
            size_bytes=_req(d, "size_bytes", int, where),
            uncompressed_bytes=_opt(d, "uncompressed_bytes", int, where) or 0,
            first_timestamp=_opt(d, "first_timestamp", int, where),
            last_timestamp=_opt(d, "last_timestamp", int, where),
            checksum=_opt(d, "checksum", str, where) or "",
        )


@dataclass(slots=True)
class QueueBackup:
    vhost: str
    name: str
    queue_type: str = "classic"
    segments: list[SegmentMetadata] = field(default_factory=list)
    message_count: int = 0
    first_message_timestamp: int | None = None
    last_message_timestamp: int | None = None

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

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "vhost": self.vhost,
            "name": self.name,
            "queue_type": self.queue_type,
            "segments": [s.to_json_obj() for s in self.segments],
            "message_count": self.message_count,
            "first_message_timestamp": self.first_message_timestamp,
            "last_message_timestamp": self.last_message_timestamp,
        }

    @classmethod
    def from_json_obj(cls, d: dict[str, Any], where: str = "queue") -> "QueueBackup":
        vhost = _req(d, "vhost", str, where)
        name = _req(d, "name", str, where)
        here = f"{where} {vhost!r}/{name!r}"
        segs = d.get("segments")
        segs = [] if segs is None else segs
        if not isinstance(segs, list):
            raise ManifestError(f"{here}: 'segments' must be a list")
        return cls(
            vhost=vhost,
            name=name,
            queue_type=_opt(d, "queue_type", str, here) or "classic",
            segments=[SegmentMetadata.from_json_obj(s, f"{here} segment {i}") for i, s in enumerate(segs)],
            message_count=_opt(d, "message_count", int, here) or 0,
            first_message_timestamp=_opt(d, "first_message_timestamp", int, here),
            last_message_timestamp=_opt(d, "last_message_timestamp", int, here),
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
            key=_req(d, "key", str, where),
            vhost_count=_opt(d, "vhost_count", int, where) or 0,
            queue_count=_opt(d, "queue_count", int, where) or 0,
            exchange_count=_opt(d, "exchange_count", int, where) or 0,
            user_count=_opt(d, "user_count", int, where) or 0,
            size_bytes=_opt(d, "size_bytes", int, where) or 0,
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
    encryption: EncryptionInfo | None = None  # rbak's extension; absent (not null) in unencrypted manifests

    @property
    def is_complete(self) -> bool:
        return self.completed_at is not None

    @property
    def uncompressed_bytes(self) -> int:
        return sum(q.uncompressed_bytes for q in self.queues)

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
        return {
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
            **({"encryption": self.encryption.to_json_obj()} if self.encryption else {}),
        }

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
            backup_id=_req(d, "backup_id", str, where),
            created_at=_req(d, "created_at", int, where),
            completed_at=_opt(d, "completed_at", int, where),
            source_cluster=_opt(d, "source_cluster", str, where),
            rabbitmq_version=_opt(d, "rabbitmq_version", str, where),
            backup_tool_version=_opt(d, "backup_tool_version", str, where) or "",
            definitions=DefinitionsBackup.from_json_obj(defs, f"{where} definitions") if defs else None,
            queues=[QueueBackup.from_json_obj(q, f"{where} queue {i}") for i, q in enumerate(queues)],
            encryption=EncryptionInfo.from_json_obj(d["encryption"], where) if d.get("encryption") is not None else None,
        )
        m.total_messages = _opt(d, "total_messages", int, where) or 0
        m.total_bytes = _opt(d, "total_bytes", int, where) or 0
        m.total_segments = _opt(d, "total_segments", int, where) or 0
        return m

    @classmethod
    def from_json(cls, data: bytes | str, where: str = "manifest.json") -> "BackupManifest":
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise ManifestError(f"{where}: not valid JSON: {e}") from None
        return cls.from_json_obj(obj, where)


def _type_ok(v: Any, typ: type) -> bool:
    if typ is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, typ)


def _req(d: dict[str, Any], name: str, typ: type, where: str) -> Any:
    if not isinstance(d, dict):
        raise ManifestError(f"{where}: must be a JSON object")
    if name not in d or d[name] is None:
        raise ManifestError(f"{where}: missing required field '{name}'")
    v = d[name]
    if not _type_ok(v, typ):
        raise ManifestError(f"{where}: field '{name}' must be {typ.__name__}, got {type(v).__name__}")
    return v


def _opt(d: dict[str, Any], name: str, typ: type, where: str) -> Any:
    v = d.get(name)
    if v is None:
        return None
    if not _type_ok(v, typ):
        raise ManifestError(f"{where}: field '{name}' must be {typ.__name__} or null, got {type(v).__name__}")
    return v
