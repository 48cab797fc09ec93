"""Scheduled restore drills of a RabbitMQBackup (``spec.verify.restoreDrill``).

On the drill's own cron schedule the operator picks the newest complete
backup it can see (else ``status.lastBackupId``) and starts a Job running
``rbak drill`` against the drill target (default: the backed-up broker). The
Job restores into a scratch vhost, compares, deletes the vhost and stores its
report next to the backup (``drills/<ts>-<job name>.json``); when the Job
ends the operator reads that report, writes ``status.restoreDrill``, posts an
event, and the per-resource gauges follow from the status. A signed report
is read again every ``EVIDENCE_RECHECK`` while the status names its signer:
one altered (or removed) in the storage since no longer shows a signer. Pure
functions decide the config, the Job and the result; ``reconcile`` applies them.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from typing import Any

from rbak.drill.archive import generation_ids as archive_generations
from rbak.repo.catalog import latest_complete
from rbak.drill.backup import find_drill_report
from rbak.errors import EvidenceError, RbakError
from rbak.repo.evidence import verify
from rbak_operator.decide import bodies, naming, rbakconfig, schedule
from rbak_operator.decide.policy import owned
from rbak_operator.decide.rbakconfig import CONFIG_DIR, CONFIG_FILE, ResolvedBroker
from rbak_operator.decide.status import RunState, job_state
from rbak_operator.decide.times import fmt, parse_time
from rbak_operator.decide.wake import EVIDENCE_RECHECK, evidence_recheck_time  # noqa: F401 (EVIDENCE_RECHECK: drill's setting)
from rbak_operator.kube.credentials import resolve_broker
from rbak_operator.kube.errors import ApiError
from rbak_operator.reconcile.storage import open_backup_storage

log = logging.getLogger("rbak_operator")

FIELD = "spec.verify.restoreDrill"
TRIGGER_ANNOTATION = "rbak.io/drill-now"  # each distinct value runs one drill now
KEEP_JOBS = 2  # finished drill Jobs (and their ConfigMaps) kept for kubectl logs
SIGNING_KEY_ENV = "RBAK_DRILL_SIGNING_KEY"  # drill.signing_key_env of the Job's config
SIGNING_KEY_KEY = "signing.pem"  # default key in spec.verify.restoreDrill.signingKeySecretRef
ARCHIVE_KIND = "RabbitMQArchive"
DEFAULT_LOOKBACK_SECONDS = 300  # spec.verify.restoreDrill.lookbackSeconds of a RabbitMQArchive (rbak's default)
ARCHIVE_REPORT_GENERATIONS = 3  # an archive drill's report is looked for in this many newest generations


# --------------------------------------------------------------------------
# Pure decisions.
# --------------------------------------------------------------------------

def drill_spec(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The drill settings when drills are on, else None."""
    d = ((spec.get("verify") or {}).get("restoreDrill")) or {}
    return d if d.get("enabled", True) and d.get("schedule") else None


def is_archive(body: dict[str, Any]) -> bool:
    """A RabbitMQArchive's drill (``rbak drill --archive``), else a RabbitMQBackup's."""
    return body.get("kind") == ARCHIVE_KIND


def drill_base(body: dict[str, Any]) -> str:
    """What a drill's Job names and labels start with: an archive's differ from a backup's of the same name."""
    name = body["metadata"]["name"]
    return f"{name}-archive" if is_archive(body) else name


def drill_run_name(backup_name: str, slot: datetime) -> str:
    """Job name == ConfigMap name == drill id of one slot (a second create of the slot gets 409)."""
    return naming.dns_label(f"{backup_name}-drill-{naming.slot_stamp(slot)}")


def manual_run_name(backup_name: str, trigger_value: str) -> str:
    return naming.dns_label(f"{backup_name}-drill-manual-{hashlib.sha256(trigger_value.encode()).hexdigest()[:8]}")


def drill_labels(backup_name: str) -> dict[str, str]:
    return {**bodies.common_labels("drill"), bodies.L_DRILLS: naming.label_value(backup_name)}


def drill_config(spec: dict[str, Any], namespace: str, backup_id: str,
                 resolved: ResolvedBroker | None = None) -> tuple[dict[str, Any], list[rbakconfig.PodEnv]]:
    """Config for ``rbak drill``: storage, keys and KMS access as the backup's, target the drill's
    (default the backup's broker)."""
    d = drill_spec(spec) or {}
    target_field = f"{FIELD}.target" if d.get("target") else "spec.broker"
    target, env1 = rbakconfig.broker_connection(d.get("target") or spec.get("broker"), namespace, target_field,
                                                resolved)
    storage, env2 = rbakconfig.storage_section(spec.get("storage"))
    lock = spec.get("objectLock") or {}
    if lock and storage.get("backend") == "s3":  # the report is one more locked object, written once
        storage["object_lock_mode"] = lock.get("mode")
        storage["object_lock_retain_days"] = lock.get("retainDays")
    drill: dict[str, Any] = {"target": target}
    if d.get("readTimeoutSeconds"):
        drill["read_timeout_secs"] = float(d["readTimeoutSeconds"])
    cfg: dict[str, Any] = {"mode": "drill", "backup_id": backup_id, "storage": storage, "drill": drill}
    kcfg, kenv = rbakconfig.kms_access(spec.get("encryption"))
    if kcfg:  # an envelope backup wrapped by KMS is unwrapped at the same endpoint it was wrapped at
        cfg["encryption"] = kcfg
    env3: list[rbakconfig.PodEnv] = [*rbakconfig.encryption_env(spec.get("encryption")), *kenv]
    ref = d.get("signingKeySecretRef")
    if ref is not None:  # the key's PEM from a Secret (no RBAC: the kubelet fills the env var)
        if not ref.get("name"):
            raise RbakError(f"{FIELD}.signingKeySecretRef.name: required")
        drill["signing_key_env"] = SIGNING_KEY_ENV
        env3 = env3 + [rbakconfig.SecretEnv(SIGNING_KEY_ENV, ref["name"], ref.get("key") or SIGNING_KEY_KEY)]
    seen: dict[str, rbakconfig.PodEnv] = {}
    for e in env1 + env2 + env3:
        seen.setdefault(e.env, e)
    return cfg, list(seen.values())


def archive_drill_config(spec: dict[str, Any], namespace: str, resolved_target: ResolvedBroker | None = None,
                         resolved_source: ResolvedBroker | None = None
                         ) -> tuple[dict[str, Any], list[rbakconfig.PodEnv]]:
    """Config for ``rbak drill --archive``: as a backup drill's, plus ``source`` (the archived broker: its
    live streams are what the restore is compared with) and ``drill.lookback_secs``."""
    cfg, env = drill_config(spec, namespace, "", resolved_target)
    cfg.pop("backup_id")
    source, env_source = rbakconfig.broker_connection(spec.get("broker"), namespace, "spec.broker", resolved_source)
    cfg["source"] = source
    d = drill_spec(spec) or {}
    look = d.get("lookbackSeconds")
    cfg["drill"]["lookback_secs"] = float(DEFAULT_LOOKBACK_SECONDS if look is None else look)  # 0: now
    seen: dict[str, rbakconfig.PodEnv] = {}
    for e in env + env_source:
        seen.setdefault(e.env, e)
    return cfg, list(seen.values())


def drill_args(backup_id: str, drill_id: str, archive: str | None = None) -> list[str]:
    what = ["--archive", archive] if archive is not None else ["--backup-id", backup_id]
    return ["drill", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}", *what, "--drill-id", drill_id, "--json"]


def drill_job(owner: dict[str, Any], run_name: str, backup_id: str, secret_env: list[rbakconfig.PodEnv],
              slot: datetime) -> dict[str, Any]:
    spec = owner.get("spec") or {}
    meta = owner["metadata"]
    d = drill_spec(spec) or {}
    pod = {**spec, **{k: d[k] for k in ("resources", "activeDeadlineSeconds") if d.get(k)}}
    archive = meta["name"] if is_archive(owner) else None
    return bodies.job_body(bodies.JobRun(name=run_name, namespace=meta["namespace"], owner=owner, spec=pod,
                           storage=spec.get("storage") or {}, secret_env=secret_env,
                           args=drill_args(backup_id, run_name, archive), labels=drill_labels(drill_base(owner)),
                           annotations={bodies.A_BACKUP_ID: backup_id, bodies.A_SLOT: fmt(slot)}))


def drill_result(state: RunState, report: dict[str, Any] | None, backup_id: str, job_name: str) -> dict[str, Any]:
    """``status.restoreDrill`` fields of a finished drill Job (its stored report first, the Job's own cause else)."""
    out: dict[str, Any] = {"lastJob": job_name, "backupId": backup_id, "lastRunTime": fmt(state.end or state.start)}
    if state.duration is not None:
        out["durationSeconds"] = round(state.duration, 3)
    if report is not None and isinstance(report.get("archive"), dict):
        out.update(archive_drill_result(report))
        out.update(evidence_status(report) if report.get("signature") is not None else {"signer": None})
        return out
    if report is not None:
        passed = bool(report.get("passed"))
        queues = report.get("queues") or []
        out.update(result="Passed" if passed else "Failed",
                   reason="DrillPassed" if passed else "DrillFailed",
                   message=(f"{len(queues)} queue(s) restored into a scratch vhost and matched the backup" if passed
                            else str(report.get("reason") or "the drill failed"))[:1000],
                   scratchVhost=report.get("scratch_vhost"), queues=len(queues),
                   failedQueues=[f"{q.get('vhost')}/{q.get('queue')}" for q in queues if not q.get("passed")][:20],
                   messages=sum(int(q.get("actual_count") or 0) for q in queues))
        # None clears the signer of an earlier signed drill: the status names only who signed this one
        out.update(evidence_status(report) if report.get("signature") is not None else {"signer": None})
        return out
    out.update(dict.fromkeys(REPORT_FIGURES))  # an earlier drill's figures are not this one's
    out.update(result="Failed", reason=state.reason or "DrillJobFailed", signer=None,
               message=(state.message or "the drill Job ended without storing a report")[:1000])
    return out


#: ``status.restoreDrill`` fields only a stored report gives; a drill Job that stored none clears them
#: (null in the status patch), so the status never shows the last passed drill's recovery point under
#: a failed drill's result.
REPORT_FIGURES = ("scratchVhost", "queues", "failedQueues", "messages", "streams", "failedStreams",
                  "recoveryPointSeconds", "restoreSeconds", "restorePoint", "recoverableUntil", "evidenceKey")


def archive_drill_result(report: dict[str, Any]) -> dict[str, Any]:
    """``status.restoreDrill`` fields of an archive drill's report: the recovery point achieved beside the
    objective, the RTO, the point restored and where the evidence is."""
    a = report["archive"]
    passed = bool(report.get("passed"))
    streams = a.get("streams") or []
    compared = sum(int(s.get("restored_count") or 0) for s in streams)
    return {"result": "Passed" if passed else "Failed", "reason": "DrillPassed" if passed else "DrillFailed",
            "message": (f"{len(streams)} stream(s) restored up to {a.get('restore_point_utc')} into a scratch vhost "
                        f"and matched the live streams ({compared} records)" if passed
                        else str(report.get("reason") or "the drill failed"))[:1000],
            "backupId": a.get("generation"), "scratchVhost": report.get("scratch_vhost"), "streams": len(streams),
            "messages": compared,
            "failedStreams": [f"{s.get('vhost')}/{s.get('stream')}" for s in streams if not s.get("passed")][:20],
            "recoveryPointSeconds": a.get("recovery_point_secs"), "restoreSeconds": a.get("restore_secs"),
            "restorePoint": a.get("restore_point_utc"), "recoverableUntil": a.get("recoverable_until_utc"),
            "evidenceKey": report.get("report_key")}


def evidence_status(report: dict[str, Any]) -> dict[str, Any]:
    """``signer`` (the key fingerprint) of a signed report that verifies against its embedded key; a
    signed report that does not verify fails the drill (its evidence was changed after signing)."""
    try:
        return {"signer": verify(report, where="drill report").fingerprint}
    except EvidenceError as e:
        return {"result": "Failed", "reason": "DrillEvidenceInvalid", "message": str(e)[:1000], "signer": None}


def recheck_evidence(d: dict[str, Any], found: tuple[str, dict[str, Any]] | None) -> dict[str, Any]:
    """``status.restoreDrill`` changes after reading the last drill's signed report again (``found``:
    its key and JSON, None when it is gone): {} while it verifies, signed by the key the status
    names; else the drill counts as failed, the message names the object and the changed field, and
    the signer is cleared (the status never vouches for evidence that no longer verifies)."""
    job, signer = d.get("lastJob"), d.get("signer")
    if found is None:
        return {"result": "Failed", "reason": "DrillEvidenceMissing", "signer": None,
                "message": f"the signed report of drill {job} (signed by {signer}) is no longer in the storage"}
    key, report = found
    try:
        fp = verify(report, where=key).fingerprint
    except EvidenceError as e:
        return {"result": "Failed", "reason": "DrillEvidenceInvalid", "signer": None,
                "message": f"the stored report of drill {job} no longer verifies: {e.args[0]}"[:1000]}
    if fp != signer:
        return {"result": "Failed", "reason": "DrillEvidenceInvalid", "signer": None,
                "message": f"{key}: now signed by key {fp}, not by {signer} that signed drill {job}"}
    return {}


# --------------------------------------------------------------------------
# Applying them.
# --------------------------------------------------------------------------

READ_FAILED = "read-failed"  # _stored_report: the storage did not answer (the status is left as it is)


def _stored_report(kube: Any, body: dict[str, Any], backup_id: str, drill_id: str
                   ) -> tuple[str, dict[str, Any]] | None | str:
    """(key, report) of a drill's stored report, None when there is none, READ_FAILED when the
    storage cannot be read (or is a PVC the operator does not mount)."""
    spec = body.get("spec") or {}
    try:
        st = open_backup_storage(kube, body["metadata"]["namespace"], spec.get("storage"))
        if st is None:
            return READ_FAILED
        prefix = rbakconfig.storage_prefix(spec.get("storage"))
        if is_archive(body):  # stored next to the generation the drill found newest: look from the newest back
            gens = archive_generations(st, prefix, body["metadata"]["name"])
            ids = [backup_id] if backup_id in gens else list(reversed(gens))[:ARCHIVE_REPORT_GENERATIONS]
            for gid in ids:
                found = find_drill_report(st, gid, prefix, drill_id)
                if found is not None:
                    return found
            return None
        return find_drill_report(st, backup_id, prefix, drill_id)
    except ApiError:
        raise  # the API's failure retries the pass (ApiError is a RbakError too)
    except RbakError as e:
        log.warning("cannot read the drill report of %s: %s", backup_id, e)
        return READ_FAILED


def _read_report(kube: Any, body: dict[str, Any], backup_id: str, drill_id: str) -> dict[str, Any] | None:
    found = _stored_report(kube, body, backup_id, drill_id)
    return found[1] if isinstance(found, tuple) else None


def _pick_backup(kube: Any, body: dict[str, Any], status: dict[str, Any]) -> str | None:
    """This object's newest complete backup in storage (what a backupRef restore would take), else the
    last successful run's."""
    spec, meta = body.get("spec") or {}, body["metadata"]
    try:
        st = open_backup_storage(kube, meta["namespace"], spec.get("storage"))
        entry = latest_complete(st, rbakconfig.storage_prefix(spec.get("storage")), with_data=True,
                                accept=lambda e: owned(e.backup_id, e.manifest, meta)) if st is not None else None
        if entry is not None:
            return entry.backup_id
    except ApiError:
        raise  # the API's failure retries the pass (ApiError is a RbakError too)
    except RbakError as e:
        log.warning("cannot list the backups of %s: %s", body["metadata"]["name"], e)
    return status.get("lastBackupId")


def reconcile(kube: Any, body: dict[str, Any], now: datetime, event) -> dict[str, Any] | None:
    """One pass: record a finished drill Job, start a due one. Returns the new ``status.restoreDrill``
    (None: drills off and nothing recorded)."""
    meta, spec = body["metadata"], body.get("spec") or {}
    ns = meta["namespace"]
    old = dict((body.get("status") or {}).get("restoreDrill") or {})
    if not old and drill_spec(spec) is None:
        return None  # drills never configured: not even a Job list per pass
    cur = dict(old)
    jobs = kube.list_jobs(ns, {bodies.L_DRILLS: naming.label_value(drill_base(body))})
    states = {j["metadata"]["name"]: job_state(j) for j in jobs}
    def ended(n: str) -> tuple[str, str]:
        return (fmt(states[n].end) or "~", n)  # by end time (manual and scheduled names do not sort by time)

    for j in sorted(jobs, key=lambda j: ended(j["metadata"]["name"])):
        jname, st = j["metadata"]["name"], states[j["metadata"]["name"]]
        if not st.finished or jname in (cur.get("recordedJobs") or []):
            continue
        if st.phase == "Failed":
            st = job_state(j, kube.job_pods(ns, jname))
        bid = (j["metadata"].get("annotations") or {}).get(bodies.A_BACKUP_ID, "")
        res = drill_result(st, _read_report(kube, body, bid, jname), bid, jname)
        cur.update(res)
        cur["evidenceCheckTime"] = fmt(now) if res.get("signer") else None  # verified just now
        cur["recordedJobs"] = ((cur.get("recordedJobs") or []) + [jname])[-10:]
        if res["result"] == "Passed":
            event(body, "Normal", "RestoreDrillPassed", f"restore drill {jname} of backup {bid}: {res['message']}")
        else:
            event(body, "Warning", "RestoreDrillFailed", f"restore drill {jname} of backup {bid} failed: {res['message']}")
    due = evidence_recheck_time(cur)
    if due is not None and due <= now:
        found = _stored_report(kube, body, cur["backupId"], cur["lastJob"])
        cur["evidenceCheckTime"] = fmt(now)  # a storage that did not answer is asked again next time
        change = recheck_evidence(cur, found) if not isinstance(found, str) else {}  # str: READ_FAILED
        if change:
            cur.update(change, evidenceCheckTime=None)
            event(body, "Warning", "RestoreDrillEvidenceInvalid", change["message"])
    finished = sorted((n for n, s in states.items() if s.finished and n in (cur.get("recordedJobs") or [])), key=ended)
    for victim in finished[:-KEEP_JOBS]:
        kube.delete_job(ns, victim)
        kube.delete_configmap(ns, victim)
    active = sorted(n for n, s in states.items() if not s.finished)
    cur["active"] = active[0] if active else None
    d = drill_spec(spec)
    if d is None:
        cur["nextRunTime"] = None
    else:
        try:
            _schedule(kube, body, d, cur, now, active, event)
            trigger = (meta.get("annotations") or {}).get(TRIGGER_ANNOTATION)
            if trigger and trigger != cur.get("lastManualTrigger") and not cur.get("active"):
                cur["lastManualTrigger"] = trigger
                _start(kube, body, d, cur, manual_run_name(drill_base(body), trigger), now, now, event)
        except ApiError:
            raise  # the API's failure retries the pass (ApiError is a RbakError too)
        except RbakError as e:
            cur.update(result="Failed", reason="InvalidSpec", message=str(e)[:1000], lastRunTime=fmt(now))
    # None clears a field (merge patch) only where the status has it: an unchanged status is not re-patched
    cur = {k: v for k, v in cur.items() if v is not None or k in old}
    return cur if (cur or old) else None


def _schedule(kube: Any, body: dict[str, Any], d: dict[str, Any], cur: dict[str, Any], now: datetime,
              active: list[str], event) -> None:
    meta, spec = body["metadata"], body.get("spec") or {}
    sched = schedule.parse_schedule(d["schedule"], spec.get("timeZone"), f"{FIELD}.schedule")
    last = parse_time(cur["lastScheduleTime"]) if cur.get("lastScheduleTime") else None
    created = parse_time(meta["creationTimestamp"]) if meta.get("creationTimestamp") else None
    if created is None and last is None:
        cur["lastScheduleTime"] = fmt(now)  # the emulator sets no creationTimestamp: count from first sight
        last = now.replace(microsecond=0)
    dec = schedule.decide(sched, last, created, now, d.get("startingDeadlineSeconds"))
    cur["nextRunTime"] = fmt(dec.next_time)
    if dec.action == "missed" or (dec.action == "run" and (active or spec.get("suspend"))):
        cur["lastScheduleTime"] = fmt(dec.slot)
        return
    if dec.action != "run":
        return
    assert dec.slot is not None, "a run decision carries its slot"
    cur["lastScheduleTime"] = fmt(dec.slot)
    _start(kube, body, d, cur, drill_run_name(drill_base(body), dec.slot), dec.slot, now, event)


def _start(kube: Any, body: dict[str, Any], d: dict[str, Any], cur: dict[str, Any], run: str, slot: datetime,
           now: datetime, event) -> None:
    """ConfigMap + Job of one drill (same name for the same slot or trigger: a second create is a no-op)."""
    meta, spec = body["metadata"], body.get("spec") or {}
    picked = meta["name"] if is_archive(body) else _pick_backup(kube, body, body.get("status") or {})
    if not picked:
        cur.update(result="Skipped", reason="NoBackup", message="no complete backup to drill yet",
                   lastRunTime=fmt(now))
        return
    target = d.get("target") or spec.get("broker")
    resolved = resolve_broker(kube, target, meta["namespace"], f"{FIELD}.target" if d.get("target") else "spec.broker")
    if is_archive(body):  # the Job finds the archive's newest generation itself
        backup_id, what = picked, f"archive {picked}"
        source = resolve_broker(kube, spec.get("broker"), meta["namespace"], "spec.broker")
        cfg, env = archive_drill_config(spec, meta["namespace"], resolved, source)
    else:
        backup_id, what = picked, f"backup {picked}"
        cfg, env = drill_config(spec, meta["namespace"], backup_id, resolved)
    kube.create_configmap(bodies.configmap_body(run, meta["namespace"], body, cfg, drill_labels(drill_base(body))))
    if kube.create_job(drill_job(body, run, backup_id, env, slot)):
        cur["active"] = run
        event(body, "Normal", "RestoreDrillStarted", f"restore drill {run} of {what} started")
