"""Live progress of running backup/restore Jobs in the resources' status.

Why storage: the Job's pod gets no Kubernetes API rights at all (no RBAC on
custom resources, not even on its own pod), and pod logs or termination
messages are either unreadable while it runs or only its last words. The CLI
already writes to the backup storage, so it stores a small progress record
every few seconds under ``{prefix}/_progress/{backup|restore}/{run}/`` (one
new key per update: Object Lock mode is never asked to rewrite an object;
outside it the Job deletes its old records as it goes). The operator already
reads that storage for manifests, retention and reports.

One follower task per RabbitMQBackup / RabbitMQRestore with a running Job
(``status.active`` / ``phase: Running``): the object's watch event starts it
when a run starts (handlers.py, tasks.py), and it ends itself once the fresh
object shows no running Job, so an idle object costs nothing. Each tick is one storage LIST + one GET and a
status patch only when something changed. The reconcile loop clears
``status.progress`` when the run ends (its counts then come from the
manifest, as before).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

from rbak.errors import RbakError
from rbak.repo.progress import latest_progress
from rbak_operator.crds.schema import BACKUP_PLURAL, RESTORE_PLURAL
from rbak_operator.decide import rbakconfig
from rbak_operator.decide.naming import run_backup_id
from rbak_operator.decide.progress import INTERVAL, progress_patch, watched_run
from rbak_operator.kube.client import ApiError, Kube
from rbak_operator.metrics.resources import observe  # the gauges follow every status written
from rbak_operator.reconcile.storage import open_backup_storage
from rbak_operator.runtime import blocking

log = logging.getLogger("rbak_operator.reconcile.progress")



# --------------------------------------------------------------------------
# the follower
# --------------------------------------------------------------------------

_storages: dict[tuple[str, str], tuple[float, Any]] = {}
_lock = threading.Lock()
STORAGE_TTL = 300.0  # re-read the credentials Secret now and then: rotated keys are picked up


def _storage(kube, namespace: str, storage_spec: dict[str, Any]):
    """The object's storage, opened once per spec for a few minutes (a Secret read and a new S3 client
    on every tick would not be cheap)."""
    key = (namespace, json.dumps(storage_spec, sort_keys=True))
    now = time.monotonic()
    with _lock:
        hit = _storages.get(key)
    if hit is not None and now - hit[0] < STORAGE_TTL:
        return hit[1]
    st = open_backup_storage(kube, namespace, storage_spec)
    with _lock:
        if st is None:
            _storages.pop(key, None)
        else:
            _storages[key] = (now, st)
    return st


def poll(kube, kind: str, namespace: str, name: str) -> str | None:
    """One tick: read the newest record of the object's running Job and patch the status if it changed.
    The run followed, or None when the object is gone or runs no Job (the follower then ends)."""
    plural = BACKUP_PLURAL if kind == "backup" else RESTORE_PLURAL
    body = kube.get_cr(plural, namespace, name)  # fresh: the run may have ended since kopf's last event
    if body is None:
        return None
    status, spec = body.get("status") or {}, body.get("spec") or {}
    run = watched_run(kind, status)
    if run is None:
        return None
    storage_spec = spec.get("storage")
    if kind == "restore" and spec.get("backupRef"):
        backup = kube.get_backup(namespace, spec["backupRef"]["name"]) or {}
        storage_spec = (backup.get("spec") or {}).get("storage")
    if not storage_spec:
        return run
    st = _storage(kube, namespace, storage_spec)
    if st is None:  # a PVC the operator does not mount
        return run
    # records are stored under the run's backup id (unique across namespaces sharing the storage)
    key = run_backup_id(run, namespace, (body.get("metadata") or {}).get("uid"))
    rec = latest_progress(st, rbakconfig.storage_prefix(storage_spec), kind, key)
    patch = progress_patch(status, run, rec, key)
    if patch:
        observe(plural, kube.patch_status(plural, namespace, name, patch))
    return run


async def follow(kind: str, namespace: str, name: str, stopped: asyncio.Event, logger) -> None:
    """Poll every INTERVAL seconds while the object runs a Job (the calls on the operator's progress pool)."""
    kube = Kube()
    while not stopped.is_set():
        try:
            if await blocking.run(poll, kube, kind, namespace, name, pool=blocking.POLLS) is None:
                return
        except (RbakError, ApiError) as e:  # progress is best effort; the next tick tries again
            logger.debug("progress of %s %s/%s: %s", kind, namespace, name, e)
        except Exception as e:  # noqa: BLE001 - a storage client's own error must not end the follower
            log.warning("progress of %s %s/%s: %s", kind, namespace, name, e)
        try:
            await asyncio.wait_for(stopped.wait(), INTERVAL)
        except asyncio.TimeoutError:
            pass
