"""Finding backups in storage and loading their manifests."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import orjson

from ..errors import ManifestError, NotFoundError, StorageError
from ..format.archive import TICK_DIR, Tick, assemble
from ..format.manifest import BackupManifest
from ..format.layout import MANIFEST_NAME, BACKUP_ID_RE, VALIDATION_DIR, BackupLayout, normalize_prefix, rebase_key
from ..storage.base import Storage

log = logging.getLogger("rbak.catalog")  # the name log filters and docs know, kept when the module moved to repo/


@dataclass(frozen=True, slots=True)
class BackupEntry:
    """One backup folder found in storage; ``manifest`` is None when it has none. ``unreadable``: its
    manifest is there but could not be read (a storage error: permissions, I/O) or parsed; ``error`` says
    which key and why. ``note``: why a folder without a manifest is probably no backup at all."""

    backup_id: str
    manifest: BackupManifest | None
    error: str | None = None
    unreadable: bool = False
    note: str | None = None

    @property
    def complete(self) -> bool:
        return self.manifest is not None and self.manifest.is_complete

    @property
    def completed_at(self) -> int | None:
        """The manifest's ``completed_at`` (None without a manifest)."""
        return self.manifest.completed_at if self.manifest is not None else None

    @property
    def status(self) -> str:
        if self.error:
            return "unreadable"
        return self.manifest.state if self.manifest is not None else "incomplete"


def load_manifest(storage: Storage, backup_id: str, prefix: str | None = "") -> BackupManifest:
    layout = BackupLayout(backup_id, prefix)
    key = layout.manifest
    try:
        data = storage.get(key)
    except NotFoundError:
        m = open_archive_manifest(storage, layout.root)
        if m is None:
            raise NotFoundError(f"{storage.url}: backup {backup_id!r} has no manifest (no object at {key!r})") from None
        return rebase_manifest(m, layout)
    return rebase_manifest(BackupManifest.from_json(data, where=key), layout)


def open_archive_manifest(storage: Storage, root: str) -> BackupManifest | None:
    """An open generation of a continuous archive (``rbak archive``): its manifest assembled from its
    ticks (``format.archive``), complete up to the last tick; None when ``root`` has no ticks."""
    keys = sorted(k for k in storage.list(f"{root}/{TICK_DIR}/") if k.endswith(".json"))
    if not keys:
        return None
    return assemble([Tick.from_json(storage.get(k), k) for k in keys], open_=True)


def rebase_manifest(m: BackupManifest, layout: BackupLayout) -> BackupManifest:
    """Every key of ``m`` relative to where it was found (``keys.rebase_key``): one URL/prefix rule
    for every reader (CLI, operator Jobs, Spark), whether the prefix is in the URL or in ``--prefix``."""
    for q in m.queues:
        for s in q.segments:
            s.key = rebase_key(s.key, layout)
    if m.definitions is not None:
        m.definitions.key = rebase_key(m.definitions.key, layout)
    return m


def list_backups(storage: Storage, prefix: str | None = "") -> list[BackupEntry]:
    """Every backup folder under the prefix, sorted by creation time then id. A manifest that cannot be
    read or parsed is an entry with ``unreadable`` and its ``error`` (naming the key), not a failure."""
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
            try:
                opened = open_archive_manifest(storage, f"{base}{name}")
                entries.append(BackupEntry(name, opened, note=None if opened else _prefix_folder(storage, base, name)))
            except (ManifestError, NotFoundError) as e:
                entries.append(BackupEntry(name, None, error=str(e)))
        except (ManifestError, StorageError) as e:  # one unreadable manifest never hides the others
            entries.append(BackupEntry(name, None, error=str(e), unreadable=True))
    entries.sort(key=lambda e: (e.manifest.created_at if e.manifest else 0, e.backup_id))
    return entries


def archive_generations(storage: Storage, name: str, prefix: str | None = "", flag: str | None = None
                        ) -> list[BackupManifest]:
    """Archive ``name``'s generations, oldest first (an open one as its ticks assemble it), in one listing:
    by the manifest's archive name, never by the id's prefix (``orders-eu.<time>`` is not archive
    ``orders``'s). ``flag`` (e.g. ``--archive``): none found is a ``NotFoundError`` under that name that
    lists the archives the storage holds, so a typo'd name is plain; else an empty list."""
    found = _archive_manifests(storage, prefix)
    gens = sorted((m for m in found if m.archive is not None and m.archive.name == name),
                  key=lambda m: (m.created_at, m.backup_id))
    if not gens and flag is not None:
        names = _names(found)
        raise NotFoundError(f"{flag} {name}: no generation of archive {name!r} at {storage.url}"
                            + (f" (prefix {prefix!r})" if prefix else "")
                            + (f"; archives there: {', '.join(map(repr, names))}" if names else "; it holds no archive"))
    return gens


def archive_names(storage: Storage, prefix: str | None = "") -> list[str]:
    """The names of the archives whose generations the storage holds under ``prefix``."""
    return _names(_archive_manifests(storage, prefix))


def _archive_manifests(storage: Storage, prefix: str | None) -> list[BackupManifest]:
    return [e.manifest for e in list_backups(storage, prefix) if e.manifest is not None and e.manifest.archive is not None]


def _names(generations: list[BackupManifest]) -> list[str]:
    return sorted({m.archive.name for m in generations if m.archive is not None})


def _prefix_folder(storage: Storage, base: str, name: str) -> str | None:
    """Why folder ``name`` (no manifest, no ticks) is no backup when it holds backups of its own: a storage
    prefix listed from above (``rbak list --path s3://bucket`` for backups written under ``prod/``)."""
    for sub in storage.list_dirs(f"{base}{name}/")[:20]:
        if BACKUP_ID_RE.match(sub) and storage.exists(f"{base}{name}/{sub}/{MANIFEST_NAME}"):
            return (f"not a backup: a folder of backups ({sub!r}, ...); list them with --prefix "
                    f"{(base + name).strip('/')}")
    return None


def newest_report(storage: Storage, folder: str, accept: Callable[[str], bool]) -> tuple[str, dict | str] | None:
    """(key, report) of the newest JSON report in ``folder`` whose file name ``accept`` takes, or
    (key, why it is unreadable), or None when there is none. Report names start with a UTC stamp
    that sorts as text (validation reports, drill reports)."""
    keys = sorted(k for k in storage.list(folder) if k.endswith(".json") and accept(k.rsplit("/", 1)[-1]))
    if not keys:
        return None
    try:
        report = orjson.loads(storage.get(keys[-1]))
        if not isinstance(report, dict):
            raise ValueError("not a JSON object")
    except (ValueError, NotFoundError) as e:
        return keys[-1], str(e)
    return keys[-1], report


def latest_validation(storage: Storage, backup_id: str, prefix: str | None = "") -> tuple[str, dict] | None:
    """(key, report) of the newest validation report stored next to a backup, or None.

    Reports are written by ``rbak validate --write-report`` (the operator's
    in-pod validation) and the Spark validation job, as
    ``validation/report-<utc stamp>.json``. An unreadable report counts as a
    failed validation (``ok`` false).
    """
    found = newest_report(storage, f"{BackupLayout(backup_id, prefix).root}/{VALIDATION_DIR}/",
                          lambda name: name.startswith("report-"))
    if found is None:
        return None
    key, report = found
    if isinstance(report, str):
        return key, {"ok": False, "all_problems": [f"unreadable validation report: {report}"]}
    return key, report


def validation_failed(report: dict) -> bool:
    """A stored report that proves the backup damaged. An unverified one (a deep check that could not
    decrypt) is neither a pass nor a failure: the backup counts as never validated."""
    return report.get("ok") is False and report.get("result") != "unverified"


def latest_complete(storage: Storage, prefix: str | None = "", with_data: bool = False,
                    skipped_empty: list[str] | None = None,
                    accept: Callable[[BackupEntry], bool] = lambda _e: True) -> BackupEntry | None:
    """The newest complete backup whose last validation (if any) did not fail (of those ``accept`` takes:
    the operator's restores take only the referenced object's own backups).

    A backup proven damaged is never picked by default: restores without a
    backup id and incremental stream offsets skip it, with a warning.
    ``with_data`` (restores and drills without an id): also skip backups that hold no message
    (``BackupManifest.content == "empty"``), naming each in ``skipped_empty``; a broken selection
    that backs up nothing every night must never displace the last backup holding data.
    """
    done = sorted((e for e in list_backups(storage, prefix) if e.complete and accept(e)),
                  key=lambda e: (e.completed_at, e.backup_id), reverse=True)
    for e in done:
        if with_data and e.manifest is not None and e.manifest.content == "empty":
            log.warning("skipping backup %r: it holds no message (empty; pass its id to restore it anyway)",
                        e.backup_id)
            if skipped_empty is not None:
                skipped_empty.append(e.backup_id)
            continue
        found = latest_validation(storage, e.backup_id, prefix)
        if found is not None and validation_failed(found[1]):
            log.warning("skipping backup %r: its last validation failed (%s)", e.backup_id, found[0])
            continue
        return e
    return None
