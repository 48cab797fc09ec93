"""Restore drills in the operator: the config and Job a drill slot gets (validated strictly with
kubernetes-validate and loaded by rbak's own config loader), the status a finished Job gives, the
schedule decisions, and the gauge the chart's alert reads."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import kubernetes_validate
import pytest
import yaml
from rbak_operator.decide import bodies
from rbak_operator.reconcile import drill
from rbak_operator.metrics import resources as rm
from rbak_operator.decide.times import fmt
from rbak_operator.decide.status import RunState
from support.operator_specs import CLUSTER_SPEC, K8S, OWNER, SECRET_ENV, SLOT, URL_SPEC

from rbak.config import Config
from rbak.drill.backup import options_from_config
from rbak.errors import RbakError

DRILL_TARGET = {"amqpUrl": "amqp://staging.example.com:5672/%2f", "managementUrl": "http://staging.example.com:15672",
                "credentialsSecretRef": {"name": "staging-admin"}}


def _owner(spec: dict) -> dict:
    o = copy.deepcopy(OWNER)
    o["spec"] = spec
    return o


def _with_drill(spec: dict, **d) -> dict:
    return {**spec, "verify": {"restoreDrill": {"schedule": "0 4 * * 0", **d}}}


@pytest.mark.parametrize("spec", [CLUSTER_SPEC, URL_SPEC], ids=["cluster", "url"])
def test_drill_job_is_valid_kubernetes_and_its_config_loads(spec):
    spec = _with_drill(spec)
    cfg, env = drill.drill_config(spec, "prod", "nightly-20261122-2300")
    run = drill.drill_run_name("nightly", SLOT)
    job = drill.drill_job(_owner(spec), run, "nightly-20261122-2300", env, SLOT)
    kubernetes_validate.validate(job, K8S, strict=True)
    cm = bodies.configmap_body(run, "prod", _owner(spec), cfg, drill.drill_labels("nightly"))
    kubernetes_validate.validate(cm, K8S, strict=True)
    assert bodies.L_BACKUP not in job["metadata"]["labels"]  # never mistaken for a backup run
    assert job["metadata"]["labels"][bodies.L_DRILLS] == "nightly"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:1] == ["drill"] and args[args.index("--backup-id") + 1] == "nightly-20261122-2300"
    assert args[args.index("--drill-id") + 1] == run
    loaded = Config.from_dict(yaml.safe_load(cm["data"]["config.yaml"]), env=SECRET_ENV)
    assert loaded.mode == "drill" and loaded.drill.target is not None
    opts = options_from_config(loaded, drill_id=run)
    assert opts.backup_id == "nightly-20261122-2300" and opts.drill_id == run
    assert "management_password: ${RBAK_BROKER_PASSWORD}" in cm["data"]["config.yaml"]  # a reference, no secret


def test_a_signing_key_secret_reaches_the_drill_as_an_env_var_the_config_names(monkeypatch):
    """spec.verify.restoreDrill.signingKeySecretRef -> the Secret's PEM as
    RBAK_DRILL_SIGNING_KEY (a secretKeyRef, no RBAC), and drill.signing_key_env names it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from rbak.repo.evidence import fingerprint

    spec = _with_drill(URL_SPEC, signingKeySecretRef={"name": "drill-signing"})
    cfg, env = drill.drill_config(spec, "prod", "b1")
    run = drill.drill_run_name("nightly", SLOT)
    job = drill.drill_job(_owner(spec), run, "b1", env, SLOT)
    kubernetes_validate.validate(job, K8S, strict=True)
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
            if "valueFrom" in e}
    assert refs["RBAK_DRILL_SIGNING_KEY"] == {"name": "drill-signing", "key": "signing.pem"}
    cm = bodies.configmap_body(run, "prod", _owner(spec), cfg, drill.drill_labels("nightly"))
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    loaded = Config.from_dict(yaml.safe_load(cm["data"]["config.yaml"]), env=SECRET_ENV)
    assert loaded.drill.signing_key_env == "RBAK_DRILL_SIGNING_KEY" and "PRIVATE KEY" not in cm["data"]["config.yaml"]
    monkeypatch.setenv("RBAK_DRILL_SIGNING_KEY", pem)  # as the kubelet fills it
    opts = options_from_config(loaded, drill_id=run)
    monkeypatch.delenv("RBAK_DRILL_SIGNING_KEY")
    assert fingerprint(opts.signing_key.public_key()) == fingerprint(key.public_key())
    with pytest.raises(RbakError, match="drill.signing_key_env: environment variable RBAK_DRILL_SIGNING_KEY is not"):
        options_from_config(loaded, drill_id=run)
    with pytest.raises(RbakError, match=r"spec.verify.restoreDrill.signingKeySecretRef.name: required"):
        drill.drill_config(_with_drill(URL_SPEC, signingKeySecretRef={}), "prod", "b1")


def test_drill_target_defaults_to_the_backed_up_broker_and_can_be_another():
    own, _ = drill.drill_config(_with_drill(URL_SPEC), "prod", "b1")
    assert own["drill"]["target"]["amqp_url"] == "amqps://rmq.example.com:5671/%2f"
    other, env = drill.drill_config(_with_drill(URL_SPEC, target=DRILL_TARGET), "prod", "b1")
    assert other["drill"]["target"]["amqp_url"] == "amqp://staging.example.com:5672/%2f"
    assert {e.secret for e in env if e.env.startswith("RBAK_BROKER")} == {"staging-admin"}


def test_a_bad_drill_target_is_named():
    from rbak.errors import ConfigError

    with pytest.raises(ConfigError, match=r"spec.verify.restoreDrill.target"):
        drill.drill_config(_with_drill(URL_SPEC, target={"amqpUrl": "amqp://x:5672/%2f"}), "prod", "b1")


def test_drill_spec_off_without_a_schedule_or_when_disabled():
    assert drill.drill_spec(URL_SPEC) is None
    assert drill.drill_spec(_with_drill(URL_SPEC, enabled=False)) is None
    assert drill.drill_spec(_with_drill(URL_SPEC))["schedule"] == "0 4 * * 0"


def _state(phase: str, **kw) -> RunState:
    t = datetime(2026, 11, 22, 4, 0, tzinfo=timezone.utc)
    return RunState(phase, start=t, end=t + timedelta(seconds=12), **kw)


def test_result_from_the_stored_report():
    good = {"passed": True, "scratch_vhost": "rbak-drill-b1-x",
            "queues": [{"vhost": "/", "queue": "q", "passed": True, "actual_count": 5}]}
    r = drill.drill_result(_state("Succeeded"), good, "b1", "nightly-drill-1")
    assert (r["result"], r["reason"], r["queues"], r["messages"], r["failedQueues"]) == ("Passed", "DrillPassed", 1, 5, [])
    assert r["durationSeconds"] == 12 and r["backupId"] == "b1"
    bad = {"passed": False, "reason": "backup 'b1': queue 'q' in vhost '/': expected 5 message(s), got 4",
           "queues": [{"vhost": "/", "queue": "q", "passed": False, "actual_count": 4}]}
    r = drill.drill_result(_state("Failed"), bad, "b1", "nightly-drill-1")
    assert r["result"] == "Failed" and "queue 'q'" in r["message"] and r["failedQueues"] == ["//q"]


def test_a_signed_report_shows_its_signer_and_a_changed_one_fails_the_drill():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from rbak.repo.evidence import fingerprint, sign

    key = Ed25519PrivateKey.generate()
    report = {"passed": True, "scratch_vhost": "rbak-drill-b1-x", "backup_id": "b1",
              "queues": [{"vhost": "/", "queue": "q", "passed": True, "actual_count": 5}]}
    report["signature"] = sign(report, key)
    r = drill.drill_result(_state("Succeeded"), report, "b1", "nightly-drill-1")
    assert (r["result"], r["signer"]) == ("Passed", fingerprint(key.public_key()))
    report["queues"][0]["actual_count"] = 6
    r = drill.drill_result(_state("Succeeded"), report, "b1", "nightly-drill-1")
    assert (r["result"], r["reason"], r["signer"]) == ("Failed", "DrillEvidenceInvalid", None)
    assert "field queues[0].actual_count was changed after signing: signed 5, the report shows 6" in r["message"]
    del report["signature"]  # a later unsigned drill clears the signer an earlier signed one left in the status
    r = drill.drill_result(_state("Succeeded"), report, "b1", "nightly-drill-1")
    assert (r["result"], r["signer"]) == ("Passed", None)


def test_result_without_a_report_names_the_jobs_cause():
    r = drill.drill_result(_state("Failed", reason="BackoffLimitExceeded", message="rbak: no complete backup"),
                           None, "b1", "j")
    assert r["result"] == "Failed" and r["reason"] == "BackoffLimitExceeded" and "no complete backup" in r["message"]


def test_a_drill_without_a_report_clears_the_figures_an_earlier_drill_left():
    """The status is merge-patched: figures not named again would stay, under a failed drill's result."""
    report = {"passed": True, "report_key": "p/orders.1/drills/t-x.json",
              "archive": {"generation": "orders.1", "recovery_point_secs": 2.5, "restore_secs": 0.8,
                          "restore_point_utc": "2026-12-06T08:00:00.000Z",
                          "recoverable_until_utc": "2026-12-06T08:04:58.000Z",
                          "streams": [{"vhost": "o", "stream": "a", "restored_count": 10, "passed": True}]}}
    status = drill.drill_result(_state("Complete"), report, "orders", "x-1")
    assert status["recoveryPointSeconds"] == 2.5 and status["streams"] == 1
    status.update(drill.drill_result(_state("Failed", reason="BackoffLimitExceeded", message="OOMKilled"), None,
                                     "orders", "x-2"))
    assert {k: v for k, v in status.items() if v is not None} == {
        "lastJob": "x-2", "backupId": "orders", "lastRunTime": status["lastRunTime"], "durationSeconds": 12,
        "result": "Failed", "reason": "BackoffLimitExceeded", "message": "OOMKilled"}


def test_drill_gauge_follows_the_status_and_the_alert_reads_it():
    now = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
    obj = {"metadata": {"namespace": "messaging", "name": "nightly"}, "spec": {},
           "status": {"restoreDrill": {"result": "Failed", "reason": "DrillFailed",
                                       "lastRunTime": "2026-11-24T04:00:12Z"}}}
    got = {(m, tuple(sorted(lab.items()))): v for m, lab, v in rm.samples("backup", obj, now)}
    lab = (("backup", "nightly"), ("rbak_namespace", "messaging"))
    assert got[("rbak_backup_restore_drill_failed", tuple(sorted(lab + (("reason", "DrillFailed"),))))] == 1
    assert got[("rbak_backup_restore_drill_last_run_timestamp_seconds", lab)] > 0
    obj["status"]["restoreDrill"]["result"] = "Passed"
    got = {(m, tuple(sorted(lab.items()))): v for m, lab, v in rm.samples("backup", obj, now)}
    assert got[("rbak_backup_restore_drill_failed", tuple(sorted(lab + (("reason", ""),))))] == 0
    from support.ship import prometheus_rules

    rule = next(r for r in prometheus_rules() if r["alert"] == "RbakRestoreDrillFailed")
    assert "rbak_backup_restore_drill_failed" in rule["expr"]


class _FakeKube:
    def __init__(self, jobs=()):
        self.jobs = list(jobs)
        self.created: list[dict] = []
        self.configmaps: list[dict] = []
        self.deleted: list[str] = []

    def list_jobs(self, ns, labels):
        return [j for j in self.jobs if all(j["metadata"]["labels"].get(k) == v for k, v in labels.items())]

    def job_pods(self, ns, name):
        return []

    def create_configmap(self, body):
        self.configmaps.append(body)
        return True

    def create_job(self, body):
        self.created.append(body)
        return True

    def delete_job(self, ns, name):
        self.deleted.append(name)

    def delete_configmap(self, ns, name):
        pass

    def secret_values(self, ns, name):
        return None


def test_reconcile_starts_a_due_drill_once_per_slot(monkeypatch):
    spec = _with_drill(URL_SPEC, schedule="*/5 * * * *")
    body = _owner(spec)
    body["metadata"]["creationTimestamp"] = "2026-11-22T04:00:00Z"
    body["status"] = {"lastBackupId": "nightly-20261122-0400"}
    monkeypatch.setattr(drill, "_pick_backup", lambda kube, b, st: st.get("lastBackupId"))
    events: list[tuple] = []
    kube = _FakeKube()
    now = datetime(2026, 11, 22, 4, 5, 3, tzinfo=timezone.utc)
    cur = drill.reconcile(kube, body, now, lambda *a: events.append(a[1:3]))
    assert [j["metadata"]["name"] for j in kube.created] == ["nightly-drill-20261122-0405"]
    assert cur["active"] == "nightly-drill-20261122-0405" and cur["lastScheduleTime"] == "2026-11-22T04:05:00Z"
    assert cur["nextRunTime"] == "2026-11-22T04:10:00Z" and events == [("Normal", "RestoreDrillStarted")]
    body["status"]["restoreDrill"] = cur
    kube.jobs = [dict(kube.created[0], status={"active": 1})]
    again = drill.reconcile(kube, body, now + timedelta(seconds=10), lambda *a: events.append(a[1:3]))
    assert len(kube.created) == 1 and again["active"] == "nightly-drill-20261122-0405"


def test_reconcile_without_any_backup_skips_the_slot(monkeypatch):
    body = _owner(_with_drill(URL_SPEC, schedule="*/5 * * * *"))
    body["metadata"]["creationTimestamp"] = "2026-11-22T04:00:00Z"
    monkeypatch.setattr(drill, "_pick_backup", lambda *a: None)
    kube = _FakeKube()
    cur = drill.reconcile(kube, body, datetime(2026, 11, 22, 4, 5, 3, tzinfo=timezone.utc), lambda *a: None)
    assert not kube.created and (cur["result"], cur["reason"]) == ("Skipped", "NoBackup")


def _finished_drill() -> tuple[dict, dict]:
    """A backup whose nightly drill Job of b1 has just completed, and that Job."""
    body = _owner(_with_drill(URL_SPEC, schedule="0 4 * * 0"))
    body["metadata"]["creationTimestamp"] = "2026-11-22T04:00:00Z"
    job = drill.drill_job(body, "nightly-drill-20261122-0400", "b1", [], SLOT)
    job["status"] = {"startTime": "2026-11-22T04:00:01Z", "completionTime": "2026-11-22T04:00:20Z",
                     "conditions": [{"type": "Complete", "status": "True"}]}
    body["status"] = {"restoreDrill": {"active": "nightly-drill-20261122-0400",
                                       "lastScheduleTime": "2026-11-22T04:00:00Z"}}
    return body, job


def test_reconcile_records_a_finished_drill_once_and_then_stops_patching(monkeypatch):
    body, job = _finished_drill()
    report = {"passed": False, "reason": "backup 'b1': queue 'q' in vhost '/': expected 3 message(s), the scratch "
              "queue gave back 2", "queues": [{"vhost": "/", "queue": "q", "passed": False, "actual_count": 2}]}
    monkeypatch.setattr(drill, "_read_report", lambda kube, b, bid, jname: report if (bid, jname) == (
        "b1", "nightly-drill-20261122-0400") else None)
    events: list[tuple] = []
    kube = _FakeKube([job])
    now = datetime(2026, 11, 22, 4, 1, tzinfo=timezone.utc)
    cur = drill.reconcile(kube, body, now, lambda *a: events.append(a[1:]))
    assert cur["result"] == "Failed" and cur["reason"] == "DrillFailed" and "queue 'q'" in cur["message"]
    assert cur["active"] is None  # cleared by the merge patch
    assert events == [("Warning", "RestoreDrillFailed",
                       "restore drill nightly-drill-20261122-0400 of backup b1 failed: " + report["reason"])]
    body["status"]["restoreDrill"] = {k: v for k, v in cur.items() if v is not None}
    again = drill.reconcile(kube, body, now + timedelta(seconds=10), lambda *a: events.append(a[1:]))
    assert again == body["status"]["restoreDrill"] and len(events) == 1  # recorded once, nothing to patch


def test_reconcile_without_drills_lists_nothing():
    class _NoCalls:
        def __getattr__(self, name):
            raise AssertionError(f"unexpected API call {name}")

    assert drill.reconcile(_NoCalls(), _owner(URL_SPEC), SLOT, lambda *a: None) is None


def test_drill_now_annotation_runs_one_drill_per_value(monkeypatch):
    body = _owner(_with_drill(URL_SPEC, schedule="0 4 * * 0"))
    body["metadata"]["creationTimestamp"] = "2026-11-22T04:00:00Z"
    body["metadata"]["annotations"] = {drill.TRIGGER_ANNOTATION: "now-1"}
    body["status"] = {"restoreDrill": {"lastScheduleTime": "2026-11-22T04:00:00Z"}}
    monkeypatch.setattr(drill, "_pick_backup", lambda *a: "b1")
    kube = _FakeKube()
    now = datetime(2026, 11, 23, 9, 0, tzinfo=timezone.utc)
    cur = drill.reconcile(kube, body, now, lambda *a: None)
    assert [j["metadata"]["name"] for j in kube.created] == [drill.manual_run_name("nightly", "now-1")]
    assert cur["lastManualTrigger"] == "now-1" and cur["active"] == kube.created[0]["metadata"]["name"]
    job = kube.created[0]
    kubernetes_validate.validate(job, K8S, strict=True)
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    kube.jobs = [job]
    body["status"]["restoreDrill"] = cur
    drill.reconcile(kube, body, now + timedelta(seconds=30), lambda *a: None)
    assert len(kube.created) == 1  # the same value never runs twice


def test_a_stored_signed_report_is_verified_again_and_a_changed_one_clears_the_signer(monkeypatch):
    """The operator records a signed drill, then reads the stored report again once EVIDENCE_RECHECK
    has passed (not before): while it verifies nothing changes; altered in the storage, the status
    shows the drill failed, names the changed field and no longer shows a signer, with an event."""
    import copy as _copy

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from rbak.repo.evidence import fingerprint, sign

    key = Ed25519PrivateKey.generate()
    signer = fingerprint(key.public_key())
    report = {"passed": True, "scratch_vhost": "rbak-drill-b1-x", "backup_id": "b1",
              "queues": [{"vhost": "/", "queue": "q", "passed": True, "actual_count": 5}]}
    report["signature"] = sign(report, key)
    stored: dict = {"found": ("pfx/b1/drills/t-nightly-drill-20261122-0400.json", report)}
    reads: list = []

    def stored_report(kube, b, bid, jname):
        reads.append((bid, jname))
        return stored["found"]

    monkeypatch.setattr(drill, "_stored_report", stored_report)
    body, job = _finished_drill()
    events: list[tuple] = []
    kube = _FakeKube([job])
    t0 = datetime(2026, 11, 22, 4, 1, tzinfo=timezone.utc)

    def run(at):
        cur = drill.reconcile(kube, body, at, lambda *a: events.append(a[1:]))
        body["status"]["restoreDrill"] = {k: v for k, v in cur.items() if v is not None}
        return body["status"]["restoreDrill"]

    d = run(t0)
    assert (d["result"], d["signer"], d["evidenceCheckTime"]) == ("Passed", signer, "2026-11-22T04:01:00Z")
    assert reads == [("b1", "nightly-drill-20261122-0400")]  # the recording read
    run(t0 + drill.EVIDENCE_RECHECK - timedelta(seconds=1))
    assert len(reads) == 1  # not due yet: no storage read
    d = run(t0 + drill.EVIDENCE_RECHECK)
    assert len(reads) == 2 and d["signer"] == signer and d["result"] == "Passed"  # still verifies
    assert d["evidenceCheckTime"] == fmt(t0 + drill.EVIDENCE_RECHECK)

    stored["found"] = drill.READ_FAILED  # the storage did not answer: nothing is concluded from that
    d = run(t0 + 2 * drill.EVIDENCE_RECHECK)
    assert d["signer"] == signer and d["evidenceCheckTime"] == fmt(t0 + 2 * drill.EVIDENCE_RECHECK)

    tampered = _copy.deepcopy(report)
    tampered["queues"][0]["actual_count"] = 6
    stored["found"] = ("pfx/b1/drills/t-nightly-drill-20261122-0400.json", tampered)
    n = len(events)
    d = run(t0 + 3 * drill.EVIDENCE_RECHECK)
    assert (d["result"], d["reason"]) == ("Failed", "DrillEvidenceInvalid") and "signer" not in d
    assert d["message"] == ("the stored report of drill nightly-drill-20261122-0400 no longer verifies: "
                            "pfx/b1/drills/t-nightly-drill-20261122-0400.json: field queues[0].actual_count was "
                            "changed after signing: signed 5, the report shows 6")
    assert events[n:] == [("Warning", "RestoreDrillEvidenceInvalid", d["message"])]
    assert "evidenceCheckTime" not in d and drill.evidence_recheck_time(d) is None
    m = len(reads)
    run(t0 + 9 * drill.EVIDENCE_RECHECK)
    assert len(reads) == m  # no signer left to vouch for: never read again


def test_recheck_names_a_removed_or_resigned_report():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from rbak.repo.evidence import fingerprint, sign

    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    report = {"passed": True, "backup_id": "b1", "queues": []}
    d = {"signer": fingerprint(key.public_key()), "lastJob": "j1", "backupId": "b1", "result": "Passed"}
    assert drill.recheck_evidence(d, ("k", dict(report, signature=sign(report, key)))) == {}
    gone = drill.recheck_evidence(d, None)
    assert (gone["result"], gone["reason"], gone["signer"]) == ("Failed", "DrillEvidenceMissing", None)
    assert gone["message"] == f"the signed report of drill j1 (signed by {d['signer']}) is no longer in the storage"
    resigned = drill.recheck_evidence(d, ("k", dict(report, signature=sign(report, other))))
    assert (resigned["reason"], resigned["signer"]) == ("DrillEvidenceInvalid", None)
    assert resigned["message"] == (f"k: now signed by key {fingerprint(other.public_key())}, not by {d['signer']} "
                                   "that signed drill j1")
    stripped = drill.recheck_evidence(d, ("k", report))
    assert stripped["reason"] == "DrillEvidenceInvalid" and "k: not signed" in stripped["message"]


# --------------------------------------------------------------------------
# A RabbitMQArchive's drill (rbak drill --archive)
# --------------------------------------------------------------------------

def _archive_owner(spec: dict) -> dict:
    o = _owner(spec)
    o["kind"], o["metadata"] = "RabbitMQArchive", {**o["metadata"], "name": "orders"}
    return o


@pytest.mark.parametrize("spec", [CLUSTER_SPEC, URL_SPEC], ids=["cluster", "url"])
def test_an_archive_drill_job_runs_rbak_drill_archive_and_its_config_loads(spec):
    spec = _with_drill(spec, lookbackSeconds=120)
    owner = _archive_owner(spec)
    cfg, env = drill.archive_drill_config(spec, "prod")
    base = drill.drill_base(owner)
    assert base == "orders-archive"  # never the Jobs of a RabbitMQBackup named orders
    run = drill.drill_run_name(base, SLOT)
    job = drill.drill_job(owner, run, "orders", env, SLOT)
    kubernetes_validate.validate(job, K8S, strict=True)
    assert job["metadata"]["labels"][bodies.L_DRILLS] == "orders-archive"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["drill", "--config", "/etc/rbak/config.yaml", "--archive", "orders", "--drill-id", run, "--json"]
    cm = bodies.configmap_body(run, "prod", owner, cfg, drill.drill_labels(base))
    loaded = Config.from_dict(yaml.safe_load(cm["data"]["config.yaml"]), env=SECRET_ENV)
    assert loaded.mode == "drill" and loaded.source is not None and loaded.drill.target is not None
    assert loaded.drill.lookback_secs == 120.0 and "backup_id" not in cfg
    assert loaded.source.management_url == loaded.drill.target.management_url  # default target: the archived broker


@pytest.mark.parametrize("spec", [CLUSTER_SPEC, URL_SPEC], ids=["cluster", "url"])
def test_an_archive_drill_lookback_of_zero_takes_effect(spec):
    """``lookbackSeconds: 0`` (drill up to the recoverable-until itself) is a value, not "unset" (it read 300)."""
    cfg, _ = drill.archive_drill_config(_with_drill(spec, lookbackSeconds=0), "prod")
    assert cfg["drill"]["lookback_secs"] == 0.0
    cfg, _ = drill.archive_drill_config(_with_drill(spec), "prod")
    assert cfg["drill"]["lookback_secs"] == float(drill.DEFAULT_LOOKBACK_SECONDS)


def test_an_archive_drill_status_shows_the_recovery_point_beside_the_objective():
    report = {"passed": True, "scratch_vhost": "rbak-drill-orders.1-x", "report_key": "p/orders.1/drills/t-x.json",
              "archive": {"generation": "orders.1", "recovery_point_secs": 2.5, "restore_secs": 0.8,
                          "restore_point_utc": "2026-12-06T08:00:00.000Z",
                          "recoverable_until_utc": "2026-12-06T08:04:58.000Z",
                          "streams": [{"vhost": "o", "stream": "a", "restored_count": 10, "passed": True},
                                      {"vhost": "o", "stream": "b", "restored_count": 5, "passed": True}]}}
    out = drill.drill_result(_state("Complete"), report, "orders", "orders-archive-drill-x")
    assert {k: out[k] for k in ("result", "reason", "backupId", "streams", "messages", "failedStreams",
                                "recoveryPointSeconds", "restoreSeconds", "restorePoint", "evidenceKey",
                                "signer")} == {
        "result": "Passed", "reason": "DrillPassed", "backupId": "orders.1", "streams": 2, "messages": 15,
        "failedStreams": [], "recoveryPointSeconds": 2.5, "restoreSeconds": 0.8,
        "restorePoint": "2026-12-06T08:00:00.000Z", "evidenceKey": "p/orders.1/drills/t-x.json", "signer": None}
    failed = {**report, "passed": False, "reason": "archive 'orders': stream 'b' in vhost 'o': record at offset 3 "
                                                  "missing from the restore"}
    failed["archive"] = {**report["archive"], "streams": [report["archive"]["streams"][0],
                                                          {"vhost": "o", "stream": "b", "passed": False}]}
    out = drill.drill_result(_state("Complete"), failed, "orders", "orders-archive-drill-x")
    assert out["result"] == "Failed" and out["failedStreams"] == ["o/b"] and out["message"] == failed["reason"]


def test_the_archive_drill_reconciler_runs_only_when_something_is_due():
    from rbak_operator.reconcile.archive import drill_quiet

    now = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
    assert drill_quiet(None, now) and drill_quiet({}, now)
    assert drill_quiet({"nextRunTime": "2026-12-07T06:00:00Z"}, now)
    assert not drill_quiet({"nextRunTime": "2026-12-06T11:59:00Z"}, now)  # a slot is due
    assert not drill_quiet({"nextRunTime": "2026-12-07T06:00:00Z", "active": "orders-archive-drill-x"}, now)
    signed = {"nextRunTime": "2026-12-07T06:00:00Z", "signer": "SHA256:ab", "lastJob": "j", "backupId": "orders.1"}
    assert not drill_quiet({**signed, "evidenceCheckTime": "2026-12-06T10:00:00Z"}, now)  # the hourly recheck
    assert drill_quiet({**signed, "evidenceCheckTime": "2026-12-06T11:30:00Z"}, now)
