"""What a queue's backup job needs of the run it belongs to (``QueueServices``).

``jobs.Job`` (``queue_backup.QueueJob``, ``stream_backup.StreamJob``) reads one queue with the
run's configuration, clients and storage; the engine (``engine.BackupEngine``) provides them.
Naming them here, rather than importing the engine, keeps the dependency one way:
engine -> run -> pool -> jobs -> services.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..config import Config, ConnectionConfig
    from ..sealing.crypto import ObjectCodec
    from ..format.manifest import BackupOrigin
    from ..format.compression import Compression
    from ..format.layout import BackupLayout
    from ..broker.management import ManagementClient
    from ..storage.base import Storage
    from .checkpoint import Checkpoint
    from .guard_store import GuardStore
    from .lease import Lease
    from .preflight import NackSupport, PolicyCache
    from .segments import AsyncSegmentWriter
    from .stages import OnDurable, Progress, Throttle
    from .stream_chain import StreamBase


class QueueServices(Protocol):
    cfg: Config
    source: ConnectionConfig  # cfg.source, which a backup requires
    backup_id: str
    storage: Storage
    layout: BackupLayout
    compression: Compression
    client: ManagementClient
    policies: PolicyCache
    nack: NackSupport
    guards: GuardStore
    progress: Progress
    throttle: Throttle | None

    def segment_writer(self, vhost: str, queue: str, queue_type: str, first_sequence: int,
                       on_durable: OnDurable | None = None) -> AsyncSegmentWriter:
        """A writer storing this queue's segments as the run's storage, compression and codec say."""

    def deadline(self) -> float | None:
        """When a read must stop (``backup.max_duration_secs``), on ``time.monotonic``'s clock."""

    def lease_risk(self, vhost: str, started: float, ended: float | None = None) -> str | None:
        """Why a read whose depth was measured at ``started`` may have missed messages (a lost lease)."""

    def stream_base(self, vhost: str, name: str) -> StreamBase | None:
        """The newest complete backup of this stream in the run's storage (an incremental's base)."""


class RunServices(QueueServices, Protocol):
    """What a run (``run.BackupRun``, ``pool.QueuePool``, ``resume``) needs of the engine beyond its
    jobs' services: the codec and run-wide state, which the run reports back (connections, reader
    processes' CPU and health)."""

    codec: ObjectCodec
    level: int
    write_once: bool
    fresh: bool
    bases: dict[tuple[str, str], StreamBase]
    skipped: list[tuple[str, str, str]]
    lease: Lease | None
    connections_opened: int
    reader_cpu_secs: float
    child_connections: int
    readers_failed: bool

    def origin(self, cluster: str) -> BackupOrigin:
        """This run's source and owner, as its manifest records them."""

    def skip(self, vhost: str, name: str, reason: str) -> None:
        """Note a queue the run passes over (logged, and in the manifest)."""

    def sync(self, ckpt: Checkpoint) -> None:
        """Store the checkpoint beside the backup."""
