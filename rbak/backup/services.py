"""What the per-queue backup code needs of the run it belongs to (``QueueServices``).

``queue_backup`` reads one queue with the run's configuration, clients and storage; the
engine (``engine.BackupEngine``) provides them. Naming them here, rather than importing the
engine, keeps the dependency one way: engine -> queue_backup -> services.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from ..config import Config, ConnectionConfig
    from ..format.compression import Compression
    from ..format.manifest import SegmentMetadata
    from ..format.layout import BackupLayout
    from ..broker.management import ManagementClient
    from ..storage.base import Storage
    from .guard_store import GuardStore
    from .preflight import NackSupport, PolicyCache
    from .segments import AsyncSegmentWriter


class QueueServices(Protocol):
    cfg: "Config"
    source: "ConnectionConfig"  # cfg.source, which a backup requires
    backup_id: str
    storage: "Storage"
    layout: "BackupLayout"
    compression: "Compression"
    client: "ManagementClient"
    policies: "PolicyCache"
    nack: "NackSupport"
    guards: "GuardStore"
    progress: Callable[..., None]
    throttle: Callable[[int], None] | None

    def segment_writer(self, vhost: str, queue: str, queue_type: str, first_sequence: int,
                       on_durable: Callable[["SegmentMetadata", Any], None] | None = None) -> "AsyncSegmentWriter":
        """A writer storing this queue's segments as the run's storage, compression and codec say."""

    def deadline(self) -> float | None:
        """When a read must stop (``backup.max_duration_secs``), on ``time.monotonic``'s clock."""

    def lease_risk(self, vhost: str, started: float, ended: float | None = None) -> str | None:
        """Why a read whose depth was measured at ``started`` may have missed messages (a lost lease)."""
