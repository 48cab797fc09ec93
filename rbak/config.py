"""The YAML configuration of ``rbak backup`` / ``rbak restore``, as typed dataclasses.

Field names follow the Rust rabbitmq-backup tool where it has them. Every
field carries its documentation in its dataclass metadata, so the README's
configuration reference is generated from here (``python -m rbak.config`` or
``rbak config-reference``) and never drifts from the code.

Loading validates the WHOLE file before anything touches a broker: unknown
keys, wrong types, out-of-range values and missing required fields are all
collected and raised as one ``ConfigError`` that lists each problem with its
key path (``backup.compression_level: must be an integer from 1 to 22, got 'high'``).

Strings may use ``${VAR}`` and ``${VAR:-default}`` (environment variables);
``$${`` is a literal ``${``. Passwords and secret keys never appear in
``repr()``, logs or errors: they are masked as ``***``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence, Union
from urllib.parse import quote, urlsplit, urlunsplit

from .errors import ConfigError

MASK = "***"
SCRATCH_VHOST_PREFIX = "rbak-drill"


def doc_field(default: Any = dataclasses.MISSING, doc: str = "", *, factory: Any = None,
              required: bool = False, min: float | None = None, max: float | None = None,
              secret: bool = False) -> Any:
    """A dataclass field with its reference documentation and constraints."""
    meta = {"doc": doc, "required": required, "min": min, "max": max, "secret": secret}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    if default is dataclasses.MISSING:
        default = None
    return field(default=default, metadata=meta)


class _Section:
    """Mixin: masked repr and a plain-dict view of a config section."""

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.metadata.get("secret") and v is not None:
                v = MASK
            elif isinstance(v, str) and "url" in f.name:
                v = mask_url(v)
            parts.append(f"{f.name}={v!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def to_dict(self, mask: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if isinstance(v, _Section):
                v = v.to_dict(mask)
            elif mask and f.metadata.get("secret") and v is not None:
                v = MASK
            elif mask and isinstance(v, str) and "url" in f.name:
                v = mask_url(v)
            elif isinstance(v, (list, dict)):
                v = type(v)(v)
            out[f.name] = v
        return out


def mask_url(url: str | None) -> str | None:
    """``amqp://user:secret@host/`` -> ``amqp://user:***@host/`` (for logs and errors)."""
    if not url or "@" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return re.sub(r"//([^:/@]*):[^@]*@", r"//\1:" + MASK + "@", url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:{MASK}@{host}", parts.path, parts.query, parts.fragment))


# --------------------------------------------------------------------------
# Sections.
# --------------------------------------------------------------------------

QueueType = Literal["classic", "quorum", "stream"]


@dataclass(repr=False)
class TlsConfig(_Section):
    """TLS for AMQP (``amqps://``) and the management API (``https://``)."""

    enabled: bool = doc_field(False, "Use TLS. Also implied by an `amqps://` / `https://` URL; never falls back to plaintext.")
    ca_cert: Optional[str] = doc_field(None, "PEM file of the CA(s) that signed the broker's certificate; the system store when unset.")
    client_cert: Optional[str] = doc_field(None, "PEM client certificate for mutual TLS (with `client_key`).")
    client_key: Optional[str] = doc_field(None, "PEM private key of `client_cert`.")
    verify: bool = doc_field(True, "Verify the broker's certificate and host name. `false` is insecure and logged as a warning.")
    server_name: Optional[str] = doc_field(None, "Host name to verify the certificate against (SNI), when it differs from the URL's host.")


@dataclass(repr=False)
class QueueSelection(_Section):
    """Which queues a run covers. Patterns are shell globs (`*`, `?`, `[abc]`) matched
    against the queue name, or `vhost/queue` when the pattern contains a `/`;
    a pattern without glob characters is an exact name."""

    include: list[str] = doc_field(doc="Queues to cover (globs or exact names). Empty: every queue.", factory=list)
    exclude: list[str] = doc_field(doc="Queues to skip (globs or exact names); wins over `include`.", factory=list)
    vhosts: list[str] = doc_field(doc="Vhosts to cover (exact names, `/` is the default vhost). Empty: every vhost.", factory=list)
    types: list[QueueType] = doc_field(doc="Queue types to cover: `classic`, `quorum`, `stream`.",
                                       factory=lambda: ["classic", "quorum", "stream"])
    min_messages: int = doc_field(0, "Skip queues holding fewer messages than this (streams are never skipped by it).", min=0)

    def matches(self, vhost: str, name: str, queue_type: str | None = None) -> bool:
        """Whether a queue is covered by this selection."""
        return queue_selected(vhost, name, queue_type, self.include, self.exclude, self.vhosts, self.types)


def queue_selected(vhost: str, name: str, queue_type: str | None, include: Sequence[str],
                   exclude: Sequence[str], vhosts: Sequence[str], types: Sequence[str]) -> bool:
    """The one rule for queue selection (backup's ``source.queues``, restore's selection).

    A pattern with ``/`` matches ``vhost/queue``, otherwise the queue name; a pattern
    without ``* ? [`` matches exactly. Empty ``include``/``vhosts``/``types`` cover all.
    """
    import fnmatch

    if vhosts and vhost not in vhosts:
        return False
    if queue_type is not None and types and queue_type not in types:
        return False

    def hit(pattern: str) -> bool:
        subject = f"{vhost}/{name}" if "/" in pattern else name
        if not any(c in pattern for c in "*?["):
            return subject == pattern
        return fnmatch.fnmatchcase(subject, pattern)

    if include and not any(hit(p) for p in include):
        return False
    return not any(hit(p) for p in exclude)


@dataclass(repr=False)
class ConnectionConfig(_Section):
    """A broker: `source` for backups, `target` for restores."""

    amqp_url: str = doc_field(None, "AMQP URL, e.g. `amqp://user:pass@host:5672/%2f` (`%2f` is the vhost `/`); without `user:pass@` the management credentials are used. "
                              "`amqps://` for TLS.", required=True)
    management_url: str = doc_field("http://localhost:15672", "Management API base URL (`https://` for TLS).")
    management_username: Optional[str] = doc_field(None, "Management API user; defaults to the AMQP URL's user.")
    management_password: Optional[str] = doc_field(None, "Management API password; defaults to the AMQP URL's password.", secret=True)
    stream_port: int = doc_field(5552, "RabbitMQ stream protocol port.", min=1, max=65535)
    tls: TlsConfig = doc_field(doc="TLS settings.", factory=TlsConfig)
    queues: QueueSelection = doc_field(doc="Queue selection.", factory=QueueSelection)
    heartbeat_secs: int = doc_field(60, "AMQP heartbeat interval in seconds (0 disables).", min=0)
    connection_timeout_secs: float = doc_field(10.0, "Socket connect / management request timeout in seconds.", min=0.1)

    # -- derived values -------------------------------------------------------
    def _url(self):
        return urlsplit(self.amqp_url)

    # An amqp_url without credentials takes them from management_username/password:
    # a secret then never has to be URL-encoded into the URL (the operator relies on it).
    @property
    def username(self) -> str:
        from urllib.parse import unquote

        p = self._url()
        if p.username is not None:
            return unquote(p.username)
        return self.management_username if self.management_username is not None else "guest"

    @property
    def password(self) -> str:
        from urllib.parse import unquote

        p = self._url()
        if p.password is not None:
            return unquote(p.password)
        if p.username is None and self.management_password is not None:
            return self.management_password
        return "guest"

    @property
    def mgmt_username(self) -> str:
        return self.management_username if self.management_username is not None else self.username

    @property
    def mgmt_password(self) -> str:
        return self.management_password if self.management_password is not None else self.password

    @property
    def use_tls(self) -> bool:
        return bool(self.tls.enabled) or self._url().scheme == "amqps"

    @property
    def host(self) -> str:
        return self._url().hostname or "localhost"

    @property
    def port(self) -> int:
        p = self._url()
        return p.port or (5671 if p.scheme == "amqps" else 5672)

    def amqp_url_for_vhost(self, vhost: str) -> str:
        """The AMQP URL with its vhost replaced (vhost percent-encoded, `/` as `%2f`)."""
        p = self._url()
        scheme = p.scheme
        if self.tls.enabled and scheme == "amqp":
            scheme = "amqps"
        return urlunsplit((scheme, p.netloc, "/" + quote(vhost, safe=""), p.query, ""))

    @property
    def safe_amqp_url(self) -> str:
        return mask_url(self.amqp_url) or ""


@dataclass(repr=False)
class StorageConfig(_Section):
    """Where backups live. `prefix` is applied inside the storage root:
    keys are `{prefix}/{backup_id}/...`."""

    backend: Literal["filesystem", "s3", "azure", "gcs", "memory"] = doc_field(
        None, "Storage backend: `filesystem`, `s3`, `memory` (`azure`, `gcs` are recognised but not supported yet).", required=True)
    path: Optional[str] = doc_field(None, "Directory for `filesystem` (required there); the store name for `memory`.")
    bucket: Optional[str] = doc_field(None, "Bucket for `s3` (required there).")
    region: Optional[str] = doc_field(None, "S3 region.")
    prefix: Optional[str] = doc_field(None, "Key prefix inside the bucket/directory.")
    endpoint: Optional[str] = doc_field(None, "S3-compatible endpoint URL (MinIO, Ceph, moto).")
    path_style: bool = doc_field(False, "Path-style S3 addressing (needed by most S3-compatible servers).")
    access_key_id: Optional[str] = doc_field(None, "S3 access key; boto3's credential chain (env, profile, IRSA) when unset.")
    secret_access_key: Optional[str] = doc_field(None, "S3 secret key (with `access_key_id`).", secret=True)
    sse: Optional[Literal["AES256", "aws:kms"]] = doc_field(
        None, "S3 server-side encryption of every object put: `AES256` (SSE-S3) or `aws:kms` (SSE-KMS).")
    sse_kms_key_id: Optional[str] = doc_field(None, "KMS key id/ARN for `sse: aws:kms` (the bucket's default KMS key when unset).")
    object_lock_mode: Optional[Literal["GOVERNANCE", "COMPLIANCE"]] = doc_field(
        None, "S3 Object Lock (the bucket must have it enabled): every object is written once, locked in this mode; "
        "the manifest and state are written once at the end, and deletion waits for locks to expire.")
    object_lock_retain_days: Optional[float] = doc_field(None, "How long each object stays locked (days; required "
                                                         "with `object_lock_mode`).", min=0)

    def storage_url(self) -> str:
        """The rbak storage URL of this backend's root (without `prefix`, which the key layout applies)."""
        b = self.backend
        if b == "filesystem":
            return "file://" + os.path.abspath(os.path.expanduser(self.path or "."))
        if b == "memory":
            return f"memory://{self.path or ''}"
        if b == "s3":
            q = []
            if self.region:
                q.append("region=" + quote(self.region, safe=""))
            if self.endpoint:
                q.append("endpoint=" + quote(self.endpoint, safe=":/"))
            if self.path_style:
                q.append("path_style=true")
            if self.sse:
                q.append("sse=" + quote(self.sse, safe=""))
            if self.sse_kms_key_id:
                q.append("sse_kms_key_id=" + quote(self.sse_kms_key_id, safe=""))
            if self.object_lock_mode:
                q.append(f"object_lock_mode={self.object_lock_mode}&object_lock_retain_days={self.object_lock_retain_days}")
            return f"s3://{self.bucket}" + ("?" + "&".join(q) if q else "")
        return f"{b}://{self.bucket or ''}"

    def open(self):
        """An rbak ``Storage`` for this backend (``rbak.storage``)."""
        if self.backend == "s3" and (self.access_key_id or self.secret_access_key):
            from .storage.s3 import S3Storage

            return S3Storage(
                bucket=self.bucket or "", region=self.region, endpoint=self.endpoint, path_style=self.path_style,
                access_key_id=self.access_key_id, secret_access_key=self.secret_access_key,
                sse=self.sse, sse_kms_key_id=self.sse_kms_key_id, object_lock_mode=self.object_lock_mode,
                object_lock_retain_days=self.object_lock_retain_days, url=self.storage_url(),
            )
        from .storage import open_storage

        return open_storage(self.storage_url())


@dataclass(repr=False)
class BackupOptions(_Section):
    """How a backup reads queues and writes segments."""

    compression: Literal["zstd", "lz4", "none"] = doc_field("zstd", "Segment and definitions compression: `zstd`, `lz4`, `none`.")
    compression_level: int = doc_field(3, "zstd level, 1-22 (ignored for lz4/none).", min=1, max=22)
    stream_enabled: bool = doc_field(True, "Back up stream queues (read by offset, never consumed).")
    stream_incremental: bool = doc_field(True, "Start each stream after the last offset a previous backup stored "
                                         "(kept in `offset_storage`); `false` reads every stream from its first offset.")
    segment_max_bytes: int = doc_field(128 * 1024 * 1024, "Rotate a segment once its uncompressed payload reaches this many bytes "
                                       "(also bounds memory per queue).", min=1024)
    segment_max_interval_ms: int = doc_field(60_000, "Rotate a segment once it has been open this long.", min=1)
    max_concurrent_queues: int = doc_field(4, "Queues read at the same time (a bounded pool).", min=1, max=256)
    max_connections: int = doc_field(2, "AMQP connections per vhost shared by the pool (channels are multiplexed on them).", min=1, max=64)
    prefetch_count: int = doc_field(1000, "Prefetch for stream reads (classic/quorum reads use the broker's own limits).", min=1, max=65535)
    include_definitions: bool = doc_field(True, "Export `/api/definitions` into `definitions/definitions.json<ext>`.")
    checkpoint_interval_secs: float = doc_field(5.0, "How often progress is written to the local checkpoint database.", min=0)
    read_timeout_secs: float = doc_field(30.0, "Give up on a queue when no message arrives for this long although the queue "
                                         "still reports more (every message is returned to it).", min=0.1)
    max_duration_secs: Optional[float] = doc_field(None, "Abort a queue's read (returning every message) after this long; default: "
                                                   "the broker's `consumer_timeout` minus a margin when known.", min=1)
    delivery_limit_margin: int = doc_field(1, "Refuse a quorum queue whose messages are within this many deliveries of their "
                                           "delivery limit (a backup adds one delivery per message on RabbitMQ < 4.0).", min=1)
    skip_queues_with_consumers: bool = doc_field(False, "Leave out classic and quorum queues that have consumers "
                                                 "when the backup reaches them (noted in the manifest's "
                                                 "`queue_status`, status `skipped`); by default they are read, and their consumers "
                                                 "receive nothing while the backup holds the messages.")
    overwrite: bool = doc_field(False, "Allow reusing the id of a COMPLETED backup (its files are deleted first). Off by default.")


@dataclass(repr=False)
class DefinitionsSelection(_Section):
    """Subset of the definitions to import (empty lists: everything)."""

    vhosts: list[str] = doc_field(doc="Vhosts to import.", factory=list)
    queues: list[str] = doc_field(doc="Queues to import (globs or exact names).", factory=list)
    exchanges: list[str] = doc_field(doc="Exchanges to import (globs or exact names).", factory=list)


TimeBound = Union[int, str]


@dataclass(repr=False)
class RestoreOptions(_Section):
    """How a restore publishes."""

    time_window_start: Optional[TimeBound] = doc_field(None, "PITR: only records with `backed_up_at` >= this (epoch ms or RFC 3339).")
    time_window_end: Optional[TimeBound] = doc_field(None, "PITR: only records with `backed_up_at` <= this (epoch ms or RFC 3339).")
    restore_definitions: bool = doc_field(False, "Import the backup's definitions before the messages "
                                          "(a rollback snapshot of the target's definitions is stored first).")
    definitions_dry_run: bool = doc_field(False, "Report what the definitions import would change, import nothing.")
    definitions_selection: DefinitionsSelection = doc_field(doc="Subset of the definitions to import.", factory=DefinitionsSelection)
    restore_messages: bool = doc_field(True, "Publish the backed-up messages.")
    queues: QueueSelection = doc_field(doc="Which backed-up queues to restore (names as in the backup).", factory=QueueSelection)
    publish_mode: Literal["exchange", "queue"] = doc_field(
        "queue", "`queue` (default): straight to the (remapped) queue via the default exchange: restores exactly "
        "the backed-up queue and resumes exactly once; `exchange`: original exchange and routing key (current "
        "bindings decide; a fan-out bound to several backed-up queues delivers copies).")
    publisher_confirms: bool = doc_field(True, "Count a record as restored only once the broker confirmed it.")
    max_concurrent_queues: int = doc_field(4, "Queues restored at the same time.", min=1, max=256)
    produce_batch_size: int = doc_field(500, "Messages in flight (unconfirmed) per queue.", min=1, max=100_000)
    dry_run: bool = doc_field(False, "Read and report what would be published; publish nothing.")
    checkpoint_state: Optional[str] = doc_field(None, "Local file recording restore progress, so a rerun resumes without duplicates.")
    vhost_mapping: dict[str, str] = doc_field(doc="Restore vhost `src` into vhost `dst` (`{src: dst}`).", factory=dict)
    queue_mapping: dict[str, str] = doc_field(doc="Rename queues: key `vhost/queue` or `queue`, value the new queue name.", factory=dict)
    allow_non_empty: bool = doc_field(False, "Publish into queues that already hold messages (refused by default).")
    skip_existing: bool = doc_field(False, "Skip (instead of failing on) target queues that already hold messages.")
    overwrite_users: bool = doc_field(False, "Let the definitions import replace an existing user's password hash, tags "
                                      "and permissions (by default the target's users and permissions are kept).")
    definitions_strict: bool = doc_field(False, "Refuse definitions the target would reject (e.g. 3.x `ha-*` policies, "
                                         "CQv1 queues on 4.3) instead of adapting them; lists every one, changes nothing.")
    transient_queues: Literal["durable", "skip"] = doc_field(
        "durable", "Transient non-exclusive queues on a target that denies them: declare them `durable`, or `skip` "
        "them (and their messages).")
    increment_only: bool = doc_field(False, "A stream from an incremental backup: restore that backup's own offsets only. "
                                     "Default: base through the chosen backup, every offset once, in order.")

    def window_ms(self) -> tuple[int | None, int | None]:
        """The PITR window as epoch milliseconds."""
        return (parse_time_bound(self.time_window_start, "restore.time_window_start"),
                parse_time_bound(self.time_window_end, "restore.time_window_end"))


@dataclass(repr=False)
class OffsetStorageConfig(_Section):
    """The SQLite checkpoint (`offsets.db`) that makes a killed backup resumable and streams incremental."""

    backend: Literal["sqlite"] = doc_field("sqlite", "Checkpoint store (only `sqlite`).")
    path: str = doc_field("./.rbak-state/offsets.db", "Local SQLite file.")
    s3_key: Optional[str] = doc_field(None, "Storage key the database is synced to; default `{prefix}/{backup_id}/state/offsets.db`.")
    sync_interval_secs: float = doc_field(30.0, "How often the local database is copied to storage.", min=0)


@dataclass(repr=False)
class MetricsConfig(_Section):
    """Prometheus metrics endpoint."""

    enabled: bool = doc_field(False, "Serve Prometheus metrics while running.")
    port: int = doc_field(8080, "Metrics port.", min=0, max=65535)
    path: str = doc_field("/metrics", "Metrics URL path.")
    bind: str = doc_field("0.0.0.0", "Address to listen on.")


@dataclass(repr=False)
class EncryptionConfig(_Section):
    """Client-side encryption (AES-256-GCM) of segments, definitions and state: rbak's own extension of
    the format (the Rust tool cannot read encrypted backups). The manifest stays plaintext and names the
    key id. Keys are read from `keys_env`/`RBAK_ENCRYPTION_KEYS` and `keys_file` whenever a backup is
    read, so restore and validate of encrypted backups need only the keys, not `enabled`."""

    enabled: bool = doc_field(False, "Encrypt this backup (with the key `key_id`).")
    key_id: Optional[str] = doc_field(None, "Id of the key new backups are encrypted with (required when `enabled`); "
                                      "recorded in the manifest, so older keys stay usable after a rotation.")
    keys_file: Optional[str] = doc_field(None, "Keyring: a YAML/JSON file `{key id: base64 key}` (a bare base64 key "
                                         "is `key_id`'s), or a directory with one file per key id (a mounted Kubernetes Secret).")
    keys_env: Optional[str] = doc_field(None, "Environment variable holding a keyring in the same format "
                                        "(`RBAK_ENCRYPTION_KEYS` is always read when set).")

    def keyring(self) -> dict[str, bytes]:
        from .crypto import load_keyring

        return load_keyring(self.keys_file, self.keys_env, self.key_id)


@dataclass(repr=False)
class DrillConfig(_Section):
    """Restore drills (`rbak drill`): restore a backup (default the newest complete one) into a fresh
    scratch vhost, compare per-queue message counts and record hashes with the backup, delete the vhost."""

    target: Optional[ConnectionConfig] = doc_field(None, "Broker the scratch vhost is created on; default "
                                                   "`source` (else `target`). Its user needs the administrator tag.")
    scratch_vhost_prefix: str = doc_field(SCRATCH_VHOST_PREFIX, "Scratch vhosts are named "
                                          "`<prefix>-<backup id>-<random>` (letters, digits, `.`, `_`, `-`).")
    read_timeout_secs: float = doc_field(10.0, "Reading messages back from a scratch queue stops after this long "
                                         "without a delivery.", min=0.1, max=3600)
    store_report: bool = doc_field(True, "Store the report next to the backup (`drills/<time>-<id>.json`, "
                                   "a new object per drill).")


@dataclass(repr=False)
class Config(_Section):
    """A whole rbak configuration file."""

    mode: Literal["backup", "restore", "drill"] = doc_field(None, "`backup`, `restore` or `drill` "
                                                            "(`rbak drill` reads a config of any mode).", required=True)
    backup_id: Optional[str] = doc_field(None, "Backup id (letters, digits, `.`, `_`, `-`). Required for restore; "
                                         "a backup without one gets `backup-<UTC timestamp>`.")
    source: Optional[ConnectionConfig] = doc_field(None, "Broker to back up (required when `mode: backup`).")
    target: Optional[ConnectionConfig] = doc_field(None, "Broker to restore into (required when `mode: restore`).")
    storage: StorageConfig = doc_field(None, "Where backups are stored.", required=True)
    backup: BackupOptions = doc_field(doc="Backup options.", factory=BackupOptions)
    restore: RestoreOptions = doc_field(doc="Restore options.", factory=RestoreOptions)
    offset_storage: OffsetStorageConfig = doc_field(doc="Checkpoint database.", factory=OffsetStorageConfig)
    metrics: MetricsConfig = doc_field(doc="Prometheus metrics.", factory=MetricsConfig)
    encryption: EncryptionConfig = doc_field(doc="Client-side encryption (rbak's extension of the format).",
                                             factory=EncryptionConfig)
    drill: DrillConfig = doc_field(doc="Restore drills (`rbak drill`).", factory=DrillConfig)

    # -- construction -------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, env: typing.Mapping[str, str] | None = None, where: str = "") -> "Config":
        """Validate ``data`` (a parsed YAML mapping) completely; raise one ConfigError listing every problem."""
        errors: list[str] = []
        env = os.environ if env is None else env
        cfg = _build(cls, data, "", errors, env)
        if cfg is not None:
            # Cross-field checks also run when some fields were invalid, so one
            # pass reports everything; a key path already reported is not repeated.
            more: list[str] = []
            try:
                _check_config(cfg, more)
            except Exception:  # a section that failed to build; already reported
                pass
            seen = {e.split(":", 1)[0] for e in errors}
            errors.extend(e for e in more if e.split(":", 1)[0] not in seen)
        if errors:
            head = f"{where}: " if where else ""
            n = len(errors)
            raise ConfigError(f"{head}{n} problem{'s' if n > 1 else ''} in the configuration:\n  - " + "\n  - ".join(errors))
        assert cfg is not None
        return cfg

    @classmethod
    def default_backup(cls, backup_id: str | None = None, path: str = "./rbak-backups") -> "Config":
        """The embedded default: back up the local broker to ``./rbak-backups``."""
        return cls.from_dict({
            "mode": "backup",
            "backup_id": backup_id or default_backup_id(),
            "source": {
                "amqp_url": "amqp://guest:guest@localhost:5672/%2f",
                "management_url": "http://localhost:15672",
                "management_username": "guest",
                "management_password": "guest",
            },
            "storage": {"backend": "filesystem", "path": path},
        }, env={})

    @classmethod
    def default_restore(cls, backup_id: str, path: str = "./rbak-backups") -> "Config":
        """Safe restore defaults: local broker, no definitions, refuse non-empty queues."""
        return cls.from_dict({
            "mode": "restore",
            "backup_id": backup_id,
            "target": {
                "amqp_url": "amqp://guest:guest@localhost:5672/%2f",
                "management_url": "http://localhost:15672",
            },
            "storage": {"backend": "filesystem", "path": path},
        }, env={})

    def layout(self):
        """The ``BackupLayout`` of this config's backup id and storage prefix."""
        from .keys import BackupLayout

        if not self.backup_id:
            raise ConfigError("backup_id: required")
        return BackupLayout(self.backup_id, self.storage.prefix or "")


def default_backup_id(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return "backup-" + now.strftime("%Y%m%dT%H%M%SZ")


def yaml_error_text(e: Exception) -> str:
    """A YAML error without the offending text: line and column and what was wrong, never the
    line itself (it may hold a password), and never a value."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or type(e).__name__
    if isinstance(e, DuplicateKeyError):
        return str(e)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    # PyYAML's problems are fixed phrases ("found unexpected end of stream"); values never appear in them
    # except in "found character '...'" which names one character, which we keep out as well.
    problem = re.sub(r"'.*'", "a character", str(problem))
    return f"{where}{problem}"


def _strict_loader():
    """``yaml.SafeLoader`` that refuses duplicate mapping keys (naming the key and its line)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue
            if key in seen:
                raise DuplicateKeyError(f"line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                                        f"(first at line {seen[key] + 1})")
            seen[key] = key_node.start_mark.line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return StrictLoader


class DuplicateKeyError(Exception):
    """A key given twice in one YAML mapping (the later one would silently win)."""


def load_config(path: str | os.PathLike[str], env: typing.Mapping[str, str] | None = None) -> Config:
    """Read and validate a YAML config file."""
    import yaml

    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            text = f.read().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read config file: {e}") from None
    try:
        data = yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except (yaml.YAMLError, DuplicateKeyError) as e:
        raise ConfigError(f"{p}: not valid YAML: {yaml_error_text(e)}") from None
    if data is None:
        data = {}
    return Config.from_dict(data, env=env, where=p)


# --------------------------------------------------------------------------
# Time bounds.
# --------------------------------------------------------------------------


def parse_time_bound(value: Any, where: str) -> int | None:
    """Epoch milliseconds from an int (ms) or an RFC 3339 string."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{where}: must be epoch milliseconds or an RFC 3339 time, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        s = value.strip()
        if re.fullmatch(r"-?\d+", s):
            return int(s)
        try:
            t = _dt.datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ConfigError(f"{where}: must be epoch milliseconds or an RFC 3339 time, got {value!r}") from None
        if t.tzinfo is None:
            raise ConfigError(f"{where}: RFC 3339 time {value!r} needs a time zone (e.g. 'Z')")
        return int(t.timestamp() * 1000)
    raise ConfigError(f"{where}: must be epoch milliseconds or an RFC 3339 time, got {value!r}")


# --------------------------------------------------------------------------
# Interpolation and the generic, type-driven validator.
# --------------------------------------------------------------------------

_ENV_RE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def interpolate(s: str, env: typing.Mapping[str, str], path: str, errors: list[str]) -> str:
    """Expand ``${VAR}`` / ``${VAR:-default}``; an unset variable without a default is an error."""
    if "$" not in s:
        return s

    def rep(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name, default = m.group(1), m.group(2)
        val = env.get(name)
        if val is None or (val == "" and default is not None):
            if default is not None:
                return default
            errors.append(f"{path}: environment variable {name} is not set (use ${{{name}:-default}} for a default)")
            return ""
        return val

    return _ENV_RE.sub(rep, s)


def _describe(v: Any) -> str:
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (dict, list)):
        return f"a {'mapping' if isinstance(v, dict) else 'list'}"
    return repr(v)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, data: Any, path: str, errors: list[str], env: typing.Mapping[str, str]) -> Any:
    where = path or "(top level)"
    if not isinstance(data, dict):
        errors.append(f"{where}: must be a mapping, got {_describe(data)}")
        return None
    hints = _hints(cls)
    flds = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key in data:
        if not isinstance(key, str) or key not in flds:
            known = ", ".join(flds)
            errors.append(f"{_join(path, str(key))}: unknown key (known keys here: {known})")
    for name, f in flds.items():
        p = _join(path, name)
        if name not in data or data[name] is None:
            if f.metadata.get("required"):
                errors.append(f"{p}: required")
            continue
        ok, val = _coerce(hints[name], data[name], p, errors, env, f.metadata)
        if ok:
            kwargs[name] = val
    try:
        return cls(**kwargs)
    except TypeError:  # pragma: no cover - a required field missing; already reported
        return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _coerce(tp: Any, v: Any, path: str, errors: list[str], env: typing.Mapping[str, str],
            meta: typing.Mapping[str, Any] | None = None) -> tuple[bool, Any]:
    meta = meta or {}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if v is None:
            return True, None
        if len(non_none) == 1:
            return _coerce(non_none[0], v, path, errors, env, meta)
        # int | str (time bounds): accept either, interpolate strings
        if isinstance(v, str):
            v = interpolate(v, env, path, errors)
            if "time_window" in path:
                try:
                    parse_time_bound(v, path)
                except ConfigError as e:
                    errors.append(str(e.args[0]))
                    return False, None
            return True, v
        if isinstance(v, int) and not isinstance(v, bool) and int in non_none:
            return True, v
        errors.append(f"{path}: must be {' or '.join(_type_name(a) for a in non_none)}, got {_describe(v)}")
        return False, None
    if origin is Literal:
        if isinstance(v, str):
            v = interpolate(v, env, path, errors)
        if v not in args:
            errors.append(f"{path}: must be one of {', '.join(map(str, args))}; got {_describe(v)}")
            return False, None
        return True, v
    if origin is list:
        if not isinstance(v, list):
            if isinstance(v, str) and args and args[0] is str:
                v = [v]  # a single name where a list is expected
            else:
                errors.append(f"{path}: must be a list, got {_describe(v)}")
                return False, None
        out, ok = [], True
        for i, item in enumerate(v):
            good, x = _coerce(args[0] if args else Any, item, f"{path}[{i}]", errors, env)
            ok &= good
            out.append(x)
        return ok, out
    if origin is dict:
        if not isinstance(v, dict):
            errors.append(f"{path}: must be a mapping, got {_describe(v)}")
            return False, None
        out_d, ok = {}, True
        for k, item in v.items():
            if not isinstance(k, str):
                errors.append(f"{path}: keys must be strings, got {_describe(k)}")
                ok = False
                continue
            good, x = _coerce(args[1] if args else Any, item, f"{path}.{k}", errors, env)
            ok &= good
            out_d[k] = x
        return ok, out_d
    if dataclasses.is_dataclass(tp):
        # Keep a partly invalid section (its bad fields at their defaults) so the
        # cross-field checks still run on the rest; the errors are already listed.
        obj = _build(tp, v, path, errors, env)
        return obj is not None, obj
    if tp is bool:
        if isinstance(v, str):
            s = interpolate(v, env, path, errors).strip().lower()
            if s in ("true", "yes", "on", "1"):
                return True, True
            if s in ("false", "no", "off", "0"):
                return True, False
        if not isinstance(v, bool):
            errors.append(f"{path}: must be true or false, got {_describe(v)}")
            return False, None
        return True, v
    if tp is int or tp is float:
        if isinstance(v, str):
            s = interpolate(v, env, path, errors).strip()
            try:
                v = int(s) if tp is int else float(s)
            except ValueError:
                pass
        good = (isinstance(v, int) and not isinstance(v, bool)) or (tp is float and isinstance(v, float))
        lo, hi = meta.get("min"), meta.get("max")
        if good and ((lo is not None and v < lo) or (hi is not None and v > hi)):
            good = False
        if not good:
            kind = "an integer" if tp is int else "a number"
            rng = ""
            if lo is not None and hi is not None:
                rng = f" {lo:g}-{hi:g}" if tp is int else f" from {lo:g} to {hi:g}"
            elif lo is not None:
                rng = f" >= {lo:g}"
            errors.append(f"{path}: must be {kind}{rng}, got {_describe(v)}")
            return False, None
        return True, (float(v) if tp is float else v)
    if tp is str:
        if isinstance(v, bool) or isinstance(v, (dict, list)) or v is None:
            errors.append(f"{path}: must be a string, got {_describe(v)}")
            return False, None
        if isinstance(v, (int, float)):
            v = str(v)
        return True, interpolate(v, env, path, errors)
    if tp is Any:
        return True, v
    raise TypeError(f"config: unsupported field type {tp!r} at {path}")  # pragma: no cover


def _type_name(tp: Any) -> str:
    return {int: "an integer", str: "a string", float: "a number", bool: "true or false"}.get(tp, str(tp))


def _check_url(url: str, schemes: tuple[str, ...], path: str, errors: list[str]) -> None:
    try:
        p = urlsplit(url)
        p.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        errors.append(f"{path}: not a valid URL ({e}): {mask_url(url)!r}")
        return
    if p.scheme not in schemes or not p.hostname:
        errors.append(f"{path}: must be a {'/'.join(s + '://' for s in schemes)} URL with a host, got {mask_url(url)!r}")


def _check_connection(c: ConnectionConfig, path: str, errors: list[str]) -> None:
    _check_url(c.amqp_url, ("amqp", "amqps"), f"{path}.amqp_url", errors)
    _check_url(c.management_url, ("http", "https"), f"{path}.management_url", errors)
    for name in ("ca_cert", "client_cert", "client_key"):
        v = getattr(c.tls, name)
        if v and not os.path.isfile(v):
            errors.append(f"{path}.tls.{name}: file not found: {v!r}")
    if bool(c.tls.client_cert) != bool(c.tls.client_key):
        errors.append(f"{path}.tls: client_cert and client_key go together (one is missing)")


def _check_config(cfg: Config, errors: list[str]) -> None:
    from .keys import check_backup_id, normalize_prefix

    if cfg.backup_id is not None:
        try:
            check_backup_id(cfg.backup_id)
        except ConfigError as e:
            errors.append(e.args[0])
    if cfg.mode == "restore" and not cfg.backup_id:
        errors.append("backup_id: required when mode is restore")
    if cfg.mode == "backup" and cfg.source is None:
        errors.append("source: required when mode is backup")
    if cfg.mode == "restore" and cfg.target is None:
        errors.append("target: required when mode is restore")
    if cfg.mode == "drill" and cfg.source is None and cfg.target is None and cfg.drill.target is None:
        errors.append("drill.target: required when mode is drill and there is no source or target")
    if cfg.drill.target is not None:
        _check_connection(cfg.drill.target, "drill.target", errors)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", cfg.drill.scratch_vhost_prefix or ""):
        errors.append(f"drill.scratch_vhost_prefix: {cfg.drill.scratch_vhost_prefix!r} must be 1-64 letters, digits, "
                      "'.', '_' or '-', starting with a letter or digit")
    if cfg.source is not None:
        _check_connection(cfg.source, "source", errors)
    if cfg.target is not None:
        _check_connection(cfg.target, "target", errors)
    st = cfg.storage
    if st.backend == "filesystem" and not st.path:
        errors.append("storage.path: required when storage.backend is filesystem")
    if st.backend == "s3" and not st.bucket:
        errors.append("storage.bucket: required when storage.backend is s3")
    if st.backend in ("azure", "gcs"):
        errors.append(f"storage.backend: {st.backend} is not supported yet; use s3 or filesystem")
    if st.sse_kms_key_id and st.sse != "aws:kms":
        errors.append("storage.sse_kms_key_id: only used with sse: aws:kms")
    if st.object_lock_mode and st.backend != "s3":
        errors.append("storage.object_lock_mode: only for the s3 backend")
    if st.object_lock_mode and not st.object_lock_retain_days:
        errors.append("storage.object_lock_retain_days: required (> 0) with object_lock_mode")
    if cfg.encryption.enabled and not cfg.encryption.key_id:
        errors.append("encryption.key_id: required when encryption.enabled is true")
    if bool(st.access_key_id) != bool(st.secret_access_key):
        errors.append("storage: access_key_id and secret_access_key go together (one is missing)")
    try:
        normalize_prefix(st.prefix)
    except ConfigError as e:
        errors.append(e.args[0])
    try:
        start, end = cfg.restore.window_ms()
        if start is not None and end is not None and start > end:
            errors.append(f"restore.time_window_start: {start} is after time_window_end {end}")
    except ConfigError as e:
        errors.append(e.args[0])
    if not cfg.metrics.path.startswith("/"):
        errors.append(f"metrics.path: must start with '/', got {cfg.metrics.path!r}")
    for sel_path, sel in (("source.queues", cfg.source.queues if cfg.source else None),
                          ("target.queues", cfg.target.queues if cfg.target else None)):
        if sel is not None and not sel.types:
            errors.append(f"{sel_path}.types: must list at least one of classic, quorum, stream")


# --------------------------------------------------------------------------
# Reference export (README and JSON schema), generated from the dataclasses.
# --------------------------------------------------------------------------


_UNION_ORDER = ("string", "integer", "number", "boolean")


def _field_type_str(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        # sorted: typing caches Union[int, str] and Union[str, int] as one object, so the
        # order of ``args`` depends on which was built first in this process
        names = sorted((_field_type_str(a) for a in args if a is not type(None)),
                       key=lambda n: (_UNION_ORDER.index(n) if n in _UNION_ORDER else len(_UNION_ORDER), n))
        return " or ".join(names)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {_field_type_str(args[0])}"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "section"
    return {int: "integer", str: "string", float: "number", bool: "boolean"}.get(tp, str(tp))


def _default_str(f: dataclasses.Field) -> str:
    if f.metadata.get("required"):
        return "**required**"
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        v = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(v):
            return ""
        return f"`{v!r}`".replace("'", '"') if v else ("`[]`" if isinstance(v, list) else "`{}`")
    if f.default is None:
        return "unset"
    if isinstance(f.default, bool):
        return f"`{str(f.default).lower()}`"
    return f"`{f.default}`"


def iter_fields(cls: type = Config, path: str = ""):
    """(key path, field, type) for every field, depth first."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        p = _join(path, f.name)
        yield p, f, tp
        inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] or ([tp] if dataclasses.is_dataclass(tp) else [])
        for sub in inner:
            yield from iter_fields(sub, p)


def config_reference_markdown() -> str:
    """The configuration reference as Markdown (one table per section)."""
    lines = ["## Configuration reference", "",
             "Generated from `rbak/config.py` (`python -m rbak.config`). Strings accept `${VAR}` and "
             "`${VAR:-default}`; secrets are masked in every log and error.", ""]

    def section(cls: type, path: str) -> None:
        title = f"`{path}`" if path else "Top level"
        lines.extend([f"### {title}", "", (cls.__doc__ or "").strip().replace("\n    ", " "), "",
                      "| Key | Type | Default | Description |", "|---|---|---|---|"])
        subs = []
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            p = _join(path, f.name)
            lines.append(f"| `{p}` | {_field_type_str(tp)} | {_default_str(f)} | {f.metadata.get('doc', '')} |")
            inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] or ([tp] if dataclasses.is_dataclass(tp) else [])
            subs.extend((s, p) for s in inner)
        lines.append("")
        for s, p in subs:
            section(s, p)

    section(Config, "")
    return "\n".join(lines)


def json_schema(cls: type = Config) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of the config file, for editors and CI."""

    def schema_of(tp: Any, meta: typing.Mapping[str, Any]) -> dict[str, Any]:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (Union, types.UnionType):
            opts = [schema_of(a, meta) for a in args if a is not type(None)]
            s = opts[0] if len(opts) == 1 else {"anyOf": opts}
            return {"anyOf": [s, {"type": "null"}]} if type(None) in args else s
        if origin is Literal:
            return {"enum": list(args)}
        if origin is list:
            return {"type": "array", "items": schema_of(args[0], {})}
        if origin is dict:
            return {"type": "object", "additionalProperties": schema_of(args[1], {})}
        if dataclasses.is_dataclass(tp):
            return obj(tp)
        s: dict[str, Any] = {"type": {int: "integer", str: "string", float: "number", bool: "boolean"}[tp]}
        if meta.get("min") is not None:
            s["minimum"] = meta["min"]
        if meta.get("max") is not None:
            s["maximum"] = meta["max"]
        return s

    def obj(c: type) -> dict[str, Any]:
        hints = _hints(c)
        props, req = {}, []
        for f in dataclasses.fields(c):
            s = schema_of(hints[f.name], f.metadata)
            s["description"] = f.metadata.get("doc", "")
            props[f.name] = s
            if f.metadata.get("required"):
                req.append(f.name)
        out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
        if req:
            out["required"] = req
        if c.__doc__:
            out["description"] = " ".join(c.__doc__.split())
        return out

    s = obj(cls)
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    s["title"] = "rbak configuration"
    return s


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--json-schema":
        import json

        print(json.dumps(json_schema(), indent=2))
    else:
        print(config_reference_markdown())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
