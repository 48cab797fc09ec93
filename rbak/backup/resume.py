"""What a run finds of its backup id, and of earlier backups, before it reads anything.

A complete backup is never touched (unless ``backup.overwrite``); an incomplete or partial one is
resumed with its own data key and encryption, and only by a run of the same origin (cluster,
vhost scope, owner). The checkpoint is seeded with another machine's progress for this id and the
newest complete backup's stream offsets and delivery guards.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..repo.catalog import latest_complete
from ..sealing.crypto import ObjectCodec, codec_for
from ..sealing.envelope import data_key, with_data_key
from ..errors import ConfigError, NotFoundError, RbakError
from ..format.manifest import BackupManifest, BackupOrigin, EncryptionInfo
from ..format.layout import BackupLayout
from .checkpoint import Checkpoint

if TYPE_CHECKING:
    from .services import RunServices

log = logging.getLogger("rbak.backup.engine")  # the run's log lines keep the engine's name (log filters, docs)


def describe_encryption(info: EncryptionInfo | None) -> str:
    if info is None:
        return "no encryption"
    return "envelope encryption" if info.envelope else f"key id {info.key_id!r}"


def check_origin(eng: RunServices, old: BackupManifest, origin: BackupOrigin) -> None:
    """One backup holds one source's messages: a run of another cluster, vhost set or owner never
    resumes, completes or replaces it (two objects sharing a storage and an id would mix clusters)."""
    if old.origin is not None:
        if old.origin == origin:
            return
        was = old.origin.describe()
    elif old.source_cluster is None or old.source_cluster == origin.cluster:
        return  # written before origins were recorded: its cluster is all there is to compare
    else:
        was = f"cluster {old.source_cluster!r}"
    raise ConfigError(f"backup_id: the {old.state} backup {eng.backup_id!r} in {eng.storage.url} is of {was}; "
                      f"this run is of {origin.describe()}: choose another backup_id")


def check_existing(eng: RunServices, origin: BackupOrigin) -> tuple[int, bool]:
    """(created_at of the manifest, fresh): ``fresh`` when no usable manifest of this id is in this
    storage, so local progress is stale. Refuses a complete backup (unless ``backup.overwrite``)."""
    layout, storage, backup_id = eng.layout, eng.storage, eng.backup_id
    now = int(time.time() * 1000)
    if eng.write_once:
        used = next(iter(storage.list(layout.root + "/")), None)
        if used is not None:
            raise ConfigError(
                f"backup_id: {backup_id!r} already has objects in {storage.url} ({used}); with "
                f"storage.object_lock_mode every object is written once, so a backup id cannot be resumed or "
                f"reused: choose another backup_id")
        return now, False
    try:
        data = storage.get(layout.manifest)
    except NotFoundError:
        return now, True  # whatever local progress says, nothing of this id is in THIS storage
    old = BackupManifest.from_json(data, layout.manifest)
    check_origin(eng, old, origin)
    retry = old.is_partial and not eng.cfg.backup.overwrite  # its failed queues are backed up again
    if not old.is_complete or retry:
        adopt_data_key(eng, old)
        if old.encryption != eng.codec.info:  # one backup's objects are never sealed two ways
            was, has = describe_encryption(old.encryption), describe_encryption(eng.codec.info)
            raise ConfigError(f"encryption: the {old.state} backup {backup_id!r} was started with {was}, "
                              f"this configuration has {has}; resume it with the same encryption settings or use "
                              "another backup_id")
    if retry:
        log.warning("backup %s is partial: retrying its refused/failed queues (%s)", backup_id,
                    ", ".join(f"{q.vhost}/{q.name}" for q in old.queue_status if q.status != "skipped"))
        return old.created_at, False
    if old.is_complete:
        if not eng.cfg.backup.overwrite:
            raise ConfigError(
                f"backup_id: backup {backup_id!r} already exists and is complete in {storage.url} "
                f"({layout.manifest}); choose another backup_id (backup.overwrite: true replaces it)")
        log.warning("overwriting the complete backup %s (backup.overwrite)", backup_id)
        storage.delete_prefix(layout.root + "/")
        return now, True
    log.info("resuming the incomplete backup %s", backup_id)
    return old.created_at, False


def adopt_data_key(eng: RunServices, old: BackupManifest) -> None:
    """Resuming (or retrying) an envelope backup: seal with ITS data key, unwrapped with this config's
    keys, and store no new wraps; one backup never mixes two data keys."""
    if not (old.encryption and old.encryption.envelope and eng.codec.info and eng.codec.info.envelope):
        return
    dek, _ = data_key(eng.storage, eng.layout, old.encryption, eng.cfg.encryption.key_sources())
    eng.codec = ObjectCodec(eng.backup_id, old.encryption, dek)


def keyring(eng: RunServices) -> dict[str, bytes]:
    """Keys for reading earlier backups; a keyring that cannot be read only costs incremental offsets."""
    try:
        return eng.cfg.encryption.keyring()
    except ConfigError as e:
        log.warning("cannot read the encryption keyring: %s", e)
        return {}


def seed_checkpoint(eng: RunServices, ckpt: Checkpoint, cluster: str) -> None:
    """Another machine's progress for this id, and the newest complete backup's stream offsets/guards."""
    storage, prefix = eng.storage, eng.cfg.storage.prefix or ""
    if not ckpt.has_backup():
        ckpt.seed_from_storage(storage, eng.layout.offsets_db, own_backup=True, cross=True, codec=eng.codec)
    try:
        entry = latest_complete(storage, prefix)
    except RbakError as e:
        log.warning("cannot list earlier backups for incremental stream offsets: %s", e)
        return
    if entry is None or entry.backup_id == eng.backup_id:
        return
    previous = entry.manifest
    assert previous is not None  # latest_complete: a complete backup, so with its manifest
    if previous.source_cluster != cluster:
        return
    prev = BackupLayout(entry.backup_id, prefix)
    try:
        ring = with_data_key(storage, prefix, entry.backup_id, previous.encryption, keyring(eng),
                             eng.cfg.encryption.kms(), required=False)
        codec = codec_for(entry.backup_id, previous.encryption, ring, required=False)
        if not codec.can_open:
            assert previous.encryption is not None  # an unencrypted backup's codec can always open
            log.warning("no key for the previous backup %r (key id %r): streams are read from the start",
                        entry.backup_id, previous.encryption.key_id)
            return
        data = codec.get(storage, prev.offsets_db)
    except NotFoundError:
        return
    ckpt.merge_from_bytes(data, own_backup=False, cross=True, completed_backup=entry.backup_id, source=cluster)
