"""One pass over a RabbitMQArchive: its ConfigMap and Deployment follow the spec, and its status follows
the archive in the storage (the newest tick), written only when it changed enough (decide/archive.py).

A pass costs no API request unless something is to be done: the object comes from the watch
(``remember``), the storage client is kept between passes (its Secret is read again only when the
storage spec changes or a read fails), and the Deployment is read again only when the spec changed or
at the safety resync. So an idle archive costs its storage reads every ``POLL`` seconds and about one
status write an hour; a lag change shows within a poll.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from rbak.drill.archive import generation_ids
from rbak.errors import RbakError
from rbak.format.archive import TICK_DIR, Tick
from rbak.repo.immutable import delete_backup
from rbak_operator.crds.schema import ARCHIVE_PLURAL
from rbak_operator.decide import rbakconfig
from rbak_operator.decide.archive import (
    PROGRESS_WRITE_SECS,
    applied_hash,
    archive_config,
    archiver_exit,
    conditions,
    L_ARCHIVE,
    configmap_body,
    deployment_body,
    labels,
    lag_step,
    max_delay_seconds,
    resource_name,
    status_patch,
    view,
)
from rbak_operator.decide.status import GONE, set_condition
from rbak_operator.decide.times import fmt, parse_time
from rbak_operator.decide.wake import evidence_recheck_time
from rbak_operator.kube import events
from rbak_operator.kube.client import Kube
from rbak_operator.kube.credentials import resolve_broker
from rbak_operator.kube.errors import ApiError
from rbak_operator.metrics import resources
from rbak_operator.reconcile import drill
from rbak_operator.reconcile.storage import open_backup_storage
from rbak_operator.runtime import clock

log = logging.getLogger("rbak_operator")

POLL = timedelta(seconds=float(os.environ.get("RBAK_OPERATOR_ARCHIVE_POLL_SECONDS", "10")))
RESYNC_SECS = float(os.environ.get("RBAK_OPERATOR_RESYNC_SECONDS", str(6 * 3600)))
PROGRESS_SECS = float(os.environ.get("RBAK_OPERATOR_ARCHIVE_PROGRESS_SECONDS", str(PROGRESS_WRITE_SECS)))
METRICS_PORT = int(os.environ.get("RBAK_ARCHIVE_METRICS_PORT", "9100"))
# deletionPolicy delete waits this long (plus 4 max delays: the archiver's flush) for the pod to go per try
DELETE_WAIT_SECS = float(os.environ.get("RBAK_OPERATOR_ARCHIVE_DELETE_WAIT_SECONDS", "60"))

Key = tuple[str, str, str]


@dataclass
class ArchiveState:
    """What the operator keeps about one archive between passes."""

    applied_spec: str | None = None  # the spec (JSON) last applied to the Deployment and ConfigMap
    next_check: float = 0.0  # monotonic: when the Deployment is read again although the spec is unchanged
    storage: Any = None
    storage_spec: str | None = None
    last_tick: Tick | None = None
    written: dict[str, Any] | None = None  # the status as this operator last wrote it
    last_write: float = field(default_factory=time.monotonic)
    config_error: str | None = None
    pod_error: str | None = None  # why the archiver's pod makes no tick, as last said (an event once per cause)
    drill_intent: str | None = None  # spec.verify and the drill trigger as the drill reconciler last saw them


_lock = threading.Lock()
_bodies: dict[Key, dict[str, Any]] = {}
_states: dict[Key, ArchiveState] = {}


def remember(key: Key, body: dict[str, Any]) -> None:
    """The object as the watch last showed it (the passes read it from here, not from the API)."""
    with _lock:
        _bodies[key] = body


def forget(key: Key) -> None:
    with _lock:
        _bodies.pop(key, None)
        _states.pop(key, None)


def wall_now() -> datetime:
    """The archive is judged on wall time (the archiver stamps its ticks with it), not the operator's
    schedule clock (``clock``, which tests may fake)."""
    return datetime.now(timezone.utc)


def archive_pass(kube: Kube, namespace: str, name: str, logger) -> tuple[dict[str, Any] | str, list[datetime | None]]:
    """One pass: the patch written (or GONE), and when the next is due (the next storage poll)."""
    key = ("archive", namespace, name)
    with _lock:
        body = _bodies.get(key)
        state = _states.setdefault(key, ArchiveState())
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return GONE, []
    now = wall_now()
    mono = time.monotonic()
    ensure_archiver(kube, body, state, mono, logger)
    tick, storage_error = read_newest_tick(kube, body, state, logger)
    spec = body.get("spec") or {}
    written = state.written if state.written is not None else dict(body.get("status") or {})
    v = view(tick, int(now.timestamp() * 1000), spec, written)
    meta = body["metadata"]
    phase, conds = conditions(v, spec, written.get("conditions"), now, meta.get("generation"), storage_error)
    if state.config_error:
        conds = [c for c in conds if c["type"] != "Ready"] + [
            {"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": state.config_error[:1000],
             "lastTransitionTime": fmt(now)}]
        phase = "Failed"
    elif _ready_reason(conds) in ("NoTick", "TicksOverdue"):
        # no tick on time: the archiver's pods may say why (a refused config exits 2; its message is the pod's)
        failure = archiver_exit(kube.list_pods(meta["namespace"], pod_selector(name)), v.status.get("lastTickTime"))
        if failure is not None:
            conds = set_condition(conds, "Ready", "False", "ArchiverFailing", failure, now, meta.get("generation"))
            phase = "Failed"
            if state.pod_error != failure:
                events.post(body, "Warning", "ArchiverFailing", failure)
        state.pod_error = failure
    new = {**v.status, "phase": phase, "conditions": conds, "archiveName": name,
           "deployment": resource_name(name), "configMap": resource_name(name)}
    restore_drill = drill_pass(kube, body, state, written)
    if restore_drill is not None:
        new["restoreDrill"] = restore_drill
    if meta.get("generation") is not None:
        new["observedGeneration"] = meta["generation"]
    # the gauges follow every pass (the lag moves between status writes)
    resources.observe(ARCHIVE_PLURAL, {"metadata": meta, "spec": spec, "status": {**written, **new}})
    patch = status_patch(written, new, mono - state.last_write, lag_step(spec), PROGRESS_SECS)
    if patch:
        kube.patch_status(ARCHIVE_PLURAL, namespace, name, patch)
        state.written = {k: v for k, v in {**written, **patch}.items() if v is not None}
        state.last_write = mono
    return patch, [now + POLL]


def drill_pass(kube: Kube, body: dict[str, Any], state: ArchiveState, written: dict[str, Any]
               ) -> dict[str, Any] | None:
    """``status.restoreDrill``: the drill reconciler (a Job list) runs only when it has something to do (a
    drill running, a slot or an evidence check due, a new trigger, a changed spec); else the status as
    written, so an idle archive's drills cost no request between slots."""
    old = written.get("restoreDrill")
    spec, meta = body.get("spec") or {}, body["metadata"]
    now = clock.now()
    intent = json.dumps([spec.get("verify"), (meta.get("annotations") or {}).get(drill.TRIGGER_ANNOTATION)],
                        sort_keys=True, default=str)
    if drill_quiet(old, now) and intent == state.drill_intent:
        return old
    result = drill.reconcile(kube, {**body, "status": written}, now, events.post)
    state.drill_intent = intent
    return result


def drill_quiet(d: dict[str, Any] | None, now: datetime) -> bool:
    """Nothing for the drill reconciler now: no drill running, the next slot and evidence check not due."""
    if not d:
        return True
    due = [parse_time(d["nextRunTime"])] if d.get("nextRunTime") else []
    check = evidence_recheck_time(d)
    return not d.get("active") and all(t > now for t in due + ([check] if check else []))


def ensure_archiver(kube: Kube, body: dict[str, Any], state: ArchiveState, mono: float, logger) -> None:
    """Create or update the ConfigMap and the Deployment when the spec changed (or at the resync)."""
    spec = body.get("spec") or {}
    intent = json.dumps([spec, body["metadata"].get("uid")], sort_keys=True, default=str)
    if state.applied_spec == intent and mono < state.next_check:
        return
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    try:
        resolved = resolve_broker(kube, spec.get("broker"), ns, "spec.broker")
        cfg, env = archive_config(spec, ns, name, resolved)
    except ApiError:
        raise  # the API's failure retries the pass (ApiError is a RbakError too)
    except RbakError as e:  # a spec or Secret problem: said in the status, tried again when the spec changes
        if state.config_error != str(e):
            events.post(body, "Warning", "InvalidSpec", str(e))
        state.config_error = str(e)
        state.applied_spec, state.next_check = intent, mono + RESYNC_SECS
        return
    state.config_error = None
    cm = configmap_body(body, cfg)
    dep = deployment_body(body, env, cm, METRICS_PORT)
    existing = kube.get_deployment(ns, dep["metadata"]["name"])
    if existing is None:
        if not kube.create_configmap(cm):
            _replace_configmap(kube, cm)
        kube.create_deployment(dep)
        events.post(body, "Normal", "ArchiverCreated", f"created Deployment {dep['metadata']['name']} (rbak archive)")
    elif applied_hash(existing) != applied_hash(dep):
        _replace_configmap(kube, cm)
        dep["metadata"]["resourceVersion"] = existing["metadata"].get("resourceVersion")
        if not kube.replace_deployment(dep):
            logger.info("archive %s/%s: Deployment changed meanwhile; applied at the next pass", ns, name)
            return
        events.post(body, "Normal", "ArchiverUpdated", f"updated Deployment {dep['metadata']['name']}"
                    + (" (suspended: 0 replicas)" if spec.get("suspend") else ""))
    elif _replace_configmap(kube, cm):  # at start and at the resync: a ConfigMap deleted or edited by hand
        events.post(body, "Normal", "ArchiverConfigRestored", f"restored ConfigMap {cm['metadata']['name']}")
    state.applied_spec, state.next_check = intent, mono + RESYNC_SECS


def _replace_configmap(kube: Kube, cm: dict[str, Any]) -> bool:
    """Make the ConfigMap hold ``cm``'s data; True when it had to be written (missing or different)."""
    meta = cm["metadata"]
    old = kube.get_configmap(meta["namespace"], meta["name"])
    if old is None:
        kube.create_configmap(cm)
        return True
    if old.get("data") != cm.get("data"):
        cm = dict(cm, metadata={**meta, "resourceVersion": old["metadata"].get("resourceVersion")})
        kube.replace_configmap(cm)
        return True
    return False


def read_newest_tick(kube: Kube, body: dict[str, Any], state: ArchiveState, logger) -> tuple[Tick | None, str | None]:
    """The newest tick of the archive (or the last one read, when the storage cannot be read now) and
    the reason it could not be read."""
    meta, spec = body["metadata"], body.get("spec") or {}
    storage_spec = json.dumps(spec.get("storage"), sort_keys=True)
    try:
        if state.storage is None or state.storage_spec != storage_spec:
            state.storage = open_backup_storage(kube, meta["namespace"], spec.get("storage"))
            state.storage_spec = storage_spec
        if state.storage is None:
            return state.last_tick, "the storage (a PersistentVolumeClaim) is not mounted in the operator"
        tick = newest_tick(state.storage, rbakconfig.storage_prefix(spec.get("storage")), meta["name"])
    except ApiError:
        raise  # the API's failure (reading the storage's Secret) retries the pass
    except (RbakError, OSError) as e:
        state.storage = None  # its Secret is read again next time (rotated keys)
        logger.warning("archive %s/%s: cannot read the storage: %s", meta["namespace"], meta["name"], e)
        return state.last_tick, str(e)[:300]
    if tick is not None:
        state.last_tick = tick
    return state.last_tick, None


def generations(storage: Any, prefix: str, name: str) -> list[str]:
    """The archive's generations (backup ids ``<name>.<UTC time>``), oldest first."""
    return generation_ids(storage, prefix, name)


def newest_tick(storage: Any, prefix: str, name: str) -> Tick | None:
    """The newest tick of the newest generation that has one: a LIST of the generations, a LIST of
    its ticks and one GET."""
    base = prefix + "/" if prefix else ""
    for gid in reversed(generations(storage, prefix, name)):
        keys = sorted(k for k in storage.list(f"{base}{gid}/{TICK_DIR}/") if k.endswith(".json"))
        if keys:
            return Tick.from_json(storage.get(keys[-1]), keys[-1])
    return None


WRITER_LIVE = "writer-live"  # delete_archive_data: the archiver's pod still runs; nothing was deleted


def pod_selector(name: str) -> dict[str, str]:
    return {L_ARCHIVE: labels(name)[L_ARCHIVE], "app.kubernetes.io/component": "archive"}


def _ready_reason(conds: list[dict[str, Any]]) -> str | None:
    return next((c.get("reason") for c in conds if c.get("type") == "Ready"), None)


def archiver_pods(kube: Kube, namespace: str, name: str) -> list[str]:
    """The archiver's pods the API still lists (running or terminating: either may still write)."""
    return [p["metadata"]["name"] for p in kube.list_pods(namespace, pod_selector(name))
            if ((p.get("status") or {}).get("phase")) not in ("Succeeded", "Failed")]


def stop_archiver(kube: Kube, namespace: str, deployment: str) -> None:
    """Scale the Deployment to 0 (its pod gets SIGTERM whether or not a garbage collector follows the
    delete), then delete it."""
    dep = kube.get_deployment(namespace, deployment)
    if dep is not None and (dep.get("spec") or {}).get("replicas") != 0:
        dep["spec"]["replicas"] = 0
        kube.replace_deployment(dep)  # a conflict: the delete below stops it all the same
    kube.delete_deployment(namespace, deployment)


def wait_archiver_gone(kube: Kube, namespace: str, name: str, timeout: float) -> list[str]:
    """Wait (at most ``timeout`` seconds) until no archiver pod of ``name`` is left; the ones still there."""
    deadline = time.monotonic() + timeout
    while True:
        left = archiver_pods(kube, namespace, name)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(1.0)


def delete_archive_data(kube: Kube, body: dict[str, Any], logger
                        ) -> tuple[list[str], list[str]] | str | None:
    """deletionPolicy delete: stop the archiver, wait until its pod is gone (its SIGTERM flush writes the
    generation's manifest), then delete its generations; (deleted, still object-locked), None when the
    storage is not reachable from here, WRITER_LIVE when a pod still runs after the wait (nothing deleted:
    the caller retries later, never deleting under a live writer)."""
    meta, spec = body["metadata"], body.get("spec") or {}
    stop_archiver(kube, meta["namespace"], resource_name(meta["name"]))
    left = wait_archiver_gone(kube, meta["namespace"], meta["name"],
                              DELETE_WAIT_SECS + 4 * max_delay_seconds(spec))
    if left:
        logger.warning("deletionPolicy delete: archiver pod(s) %s still running; archive kept for now", left)
        return WRITER_LIVE
    st = open_backup_storage(kube, meta["namespace"], spec.get("storage"))
    if st is None:
        logger.warning("deletionPolicy delete: storage not reachable from the operator; archive kept")
        return None
    prefix = rbakconfig.storage_prefix(spec.get("storage"))
    ids = generations(st, prefix, meta["name"])
    locked = [gid for gid in ids if delete_backup(st, gid, prefix) is not None]
    return [gid for gid in ids if gid not in locked], locked
