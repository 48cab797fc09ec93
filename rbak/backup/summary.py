"""What a backup run reports: per queue and in total (printed, ``--json``, and read by the operator's tests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..format.manifest import DefinitionsBackup


@dataclass(slots=True)
class QueueSummary:
    vhost: str
    name: str
    queue_type: str
    messages: int = 0
    segments: int = 0
    bytes: int = 0
    status: str = "done"  # done | resumed | partial (read short) | refused | failed | skipped
    error: str | None = None
    expected: int | None = None  # classic/quorum: the depth when the read started
    held_by_consumers: int = 0  # unacknowledged by consumers when listed: not backed up

    def to_json_obj(self) -> dict[str, Any]:
        return {"vhost": self.vhost, "name": self.name, "queue_type": self.queue_type, "messages": self.messages,
                "expected": self.expected, "held_by_consumers": self.held_by_consumers, "segments": self.segments, "bytes": self.bytes, "status": self.status,
                "error": self.error}


@dataclass(slots=True)
class BackupSummary:
    backup_id: str
    storage: str
    manifest_key: str
    queues: list[QueueSummary] = field(default_factory=list)
    definitions: DefinitionsBackup | None = None
    completed: bool = False
    duration_secs: float = 0.0
    rabbitmq_version: str | None = None
    source_cluster: str | None = None
    partial: bool = False
    vhosts: list[str] = field(default_factory=list)  # the vhosts whose queues were read
    vhost_scope: list[str] | None = None  # the vhosts the run was limited to (None: every vhost)

    @property
    def total_messages(self) -> int:
        return sum(q.messages for q in self.queues)

    @property
    def total_bytes(self) -> int:
        return sum(q.bytes for q in self.queues)

    @property
    def held_by_consumers(self) -> int:
        return sum(q.held_by_consumers for q in self.queues)

    @property
    def failed(self) -> list[QueueSummary]:
        """The queues that make the backup partial: refused, failed, or read short."""
        return [q for q in self.queues if q.status in ("failed", "refused", "partial")]

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "backup_id": self.backup_id, "storage": self.storage, "manifest": self.manifest_key,
            "completed": self.completed, "partial": self.partial, "source_cluster": self.source_cluster,
            "rabbitmq_version": self.rabbitmq_version, "vhosts": self.vhosts, "vhost_scope": self.vhost_scope,
            "duration_secs": round(self.duration_secs, 3),
            "total_messages": self.total_messages, "total_bytes": self.total_bytes,
            "total_segments": sum(q.segments for q in self.queues),
            "held_by_consumers": self.held_by_consumers,
            "definitions": self.definitions.to_json_obj() if self.definitions else None,
            "queues": [q.to_json_obj() for q in self.queues],
        }
