"""kopf handlers: read the objects, call the pure functions, apply the result.

Scheduling is a short loop per RabbitMQBackup (a kopf daemon) comparing the
cron's slots with the persisted ``status.lastScheduleTime`` (written *before*
the Job is created), so restarts and a second replica never double-run a
slot: the Job name is derived from the slot and a second create gets 409.
Its first pass after a start-up reads the Jobs' real state, so a run left
``Running`` by a crashed operator is reconciled, not failed blindly.
Run with ``kopf run -m rbak_operator.handlers`` or ``python -m rbak_operator``.
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
from datetime import datetime
from typing import Any

import kopf

from rbak.errors import RbakError

from . import bodies, metrics, naming, policy, progress, progress_status, rbakconfig, resource_metrics, schedule
from .clock import fmt, now as clock_now, parse_time
from .credentials import MissingSecret, resolve_broker
from .crds import BACKUP_PLURAL, GROUP, RESTORE_PLURAL, VERSION
from .k8s import ApiError, Kube, connection_info
from .status import RunState, in_pod_validation, job_state, push_history, run_summary, set_condition, spark_state

log = logging.getLogger("rbak_operator")

TICK = float(os.environ.get("RBAK_OPERATOR_TICK_SECONDS", "10"))
TRIGGER_ANNOTATION = "rbak.io/backup-now"
DEFAULT_DEADLINE = 600  # a slot older than this is not (re)created after a crash without startingDeadlineSeconds
HISTORY = 10


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
    """In-cluster service account or kubeconfig, read by our own small client (see k8s.py)."""
    return connection_info()


# --------------------------------------------------------------------------
# storage access for the operator (manifests, retention, deletion)
# --------------------------------------------------------------------------

def open_backup_storage(kube: Kube, namespace: str, storage: dict[str, Any]):
    """The backup storage as the operator can read it, or None (a PVC not mounted here)."""
    from rbak.storage import open_storage
    from rbak.storage.s3 import S3Storage

    s3 = (storage or {}).get("s3")
    if s3:
        creds: dict[str, str] = {}
        ref = s3.get("credentialsSecretRef")
        if ref:
            data = kube.secret_values(namespace, ref["name"])
            if data is None:
                raise MissingSecret(f"spec.storage.s3.credentialsSecretRef: Secret {namespace}/{ref['name']} not found")
            ak, sk = ref.get("accessKeyIdKey") or "AWS_ACCESS_KEY_ID", ref.get("secretAccessKeyKey") or "AWS_SECRET_ACCESS_KEY"
            if ak not in data or sk not in data:
                raise MissingSecret(f"Secret {namespace}/{ref['name']} lacks key {ak if ak not in data else sk!r}")
            creds = {"access_key_id": data[ak], "secret_access_key": data[sk]}
        # The bucket root: keys (and manifests' segment keys) carry the prefix themselves.
        return S3Storage(bucket=s3["bucket"], prefix="", region=s3.get("region") or "us-east-1",
                         endpoint=s3.get("endpoint"), path_style=bool(s3.get("pathStyle")), **creds)
    pvc = (storage or {}).get("pvc")
    root = os.environ.get("RBAK_OPERATOR_PVC_ROOT")
    if pvc and root:
        path = os.path.join(root, pvc["claimName"], (pvc.get("path") or "backups").strip("/"))
        if os.path.isdir(path):
            return open_storage("file://" + path)
    return None


def load_manifest_safe(kube: Kube, namespace: str, storage_spec: dict[str, Any], backup_id: str, logger):
    from rbak.catalog import load_manifest

    try:
        st = open_backup_storage(kube, namespace, storage_spec)
        if st is None:
            return None
        return load_manifest(st, backup_id, rbakconfig.storage_prefix(storage_spec))
    except RbakError as e:
        logger.warning("cannot read manifest of %s: %s", backup_id, e)
        return None


# --------------------------------------------------------------------------
# RabbitMQBackup
# --------------------------------------------------------------------------

def _event(body: dict[str, Any], etype: str, reason: str, message: str) -> None:
    try:
        kopf.event(body, type=etype, reason=reason, message=message)
    except Exception:  # events are best effort
        log.exception("cannot post event %s", reason)


def _start_backup_run(kube: Kube, body: dict[str, Any], run_name: str, trigger: str, slot: datetime | None,
                      trigger_value: str | None = None) -> bool:
    """ConfigMap + Job for one run; False when the Job already existed."""
    meta, spec = body["metadata"], body.get("spec") or {}
    ns, name = meta["namespace"], meta["name"]
    resolved = resolve_broker(kube, spec.get("broker"), ns, "spec.broker")
    cfg, secret_env = rbakconfig.backup_config(spec, ns, run_name, resolved)
    labels = bodies.backup_run_labels(name, trigger)
    validate = spec.get("validate") or {}
    vargs = None
    if validate.get("enabled", True) and validate.get("sparkThresholdBytes") is None:
        vargs = bodies.validate_args(rbakconfig.storage_url(spec["storage"]), run_name, bool(validate.get("deep")),
                                     rbakconfig.storage_prefix(spec["storage"]))
    annotations = {bodies.A_BACKUP_ID: run_name}
    if slot:
        annotations[bodies.A_SLOT] = fmt(slot)
    if trigger_value is not None:
        annotations[bodies.A_TRIGGER_VALUE] = trigger_value[:256]
    kube.create_configmap(bodies.configmap_body(run_name, ns, body, cfg, labels))
    job = bodies.job_body(name=run_name, namespace=ns, owner=body, spec=spec, storage=spec["storage"],
                          secret_env=secret_env, args=bodies.backup_args(), labels=labels,
                          annotations=annotations, validate_args=vargs, progress_id=run_name)
    created = kube.create_job(job)
    if created:
        metrics.STARTED.labels("backup", trigger).inc()
        _event(body, "Normal", "BackupStarted", f"started {trigger} backup run {run_name}")
    return created


GONE = "gone"


def reconcile_backup(kube: Kube, namespace: str, name: str, logger) -> dict[str, Any] | str | None:
    """One pass over a RabbitMQBackup: the status patch applied, or GONE."""
    body = kube.get_backup(namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return GONE
    now = clock_now()
    meta, spec = body["metadata"], body.get("spec") or {}
    status = dict(body.get("status") or {})
    generation = meta.get("generation")
    patch: dict[str, Any] = {}
    labels = {bodies.L_BACKUP: naming.label_value(name)}
    jobs = kube.list_jobs(namespace, labels)
    states: dict[str, RunState] = {}
    pods: dict[str, list[dict[str, Any]]] = {}
    for j in jobs:
        st = job_state(j)
        if st.phase == "Failed":
            pods[j["metadata"]["name"]] = kube.job_pods(namespace, j["metadata"]["name"])
            st = job_state(j, pods[j["metadata"]["name"]])
        states[j["metadata"]["name"]] = st
    active = sorted(n for n, s in states.items() if not s.finished)
    metrics.ACTIVE.labels("backup").set(len(active))

    # 1. Record runs that finished since the last pass (counts from manifest.json).
    history = list(status.get("history") or [])
    recorded = {h.get("jobName") for h in history}
    new_success = False
    conditions = status.get("conditions")
    for j in sorted(jobs, key=lambda j: (states[j["metadata"]["name"]].end or now, j["metadata"]["name"])):
        jname = j["metadata"]["name"]
        st = states[jname]
        if not st.finished or jname in recorded:
            continue
        ann = j["metadata"].get("annotations") or {}
        jlabels = j["metadata"].get("labels") or {}
        backup_id = ann.get(bodies.A_BACKUP_ID, jname)
        has_validate = any(c.get("name") == "validate" for c in j["spec"]["template"]["spec"].get("containers", []))
        # Validation in the run's pod: the backup (init container) may have been written and then failed it.
        validation = in_pod_validation(st, pods.get(jname)) if has_validate else None
        # A failed run may still have written a complete manifest: a partial backup (some queue refused/failed).
        manifest = load_manifest_safe(kube, namespace, spec.get("storage"), backup_id, logger)
        written = st.phase == "Succeeded" or validation == "Failed" or bool(manifest and manifest.is_partial)
        manifest = manifest if written else None
        summary = run_summary(
            backup_id=backup_id, job_name=jname, trigger=jlabels.get(bodies.L_TRIGGER, "schedule"), state=st,
            slot=parse_time(ann[bodies.A_SLOT]) if ann.get(bodies.A_SLOT) else None, manifest=manifest,
            validation=validation)
        if validation:
            summary.update(validationRun=jname, validationEngine="job")
        if validation == "Failed":
            cause = _report_problems(kube, body, backup_id) or st.message or st.reason
            summary.update(reason="ValidationFailed", message=f"validation failed: {cause}")
        partial = manifest is not None and manifest.is_partial
        if partial:
            summary.update(reason="PartiallyFailed", message=f"backup {backup_id} is partial: "
                           + "; ".join(summary.get("partialQueues") or [])[:900])
        if st.phase == "Succeeded" and manifest is None:
            summary["message"] = "succeeded; manifest.json not readable by the operator (counts unknown)"
        if st.phase == "Succeeded" and not has_validate and manifest is not None:
            _start_validation(kube, body, summary, manifest.total_bytes)
        history = push_history(history, summary, HISTORY)
        recorded.add(jname)
        patch["lastRun"] = summary
        metrics.RUNS.labels("backup", st.phase.lower()).inc()
        if st.duration is not None:
            metrics.DURATION.labels("backup").observe(st.duration)
        if st.phase == "Succeeded":
            # Retention waits for a pending validation: a new backup that later fails it
            # must not have cost an older good one (keepLast: 1).
            new_success = new_success or summary.get("validation") != "Pending"
            patch["lastSuccessfulTime"] = fmt(st.end or now)
            patch["lastBackupId"] = backup_id
            conditions = set_condition(conditions, "Ready", "True", "BackupSucceeded",
                                       f"backup {backup_id} completed", now, generation)
            msg = f"backup {backup_id} succeeded"
            if manifest is not None:
                msg += f": {summary['messages']} messages, {summary['size']}, {summary['queues']} queues"
            _event(body, "Normal", "BackupSucceeded", msg)
        elif validation == "Failed":
            conditions = set_condition(conditions, "Ready", "False", "ValidationFailed",
                                       f"backup {backup_id} {summary['message']}", now, generation)
            _event(body, "Warning", "ValidationFailed", f"backup {backup_id} {summary['message']}")
        elif partial:
            conditions = set_condition(conditions, "Ready", "False", "BackupPartial", summary["message"], now, generation)
            _event(body, "Warning", "BackupPartial", summary["message"])
        else:
            reason = st.message or st.reason or "the Job failed"
            conditions = set_condition(conditions, "Ready", "False", "BackupFailed",
                                       f"backup {backup_id} failed: {reason}", now, generation)
            _event(body, "Warning", "BackupFailed", f"backup {backup_id} failed: {reason}")
    history, validated = _follow_validations(kube, body, history, patch)
    new_success = new_success or validated
    if history != list(status.get("history") or []):
        patch["history"] = history

    # 2. Job history limits (the Jobs' ConfigMaps go with them).
    finished = [(n, s.phase, fmt(s.end) or "") for n, s in states.items() if s.finished and n in recorded]
    for victim in policy.history_victims(finished, int(spec.get("successfulJobsHistoryLimit", 3)),
                                         int(spec.get("failedJobsHistoryLimit", 3))):
        kube.delete_job(namespace, victim)
        kube.delete_configmap(namespace, victim)

    # 3. Retention, after a new successful (and, when validated after the run, validated) backup.
    if new_success and spec.get("retention"):
        deleted = apply_retention(kube, body, now, logger)
        if deleted:
            ret = dict(status.get("retention") or {})
            patch["retention"] = {"deletedTotal": int(ret.get("deletedTotal") or 0) + len(deleted), "lastDeleted": deleted}

    # 4. On-demand trigger (annotation value names the run; runs once per value).
    trigger_value = (meta.get("annotations") or {}).get(TRIGGER_ANNOTATION)
    if trigger_value and trigger_value != status.get("lastManualTrigger"):
        decision = policy.concurrency(spec.get("concurrencyPolicy"), active)
        if decision != "skip":
            if decision == "replace":
                for a in active:
                    kube.delete_job(namespace, a)
            run_name = naming.manual_run_name(name, trigger_value)
            kube.patch_status(BACKUP_PLURAL, namespace, name, {"lastManualTrigger": trigger_value})
            status["lastManualTrigger"] = trigger_value
            if _start_backup_run(kube, body, run_name, "manual", None, trigger_value):
                active.append(run_name)

    # 5. The schedule.
    phase_hint = None
    if spec.get("schedule"):
        try:
            sched = schedule.parse_schedule(spec["schedule"], spec.get("timeZone"))
        except RbakError as e:
            conditions = set_condition(conditions, "Ready", "False", "InvalidSchedule", str(e), now, generation)
            patch.update(phase="Failed", conditions=conditions)
            kube.patch_status(BACKUP_PLURAL, namespace, name, patch)
            return patch
        last = parse_time(status["lastScheduleTime"]) if status.get("lastScheduleTime") else None
        created = parse_time(meta["creationTimestamp"]) if meta.get("creationTimestamp") else None
        if created is None and last is None:
            # The emulator (and only it) sets no creationTimestamp: start counting from first sight.
            patch["lastScheduleTime"] = fmt(now)
            last = now.replace(microsecond=0)
        deadline = spec.get("startingDeadlineSeconds")
        # A crash between persisting the slot and creating its Job: create it now (same name, so once).
        pending = status.get("lastScheduledRun")
        if pending and last and pending not in states and pending not in recorded and not spec.get("suspend"):
            if (now - last).total_seconds() <= (deadline if deadline is not None else DEFAULT_DEADLINE):
                if policy.concurrency(spec.get("concurrencyPolicy"), active) != "skip" or not active:
                    if _start_backup_run(kube, body, pending, "schedule", last):
                        active.append(pending)
        if spec.get("suspend"):
            d = schedule.decide(sched, last, created, now, deadline)
            patch["nextScheduleTime"] = None
            phase_hint = "Suspended"
            if d.slot is not None:
                # Slots passing while suspended are skipped, not run on resume.
                patch["lastScheduleTime"] = fmt(d.slot)
        else:
            d = schedule.decide(sched, last, created, now, deadline)
            patch["nextScheduleTime"] = fmt(d.next_time)
            if d.action == "missed":
                patch["lastScheduleTime"] = fmt(d.slot)
                patch["missedSchedules"] = int(status.get("missedSchedules") or 0) + d.missed
                patch["lastMissedTime"] = fmt(d.slot)
                metrics.MISSED.labels("deadline").inc(d.missed)
                _event(body, "Warning", "MissedSchedule",
                       f"slot {fmt(d.slot)} missed by more than startingDeadlineSeconds={deadline}; not run")
            elif d.action == "run":
                decision = policy.concurrency(spec.get("concurrencyPolicy"), active)
                if decision == "skip":
                    patch["lastScheduleTime"] = fmt(d.slot)
                    patch["missedSchedules"] = int(status.get("missedSchedules") or 0) + 1
                    patch["lastMissedTime"] = fmt(d.slot)
                    metrics.MISSED.labels("forbid").inc()
                    _event(body, "Warning", "ScheduleSkipped",
                           f"slot {fmt(d.slot)} skipped: run {', '.join(active)} still active (concurrencyPolicy Forbid)")
                else:
                    if decision == "replace":
                        for a in active:
                            kube.delete_job(namespace, a)
                            _event(body, "Normal", "RunReplaced", f"stopped run {a} (concurrencyPolicy Replace)")
                        active = []
                    run_name = naming.scheduled_run_name(name, d.slot)
                    # Persist the slot BEFORE creating the Job: a restart sees it and never runs it twice.
                    kube.patch_status(BACKUP_PLURAL, namespace, name,
                                      {"lastScheduleTime": fmt(d.slot), "lastScheduledRun": run_name})
                    patch.pop("lastScheduleTime", None)
                    if _start_backup_run(kube, body, run_name, "schedule", d.slot):
                        active.append(run_name)
                    if d.missed:
                        patch["missedSchedules"] = int(status.get("missedSchedules") or 0) + d.missed
    else:
        patch["nextScheduleTime"] = None

    # 6. Phase and conditions.
    active = sorted(set(active))
    patch["active"] = active
    if active:
        phase = "Running"
        conditions = set_condition(conditions, "Progressing", "True", "RunActive", f"running: {', '.join(active)}", now, generation)
    else:
        last_run = patch.get("lastRun") or status.get("lastRun") or {}
        phase = phase_hint or last_run.get("phase") or ("Scheduled" if spec.get("schedule") else "Pending")
        conditions = set_condition(conditions, "Progressing", "False", "Idle", "no run in progress", now, generation)
    if not any(c.get("type") == "Ready" for c in conditions or []):
        conditions = set_condition(conditions, "Ready", "True", "Configured", "waiting for the first run", now, generation)
    patch["phase"] = phase
    patch["conditions"] = conditions
    patch.update(progress_status.cleared(status, bool(active)))  # the run ended: its counts are in lastRun
    if generation is not None:
        patch["observedGeneration"] = generation
    changed = {k: v for k, v in patch.items() if status.get(k) != v}
    if changed:
        kube.patch_status(BACKUP_PLURAL, namespace, name, changed)
    return changed


def _start_validation(kube: Kube, body: dict[str, Any], summary: dict[str, Any], nbytes: int) -> None:
    """validate.sparkThresholdBytes set: validate after the run, with Spark above the threshold."""
    meta, spec = body["metadata"], body.get("spec") or {}
    validate = spec.get("validate") or {}
    engine = policy.validation_engine(validate, nbytes)
    if engine == "none":
        return
    ns, run, bid = meta["namespace"], summary["jobName"], summary["backupId"]
    vname = naming.validate_run_name(run)
    url, prefix = rbakconfig.storage_url(spec["storage"]), rbakconfig.storage_prefix(spec["storage"])
    _, storage_env = rbakconfig.storage_section(spec["storage"])
    storage_env += rbakconfig.encryption_env(spec.get("encryption"))  # a deep validation opens the objects
    labels = {**bodies.common_labels("validate"), bodies.L_VALIDATES: naming.label_value(meta["name"])}
    if engine == "spark":
        kube.create_spark_app(bodies.spark_application_body(
            name=vname, namespace=ns, owner=body, spark=spec.get("spark") or {}, script="validate.py",
            arguments=["--path", url, "--backup-id", bid, *(["--prefix", prefix] if prefix else [])],
            secret_env=storage_env, config_name=None, labels=labels))
    else:
        kube.create_job(bodies.job_body(
            name=vname, namespace=ns, owner=body, spec=spec, storage=spec["storage"], secret_env=storage_env,
            args=bodies.validate_args(url, bid, bool(validate.get("deep")), prefix), labels=labels, with_config=False))
    summary.update(validation="Pending", validationRun=vname, validationEngine=engine)
    _event(body, "Normal", "ValidationStarted", f"validating backup {bid} with {engine} {vname}")


def _follow_validations(kube: Kube, body: dict[str, Any], history: list[dict[str, Any]],
                        patch: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """Move Pending validations to Passed/Failed from their Job or SparkApplication.

    Returns the history and whether a validation passed (retention is due)."""
    ns = body["metadata"]["namespace"]
    out = []
    passed = False
    for h in history:
        if h.get("validation") == "Pending" and h.get("validationRun"):
            if h.get("validationEngine") == "spark":
                app = kube.get_spark_app(ns, h["validationRun"])
                st = spark_state(app) if app else RunState("Failed", "Missing", "validation SparkApplication disappeared")
            else:
                job = kube.get_job(ns, h["validationRun"])
                st = job_state(job, kube.job_pods(ns, h["validationRun"])) if job else RunState(
                    "Failed", "Missing", "validation Job disappeared")
            if st.finished:
                h = dict(h, validation="Passed" if st.phase == "Succeeded" else "Failed")
                if st.phase != "Succeeded":
                    # Both engines store a report naming every bad segment (spark-operator's
                    # errorMessage and a pod's termination message are only its last words).
                    cause = _report_problems(kube, body, h["backupId"]) or st.message or st.reason
                    h["message"] = f"validation failed: {cause}"
                    _event(body, "Warning", "ValidationFailed", f"backup {h['backupId']} failed validation: {cause}")
                else:
                    passed = True
                    _event(body, "Normal", "ValidationPassed", f"backup {h['backupId']} validated")
                last = patch.get("lastRun") or (body.get("status") or {}).get("lastRun") or {}
                if last.get("jobName") == h.get("jobName"):
                    patch["lastRun"] = h
        out.append(h)
    return out, passed


def _report_problems(kube: Kube, body: dict[str, Any], backup_id: str, limit: int = 5) -> str:
    """The problems of the newest validation report stored next to the backup ('' if none).

    spark-operator's ``errorMessage`` only says the driver exited 1 and a
    pod's termination message holds its last lines; the report that
    ``spark/validate.py`` and ``rbak validate --write-report`` store names
    every bad segment key.
    """
    from rbak.catalog import latest_validation

    spec = body.get("spec") or {}
    try:
        st = open_backup_storage(kube, body["metadata"]["namespace"], spec.get("storage"))
        if st is None:
            return ""
        found = latest_validation(st, backup_id, rbakconfig.storage_prefix(spec.get("storage")))
        if found is None:
            return ""
        key, report = found
    except RbakError as e:
        log.warning("cannot read the validation report of %s: %s", backup_id, e)
        return ""
    problems = [str(p) for p in report.get("all_problems") or []]
    if not problems:
        return ""
    more = f" (and {len(problems) - limit} more; report {key})" if len(problems) > limit else f" (report {key})"
    return "; ".join(problems[:limit]) + more


def apply_retention(kube: Kube, body: dict[str, Any], now: datetime, logger) -> list[str]:
    """Delete old complete backups made by this object, per spec.retention (``rbak.retention``: chains kept;
    object-locked ones once their lock has expired)."""
    from rbak.catalog import list_backups
    from rbak.immutable import delete_backup
    from rbak.retention import stored_backups

    meta, spec = body["metadata"], body.get("spec") or {}
    try:
        st = open_backup_storage(kube, meta["namespace"], spec.get("storage"))
        if st is None:
            return []
        prefix = rbakconfig.storage_prefix(spec.get("storage"))
        entries = list_backups(st, prefix)
    except RbakError as e:
        logger.warning("retention: cannot list backups: %s", e)
        return []
    # Every backup in the storage, so the chains of other objects' backups are kept too; only ours are deleted.
    stored = stored_backups(entries, lambda bid: policy.owned(bid, meta["name"]))
    plan = policy.retention_plan(stored, spec.get("retention"), now)
    ours = {b.backup_id for b in stored if b.owned}
    for v in plan.verdicts:
        if v.backup_id in ours:  # what it keeps and why, and what it deletes
            logger.info("retention: %s %s: %s", "keep" if v.keep else "delete", v.backup_id, "; ".join(v.reasons))
    deleted = []
    for bid in plan.delete:
        try:
            # Manifest first: a half-deleted backup then reads as incomplete, never as complete-but-damaged.
            locked = delete_backup(st, bid, prefix, now)
            if locked is not None:  # S3 Object Lock: kept until its lock expires, deleted by a later pass
                logger.info("retention: %s is object-locked until %s; deleting it later", bid, fmt(locked))
                continue
            deleted.append(bid)
            metrics.RETENTION_DELETED.inc()
        except RbakError as e:
            logger.warning("retention: cannot delete %s: %s", bid, e)
    if deleted:
        _event(body, "Normal", "RetentionApplied", f"deleted old backups: {', '.join(deleted)}")
    return deleted


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
    from rbak.catalog import list_backups
    from rbak.immutable import delete_backup

    kube = Kube()
    try:
        st = open_backup_storage(kube, namespace, spec.get("storage"))
        if st is None:
            logger.warning("deletionPolicy delete: storage not reachable from the operator; backups kept")
            return
        prefix = rbakconfig.storage_prefix(spec.get("storage"))
        ids = [e.backup_id for e in list_backups(st, prefix) if policy.owned(e.backup_id, name)]
        locked = [bid for bid in ids if delete_backup(st, bid, prefix) is not None]  # Object Lock: kept
        _event(body, "Normal", "BackupsDeleted", f"deleted {len(ids) - len(locked)} stored backups (deletionPolicy delete)"
               + (f"; kept {len(locked)} still object-locked: {', '.join(locked)}" if locked else ""))
    except (RbakError, ApiError) as e:
        # A missing Secret (namespace teardown) must not hang deletion: report and let go.
        _event(body, "Warning", "BackupsKept", f"could not delete stored backups: {e}")
        logger.warning("deletionPolicy delete: %s; letting the object go, backups kept", e)


# --------------------------------------------------------------------------
# RabbitMQRestore
# --------------------------------------------------------------------------

class RestoreSpecError(RbakError):
    prefix = "Restore spec error"


def resolve_restore(kube: Kube, body: dict[str, Any], logger) -> tuple[dict, dict, str, int | None, dict]:
    """(target broker, storage, backup id, stored bytes, backup's spark settings) of a restore."""
    from rbak.catalog import latest_complete, load_manifest

    meta, spec = body["metadata"], body.get("spec") or {}
    ns = meta["namespace"]
    ref = spec.get("backupRef")
    if ref:
        backup = kube.get_backup(ns, ref["name"])
        if backup is None:
            raise RestoreSpecError(f"spec.backupRef.name: RabbitMQBackup {ns}/{ref['name']} not found")
        bspec = backup.get("spec") or {}
        storage, target = bspec.get("storage"), spec.get("target") or bspec.get("broker")
        backup_id = ref.get("backupId")
    else:
        storage, target, backup_id = spec.get("storage"), spec.get("target"), spec.get("backupId")
    if not target:
        raise RestoreSpecError("spec.target: required when restoring from spec.storage")
    st = open_backup_storage(kube, ns, storage)
    prefix = rbakconfig.storage_prefix(storage)
    nbytes = None
    if st is not None:
        if not backup_id:
            entry = latest_complete(st, prefix)
            if entry is None:
                raise RestoreSpecError("no complete backup found in the storage to restore (set backupId?)")
            backup_id, nbytes = entry.backup_id, entry.manifest.total_bytes
        else:
            m = load_manifest(st, backup_id, prefix)
            if not m.is_complete:
                raise RestoreSpecError(f"backup {backup_id!r} is incomplete (manifest has no completed_at)")
            nbytes = m.total_bytes
    elif not backup_id:
        raise RestoreSpecError("backupId: required when the operator cannot read the storage (PVC)")
    return target, storage, backup_id, nbytes, spec.get("spark") or {}


def _with_backup_keys(kube: Kube, body: dict[str, Any]) -> dict[str, Any]:
    """A restore's spec with the referenced RabbitMQBackup's keys when it names none itself."""
    spec = body.get("spec") or {}
    ref = spec.get("backupRef")
    if spec.get("encryption") or not ref:
        return spec
    backup = kube.get_backup(body["metadata"]["namespace"], ref["name"]) or {}
    enc = (backup.get("spec") or {}).get("encryption") or {}
    return {**spec, "encryption": {"keysSecretRef": enc["keysSecretRef"]}} if enc.get("keysSecretRef") else spec


def reconcile_restore(kube: Kube, namespace: str, name: str, logger) -> dict[str, Any] | str | None:
    """One pass over a RabbitMQRestore: the status patch, None (still running) or GONE (nothing left to do)."""
    body = kube.get_restore(namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return GONE
    now = clock_now()
    meta, spec = body["metadata"], body.get("spec") or {}
    status = dict(body.get("status") or {})
    gen = meta.get("generation")
    if status.get("phase") in ("Succeeded", "Failed"):
        return GONE
    if not status.get("engine"):
        try:
            target, storage, backup_id, nbytes, spark = resolve_restore(kube, body, logger)
            engine = policy.restore_engine(spec.get("engine"), nbytes, spec.get("sparkThresholdBytes"))
            run = naming.restore_run_name(name)
            resolved = resolve_broker(kube, target, namespace, "spec.target")
            cfg, secret_env = rbakconfig.restore_config(_with_backup_keys(kube, body), namespace, backup_id, target,
                                                        storage, resolved)
        except RbakError as e:
            patch = {"phase": "Failed", "reason": "InvalidSpec", "message": str(e), "completionTime": fmt(now),
                     "conditions": set_condition(status.get("conditions"), "Completed", "False", "InvalidSpec", str(e), now, gen)}
            kube.patch_status(RESTORE_PLURAL, namespace, name, patch)
            _event(body, "Warning", "RestoreFailed", str(e))
            metrics.RUNS.labels("restore", "failed").inc()
            return patch
        start = {"phase": "Running", "backupId": backup_id, "engine": engine, "startTime": fmt(now),
                 "observedGeneration": gen,
                 "conditions": set_condition(status.get("conditions"), "Progressing", "True", "Started",
                                             f"restoring {backup_id} with {engine}", now, gen)}
        if nbytes is not None:
            start["bytes"] = nbytes
        labels = bodies.restore_labels(name)
        if engine == "spark":
            start["sparkApplicationName"] = run
        else:
            start["jobName"] = run
        kube.patch_status(RESTORE_PLURAL, namespace, name, {k: v for k, v in start.items() if v is not None})
        kube.create_configmap(bodies.configmap_body(run, namespace, body, cfg, labels))
        if engine == "spark":
            prefix = rbakconfig.storage_prefix(storage)
            args = ["--path", rbakconfig.storage_url(storage), "--backup-id", backup_id,
                    *(["--prefix", prefix] if prefix else []),
                    "--config", f"{rbakconfig.CONFIG_DIR}/{rbakconfig.CONFIG_FILE}"]
            created = kube.create_spark_app(bodies.spark_application_body(
                name=run, namespace=namespace, owner=body, spark=spark, script="restore.py", arguments=args,
                secret_env=secret_env, config_name=run, labels=labels))
        else:
            created = kube.create_job(bodies.job_body(
                name=run, namespace=namespace, owner=body, spec=spec, storage=storage, secret_env=secret_env,
                args=bodies.restore_args(), labels=labels, annotations={bodies.A_BACKUP_ID: backup_id},
                progress_id=run))
        if created:
            metrics.STARTED.labels("restore", "manual").inc()
            _event(body, "Normal", "RestoreStarted", f"restoring backup {backup_id} with {engine} {run}")
        return start
    # Follow the run.
    if status.get("engine") == "spark":
        app = kube.get_spark_app(namespace, status.get("sparkApplicationName", ""))
        st = spark_state(app) if app else RunState("Failed", "SparkApplicationMissing", "the SparkApplication disappeared")
    else:
        job = kube.get_job(namespace, status.get("jobName", ""))
        if job is None:
            st = RunState("Failed", "JobMissing", f"Job {status.get('jobName')} disappeared")
        else:
            st = job_state(job)
            if st.phase == "Failed":
                st = job_state(job, kube.job_pods(namespace, job["metadata"]["name"]))
    if not st.finished:
        return None
    end = st.end or now
    # progress: None even if this pass read none (a timer tick may have written one since)
    patch = {"phase": st.phase, "reason": st.reason, "message": st.message, "completionTime": fmt(end),
             "progress": None}
    started = parse_time(status["startTime"]) if status.get("startTime") else None
    if started:
        patch["durationSeconds"] = round(max(0.0, (end - started).total_seconds()), 3)
    ref = spec.get("backupRef")
    storage = spec.get("storage")
    if ref:
        b = kube.get_backup(namespace, ref["name"]) or {}
        storage = (b.get("spec") or {}).get("storage")
    m = load_manifest_safe(kube, namespace, storage, status.get("backupId", ""), logger) if storage else None
    if m is not None:
        from .status import manifest_counts

        c = manifest_counts(m)
        patch.update(messages=c["messages"], bytes=c["bytes"], size=c["size"])
    ok = st.phase == "Succeeded"
    conds = set_condition(status.get("conditions"), "Progressing", "False", "Finished", "run finished", now, gen)
    patch["conditions"] = set_condition(conds, "Completed", "True" if ok else "False",
                                        "RestoreSucceeded" if ok else "RestoreFailed",
                                        st.message or st.reason or st.phase, now, gen)
    kube.patch_status(RESTORE_PLURAL, namespace, name, patch)
    metrics.RUNS.labels("restore", st.phase.lower()).inc()
    if started:
        metrics.DURATION.labels("restore").observe(patch.get("durationSeconds", 0))
    if ok:
        _event(body, "Normal", "RestoreSucceeded", f"restored backup {status.get('backupId')}")
    else:
        _event(body, "Warning", "RestoreFailed", f"restore of {status.get('backupId')} failed: {st.message or st.reason}")
    return patch


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
