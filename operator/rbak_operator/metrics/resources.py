"""Per-resource gauges that outlive a run's Job: computed from the status the operator writes.

A backup Job's pod is gone seconds after it ends, so Prometheus can never
scrape it reliably; the operator, which keeps running, exports what each
RabbitMQBackup / RabbitMQRestore status says. Labels are ``rbak_namespace``
plus ``backup`` or ``restore`` (never ``namespace``: Prometheus's own target
label would clash). ``samples`` is pure (tests and the chart's rules use it);
``observe`` sets the gauges from an object the API returned.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from prometheus_client import Gauge

from rbak_operator.decide.schedule import parse_schedule
from rbak_operator.decide.times import parse_time

log = logging.getLogger(__name__)

B = ("rbak_namespace", "backup")
R = ("rbak_namespace", "restore")
A = ("rbak_namespace", "archive")
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rbak_backup_last_success_timestamp_seconds": ("Completion time of the last successful backup run", B),
    "rbak_backup_last_duration_seconds": ("Wall time of the last finished backup run", B),
    "rbak_backup_last_messages": ("Messages in the last finished backup (from its manifest)", B),
    "rbak_backup_last_bytes": ("Stored bytes of the last finished backup (from its manifest)", B),
    "rbak_backup_last_run_failed": ("1 when the last finished backup run failed (label reason), else 0", B + ("reason",)),
    "rbak_backup_validation_failed": ("1 when the last run's validation failed, 0 when it passed", B),
    "rbak_backup_schedule_period_seconds": ("Seconds between the schedule's next two slots", B),
    "rbak_backup_restore_drill_failed": ("1 when the last restore drill failed (label reason), 0 when it passed",
                                         B + ("reason",)),
    "rbak_backup_restore_drill_last_run_timestamp_seconds": ("End time of the last restore drill", B),
    "rbak_restore_last_success_timestamp_seconds": ("Completion time of a succeeded restore", R),
    "rbak_restore_last_duration_seconds": ("Wall time of a finished restore", R),
    "rbak_restore_messages": ("Messages restored", R),
    "rbak_restore_bytes": ("Stored bytes of the backup restored", R),
    "rbak_restore_failed": ("1 when the restore failed (label reason), 0 when it succeeded", R + ("reason",)),
    # RabbitMQArchive: judged from the archive's newest tick in the storage, set at every pass (not only
    # when the status is written), so the lag is current within a poll
    "rbak_archive_status_lag_seconds": ("How far the archive's recoverable-until is behind now (0 for an idle "
                                        "archive whose watermark advances)", A),
    "rbak_archive_rpo_seconds": ("The archive's recovery point objective (spec.rpoSeconds)", A),
    "rbak_archive_rpo_met": ("1 when the archive's lag is within its objective, 0 when not", A),
    "rbak_archive_status_recoverable_timestamp_seconds": ("Every stream of the archive is archived up to this time", A),
    "rbak_archive_gap_messages": ("Messages the streams' retention removed before the archive read them", A),
    "rbak_archive_ticking": ("1 while the archiver's ticks reach the storage on time, 0 when they are overdue or "
                             "none was ever written (no sample while suspended)", A),
    # the last drill of the archive (spec.verify.restoreDrill: rbak drill --archive)
    "rbak_archive_drill_failed": ("1 when the archive's last drill failed (label reason), 0 when it passed",
                                  A + ("reason",)),
    "rbak_archive_drill_recovery_point_seconds": ("Recovery point the last drill achieved: how far the archive's "
                                                  "recoverable-until was behind its start", A),
    "rbak_archive_drill_restore_seconds": ("RTO of the last drill: wall time of its restore", A),
}
_GAUGES = {name: Gauge(name, doc, list(labels)) for name, (doc, labels) in METRICS.items()}
_seen: dict[tuple[str, str, str], list[tuple[str, tuple[str, ...]]]] = {}


def _ts(v: Any) -> float | None:
    t = parse_time(v) if v else None
    return t.timestamp() if t else None


def schedule_period(spec: dict[str, Any], now: datetime) -> float | None:
    if not spec.get("schedule"):
        return None

    try:
        it = parse_schedule(spec["schedule"], spec.get("timeZone")).slots_after(now)
        a, b = next(it), next(it)
    except Exception:  # an invalid schedule is reported on the object, not here
        return None
    return (b - a).total_seconds()


def samples(kind: str, obj: dict[str, Any], now: datetime | None = None) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) for one object's status."""
    meta, spec, st = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    ns, name = meta.get("namespace") or "", meta.get("name") or ""
    out: list[tuple[str, dict[str, str], float]] = []
    if kind == "backup":
        lab = {"rbak_namespace": ns, "backup": name}
        if (t := _ts(st.get("lastSuccessfulTime"))) is not None:
            out.append(("rbak_backup_last_success_timestamp_seconds", lab, t))
        run = st.get("lastRun") or {}
        if run.get("phase") in ("Succeeded", "Failed"):
            if run.get("durationSeconds") is not None:
                out.append(("rbak_backup_last_duration_seconds", lab, float(run["durationSeconds"])))
            for key, metric in (("messages", "rbak_backup_last_messages"), ("bytes", "rbak_backup_last_bytes")):
                if run.get(key) is not None:
                    out.append((metric, lab, float(run[key])))
            failed = run["phase"] == "Failed"
            out.append(("rbak_backup_last_run_failed", {**lab, "reason": (run.get("reason") or "") if failed else ""},
                        1.0 if failed else 0.0))
            if run.get("validation") in ("Passed", "Failed"):
                out.append(("rbak_backup_validation_failed", lab, 1.0 if run["validation"] == "Failed" else 0.0))
        drill = st.get("restoreDrill") or {}
        if drill.get("result") in ("Passed", "Failed"):
            failed = drill["result"] == "Failed"
            out.append(("rbak_backup_restore_drill_failed",
                        {**lab, "reason": (drill.get("reason") or "") if failed else ""}, 1.0 if failed else 0.0))
            if (t := _ts(drill.get("lastRunTime"))) is not None:
                out.append(("rbak_backup_restore_drill_last_run_timestamp_seconds", lab, t))
        if (p := schedule_period(spec, now or datetime.now(timezone.utc))) is not None:
            out.append(("rbak_backup_schedule_period_seconds", lab, p))
    elif kind == "archive":
        lab = {"rbak_namespace": ns, "archive": name}
        conds = {c.get("type"): c for c in st.get("conditions") or []}
        out.append(("rbak_archive_rpo_seconds", lab, float(spec.get("rpoSeconds") or 30)))
        if st.get("lagSeconds") is not None:
            out.append(("rbak_archive_status_lag_seconds", lab, float(st["lagSeconds"])))
        if (conds.get("RPOMet") or {}).get("status") in ("True", "False"):
            out.append(("rbak_archive_rpo_met", lab, 1.0 if conds["RPOMet"]["status"] == "True" else 0.0))
        if (t := _ts(st.get("recoverableUntil"))) is not None:
            out.append(("rbak_archive_status_recoverable_timestamp_seconds", lab, t))
        out.append(("rbak_archive_gap_messages", lab, float(st.get("gapMessages") or 0)))
        ready = conds.get("Ready") or {}
        if ready.get("reason") not in ("Suspended", "InvalidSpec", None):
            out.append(("rbak_archive_ticking", lab, 1.0 if ready.get("status") == "True" else 0.0))
        drill = st.get("restoreDrill") or {}
        if drill.get("result") in ("Passed", "Failed"):
            failed = drill["result"] == "Failed"
            out.append(("rbak_archive_drill_failed", {**lab, "reason": (drill.get("reason") or "") if failed else ""},
                        1.0 if failed else 0.0))
            for metric, field in (("rbak_archive_drill_recovery_point_seconds", "recoveryPointSeconds"),
                                  ("rbak_archive_drill_restore_seconds", "restoreSeconds")):
                if drill.get(field) is not None:
                    out.append((metric, lab, float(drill[field])))
    else:
        lab = {"rbak_namespace": ns, "restore": name}
        phase = st.get("phase")
        if phase in ("Succeeded", "Failed"):
            if phase == "Succeeded" and (t := _ts(st.get("completionTime"))) is not None:
                out.append(("rbak_restore_last_success_timestamp_seconds", lab, t))
            if st.get("durationSeconds") is not None:
                out.append(("rbak_restore_last_duration_seconds", lab, float(st["durationSeconds"])))
            for key, metric in (("messages", "rbak_restore_messages"), ("bytes", "rbak_restore_bytes")):
                if st.get(key) is not None:
                    out.append((metric, lab, float(st[key])))
            failed = phase == "Failed"
            out.append(("rbak_restore_failed", {**lab, "reason": (st.get("reason") or "") if failed else ""},
                        1.0 if failed else 0.0))
    return out


def observe(plural: str, obj: dict[str, Any] | None) -> None:
    """Set the gauges of one object (as the API returned it after a status patch); never raises."""
    if not isinstance(obj, dict):
        return
    kind = {"rabbitmqbackups": "backup", "rabbitmqrestores": "restore", "rabbitmqarchives": "archive"}.get(plural)
    if kind is None:
        return
    try:
        meta = obj.get("metadata") or {}
        ident = (kind, meta.get("namespace") or "", meta.get("name") or "")
        new = samples(kind, obj)
        for metric, old_labels in _seen.get(ident, []):  # a reason that changed: drop the old series
            if (metric, tuple(old_labels)) not in {(m, tuple(lab.values())) for m, lab, _ in new}:
                try:
                    _GAUGES[metric].remove(*old_labels)
                except KeyError:
                    pass
        for metric, labels, value in new:
            _GAUGES[metric].labels(**labels).set(value)
        _seen[ident] = [(m, tuple(lab.values())) for m, lab, _ in new]
    except Exception:  # metrics must never break a reconcile
        log.exception("cannot update metrics of %s", plural)


def forget(plural: str, namespace: str, name: str) -> list[tuple[str, tuple[str, ...]]]:
    """Drop every series of a deleted object (whatever reason label it carried, seen by this process
    or not); returns the (metric, labels) removed."""
    kind = {"rabbitmqbackups": "backup", "rabbitmqarchives": "archive"}.get(plural, "restore")
    _seen.pop((kind, namespace, name), None)
    removed = []
    for metric, (_doc, labelnames) in METRICS.items():
        if labelnames[1] != kind:
            continue
        gauge = _GAUGES[metric]
        for fam in gauge.collect():
            for sample in fam.samples:
                lab = sample.labels
                if lab.get("rbak_namespace") == namespace and lab.get(kind) == name:
                    values = tuple(lab[n] for n in labelnames)
                    try:
                        gauge.remove(*values)
                        removed.append((metric, values))
                    except KeyError:
                        pass
    return removed
