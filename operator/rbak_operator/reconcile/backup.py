"""One pass over a RabbitMQBackup, in small steps: observe its runs, record the finished ones,
prune Job history, apply retention, start on-demand and scheduled runs, follow drills, and write
the status. Each step reads and extends one ``BackupPass``; the decisions themselves are pure
functions (``policy``, ``schedule``, ``status``).

Scheduling compares the cron's slots with the persisted ``status.lastScheduleTime`` (written
*before* the Job is created), so restarts and a second replica never double-run a slot: the Job
name is derived from the slot and a second create gets 409. The first pass after a start-up reads
the Jobs' real state, so a run left ``Running`` by a crashed operator is reconciled, not failed
blindly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rbak.errors import RbakError
from rbak_operator.crds.schema import BACKUP_PLURAL
from rbak_operator.decide import bodies, naming, policy, rbakconfig, schedule, wake
from rbak_operator.decide import progress
from rbak_operator.decide.status import (
    GONE,
    RunState,
    in_pod_validation,
    job_state,
    push_history,
    run_summary,
    set_condition,
    spark_state,
)
from rbak_operator.decide.times import fmt, parse_time
from rbak_operator.kube import events
from rbak_operator.kube.client import Kube
from rbak_operator.kube.credentials import resolve_broker
from rbak_operator.metrics import runs as metrics
from rbak_operator.metrics.resources import observe  # the gauges follow every status written
from rbak_operator.reconcile import drill
from rbak_operator.reconcile.startup import check_start
from rbak_operator.reconcile.storage import apply_retention, load_manifest_safe, report_problems
from rbak_operator.runtime import clock, wakeups

TRIGGER_ANNOTATION = "rbak.io/backup-now"
DEFAULT_DEADLINE = 600  # a slot older than this is not (re)created after a crash without startingDeadlineSeconds
HISTORY = 10


@dataclass
class BackupPass:
    """What one pass knows and has decided so far."""

    kube: Kube
    body: dict[str, Any]
    now: datetime
    logger: Any
    jobs: list[dict[str, Any]] = field(default_factory=list)
    states: dict[str, RunState] = field(default_factory=dict)
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    active: list[str] = field(default_factory=list)
    patch: dict[str, Any] = field(default_factory=dict)
    conditions: list[dict[str, Any]] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    recorded: set[str] = field(default_factory=set)
    new_success: bool = False
    phase_hint: str | None = None
    next_slot: datetime | None = None  # the cron's next slot, suspended or not (wake.py)
    start_due: list[datetime | None] = field(default_factory=list)  # when a waiting pod reaches the start bound

    @property
    def meta(self) -> dict[str, Any]:
        return self.body["metadata"]

    @property
    def spec(self) -> dict[str, Any]:
        return self.body.get("spec") or {}

    @property
    def status(self) -> dict[str, Any]:
        return self.body["status"]  # a copy made for this pass (reconcile_backup)

    @property
    def namespace(self) -> str:
        return self.meta["namespace"]

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def generation(self) -> Any:
        return self.meta.get("generation")

    def condition(self, ctype: str, value: str, reason: str, message: str) -> None:
        self.conditions = set_condition(self.conditions, ctype, value, reason, message, self.now, self.generation)


def reconcile_backup(kube: Kube, namespace: str, name: str, logger) -> dict[str, Any] | str | None:
    """One pass over a RabbitMQBackup: the status patch applied, or GONE."""
    return backup_pass(kube, namespace, name, logger)[0]


def backup_pass(kube: Kube, namespace: str, name: str, logger) -> tuple[dict[str, Any] | str, list[datetime | None]]:
    """``reconcile_backup`` and the times its next pass is due for (wake.py)."""
    body = kube.get_backup(namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return GONE, []
    body = dict(body, status=dict(body.get("status") or {}))
    p = BackupPass(kube, body, clock.now(), logger)
    observe_runs(p)
    record_finished_runs(p)
    prune_job_history(p)
    retention_step(p)
    manual_trigger_step(p)
    if not schedule_step(p):
        return p.patch, []  # an invalid schedule: the status says so, nothing else happens until the spec changes
    restore_drill = drill.reconcile(kube, body, p.now, events.post)
    if restore_drill is not None:
        p.patch["restoreDrill"] = restore_drill
    changed = write_status(p)
    return changed, [*wake.backup_times({**p.status, **p.patch}, p.next_slot), *p.start_due]


def observe_runs(p: BackupPass) -> None:
    """The Jobs of this object and their state (pods read only for failed ones: the reason)."""
    p.jobs = p.kube.list_jobs(p.namespace, {bodies.L_BACKUP: naming.label_value(p.name)})
    for j in p.jobs:
        jname = j["metadata"]["name"]
        st = job_state(j)
        if st.phase == "Running":  # a pod that cannot start fails the run past the bound (startup.py)
            st, due = check_start(p.kube, p.namespace, j, p.now)
            p.start_due.append(due)
        elif st.phase == "Failed":
            p.pods[jname] = p.kube.job_pods(p.namespace, jname)
            st = job_state(j, p.pods[jname])
        p.states[jname] = st
    p.active = sorted(n for n, s in p.states.items() if not s.finished)
    metrics.ACTIVE.labels("backup").set(len(p.active))
    p.conditions = p.status.get("conditions")
    p.history = list(p.status.get("history") or [])
    p.recorded = {h["jobName"] for h in p.history if h.get("jobName")}


def record_finished_runs(p: BackupPass) -> None:
    """Runs that finished since the last pass, into history/lastRun (counts from manifest.json)."""
    order = sorted(p.jobs, key=lambda j: (p.states[j["metadata"]["name"]].end or p.now, j["metadata"]["name"]))
    for j in order:
        jname = j["metadata"]["name"]
        st = p.states[jname]
        if not st.finished or jname in p.recorded:
            continue
        summary, outcome, counted = summarize_run(p, j, st)
        p.history = push_history(p.history, summary, HISTORY)
        p.recorded.add(jname)
        p.patch["lastRun"] = summary
        metrics.RUNS.labels("backup", st.phase.lower()).inc()
        if st.duration is not None:
            metrics.DURATION.labels("backup").observe(st.duration)
        record_outcome(p, summary, st, outcome, counted)
    p.history, validated = follow_validations(p.kube, p.body, p.history, p.patch)
    p.new_success = p.new_success or validated
    if p.history != list(p.status.get("history") or []):
        p.patch["history"] = p.history


def summarize_run(p: BackupPass, job: dict[str, Any], st: RunState) -> tuple[dict[str, Any], str, bool]:
    """The history entry of one finished run and its outcome: succeeded, validation-failed, partial or failed."""
    jname = job["metadata"]["name"]
    ann = job["metadata"].get("annotations") or {}
    jlabels = job["metadata"].get("labels") or {}
    backup_id = ann.get(bodies.A_BACKUP_ID, jname)
    has_validate = any(c.get("name") == "validate" for c in job["spec"]["template"]["spec"].get("containers", []))
    # Validation in the run's pod: the backup (init container) may have been written and then failed it.
    validation = in_pod_validation(st, p.pods.get(jname)) if has_validate else None
    # A failed run may still have written a complete manifest: a partial backup (some queue refused/failed).
    manifest = load_manifest_safe(p.kube, p.namespace, p.spec.get("storage"), backup_id, p.logger)
    written = st.phase == "Succeeded" or validation == "Failed" or bool(manifest and manifest.is_partial)
    manifest = manifest if written else None
    summary = run_summary(
        backup_id=backup_id, job_name=jname, trigger=jlabels.get(bodies.L_TRIGGER, "schedule"), state=st,
        slot=parse_time(ann[bodies.A_SLOT]) if ann.get(bodies.A_SLOT) else None, manifest=manifest,
        validation=validation)
    if validation:
        summary.update(validationRun=jname, validationEngine="job")
    if validation == "Failed":
        cause = report_problems(p.kube, p.body, backup_id) or st.message or st.reason
        summary.update(reason="ValidationFailed", message=f"validation failed: {cause}")
    partial = manifest is not None and manifest.is_partial
    if partial:
        summary.update(reason="PartiallyFailed", message=f"backup {backup_id} is partial: "
                       + "; ".join(summary.get("partialQueues") or [])[:900])
    if st.phase == "Succeeded" and manifest is None:
        summary["message"] = "succeeded; manifest.json not readable by the operator (counts unknown)"
    if st.phase == "Succeeded" and not has_validate and manifest is not None:
        start_validation(p.kube, p.body, summary, manifest.total_bytes)
    if st.phase == "Succeeded":
        return summary, "succeeded", manifest is not None
    return summary, "validation-failed" if validation == "Failed" else "partial" if partial else "failed", manifest is not None


def record_outcome(p: BackupPass, summary: dict[str, Any], st: RunState, outcome: str, counted: bool) -> None:
    """Ready condition, event and the success fields of one finished run."""
    backup_id = summary["backupId"]
    if outcome == "succeeded":
        # Retention waits for a pending validation: a new backup that later fails it
        # must not have cost an older good one (keepLast: 1).
        p.new_success = p.new_success or summary.get("validation") != "Pending"
        p.patch["lastSuccessfulTime"] = fmt(st.end or p.now)
        p.patch["lastBackupId"] = backup_id
        p.condition("Ready", "True", "BackupSucceeded", f"backup {backup_id} completed")
        msg = f"backup {backup_id} succeeded"
        if counted:  # the operator read the manifest
            msg += f": {summary['messages']} messages, {summary['size']}, {summary['queues']} queues"
        events.post(p.body, "Normal", "BackupSucceeded", msg)
        held = summary.get("heldByConsumers") or 0
        if held:  # complete as far as the queues' ready messages go; what consumers held is not in it
            text = (f"backup {backup_id}: {held} message(s) held unacknowledged by consumers are not in the backup: "
                    + ", ".join(summary.get("heldQueues") or []))
            p.condition("MessagesHeld", "True", "HeldByConsumers", text)
            events.post(p.body, "Warning", "MessagesNotBackedUp", text)
        elif any(c.get("type") == "MessagesHeld" for c in p.conditions or []):
            p.condition("MessagesHeld", "False", "NoneHeld", f"backup {backup_id}: no message held by consumers")
    elif outcome == "validation-failed":
        p.condition("Ready", "False", "ValidationFailed", f"backup {backup_id} {summary['message']}")
        events.post(p.body, "Warning", "ValidationFailed", f"backup {backup_id} {summary['message']}")
    elif outcome == "partial":
        p.condition("Ready", "False", "BackupPartial", summary["message"])
        events.post(p.body, "Warning", "BackupPartial", summary["message"])
    else:
        why = summary.get("reason") or "RunFailed"  # specific: AuthenticationFailed, SecretMissing, ... (status.py)
        reason = summary.get("message") or st.reason or "the Job failed"  # in the spec's words (status.py)
        p.condition("Ready", "False", why, f"backup {backup_id} failed ({why}): {reason}")
        events.post(p.body, "Warning", "BackupFailed", f"backup {backup_id} failed ({why}): {reason}")


def prune_job_history(p: BackupPass) -> None:
    """Job history limits (the Jobs' ConfigMaps go with them)."""
    finished = [(n, s.phase, fmt(s.end) or "") for n, s in p.states.items() if s.finished and n in p.recorded]
    for victim in policy.history_victims(finished, int(p.spec.get("successfulJobsHistoryLimit", 3)),
                                         int(p.spec.get("failedJobsHistoryLimit", 3))):
        p.kube.delete_job(p.namespace, victim)
        p.kube.delete_configmap(p.namespace, victim)


def retention_step(p: BackupPass) -> None:
    """Retention, after a new successful (and, when validated after the run, validated) backup."""
    if not (p.new_success and p.spec.get("retention")):
        return
    deleted = apply_retention(p.kube, p.body, p.now, p.logger)
    if deleted:
        metrics.RETENTION_DELETED.inc(len(deleted))
        events.post(p.body, "Normal", "RetentionApplied", f"deleted old backups: {', '.join(deleted)}")
        ret = dict(p.status.get("retention") or {})
        p.patch["retention"] = {"deletedTotal": int(ret.get("deletedTotal") or 0) + len(deleted), "lastDeleted": deleted}


def manual_trigger_step(p: BackupPass) -> None:
    """On-demand trigger: the annotation's value names the run, which runs once per value."""
    trigger_value = (p.meta.get("annotations") or {}).get(TRIGGER_ANNOTATION)
    if not trigger_value or trigger_value == p.status.get("lastManualTrigger"):
        return
    decision = policy.concurrency(p.spec.get("concurrencyPolicy"), p.active)
    if decision == "skip":
        return
    if decision == "replace":
        for a in p.active:
            p.kube.delete_job(p.namespace, a)
    run_name = naming.manual_run_name(p.name, trigger_value)
    observe(BACKUP_PLURAL, p.kube.patch_status(BACKUP_PLURAL, p.namespace, p.name, {"lastManualTrigger": trigger_value}))
    p.status["lastManualTrigger"] = trigger_value
    if start_backup_run(p.kube, p.body, run_name, "manual", None, trigger_value):
        p.active.append(run_name)


def schedule_step(p: BackupPass) -> bool:
    """The cron: resume a slot a crash left without its Job, skip or run the due slot. False when the
    schedule is invalid (the status is already written)."""
    if not p.spec.get("schedule"):
        p.patch["nextScheduleTime"] = None
        return True
    try:
        sched = schedule.parse_schedule(p.spec["schedule"], p.spec.get("timeZone"))
    except RbakError as e:
        p.condition("Ready", "False", "InvalidSchedule", str(e))
        p.patch.update(phase="Failed", conditions=p.conditions)
        observe(BACKUP_PLURAL, p.kube.patch_status(BACKUP_PLURAL, p.namespace, p.name, p.patch))
        return False
    last = parse_time(p.status["lastScheduleTime"]) if p.status.get("lastScheduleTime") else None
    created = parse_time(p.meta["creationTimestamp"]) if p.meta.get("creationTimestamp") else None
    if created is None and last is None:
        # The emulator (and only it) sets no creationTimestamp: start counting from first sight.
        p.patch["lastScheduleTime"] = fmt(p.now)
        last = p.now.replace(microsecond=0)
    deadline = p.spec.get("startingDeadlineSeconds")
    resume_pending_slot(p, last, deadline)
    d = schedule.decide(sched, last, created, p.now, deadline)
    p.next_slot = d.next_time
    if p.spec.get("suspend"):
        p.patch["nextScheduleTime"] = None
        p.phase_hint = "Suspended"
        if d.slot is not None:
            p.patch["lastScheduleTime"] = fmt(d.slot)  # slots passing while suspended are skipped, not run on resume
        return True
    p.patch["nextScheduleTime"] = fmt(d.next_time)
    if d.action == "missed":
        p.patch["lastScheduleTime"] = fmt(d.slot)
        p.patch["missedSchedules"] = int(p.status.get("missedSchedules") or 0) + d.missed
        p.patch["lastMissedTime"] = fmt(d.slot)
        metrics.MISSED.labels("deadline").inc(d.missed)
        events.post(p.body, "Warning", "MissedSchedule",
                    f"slot {fmt(d.slot)} missed by more than startingDeadlineSeconds={deadline}; not run")
    elif d.action == "run":
        run_slot(p, d)
    return True


def resume_pending_slot(p: BackupPass, last: datetime | None, deadline: int | None) -> None:
    """A crash between persisting the slot and creating its Job: create it now (same name, so once)."""
    pending = p.status.get("lastScheduledRun")
    if not pending or not last or pending in p.states or pending in p.recorded or p.spec.get("suspend"):
        return
    if (p.now - last).total_seconds() > (deadline if deadline is not None else DEFAULT_DEADLINE):
        return
    if policy.concurrency(p.spec.get("concurrencyPolicy"), p.active) != "skip" or not p.active:
        if start_backup_run(p.kube, p.body, pending, "schedule", last):
            p.active.append(pending)


def run_slot(p: BackupPass, d: schedule.SlotDecision) -> None:
    """The due slot: skipped while a run is active (Forbid), else its Job (after stopping the old ones: Replace)."""
    assert d.slot is not None, "a run decision carries its slot"
    decision = policy.concurrency(p.spec.get("concurrencyPolicy"), p.active)
    if decision == "skip":
        p.patch["lastScheduleTime"] = fmt(d.slot)
        p.patch["missedSchedules"] = int(p.status.get("missedSchedules") or 0) + 1
        p.patch["lastMissedTime"] = fmt(d.slot)
        metrics.MISSED.labels("forbid").inc()
        events.post(p.body, "Warning", "ScheduleSkipped",
                    f"slot {fmt(d.slot)} skipped: run {', '.join(p.active)} still active (concurrencyPolicy Forbid)")
        return
    if decision == "replace":
        for a in p.active:
            p.kube.delete_job(p.namespace, a)
            events.post(p.body, "Normal", "RunReplaced", f"stopped run {a} (concurrencyPolicy Replace)")
        p.active = []
    busy = other_runs_on_source(p)
    if busy:
        p.patch["lastScheduleTime"] = fmt(d.slot)
        p.patch["missedSchedules"] = int(p.status.get("missedSchedules") or 0) + 1
        p.patch["lastMissedTime"] = fmt(d.slot)
        metrics.MISSED.labels("source-busy").inc()
        events.post(p.body, "Warning", "ScheduleSkipped",
                    f"slot {fmt(d.slot)} skipped: {', '.join(busy)} of another RabbitMQBackup is backing up the same "
                    "source (broker and vhosts)")
        return
    run_name = naming.scheduled_run_name(p.name, d.slot)
    # Persist the slot BEFORE creating the Job: a restart sees it and never runs it twice.
    observe(BACKUP_PLURAL, p.kube.patch_status(BACKUP_PLURAL, p.namespace, p.name, {"lastScheduleTime": fmt(d.slot), "lastScheduledRun": run_name}))
    p.patch.pop("lastScheduleTime", None)
    if start_backup_run(p.kube, p.body, run_name, "schedule", d.slot):
        p.active.append(run_name)
    if d.missed:
        p.patch["missedSchedules"] = int(p.status.get("missedSchedules") or 0) + d.missed


def other_runs_on_source(p: BackupPass) -> list[str]:
    """Active backup runs of the other RabbitMQBackups in this namespace that read this one's source.
    When the watch has shown this namespace's RabbitMQBackups and none other shares the source, no
    LIST is needed (a fleet of objects with one source each costs no namespace-wide LIST per slot)."""
    mine = policy.source_of(p.spec, p.namespace)
    known = wakeups.sources_in(p.namespace)
    if known is not None and not any(n != p.name and policy.same_source(mine, s) for n, s in known.items()):
        return []
    others: dict[str, list[str]] = {}
    for j in p.kube.list_jobs(p.namespace, bodies.common_labels("backup")):
        meta = j.get("metadata") or {}
        owner = next((o.get("name") for o in meta.get("ownerReferences") or []
                      if o.get("kind") == "RabbitMQBackup"), None)
        if not owner or owner == p.name or bodies.L_BACKUP not in (meta.get("labels") or {}):
            continue
        if not job_state(j).finished:
            others.setdefault(owner, []).append(meta["name"])
    found = []
    for owner, runs in others.items():
        body = p.kube.get_backup(p.namespace, owner)
        if body is not None:
            found.append((owner, policy.source_of(body.get("spec") or {}, p.namespace), runs))
    return policy.busy_source(mine, found)


def write_status(p: BackupPass) -> dict[str, Any]:
    """Phase and conditions; only the fields that changed are patched."""
    active = sorted(set(p.active))
    p.patch["active"] = active
    if active:
        phase = "Running"
        p.condition("Progressing", "True", "RunActive", f"running: {', '.join(active)}")
    else:
        last_run = p.patch.get("lastRun") or p.status.get("lastRun") or {}
        phase = p.phase_hint or last_run.get("phase") or ("Scheduled" if p.spec.get("schedule") else "Pending")
        p.condition("Progressing", "False", "Idle", "no run in progress")
    if not any(c.get("type") == "Ready" for c in p.conditions or []):
        p.condition("Ready", "True", "Configured", "waiting for the first run")
    p.patch["phase"] = phase
    p.patch["conditions"] = p.conditions
    p.patch.update(progress.cleared(p.status, bool(active)))  # the run ended: its counts are in lastRun
    if p.generation is not None:
        p.patch["observedGeneration"] = p.generation
    changed = {k: v for k, v in p.patch.items() if p.status.get(k) != v}
    if changed:
        observe(BACKUP_PLURAL, p.kube.patch_status(BACKUP_PLURAL, p.namespace, p.name, changed))
    return changed


def start_backup_run(kube: Kube, body: dict[str, Any], run_name: str, trigger: str, slot: datetime | None,
                      trigger_value: str | None = None) -> bool:
    """ConfigMap + Job for one run; False when the Job already existed."""
    meta, spec = body["metadata"], body.get("spec") or {}
    ns, name = meta["namespace"], meta["name"]
    resolved = resolve_broker(kube, spec.get("broker"), ns, "spec.broker")
    backup_id = naming.run_backup_id(run_name, ns, meta.get("uid"))
    cfg, secret_env = rbakconfig.backup_config(spec, ns, backup_id, resolved, meta)
    labels = bodies.backup_run_labels(name, trigger)
    validate = spec.get("validate") or {}
    vargs = None
    if validate.get("enabled", True) and validate.get("sparkThresholdBytes") is None:
        vargs = bodies.validate_args(rbakconfig.storage_url(spec["storage"]), backup_id, bool(validate.get("deep")),
                                     rbakconfig.storage_prefix(spec["storage"]))
    annotations = {bodies.A_BACKUP_ID: backup_id}
    if slot:
        annotations[bodies.A_SLOT] = fmt(slot)
    if trigger_value is not None:
        annotations[bodies.A_TRIGGER_VALUE] = trigger_value[:256]
    kube.create_configmap(bodies.configmap_body(run_name, ns, body, cfg, labels))
    job = bodies.job_body(bodies.JobRun(name=run_name, namespace=ns, owner=body, spec=spec, storage=spec["storage"],
                          secret_env=secret_env, args=bodies.backup_args(), labels=labels,
                          annotations=annotations, validate_args=vargs, progress_id=backup_id))
    created = kube.create_job(job)
    if created:
        metrics.STARTED.labels("backup", trigger).inc()
        events.post(body, "Normal", "BackupStarted", f"started {trigger} backup run {run_name}")
    return created


def start_validation(kube: Kube, body: dict[str, Any], summary: dict[str, Any], nbytes: int) -> None:
    """validate.sparkThresholdBytes set: validate after the run, with Spark above the threshold."""
    meta, spec = body["metadata"], body.get("spec") or {}
    validate = spec.get("validate") or {}
    engine = policy.validation_engine(validate, nbytes)
    if engine == "none":
        return
    ns, run, bid = meta["namespace"], summary["jobName"], summary["backupId"]
    vname = naming.validate_run_name(run)
    url, prefix = rbakconfig.storage_url(spec["storage"]), rbakconfig.storage_prefix(spec["storage"])
    storage_env = rbakconfig.validation_env(spec)
    labels = {**bodies.common_labels("validate"), bodies.L_VALIDATES: naming.label_value(meta["name"])}
    if engine == "spark":
        kube.create_spark_app(bodies.spark_application_body(
            name=vname, namespace=ns, owner=body, spark=spec.get("spark") or {}, script="validate.py",
            arguments=["--path", url, "--backup-id", bid, *(["--prefix", prefix] if prefix else [])],
            secret_env=storage_env, config_name=None, labels=labels))
    else:
        kube.create_job(bodies.job_body(bodies.JobRun(
            name=vname, namespace=ns, owner=body, spec=spec, storage=spec["storage"], secret_env=storage_env,
            args=bodies.validate_args(url, bid, bool(validate.get("deep")), prefix), labels=labels, with_config=False)))
    summary.update(validation="Pending", validationRun=vname, validationEngine=engine)
    events.post(body, "Normal", "ValidationStarted", f"validating backup {bid} with {engine} {vname}")


def follow_validations(kube: Kube, body: dict[str, Any], history: list[dict[str, Any]],
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
                    cause = report_problems(kube, body, h["backupId"]) or st.message or st.reason
                    h["message"] = f"validation failed: {cause}"
                    events.post(body, "Warning", "ValidationFailed", f"backup {h['backupId']} failed validation: {cause}")
                else:
                    passed = True
                    events.post(body, "Normal", "ValidationPassed", f"backup {h['backupId']} validated")
                last = patch.get("lastRun") or (body.get("status") or {}).get("lastRun") or {}
                if last.get("jobName") == h.get("jobName"):
                    patch["lastRun"] = h
        out.append(h)
    return out, passed
