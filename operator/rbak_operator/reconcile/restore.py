"""One pass over a RabbitMQRestore: start its run once (a Job, or a SparkApplication above the
size threshold), then follow it to the end and write the outcome with the manifest's counts."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from rbak.repo.catalog import latest_complete, load_manifest
from rbak.errors import NotFoundError, RbakError
from rbak.format.manifest import BackupManifest
from rbak_operator.crds.schema import RESTORE_PLURAL
from rbak_operator.decide import bodies, naming, policy, rbakconfig
from rbak_operator.decide.restore_checks import backup_broker_as_target, check_restore_spec
from rbak_operator.decide.archive import is_recoverable, restore_point
from rbak_operator.decide.status import (
    GONE,
    RunState,
    failure_reason,
    in_user_words,
    job_state,
    manifest_counts,
    restore_outcome,
    restore_summary_line,
    run_result,
    set_condition,
    spark_state,
)
from rbak_operator.decide.times import fmt, parse_time
from rbak_operator.kube import events
from rbak_operator.kube.client import Kube
from rbak_operator.kube.credentials import resolve_broker
from rbak_operator.kube.errors import ApiError
from rbak_operator.metrics import runs as metrics
from rbak_operator.metrics.resources import observe  # the gauges follow every status written
from rbak_operator.reconcile.archive import generations as archive_generations
from rbak_operator.reconcile.startup import check_start
from rbak_operator.reconcile.storage import load_manifest_safe, open_backup_storage
from rbak_operator.runtime import clock


class RestoreSpecError(RbakError):
    prefix = "Restore spec error"


def resolve_archive_restore(kube: Kube, body: dict[str, Any]) -> tuple[dict, dict, str, int | None, int]:
    """``spec.archiveRef``: (target broker, storage, the archive's newest generation, its stored bytes, the
    instant in epoch ms every stream is restored up to)."""
    meta, spec = body["metadata"], body.get("spec") or {}
    ns, ref = meta["namespace"], spec["archiveRef"]
    archive = kube.get_archive(ns, ref["name"])
    if archive is None:
        raise RestoreSpecError(f"spec.archiveRef.name: RabbitMQArchive {ns}/{ref['name']} not found")
    aspec = archive.get("spec") or {}
    storage, target = aspec.get("storage"), spec.get("target") or backup_broker_as_target(aspec.get("broker"))
    if not storage or not target:
        raise RestoreSpecError(f"spec.archiveRef.name: RabbitMQArchive {ns}/{ref['name']} has no spec.storage "
                               "or spec.broker")
    st = open_backup_storage(kube, ns, storage)
    if st is None:
        raise RestoreSpecError(f"spec.archiveRef.name: the storage of RabbitMQArchive {ns}/{ref['name']} is a "
                               "PVC the operator cannot read; restore it with spec.storage and spec.backupId")
    prefix = rbakconfig.storage_prefix(storage)
    gens = archive_generations(st, prefix, ref["name"])
    if not gens:
        raise RestoreSpecError(f"spec.archiveRef.name: RabbitMQArchive {ns}/{ref['name']} has archived nothing yet")
    m = load_manifest(st, gens[-1], prefix)
    began = None if is_recoverable(ref.get("pointInTime")) else first_began(st, prefix, gens, m)
    end = restore_point(ref.get("pointInTime"), m.archive.recoverable_until if m.archive else None, ref["name"],
                        began)
    refusal = check_restore_spec(spec, target, m)
    if refusal:
        raise RestoreSpecError(refusal)
    return target, storage, gens[-1], m.total_bytes, end


def first_began(st: Any, prefix: str, gens: list[str], newest: BackupManifest) -> int:
    """When the archive's first generation began (its manifest's, or its ticks' if open): no record of the
    archive is stamped earlier. A generation that never named anything (no manifest, no tick) is skipped."""
    for gid in gens[:-1]:
        try:
            return load_manifest(st, gid, prefix).created_at
        except NotFoundError:
            continue
    return newest.created_at


def resolve_restore(kube: Kube, body: dict[str, Any], logger) -> tuple[dict, dict, str, int | None, dict]:
    """(target broker, storage, backup id, stored bytes, backup's spark settings) of a restore."""
    meta, spec = body["metadata"], body.get("spec") or {}
    ns = meta["namespace"]
    ref = spec.get("backupRef")
    backup = None
    if ref:
        backup = kube.get_backup(ns, ref["name"])
        if backup is None:
            raise RestoreSpecError(f"spec.backupRef.name: RabbitMQBackup {ns}/{ref['name']} not found")
        bspec = backup.get("spec") or {}
        storage, target = bspec.get("storage"), spec.get("target") or backup_broker_as_target(bspec.get("broker"))
        backup_id = ref.get("backupId")
    else:
        storage, target, backup_id = spec.get("storage"), spec.get("target"), spec.get("backupId")
    if not target:
        raise RestoreSpecError("spec.target: required when restoring from spec.storage")
    if not storage:
        raise RestoreSpecError(f"spec.backupRef.name: RabbitMQBackup {ns}/{ref['name']} has no spec.storage"
                               if ref else "spec.storage: required (or spec.backupRef)")
    st = open_backup_storage(kube, ns, storage)
    prefix = rbakconfig.storage_prefix(storage)
    nbytes = None
    if st is not None:
        if not backup_id:
            if backup is not None:  # backupRef: the newest complete backup OF THAT OBJECT, not of the prefix
                bmeta = backup["metadata"]
                entry = latest_complete(st, prefix, with_data=True,
                                        accept=lambda e: policy.owned(e.backup_id, e.manifest, bmeta))
                if entry is None:
                    raise RestoreSpecError(f"spec.backupRef: RabbitMQBackup {ns}/{bmeta['name']} has no complete backup "
                                           "holding data in its storage yet (set spec.backupRef.backupId to restore "
                                           "another one)")
            else:
                entry = latest_complete(st, prefix, with_data=True)  # an empty backup never displaces one with data
            if entry is None:
                raise RestoreSpecError("spec.backupId: no complete backup holding data found in spec.storage to restore")
            backup_id, nbytes = entry.backup_id, entry.manifest.total_bytes if entry.manifest else None
            m = entry.manifest
        else:
            m = load_manifest(st, backup_id, prefix)
            if not m.is_complete:
                raise RestoreSpecError(f"backup {backup_id!r} is incomplete (manifest has no completed_at)")
            nbytes = m.total_bytes
        refusal = check_restore_spec(spec, target, m) if m is not None else None
        if refusal:
            raise RestoreSpecError(refusal)
    elif not backup_id:
        raise RestoreSpecError("backupId: required when the operator cannot read the storage (PVC)")
    return target, storage, backup_id, nbytes, spec.get("spark") or {}


def restore_encryption(own: dict[str, Any] | None, backup: dict[str, Any] | None) -> dict[str, Any] | None:
    """A restore's ``encryption``: its own ``keysSecretRef`` and ``kms`` (region, endpointUrl), each
    taken from the referenced RabbitMQBackup's ``spec.encryption`` when the restore sets none, so a
    restore reads the backup with the keys and KMS endpoint it was written with."""
    own, backup = dict(own or {}), backup or {}
    for name in ("keysSecretRef", "kms"):
        if not own.get(name) and backup.get(name):
            own[name] = backup[name]
    return own or None


def with_backup_keys(kube: Kube, body: dict[str, Any]) -> dict[str, Any]:
    """A restore's spec with the referenced RabbitMQBackup's (or RabbitMQArchive's) keys and KMS access
    where it names none itself."""
    spec = body.get("spec") or {}
    ref = spec.get("backupRef") or spec.get("archiveRef")
    own = spec.get("encryption") or {}
    if not ref or (own.get("keysSecretRef") and own.get("kms")):
        return spec
    ns = body["metadata"]["namespace"]
    backup = (kube.get_backup(ns, ref["name"]) if spec.get("backupRef") else kube.get_archive(ns, ref["name"])) or {}
    enc = restore_encryption(own, (backup.get("spec") or {}).get("encryption"))
    return {**spec, "encryption": enc} if enc else spec


def reconcile_restore(kube: Kube, namespace: str, name: str, logger) -> dict[str, Any] | str | None:
    """One pass over a RabbitMQRestore: the status patch, None (still running) or GONE (nothing left to do)."""
    return restore_pass(kube, namespace, name, logger)[0]


def restore_pass(kube: Kube, namespace: str, name: str, logger) -> tuple[dict[str, Any] | str | None, list]:
    """``reconcile_restore`` and the time its next pass is due (a run's pod still waiting to start)."""
    body = kube.get_restore(namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return GONE, []
    status = dict(body.get("status") or {})
    if status.get("phase") in ("Succeeded", "Failed"):
        return GONE, []
    if not status.get("engine"):
        return start_restore(kube, body, status, logger), []
    st, due = run_state(kube, namespace, status)
    if not st.finished:
        return None, [due]
    return finish_restore(kube, body, status, st, logger), []


def start_restore(kube: Kube, body: dict[str, Any], status: dict[str, Any], logger) -> dict[str, Any]:
    """Resolve the spec and start the run (Failed/InvalidSpec when the spec cannot be resolved)."""
    now = clock.now()
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace, name, gen = meta["namespace"], meta["name"], meta.get("generation")
    point: int | None = None
    try:
        if spec.get("archiveRef"):
            target, storage, backup_id, nbytes, point = resolve_archive_restore(kube, body)
            spark = spec.get("spark") or {}
        else:
            target, storage, backup_id, nbytes, spark = resolve_restore(kube, body, logger)
        engine = policy.restore_engine(spec.get("engine"), nbytes, spec.get("sparkThresholdBytes"))
        run = naming.restore_run_name(name)
        resolved = resolve_broker(kube, target, namespace, "spec.target")
        rspec = with_backup_keys(kube, body)
        if point is not None:  # every stream up to the same instant (rbak restore's time_window_end)
            rspec = {**rspec, "pitr": {"end": point}}
        cfg, secret_env = rbakconfig.restore_config(rspec, namespace, backup_id, target, storage, resolved)
    except ApiError:
        raise  # the API's failure retries the pass (ApiError is a RbakError too)
    except RbakError as e:
        patch = {"phase": "Failed", "reason": "InvalidSpec", "message": str(e), "completionTime": fmt(now),
                 "conditions": set_condition(status.get("conditions"), "Completed", "False", "InvalidSpec", str(e), now, gen)}
        observe(RESTORE_PLURAL, kube.patch_status(RESTORE_PLURAL, namespace, name, patch))
        events.post(body, "Warning", "RestoreFailed", str(e))
        metrics.RUNS.labels("restore", "failed").inc()
        return patch
    start = {"phase": "Running", "backupId": backup_id, "engine": engine, "startTime": fmt(now),
             "observedGeneration": gen,
             "conditions": set_condition(status.get("conditions"), "Progressing", "True", "Started",
                                         f"restoring {backup_id} with {engine}", now, gen)}
    if nbytes is not None:
        start["bytes"] = nbytes
    if point is not None:
        start["pointInTime"] = datetime.fromtimestamp(point / 1000, timezone.utc).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")
    start["sparkApplicationName" if engine == "spark" else "jobName"] = run
    observe(RESTORE_PLURAL, kube.patch_status(RESTORE_PLURAL, namespace, name, {k: v for k, v in start.items() if v is not None}))
    labels = bodies.restore_labels(name)
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
        created = kube.create_job(bodies.job_body(bodies.JobRun(
            name=run, namespace=namespace, owner=body, spec=spec, storage=storage, secret_env=secret_env,
            args=bodies.restore_args(), labels=labels, annotations={bodies.A_BACKUP_ID: backup_id},
            progress_id=naming.run_backup_id(run, namespace, meta.get("uid")))))  # unique across namespaces
    if created:
        metrics.STARTED.labels("restore", "manual").inc()
        events.post(body, "Normal", "RestoreStarted", f"restoring backup {backup_id} with {engine} {run}")
    return start


def run_state(kube: Kube, namespace: str, status: dict[str, Any]) -> tuple[RunState, Any]:
    """The state of the restore's Job or SparkApplication (a vanished one has failed), and when a pod
    still waiting to start reaches the start bound (startup.py)."""
    if status.get("engine") == "spark":
        app = kube.get_spark_app(namespace, status.get("sparkApplicationName", ""))
        return (spark_state(app) if app else RunState("Failed", "SparkApplicationMissing",
                                                      "the SparkApplication disappeared")), None
    job = kube.get_job(namespace, status.get("jobName", ""))
    if job is None:
        return RunState("Failed", "JobMissing", f"Job {status.get('jobName')} disappeared"), None
    st = job_state(job)
    if st.phase == "Running":
        return check_start(kube, namespace, job, clock.now())
    if st.phase == "Failed":
        st = job_state(job, kube.job_pods(namespace, job["metadata"]["name"]))
    return st, None


def finish_restore(kube: Kube, body: dict[str, Any], status: dict[str, Any], st: RunState, logger) -> dict[str, Any]:
    """The finished run's outcome, duration and the backup's counts."""
    now = clock.now()
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace, name, gen = meta["namespace"], meta["name"], meta.get("generation")
    end = st.end or now
    # progress: None even if this pass read none (a timer tick may have written one since)
    reason = failure_reason(st) if st.phase == "Failed" else st.reason
    message = in_user_words(st.message, "restore")
    patch: dict[str, Any] = {"phase": st.phase, "reason": reason, "message": message, "completionTime": fmt(end),
             "progress": None}
    started = parse_time(status["startTime"]) if status.get("startTime") else None
    if started:
        patch["durationSeconds"] = round(max(0.0, (end - started).total_seconds()), 3)
    ref = spec.get("backupRef")
    storage = spec.get("storage")
    if ref:
        b = kube.get_backup(namespace, ref["name"]) or {}
        storage = (b.get("spec") or {}).get("storage")
    elif spec.get("archiveRef"):
        a = kube.get_archive(namespace, spec["archiveRef"]["name"]) or {}
        storage = (a.get("spec") or {}).get("storage")
    m = load_manifest_safe(kube, namespace, storage, status.get("backupId", ""), logger) if storage else None
    if m is not None:  # the backup's size; its message total is not what was restored
        c = manifest_counts(m)
        patch.update(backupMessages=c["messages"], bytes=c["bytes"], size=c["size"])
    result = run_result(kube.job_pods(namespace, status["jobName"])) if status.get("jobName") else None
    if result is not None:  # what the run published and the target confirmed, where, dry run or not
        patch.update(restore_outcome(result))
        if result.get("failed_queues") and st.phase == "Failed":  # the queues' own errors, in the spec's words
            errors = result.get("errors") or result["failed_queues"]
            patch["message"] = message = in_user_words(
                f"{len(result['failed_queues'])} queue(s) failed: " + "; ".join(errors[:5]), "restore")
            patch["reason"] = reason = failure_reason(RunState("Failed", "", message))
    ok = st.phase == "Succeeded"
    conds = set_condition(status.get("conditions"), "Progressing", "False", "Finished", "run finished", now, gen)
    patch["conditions"] = set_condition(conds, "Completed", "True" if ok else "False",
                                        "RestoreSucceeded" if ok else reason,
                                        message or st.reason or st.phase, now, gen)
    observe(RESTORE_PLURAL, kube.patch_status(RESTORE_PLURAL, namespace, name, patch))
    metrics.RUNS.labels("restore", st.phase.lower()).inc()
    if started:
        metrics.DURATION.labels("restore").observe(patch.get("durationSeconds", 0))
    if ok:
        done = f": {restore_summary_line(patch)}" if result is not None else ""
        events.post(body, "Normal", "RestoreSucceeded", f"restored backup {status.get('backupId')}{done}")
    else:
        events.post(body, "Warning", "RestoreFailed",
                    f"restore of {status.get('backupId')} failed ({reason}): {patch['message'] or st.reason}")
    return patch
