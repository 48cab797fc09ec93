"""Per-resource gauges from status, and the chart's alert rules and dashboard checked against them:
every expression parses (promql-parser) and names only metrics the operator exports."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from rbak_operator.metrics import resources as rm
from support.require import require
from support.ship import prometheus_rules

ROOT = Path(__file__).resolve().parents[2]
RULES = prometheus_rules()
DASHBOARD = json.loads((ROOT / "charts/rbak/files/grafana-dashboard.json").read_text())
NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)

BACKUP = {
    "metadata": {"namespace": "messaging", "name": "nightly"},
    "spec": {"schedule": "30 2 * * *", "timeZone": "Europe/Berlin"},
    "status": {"lastSuccessfulTime": "2026-11-23T01:31:00Z",
               "lastRun": {"phase": "Failed", "reason": "BackupFailed", "durationSeconds": 12.5, "messages": 10,
                           "bytes": 2048, "validation": "Failed"}},
}


def metric_names(expr: str) -> set[str]:
    promql_parser = require("promql_parser")
    names: set[str] = set()

    def walk(node) -> None:
        kind = type(node).__name__
        if kind == "VectorSelector":
            names.add(node.name)
            return
        for attr in ("lhs", "rhs", "expr", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                walk(child)
        for arg in getattr(node, "args", None) or []:
            walk(arg)

    walk(promql_parser.parse(expr))
    return names


def test_samples_from_a_backup_status():
    got = {(m, tuple(sorted(lab.items()))): v for m, lab, v in rm.samples("backup", BACKUP, NOW)}
    lab = (("backup", "nightly"), ("rbak_namespace", "messaging"))
    assert got[("rbak_backup_last_success_timestamp_seconds", lab)] == datetime(2026, 11, 23, 1, 31,
                                                                                 tzinfo=timezone.utc).timestamp()
    assert got[("rbak_backup_last_duration_seconds", lab)] == 12.5
    assert got[("rbak_backup_last_messages", lab)] == 10 and got[("rbak_backup_last_bytes", lab)] == 2048
    assert got[("rbak_backup_last_run_failed", tuple(sorted(lab + (("reason", "BackupFailed"),))))] == 1
    assert got[("rbak_backup_validation_failed", lab)] == 1
    assert got[("rbak_backup_schedule_period_seconds", lab)] == 86400
    for _, labels, _ in rm.samples("backup", BACKUP, NOW):
        assert "namespace" not in labels  # Prometheus's own target label


def test_observe_exports_and_replaces_series_when_the_reason_changes():
    rm.observe("rabbitmqbackups", BACKUP)
    val = REGISTRY.get_sample_value
    labels = {"rbak_namespace": "messaging", "backup": "nightly"}
    assert val("rbak_backup_last_run_failed", {**labels, "reason": "BackupFailed"}) == 1
    ok = {**BACKUP, "status": {"lastSuccessfulTime": "2026-11-24T01:31:00Z",
                               "lastRun": {"phase": "Succeeded", "messages": 7, "validation": "Passed"}}}
    rm.observe("rabbitmqbackups", ok)
    assert val("rbak_backup_last_run_failed", {**labels, "reason": "BackupFailed"}) is None
    assert val("rbak_backup_last_run_failed", {**labels, "reason": ""}) == 0
    assert val("rbak_backup_last_messages", labels) == 7 and val("rbak_backup_validation_failed", labels) == 0
    rm.observe("rabbitmqrestores", {"metadata": {"namespace": "messaging", "name": "r1"},
                                    "status": {"phase": "Failed", "reason": "InvalidSpec", "durationSeconds": 1}})
    assert val("rbak_restore_failed", {"rbak_namespace": "messaging", "restore": "r1", "reason": "InvalidSpec"}) == 1
    rm.forget("rabbitmqrestores", "messaging", "r1")
    assert val("rbak_restore_failed", {"rbak_namespace": "messaging", "restore": "r1", "reason": "InvalidSpec"}) is None


@pytest.mark.parametrize("rule", RULES, ids=[r["alert"] for r in RULES])
def test_every_rule_parses_and_names_exported_metrics(rule):
    names = metric_names(rule["expr"])
    assert names and names <= set(rm.METRICS), names - set(rm.METRICS)


def test_the_issue_alerts_exist():
    by_name = {r["alert"]: metric_names(r["expr"]) for r in RULES}
    assert {"rbak_backup_last_success_timestamp_seconds", "rbak_backup_schedule_period_seconds"} <= by_name["RbakBackupMissing"]
    assert "1.5 *" in next(r["expr"] for r in RULES if r["alert"] == "RbakBackupMissing")
    assert by_name["RbakBackupFailed"] == {"rbak_backup_last_run_failed"}
    assert by_name["RbakBackupValidationFailed"] == {"rbak_backup_validation_failed"}
    assert by_name["RbakRestoreFailed"] == {"rbak_restore_failed"}
    assert by_name["RbakArchiveRPOBreached"] == {"rbak_archive_status_lag_seconds", "rbak_archive_rpo_seconds"}
    assert next(r for r in RULES if r["alert"] == "RbakArchiveRPOBreached")["for"] == "3m"
    assert by_name["RbakArchiveGap"] == {"rbak_archive_gap_messages"}
    assert by_name["RbakArchiveDown"] == {"rbak_archive_ticking"}


def test_archive_samples_judge_the_lag_from_the_status():
    """What the RPO alert compares: an archive over its objective has lag > rpo; a suspended one is not 'down'."""
    obj = {"metadata": {"namespace": "messaging", "name": "orders"}, "spec": {"rpoSeconds": 30},
           "status": {"lagSeconds": 41, "recoverableUntil": "2026-11-24T11:59:19Z", "gapMessages": 50, "conditions": [
               {"type": "Ready", "status": "False", "reason": "TicksOverdue"},
               {"type": "RPOMet", "status": "False", "reason": "ObjectiveMissed"}]}}
    lab = {"rbak_namespace": "messaging", "archive": "orders"}
    assert sorted(rm.samples("archive", obj)) == sorted([
        ("rbak_archive_rpo_seconds", lab, 30.0), ("rbak_archive_status_lag_seconds", lab, 41.0),
        ("rbak_archive_rpo_met", lab, 0.0),
        ("rbak_archive_status_recoverable_timestamp_seconds", lab, datetime(2026, 11, 24, 11, 59, 19,
                                                                            tzinfo=timezone.utc).timestamp()),
        ("rbak_archive_gap_messages", lab, 50.0), ("rbak_archive_ticking", lab, 0.0)])
    suspended = {**obj, "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Suspended"}]}}
    assert [m for m, _, _ in rm.samples("archive", suspended)] == ["rbak_archive_rpo_seconds", "rbak_archive_gap_messages"]


def test_the_failure_alerts_and_the_docs_name_every_reason():
    """Issue 44: the reason label is specific; the alerts and docs/operator.md name every value it takes."""
    from rbak_operator.decide.status import FAILURE_REASONS

    docs = (Path(__file__).resolve().parents[2] / "docs" / "operator.md").read_text()
    for alert in ("RbakBackupFailed", "RbakRestoreFailed"):
        text = next(r for r in RULES if r["alert"] == alert)["annotations"]["description"]
        assert all(reason in text for reason in FAILURE_REASONS), (alert, text)
    assert all(f"`{reason}`" in docs for reason in FAILURE_REASONS)


def test_every_dashboard_query_parses_and_names_exported_metrics():
    exprs = [t["expr"] for p in DASHBOARD["panels"] for t in p["targets"]]
    assert exprs
    used = set()
    for e in exprs:
        names = metric_names(e)
        assert names <= set(rm.METRICS), (e, names - set(rm.METRICS))
        used |= names
    assert used == set(rm.METRICS) - {"rbak_restore_last_success_timestamp_seconds", "rbak_restore_last_duration_seconds",
                                      "rbak_restore_bytes"}


def test_the_chart_renders_the_rules_and_the_dashboard():
    from support.ship import find, manifests, render_chart

    objs = manifests(render_chart({"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "p"}},
                                               "grafanaDashboard": {"enabled": True}}}))
    (rule,) = find(objs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "p"
    assert rule["spec"]["groups"][0]["rules"] == RULES
    cm = next(o for o in find(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard"))
    assert json.loads(cm["data"]["rbak.json"]) == DASHBOARD and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    off = manifests(render_chart({}))
    assert find(off, "PrometheusRule") == [] and not [o for o in find(off, "ConfigMap")
                                                    if o["metadata"]["name"].endswith("-dashboard")]


def test_archive_drill_samples_and_their_alert():
    """The archive's last drill: failed (with its reason), the recovery point achieved and the RTO; the chart's
    RbakArchiveDrillFailed reads the first."""
    lab = {"rbak_namespace": "messaging", "archive": "orders"}
    obj = {"metadata": {"namespace": "messaging", "name": "orders"}, "spec": {"rpoSeconds": 30},
           "status": {"restoreDrill": {"result": "Failed", "reason": "DrillFailed", "recoveryPointSeconds": 2.5,
                                       "restoreSeconds": 0.75}}}
    drill = [s for s in rm.samples("archive", obj) if "drill" in s[0]]
    assert drill == [("rbak_archive_drill_failed", {**lab, "reason": "DrillFailed"}, 1.0),
                     ("rbak_archive_drill_recovery_point_seconds", lab, 2.5),
                     ("rbak_archive_drill_restore_seconds", lab, 0.75)]
    passed = {**obj, "status": {"restoreDrill": {"result": "Passed", "reason": "DrillPassed"}}}
    assert [s for s in rm.samples("archive", passed) if "drill" in s[0]] == [
        ("rbak_archive_drill_failed", {**lab, "reason": ""}, 0.0)]
    rule = next(r for r in RULES if r["alert"] == "RbakArchiveDrillFailed")
    assert metric_names(rule["expr"]) == {"rbak_archive_drill_failed"} and rule["labels"]["severity"] == "critical"
