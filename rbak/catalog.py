"""Finding backups in storage and loading their manifests."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ManifestError, NotFoundError
from .format.manifest import BackupManifest
from .keys import MANIFEST_NAME, BACKUP_ID_RE, BackupLayout, normalize_prefix
from .storage.base import Storage


@dataclass(frozen=True, slots=True)
class BackupEntry:
    """One backup folder found in storage; ``manifest`` is None when it has none."""

    backup_id: str
    manifest: BackupManifest | None
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.manifest is not None and self.manifest.is_complete

    @property
    def status(self) -> str:
        if self.error:
            return "unreadable"
        return "complete" if self.complete else "incomplete"


def load_manifest(storage: Storage, backup_id: str, prefix: str | None = "") -> BackupManifest:
    key = BackupLayout(backup_id, prefix).manifest
    try:
        data = storage.get(key)
    except NotFoundError:
        raise NotFoundError(f"{storage.url}: backup {backup_id!r} has no manifest (no object at {key!r})") from None
    return BackupManifest.from_json(data, where=key)


def list_backups(storage: Storage, prefix: str | None = "") -> list[BackupEntry]:
    """Every backup folder under the prefix, sorted by creation time then id."""
    base = normalize_prefix(prefix)
    base = base + "/" if base else ""
    entries = []
    for name in storage.list_dirs(base):
        if not BACKUP_ID_RE.match(name):
            continue
        try:
            manifest = BackupManifest.from_json(storage.get(f"{base}{name}/{MANIFEST_NAME}"), f"{base}{name}/{MANIFEST_NAME}")
            entries.append(BackupEntry(name, manifest))
        except NotFoundError:
            entries.append(BackupEntry(name, None))
        except ManifestError as e:
            entries.append(BackupEntry(name, None, error=str(e)))
    entries.sort(key=lambda e: (e.manifest.created_at if e.manifest else 0, e.backup_id))
    return entries


def latest_complete(storage: Storage, prefix: str | None = "") -> BackupEntry | None:
    done = [e for e in list_backups(storage, prefix) if e.complete]
    return max(done, key=lambda e: (e.manifest.completed_at, e.backup_id)) if done else None
