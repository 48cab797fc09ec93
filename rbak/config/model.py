"""The configuration model: ``Config``, one of each section, built from plain data and checked across fields.

``validation`` builds it (types, ranges, interpolation); the checks across fields (modes, backends,
encryption, selections) are here, beside the model they read.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional
from urllib.parse import urlsplit

from ..errors import ConfigError
from .fields import _Section, doc_field
from .sections import (
    ArchiveOptions, BackupOptions, ConnectionConfig, DrillConfig, EncryptionConfig, MetricsConfig,
    OffsetStorageConfig, QueueSelection, RestoreOptions, StorageConfig,
)
from .validation import _build, _check_url

if TYPE_CHECKING:
    from ..format.layout import BackupLayout

# LAYOUT_LAZY: rbak.format.layout is imported in the functions that use it. `import rbak.config` takes
# about 0.16 s and loads no numpy, zstandard or lz4; rbak.format (which layout belongs to) takes about 0.7 s
# more (measured with `python -c "import time; ...; import rbak.format.layout"`), and the operator and the
# kubectl plugin import the config without needing the format.


@dataclass(repr=False)
class Config(_Section):
    """A whole rbak configuration file."""

    mode: Literal["backup", "restore", "drill", "archive"] = doc_field(
        None, "`backup`, `restore`, `drill` or `archive` (`rbak drill` reads a config of any mode).", required=True)
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
    archive: ArchiveOptions = doc_field(doc="Continuous stream archiving (`rbak archive`).", factory=ArchiveOptions)

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
            except Exception:  # noqa: BLE001 - a section that failed to build; already reported
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
                "amqp_url": "amqp://guest:guest@localhost:5672",
                "management_url": "http://localhost:15672",
            },
            "storage": {"backend": "filesystem", "path": path},
        }, env={})

    def layout(self) -> BackupLayout:
        """The ``BackupLayout`` of this config's backup id and storage prefix."""
        from ..format.layout import BackupLayout  # noqa: PLC0415 - rbak.config stays light, see LAYOUT_LAZY

        if not self.backup_id:
            raise ConfigError("backup_id: required")
        return BackupLayout(self.backup_id, self.storage.prefix or "")


def default_backup_id(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return "backup-" + now.strftime("%Y%m%dT%H%M%SZ")


def _check_connection(c: ConnectionConfig, path: str, errors: list[str], long_running: bool = False) -> None:
    """``long_running``: ``rbak archive``, which retries a broker that does not answer for ever, so one port
    given for two protocols is refused before any connection; a one-shot run fails at once, naming the port."""
    before = len(errors)
    _check_url(c.amqp_url, ("amqp", "amqps"), f"{path}.amqp_url", errors)
    _check_url(c.management_url, ("http", "https"), f"{path}.management_url", errors)
    if long_running and len(errors) == before:
        _check_ports(c, path, errors)
    for name in ("ca_cert", "client_cert", "client_key"):
        v = getattr(c.tls, name)
        if v and not os.path.isfile(v):
            errors.append(f"{path}.tls.{name}: file not found: {v!r}")
    if bool(c.tls.client_cert) != bool(c.tls.client_key):
        errors.append(f"{path}.tls: client_cert and client_key go together (one is missing)")


def _check_ports(c: ConnectionConfig, path: str, errors: list[str]) -> None:
    """One port given for two protocols: `rbak archive` retried the management port as AMQP for ever."""
    m = urlsplit(c.management_url)
    mgmt = ((m.hostname or "").lower(), m.port or (443 if m.scheme == "https" else 80))
    if (c.host.lower(), c.port) == mgmt:
        errors.append(f"{path}.amqp_url: {c.host}:{c.port} is {path}.management_url's address (the management API "
                      "speaks HTTP): point amqp_url at the broker's AMQP port (5672 by default, 5671 with TLS)")
    elif c.stream_port in (c.port, mgmt[1] if mgmt[0] == c.host.lower() else None):
        errors.append(f"{path}.stream_port: {c.stream_port} is the port of {path}."
                      f"{'amqp_url' if c.stream_port == c.port else 'management_url'}: set the broker's stream "
                      "protocol port (5552 by default)")


def _check_config(cfg: Config, errors: list[str]) -> None:
    """Append to ``errors`` what is wrong across fields (modes, backends, encryption, selections)."""
    from ..format.layout import check_backup_id, normalize_prefix  # noqa: PLC0415 - rbak.config stays light, see LAYOUT_LAZY

    if cfg.backup_id is not None:
        try:
            check_backup_id(cfg.backup_id)
        except ConfigError as e:
            errors.append(e.args[0])
    if cfg.mode == "restore" and not cfg.backup_id:
        errors.append("backup_id: required when mode is restore")
    if cfg.mode in ("backup", "archive") and cfg.source is None:
        errors.append(f"source: required when mode is {cfg.mode}")
    if cfg.mode == "archive" and not _archive_name_ok(cfg.archive.name):
        errors.append(f"archive.name: {cfg.archive.name!r} is not a valid name (letters, digits, '.', '_', '-')")
    taps = cfg.archive.taps
    if taps is not None and not taps.include:
        errors.append("archive.taps.include: name at least one classic or quorum queue to tap (nothing is tapped "
                      "by default)")
    for key, pats in (("include", taps.include), ("exclude", taps.exclude)) if taps is not None else ():
        twice = sorted({p for p in pats if pats.count(p) > 1})
        if twice:  # the second copy would do nothing: a copy-paste slip, likely meant as another queue
            errors.append(f"archive.taps.{key}: {', '.join(map(repr, twice))} listed twice")
    if taps is not None and not re.fullmatch(r"[1-9][0-9]*[YMDhms]", taps.max_age):
        errors.append(f"archive.taps.max_age: {taps.max_age!r} is not a stream max-age (a number and Y, M, D, h, m "
                      "or s, e.g. 7D)")
    if cfg.mode == "restore" and cfg.target is None:
        errors.append("target: required when mode is restore")
    if cfg.mode == "drill" and cfg.source is None and cfg.target is None and cfg.drill.target is None:
        errors.append("drill.target: required when mode is drill and there is no source or target")
    if cfg.drill.target is not None:
        _check_connection(cfg.drill.target, "drill.target", errors)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", cfg.drill.scratch_vhost_prefix or ""):
        errors.append(f"drill.scratch_vhost_prefix: {cfg.drill.scratch_vhost_prefix!r} must be 1-64 letters, digits, "
                      "'.', '_' or '-', starting with a letter or digit")
    if cfg.drill.signing_key_file is not None and cfg.drill.signing_key_env is not None:
        errors.append("drill.signing_key_env: give either it or drill.signing_key_file, not both")
    if cfg.drill.signing_key_file is not None and not Path(cfg.drill.signing_key_file).is_file():
        errors.append(f"drill.signing_key_file: {cfg.drill.signing_key_file!r} is not a readable file")
    if cfg.source is not None:
        _check_connection(cfg.source, "source", errors, long_running=cfg.mode == "archive")
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
    enc = cfg.encryption
    if enc.enabled and not enc.key_id and not (enc.envelope and enc.kms_key_id):
        errors.append("encryption.key_id: required when encryption.enabled is true"
                      + (" (or encryption.kms_key_id with envelope: true)" if enc.envelope else ""))
    named = [f"encryption.{n}" for n in ("key_id", "keys_file", "keys_env", "kms_key_id") if getattr(enc, n)]
    named += ["encryption.envelope"] if enc.envelope else []
    if cfg.mode in ("backup", "archive") and not enc.enabled and named:  # never a silent plaintext backup or archive
        errors.append(f"encryption.enabled: is false but {', '.join(named)} is set: this {cfg.mode} would be stored "
                      f"in plaintext; set encryption.enabled: true to encrypt it, or remove the encryption section")
    if enc.kms_key_id and not enc.envelope:
        errors.append("encryption.kms_key_id: a KMS key only wraps data keys: set encryption.envelope: true")
    for name in ("kms_region", "kms_endpoint_url"):
        if getattr(enc, name) is not None and not getattr(enc, name).strip():
            errors.append(f"encryption.{name}: must not be empty")
    if enc.kms_endpoint_url and not enc.kms_endpoint_url.startswith(("http://", "https://")):
        errors.append(f"encryption.kms_endpoint_url: {enc.kms_endpoint_url!r} is not an http(s) URL")
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
    for sel_path, conn in (("target.queues", cfg.target), ("drill.target.queues", cfg.drill.target)):
        if conn is not None and conn.queues != QueueSelection():
            errors.append(f"{sel_path}: not used, so it would select nothing: a restore selects queues with "
                          f"restore.queues, and a drill covers every queue of the backup; move it or remove it")
    if cfg.backup.definitions_only:
        if not cfg.backup.include_definitions:
            errors.append("backup.definitions_only: needs backup.include_definitions: true (it would back up nothing)")
        if cfg.source is not None and cfg.source.queues != QueueSelection():
            errors.append("source.queues: not used with backup.definitions_only: true (no queue is backed up); "
                          "remove one of them")
    for sel_path, sel in (("source.queues", cfg.source.queues if cfg.source else None),
                          ("target.queues", cfg.target.queues if cfg.target else None)):
        if sel is not None and not sel.types:
            errors.append(f"{sel_path}.types: must list at least one of classic, quorum, stream")


def _archive_name_ok(name: str) -> bool:
    from ..format.layout import BACKUP_ID_RE  # noqa: PLC0415 - rbak.config stays light, see LAYOUT_LAZY

    return bool(BACKUP_ID_RE.match(name)) and ".." not in name and len(name) <= 160
