"""Deleting a whole backup, honouring S3 Object Lock.

With ``storage.object_lock_mode`` every object of a backup is locked for
``object_lock_retain_days`` from when it was put; the manifest is put last,
so its lock is the backup's latest but for drill reports, put later with their own locks.
Retention asks ``retained_until`` first
and leaves a still-locked backup alone (it is deleted by a later pass once
the lock has expired) instead of trying deletes S3 would refuse or hide
behind delete markers.
"""

from __future__ import annotations

import datetime as _dt

from ..format.layout import BackupLayout, progress_prefix
from ..storage.base import Storage


def retained_until(storage: Storage, backup_id: str, prefix: str | None = "") -> _dt.datetime | None:
    """When the last object lock of a backup expires (its manifest's, or a later drill report's), or
    None if nothing is locked."""
    layout = BackupLayout(backup_id, prefix)
    until = storage.locked_until(layout.manifest)
    if until is None and not storage.exists(layout.manifest):
        # no manifest (a failed write-once run): the newest lock among its objects
        locks = [storage.locked_until(k) for k in storage.list(layout.root + "/")]
        return max((u for u in locks if u is not None), default=None)
    # drill reports are put after the manifest, each with its own (later) lock
    locks = [until] + [storage.locked_until(k) for k in storage.list(layout.drills_dir)]
    return max((u for u in locks if u is not None), default=None)


def delete_backup(storage: Storage, backup_id: str, prefix: str | None = "",
                  now: _dt.datetime | None = None) -> _dt.datetime | None:
    """Delete a whole backup, manifest first (a half-deleted backup reads as incomplete, never as
    complete-but-damaged). Returns None when deleted, or the time its object lock expires when it
    is still locked (nothing deleted)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    until = retained_until(storage, backup_id, prefix)
    if until is not None and until > now:
        return until
    layout = BackupLayout(backup_id, prefix)
    # a backup that was locked lives in a versioned bucket: remove every version, not just hide it
    remove = storage.purge if (until is not None or storage.write_once) else storage.delete
    remove(layout.manifest)
    for key in list(storage.list(layout.root + "/")):
        remove(key)
    # its live progress records beside it (kept on write-once storage, or left by a killed run);
    # one locked a moment longer than the manifest is left for the bucket's lifecycle rule
    for key in list(storage.list(progress_prefix(prefix, "backup", backup_id))):
        lock = storage.locked_until(key)
        if lock is None or lock <= now:
            remove(key)
    return None
