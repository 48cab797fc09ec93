"""kopf handlers: the glue between kopf and the operator's own runtime.

kopf delivers the watch events of our objects and of the Jobs and SparkApplications they own, logs in,
and runs the start-up and cleanup hooks; nothing else. Each event wakes or starts the object's loop
(``runtime.loop``, whose docstring is the per-object model) with its kind's pass
(``reconcile.backup.backup_pass`` / ``reconcile.restore.restore_pass`` /
``reconcile.archive.archive_pass``), and a running Job's progress
follower (``reconcile.progress``). Deletion with ``deletionPolicy: delete``, metrics start-up and the
per-resource gauges of a deleted object are here too; which replica runs all this is
``runtime.leader``'s (a Lease). Run with ``kopf run -m rbak_operator.handlers`` or ``python -m rbak_operator``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from rbak.errors import RbakError
from rbak_operator.crds.schema import (
    ARCHIVE_PLURAL,
    BACKUP_PLURAL,
    GROUP,
    RESTORE_PLURAL,
    SPARK_GROUP,
    SPARK_PLURAL,
    SPARK_VERSION,
    VERSION,
)
from rbak_operator.decide import bodies, policy
from rbak_operator.decide.progress import watched_run
from rbak_operator.kube.client import Kube, connection_info
from rbak_operator.kube.errors import ApiError
from rbak_operator.kube.events import post as _event
from rbak_operator.metrics import resources as resource_metrics
from rbak_operator.metrics import runs as metrics
from rbak_operator.reconcile import archive as archive_reconciler
from rbak_operator.reconcile import progress
from rbak_operator.reconcile.backup import backup_pass, reconcile_backup  # noqa: F401 (reconcile_backup: tests call it here)
from rbak_operator.reconcile.restore import reconcile_restore, restore_pass  # noqa: F401 (reconcile_restore: tests call it here)
from rbak_operator.reconcile.storage import delete_owned_backups
from rbak_operator.runtime import loop, tasks, wakeups

log = logging.getLogger("rbak_operator")

# --------------------------------------------------------------------------
# start-up and cleanup: settings, metrics, our tasks
# --------------------------------------------------------------------------

@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # log lines are not events; runs post their own
    settings.persistence.finalizer = "rbak.io/finalizer"
    # A watch the server ends is resumed from its last resourceVersion (kopf), so no event is lost.
    settings.watching.server_timeout = int(os.environ.get("RBAK_OPERATOR_WATCH_TIMEOUT_SECONDS", "300"))  # an integer: the server refuses "3.0"
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    # Only our own Jobs and SparkApplications, filtered by the server: a cluster's other Jobs never reach us.
    managed = f"{bodies.L_MANAGED}=rbak-operator"
    settings.watching.label_selectors["batch/v1/jobs"] = managed
    settings.watching.label_selectors[f"{SPARK_GROUP}/{SPARK_VERSION}/{SPARK_PLURAL}"] = managed
    port = metrics.serve()
    if port:
        log.info("metrics on :%d/metrics", port)


@kopf.on.cleanup()
async def stop_tasks(**_: Any) -> None:
    await tasks.stop_all()


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """In-cluster service account or kubeconfig (exec/OIDC plugins too), as the kubernetes client reads them
    for the operator's own calls (kube/client.py): one configuration for both."""
    return connection_info()


def _restore_pass(kube: Kube, namespace: str, name: str, logger) -> tuple[Any, list]:
    """A restore waits on its run's events, and on the start bound of a pod that waits to start."""
    return restore_pass(kube, namespace, name, logger)


def _ensure_tasks(kind: str, namespace: str, name: str, status: Any, logger: Any) -> None:
    """The object's reconcile loop, and while a Job of it runs, its progress follower."""
    key = (kind, namespace, name)
    reconcile = backup_pass if kind == "backup" else _restore_pass
    if kind == "restore" and (status or {}).get("phase") in ("Succeeded", "Failed"):
        return  # a finished restore has nothing left to do (its pass would only say so)
    tasks.ensure(key, lambda: loop.run(reconcile, kind, name, namespace, tasks.stopping(), logger))
    if watched_run(kind, status) is not None:
        tasks.ensure((*key, "progress"), lambda: progress.follow(kind, namespace, name, tasks.stopping(), logger))


DELETE_RETRY_SECS = 30  # an archive's deletion retried while its archiver's pod still runs


def _delete_policy(spec: kopf.Spec, **_: Any) -> bool:
    return spec.get("deletionPolicy") == "delete"


@kopf.on.delete(GROUP, VERSION, BACKUP_PLURAL, when=_delete_policy)
def backup_delete(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    """deletionPolicy: delete removes the stored backups this object made (object-locked ones stay until
    their lock expires: S3 refuses earlier). Never blocks deletion."""
    try:
        outcome = delete_owned_backups(Kube(), body, logger)
        if outcome is not None:
            deleted, locked = outcome
            _event(body, "Normal", "BackupsDeleted", f"deleted {len(deleted)} stored backups (deletionPolicy delete)"
                   + (f"; kept {len(locked)} still object-locked: {', '.join(locked)}" if locked else ""))
    except (RbakError, ApiError) as e:
        # A missing Secret (namespace teardown) must not hang deletion: report and let go.
        _event(body, "Warning", "BackupsKept", f"could not delete stored backups: {e}")
        logger.warning("deletionPolicy delete: %s; letting the object go, backups kept", e)


@kopf.on.event(GROUP, VERSION, BACKUP_PLURAL)
async def backup_event(type: str, body: kopf.Body, name: str, namespace: str | None,  # noqa: A002 - kopf's keyword
                       logger: kopf.Logger, **_: Any) -> None:
    """Wake the object's loop when its spec, annotations or deletion changed (not for our own status
    patches); keep the index of sources; a deleted one's per-resource gauges go with it."""
    namespace = namespace or ""
    key = ("backup", namespace, name)
    if type == "DELETED":
        resource_metrics.forget(BACKUP_PLURAL, namespace, name)
        wakeups.poke(key)
        wakeups.forget(key)
        return
    wakeups.remember_source(namespace, name, policy.source_of(body.get("spec") or {}, namespace))
    if wakeups.object_changed(key, body):
        wakeups.poke(key)
    _ensure_tasks("backup", namespace, name, body.get("status"), logger)


@kopf.on.event(GROUP, VERSION, RESTORE_PLURAL)
async def restore_event(type: str, body: kopf.Body, name: str, namespace: str | None,  # noqa: A002
                        logger: kopf.Logger, **_: Any) -> None:
    namespace = namespace or ""
    key = ("restore", namespace, name)
    if type == "DELETED":
        resource_metrics.forget(RESTORE_PLURAL, namespace, name)
        wakeups.poke(key)
        wakeups.forget(key)
        return
    if wakeups.object_changed(key, body):
        wakeups.poke(key)
    _ensure_tasks("restore", namespace, name, body.get("status"), logger)


@kopf.on.delete(GROUP, VERSION, ARCHIVE_PLURAL, when=_delete_policy)
def archive_delete(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    """deletionPolicy delete: the archiver's Deployment first, then, once its pod is gone (nothing written
    after), the archive's generations (object-locked ones stay until their lock expires). While the pod
    still runs the deletion waits and is retried (kopf keeps the finalizer): data is never deleted under a
    live writer. Other failures do not block deletion (the archive is kept)."""
    try:
        outcome = archive_reconciler.delete_archive_data(Kube(), dict(body), logger)
        if outcome == archive_reconciler.WRITER_LIVE:
            _event(body, "Warning", "ArchiveDeleteWaiting", "the archiver's pod is still running: the archive is "
                   "deleted once it has stopped (retried)")
            raise kopf.TemporaryError("the archiver's pod is still running", delay=DELETE_RETRY_SECS)
        if isinstance(outcome, tuple):
            deleted, locked = outcome
            _event(body, "Normal", "ArchiveDeleted", f"deleted {len(deleted)} archive generations (deletionPolicy "
                   "delete)" + (f"; kept {len(locked)} still object-locked: {', '.join(locked)}" if locked else ""))
    except (RbakError, ApiError) as e:
        _event(body, "Warning", "ArchiveKept", f"could not delete the archive: {e}")
        logger.warning("deletionPolicy delete: %s; letting the object go, archive kept", e)


@kopf.on.event(GROUP, VERSION, ARCHIVE_PLURAL)
async def archive_event(type: str, body: kopf.Body, name: str, namespace: str | None,  # noqa: A002
                        logger: kopf.Logger, **_: Any) -> None:
    """The archive's loop reads the object from here (no GET per pass); a spec change wakes it."""
    namespace = namespace or ""
    key = ("archive", namespace, name)
    if type == "DELETED":
        resource_metrics.forget(ARCHIVE_PLURAL, namespace, name)
        archive_reconciler.forget(key)
        wakeups.poke(key)
        wakeups.forget(key)
        return
    archive_reconciler.remember(key, dict(body))
    if wakeups.object_changed(key, body):
        wakeups.poke(key)
    tasks.ensure(key, lambda: loop.run(archive_reconciler.archive_pass, "archive", name, namespace,
                                       tasks.stopping(), logger, poll=archive_reconciler.POLL))


@kopf.on.event("batch", "v1", "jobs", labels={bodies.L_MANAGED: "rbak-operator"})
async def owned_job_event(body: kopf.Body, **_: Any) -> None:
    """A Job of ours changed (started, finished, deleted): its owner runs a pass now."""
    for key in wakeups.owners(body):
        wakeups.poke(key)


@kopf.on.event(SPARK_GROUP, SPARK_VERSION, SPARK_PLURAL, labels={bodies.L_MANAGED: "rbak-operator"})
async def owned_spark_app_event(body: kopf.Body, **_: Any) -> None:
    for key in wakeups.owners(body):
        wakeups.poke(key)
