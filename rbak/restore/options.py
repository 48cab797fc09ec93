"""Everything a restore needs, as one picklable dataclass.

Built from a validated config (``options_from_config``) by the CLI and the
operator, or directly by the Spark restore job, which ships it to executors:
so it holds plain values only (no sockets, no SSL contexts, no storage
objects). ``TargetConnection`` is the broker half.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..config import queue_selected
from ..errors import ConfigError

PublishMode = Literal["exchange", "queue"]


@dataclass(frozen=True)
class TargetConnection:
    """Where to publish: the AMQP URL (its vhost is replaced per queue) and the management API."""

    amqp_url: str = "amqp://guest:guest@localhost:5672/%2f"
    management_url: str = "http://localhost:15672"
    management_username: str | None = None
    management_password: str | None = field(default=None, repr=False)
    tls_enabled: bool = False
    ca_cert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    verify: bool = True
    server_name: str | None = None
    heartbeat_secs: int = 60
    connection_timeout_secs: float = 10.0

    def __repr__(self) -> str:  # credentials never in logs
        from ..config import mask_url

        return f"TargetConnection(amqp_url={mask_url(self.amqp_url)!r}, management_url={self.management_url!r})"


@dataclass(frozen=True)
class DefinitionsFilter:
    """Subset of the definitions to import; empty tuples mean everything."""

    vhosts: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    exchanges: tuple[str, ...] = ()


@dataclass(frozen=True)
class QueueFilter:
    """Which backed-up queues to restore (names as in the backup; globs allowed)."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    vhosts: tuple[str, ...] = ()
    types: tuple[str, ...] = ()

    def matches(self, vhost: str, name: str, queue_type: str | None = None) -> bool:
        return queue_selected(vhost, name, queue_type, self.include, self.exclude, self.vhosts, self.types)


@dataclass(frozen=True)
class RestoreOptions:
    backup_id: str
    prefix: str = ""
    target: TargetConnection = field(default_factory=TargetConnection)
    window_start_ms: int | None = None
    window_end_ms: int | None = None
    restore_messages: bool = True
    restore_definitions: bool = False
    definitions_dry_run: bool = False
    definitions_selection: DefinitionsFilter = field(default_factory=DefinitionsFilter)
    queues: QueueFilter = field(default_factory=QueueFilter)
    publish_mode: PublishMode = "queue"
    publisher_confirms: bool = True
    max_concurrent_queues: int = 4
    produce_batch_size: int = 500
    dry_run: bool = False
    checkpoint_state: str | None = None
    vhost_mapping: tuple[tuple[str, str], ...] = ()
    queue_mapping: tuple[tuple[str, str], ...] = ()
    allow_non_empty: bool = False
    skip_existing: bool = False
    verify_checksums: bool = True
    overwrite_users: bool = False
    definitions_strict: bool = False
    transient_queues: str = "durable"
    increment_only: bool = False  # a stream from an incremental backup: that backup's offsets only, not its chain
    keys: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)  # encryption keyring {key id: key}

    def keyring(self) -> dict[str, bytes]:
        """The keys for encrypted backups: the configured ones, else ``RBAK_ENCRYPTION_KEYS`` (Spark executors)."""
        if self.keys:
            return dict(self.keys)
        from ..crypto import load_keyring

        return load_keyring()

    def __post_init__(self) -> None:
        if self.publish_mode not in ("exchange", "queue"):
            raise ConfigError(f"restore.publish_mode: must be exchange or queue, got {self.publish_mode!r}")
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


def target_from_connection(c: Any) -> TargetConnection:
    """A ``TargetConnection`` from ``rbak.config.ConnectionConfig``."""
    return TargetConnection(
        amqp_url=c.amqp_url,
        management_url=c.management_url,
        management_username=c.mgmt_username,
        management_password=c.mgmt_password,
        tls_enabled=c.use_tls,
        ca_cert=c.tls.ca_cert,
        client_cert=c.tls.client_cert,
        client_key=c.tls.client_key,
        verify=c.tls.verify,
        server_name=c.tls.server_name,
        heartbeat_secs=c.heartbeat_secs,
        connection_timeout_secs=c.connection_timeout_secs,
    )


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
        target=target_from_connection(cfg.target) if cfg.target is not None else TargetConnection(),
        window_start_ms=start,
        window_end_ms=end,
        restore_messages=getattr(r, "restore_messages", True),
        restore_definitions=r.restore_definitions,
        definitions_dry_run=r.definitions_dry_run,
        definitions_selection=DefinitionsFilter(tuple(sel.vhosts), tuple(sel.queues), tuple(sel.exchanges)),
        queues=QueueFilter(tuple(q.include), tuple(q.exclude), tuple(q.vhosts), tuple(q.types)),
        publish_mode=r.publish_mode,
        publisher_confirms=r.publisher_confirms,
        max_concurrent_queues=r.max_concurrent_queues,
        produce_batch_size=r.produce_batch_size,
        dry_run=r.dry_run,
        checkpoint_state=r.checkpoint_state,
        vhost_mapping=tuple(sorted(r.vhost_mapping.items())),
        queue_mapping=tuple(sorted(r.queue_mapping.items())),
        allow_non_empty=r.allow_non_empty,
        skip_existing=getattr(r, "skip_existing", False),
        overwrite_users=r.overwrite_users,
        definitions_strict=r.definitions_strict,
        transient_queues=r.transient_queues,
        increment_only=getattr(r, "increment_only", False),
        keys=tuple(sorted(cfg.encryption.keyring().items())) if getattr(cfg, "encryption", None) else (),
    )
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    return RestoreOptions(**kwargs)
