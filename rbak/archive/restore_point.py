"""What a restore of an archive generation may be asked: one rule for ``rbak restore`` and the Spark
restore, so a point in time either restore takes means the same records and one refused by either is
refused by both (a Spark job that silently restored past the recoverable-until would claim records
that are not known complete across streams).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import yaml

from ..config import Config, load_config
from ..errors import ConfigError
from ..format.manifest import BackupManifest
from ..repo.catalog import archive_generations
from ..storage.base import Storage


def utc(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


ARCHIVE_PENDING = "archive.pending"  # a config's backup_id until ``--archive``'s newest generation is found


def archive_restore_config(path: str, name: str) -> Config:
    """A restore config for ``--archive NAME``: the archive's newest generation is the one restored, so a
    config that also names a ``backup_id`` is refused (one of the two would be ignored). Its ``backup_id``
    is ``ARCHIVE_PENDING`` until the caller has found that generation in the config's storage."""
    cfg = load_config(path, overrides={"backup_id": ARCHIVE_PENDING})
    if "backup_id" in (yaml.safe_load(Path(path).read_text()) or {}):
        raise ConfigError(f"--archive {name}: {path} names a backup_id; give one of the two")
    return cfg


def newest_generation(storage: Storage, name: str, prefix: str, flag: str = "--archive") -> tuple[str, int]:
    """(backup id of archive ``name``'s newest generation, how many it has): a restore of it walks every
    older one. Raises ``NotFoundError`` naming the archives the storage does hold."""
    gens = archive_generations(storage, name, prefix, flag)
    return gens[-1].backup_id, len(gens)


def recoverable_end(m: BackupManifest, flag: str) -> int:
    """The point in time ``recoverable`` names: generation ``m``'s recoverable-until (epoch ms)."""
    if m.archive is None or m.archive.recoverable_until is None:
        raise ConfigError(f"{flag} recoverable: backup {m.backup_id!r} is not a generation of an archive "
                          "with a recoverable-until time")
    return m.archive.recoverable_until


def check_archive_end(storage: Storage, m: BackupManifest, prefix: str, end: int, flag: str) -> None:
    """A point in time an archive generation cannot stand for is refused: past its recoverable-until (later
    records are not known complete across streams), or before the archive's first generation (nothing)."""
    info = m.archive
    if info is None:
        return
    if info.recoverable_until is None:
        raise ConfigError(f"{flag}: generation {m.backup_id!r} of archive {info.name!r} holds no recoverable-until "
                          "yet: nothing in it is known complete")
    if end > info.recoverable_until:
        raise ConfigError(f"{flag}: {utc(end)} is after the archive's recoverable-until {utc(info.recoverable_until)} "
                          f"(generation {m.backup_id!r} of archive {info.name!r}): records after it are not known "
                          f"complete across streams; restore the newest generation (--archive {info.name}), "
                          "'recoverable', or an earlier time")
    gens = archive_generations(storage, info.name, prefix)
    first = gens[0] if gens else m
    if end < first.created_at:
        raise ConfigError(f"{flag}: {utc(end)} is before archive {info.name!r} began ({utc(first.created_at)}, "
                          f"its first generation {first.backup_id!r}): no record is stamped that early, "
                          "nothing would be restored")


def refuse_definitions(m: BackupManifest, flag: str) -> None:
    """An archive generation stores no definitions: asking to import them is refused before anything is done,
    rather than failing as a missing object once the restore has started."""
    if m.archive is not None:
        raise ConfigError(f"{flag}: backup {m.backup_id!r} is a generation of archive {m.archive.name!r}, which "
                          "stores no definitions: declare its streams in the target first (or import a definitions "
                          "export taken by rbak backup or rbak definitions-export), then restore without it")
