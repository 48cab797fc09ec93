"""Everything a restore needs, as one picklable dataclass.

Built from a validated config (``options_from_config``) by the CLI and the
operator, or directly by the Spark restore job, which ships it to executors:
so it holds plain values only (no sockets, no SSL contexts, no storage
objects). The broker, the queue selection and the definitions selection are
the config's own sections (``ConnectionConfig``, ``QueueSelection``,
``DefinitionsSelection``): one name per concept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..config import ConnectionConfig, DefinitionsSelection, QueueSelection
from ..errors import ConfigError

PublishMode = Literal["exchange", "queue"]


@dataclass(frozen=True)
class RestoreOptions:
    backup_id: str
    prefix: str = ""
    target: ConnectionConfig = field(default_factory=lambda: local_target())
    window_start_ms: int | None = None
    window_end_ms: int | None = None
    restore_messages: bool = True
    restore_definitions: bool = False
    definitions_dry_run: bool = False
    definitions_selection: DefinitionsSelection = field(default_factory=DefinitionsSelection)
    queues: QueueSelection = field(default_factory=QueueSelection)
    publish_mode: PublishMode = "queue"
    publisher_confirms: bool = True
    protocol: str = "auto"  # auto | amqp091 | amqp10 (see record_publisher)
    max_concurrent_queues: int = 4
    produce_batch_size: int = 500
    dry_run: bool = False
    checkpoint_state: str | None = None
    vhost_mapping: tuple[tuple[str, str], ...] = ()
    queue_mapping: tuple[tuple[str, str], ...] = ()
    allow_non_empty: bool = False
    skip_existing: bool = False
    allow_lossy_target: bool = False  # publish into a queue whose limits may drop what is restored (see target_limits)
    allow_oversize_skip: bool = False  # skip (and list) records over the target's max_message_size (message_size)
    verify_target_depth: bool = True  # compare the target's depth with the confirms after publishing (queue mode)
    verify_checksums: bool = True
    overwrite_users: bool = False
    definitions_strict: bool = False
    transient_queues: str = "durable"
    increment_only: bool = False  # a stream from an incremental backup: that backup's offsets only, not its chain
    keys: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)  # encryption keyring {key id: key}
    kms_region: str | None = None  # envelope backups wrapped by KMS (encryption.kms_region)
    kms_endpoint_url: str | None = None  # (encryption.kms_endpoint_url; else AWS_ENDPOINT_URL_KMS)
    write_dir: str | None = "./rbak-restore"  # rollback snapshot and report when the storage refuses writes

    def keyring(self) -> dict[str, bytes]:
        """The keys for encrypted backups: the configured ones, else ``RBAK_ENCRYPTION_KEYS`` (Spark executors)."""
        if self.keys:
            return dict(self.keys)
        from ..sealing.crypto import load_keyring

        return load_keyring()

    def with_data_key(self, source: Any, manifest: Any) -> "RestoreOptions":
        """These options with the backup's data key added when it uses envelope encryption, and the data
        key of every earlier link of its incremental streams' chains (each link has its own): unwrapped
        once, before anything is published (a key no KEK opens is an error naming the keys tried), and
        carried with the options to whatever opens segments (threads, Spark executors)."""
        wanted = {manifest.backup_id: manifest.encryption}
        for q in manifest.queues:
            wanted.update(q.link_encryption)
        have = dict(self.keys)
        todo = {bid: info for bid, info in wanted.items()
                if info is not None and info.envelope and info.key_id not in have}
        if not todo:
            return self
        from dataclasses import replace

        from ..sealing.envelope import KmsSettings

        ring = self.keyring()
        for bid, info in sorted(todo.items()):  # source: a restore.source.BackupSource
            ring = source.data_key(bid, info, ring, KmsSettings(self.kms_region, self.kms_endpoint_url))
        return replace(self, keys=tuple(sorted(ring.items())))

    def __post_init__(self) -> None:
        if self.publish_mode not in ("exchange", "queue"):
            raise ConfigError(f"restore.publish_mode: must be exchange or queue, got {self.publish_mode!r}")
        if self.protocol not in ("auto", "amqp091", "amqp10"):
            raise ConfigError(f"restore.protocol: must be auto, amqp091 or amqp10, got {self.protocol!r}")
        if self.produce_batch_size < 1:
            raise ConfigError("restore.produce_batch_size: must be at least 1")
        if self.transient_queues not in ("durable", "skip"):
            raise ConfigError(f"restore.transient_queues: must be durable or skip, got {self.transient_queues!r}")
        if self.max_concurrent_queues < 1:
            raise ConfigError("restore.max_concurrent_queues: must be at least 1")
        s, e = self.window_start_ms, self.window_end_ms
        if s is not None and e is not None and s > e:
            raise ConfigError(f"restore.time_window_start: {s} is after time_window_end {e}")

    @property
    def vhost_map(self) -> dict[str, str]:
        return dict(self.vhost_mapping)

    @property
    def queue_map(self) -> dict[str, str]:
        return dict(self.queue_mapping)


DEFAULT_TARGET_URL = "amqp://guest:guest@localhost:5672"  # names no vhost: each goes to its own (plan.resolve_target_vhosts)
DEFAULT_MANAGEMENT_URL = "http://localhost:15672"


def local_target(amqp_url: str | None = None, management_url: str | None = None) -> ConnectionConfig:
    """The target broker when only URLs are given (CLI flags, the Spark job): the local one by default."""
    return ConnectionConfig(amqp_url=amqp_url or DEFAULT_TARGET_URL, management_url=management_url or DEFAULT_MANAGEMENT_URL)


def options_from_config(cfg: Any, **overrides: Any) -> RestoreOptions:
    """Build from a validated ``rbak.config.Config`` (its ``restore`` and ``target`` sections).

    ``overrides`` replace fields (the CLI's ``--dry-run`` etc.).
    """
    if not cfg.backup_id:
        raise ConfigError("backup_id: required for a restore")
    r = cfg.restore
    start, end = r.window_ms()
    sel = r.definitions_selection
    q = r.queues
    kwargs: dict[str, Any] = dict(
        backup_id=cfg.backup_id,
        prefix=cfg.storage.prefix or "",
        target=cfg.target if cfg.target is not None else local_target(),
        window_start_ms=start,
        window_end_ms=end,
        restore_messages=getattr(r, "restore_messages", True),
        restore_definitions=r.restore_definitions,
        definitions_dry_run=r.definitions_dry_run,
        definitions_selection=sel,
        queues=q,
        publish_mode=r.publish_mode,
        publisher_confirms=r.publisher_confirms,
        protocol=r.protocol,
        max_concurrent_queues=r.max_concurrent_queues,
        produce_batch_size=r.produce_batch_size,
        dry_run=r.dry_run,
        checkpoint_state=r.checkpoint_state,
        vhost_mapping=tuple(sorted(r.vhost_mapping.items())),
        queue_mapping=tuple(sorted(r.queue_mapping.items())),
        allow_non_empty=r.allow_non_empty,
        skip_existing=getattr(r, "skip_existing", False),
        allow_lossy_target=getattr(r, "allow_lossy_target", False),
        allow_oversize_skip=getattr(r, "allow_oversize_skip", False),
        overwrite_users=r.overwrite_users,
        definitions_strict=r.definitions_strict,
        transient_queues=r.transient_queues,
        increment_only=getattr(r, "increment_only", False),
        keys=tuple(sorted(cfg.encryption.keyring().items())) if getattr(cfg, "encryption", None) else (),
        kms_region=cfg.encryption.kms_region if getattr(cfg, "encryption", None) else None,
        kms_endpoint_url=cfg.encryption.kms_endpoint_url if getattr(cfg, "encryption", None) else None,
        write_dir=getattr(r, "write_dir", None),
    )
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    return RestoreOptions(**kwargs)
