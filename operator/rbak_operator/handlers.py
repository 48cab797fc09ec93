"""kopf handlers: the glue between kopf and the reconcilers.

A RabbitMQBackup or RabbitMQRestore gets a short reconcile loop (a kopf daemon) that calls
``backup_reconciler.reconcile_backup`` / ``restore_reconciler.reconcile_restore`` every TICK on a
thread pool until its object is gone or finished; deletion, metrics start-up, peering and login
are here too. Run with ``kopf run -m rbak_operator.handlers`` or ``python -m rbak_operator``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import logging
import os
import random
from typing import Any

import kopf

from rbak.errors import RbakError

from . import metrics, progress, resource_metrics
from .backup_reconciler import reconcile_backup
from .crds import BACKUP_PLURAL, GROUP, RESTORE_PLURAL, VERSION
from .events import post as _event
from .k8s import ApiError, Kube, connection_info
from .restore_reconciler import reconcile_restore
from .status import GONE
from .storage_access import delete_owned_backups

log = logging.getLogger("rbak_operator")

TICK = float(os.environ.get("RBAK_OPERATOR_TICK_SECONDS", "10"))


# --------------------------------------------------------------------------
# start-up: settings, peering, metrics
# --------------------------------------------------------------------------

@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # log lines are not events; runs post their own
    settings.persistence.finalizer = "rbak.io/finalizer"
    # Two replicas: kopf peering makes the highest-priority live operator the
    # only active one; the others pause. Equal priorities would both run, so
    # every pod draws its own. Even if both ran, a slot maps to one Job name.
    settings.peering.name = os.environ.get("RBAK_PEERING_NAME", "rbak-operator")
    settings.peering.priority = int(os.environ.get("RBAK_PEERING_PRIORITY") or random.randint(1, 1_000_000))
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    port = metrics.serve()
    if port:
        log.info("metrics on :%d/metrics", port)


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """In-cluster service account or kubeconfig (exec/OIDC plugins too), as the kubernetes client reads them
    for the operator's own calls (k8s.py): one configuration for both."""
    return connection_info()


# Reconciles are short blocking calls (HTTP, S3) run on this pool. The daemons
# themselves are async: a sync daemon would hold a kopf worker thread for the
# object's lifetime and starve everything once objects outnumber threads.
_POOL = concurrent.futures.ThreadPoolExecutor(
    max_workers=int(os.environ.get("RBAK_OPERATOR_WORKERS", "8")), thread_name_prefix="rbak-reconcile")


async def _loop(reconcile, kind: str, name: str, namespace: str, stopped, logger) -> None:
    """Reconcile every TICK until stopped, or until the object is gone/finished (then exit)."""
    kube = Kube()
    loop = asyncio.get_running_loop()
    log.info("%s %s/%s: reconcile loop started", kind, namespace, name)
    while not stopped:
        ctx = contextvars.copy_context()  # kopf.event() finds its poster through context vars
        try:
            result = await loop.run_in_executor(_POOL, functools.partial(ctx.run, reconcile, kube, namespace, name, logger))
            if result == GONE:
                return
        except ApiError as e:
            logger.warning("%s %s/%s: API error %s %s; retrying", kind, namespace, name, e.status, e.reason)
        except Exception:  # never let one bad object kill its loop
            logger.exception("%s %s/%s: reconcile failed; retrying", kind, namespace, name)
        await asyncio.sleep(TICK)


@kopf.daemon(GROUP, VERSION, BACKUP_PLURAL, initial_delay=0.2, cancellation_timeout=10)
async def backup_daemon(name: str, namespace: str, stopped, logger, **_: Any) -> None:
    await _loop(reconcile_backup, "RabbitMQBackup", name, namespace, stopped, logger)


def _delete_policy(spec: dict, **_: Any) -> bool:
    return (spec or {}).get("deletionPolicy") == "delete"


@kopf.on.delete(GROUP, VERSION, BACKUP_PLURAL, when=_delete_policy)
def backup_delete(body: dict, name: str, namespace: str, spec: dict, logger, **_: Any) -> None:
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


@kopf.daemon(GROUP, VERSION, RESTORE_PLURAL, initial_delay=0.2, cancellation_timeout=10)
async def restore_daemon(name: str, namespace: str, stopped, logger, **_: Any) -> None:
    await _loop(reconcile_restore, "RabbitMQRestore", name, namespace, stopped, logger)


@kopf.on.event(GROUP, VERSION, BACKUP_PLURAL)
def backup_gone(type: str, name: str, namespace: str, **_: Any) -> None:  # noqa: A002 - kopf's keyword
    """A deleted RabbitMQBackup's per-resource gauges go with it (every labelled series)."""
    if type == "DELETED":
        resource_metrics.forget(BACKUP_PLURAL, namespace, name)


@kopf.on.event(GROUP, VERSION, RESTORE_PLURAL)
def restore_gone(type: str, name: str, namespace: str, **_: Any) -> None:  # noqa: A002
    if type == "DELETED":
        resource_metrics.forget(RESTORE_PLURAL, namespace, name)


_PROGRESS_TIMERS = (progress.backup_progress, progress.restore_progress)  # registered before the loop below


def _daemons_without_finalizer() -> None:
    """kopf puts a finalizer on every object that has a daemon, so it can stop the
    daemon before the object goes. Ours stop themselves when their object is gone
    (one GET 404 later), so the only finalizer left is the opt-in one of the
    deletionPolicy-delete handler: deleting a RabbitMQBackup never waits for the
    operator unless the user asked for its stored backups to be deleted."""
    spawning = kopf.get_default_registry()._spawning
    spawning._handlers[:] = [dataclasses.replace(h, requires_finalizer=False) for h in spawning._handlers]


_daemons_without_finalizer()
