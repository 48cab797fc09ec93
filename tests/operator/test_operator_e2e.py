"""The operator's end-to-end scenarios: the real operator process (``python -m rbak_operator``,
kopf) with a local kubelet (``opcluster.PodRunner``) running each Job's pod command against the
real RabbitMQ 3.10 and a moto S3 server. The operator's clock is a file the test steps across
schedule slots (``RBAK_OPERATOR_CLOCK_FILE``), so no test waits for wall-clock minutes.

Every ``e2e_*`` function here runs on the real API server (test_operator_real_apiserver.py
imports them); kmock's emulator is kept only for faults a real server will not produce
(test_operator_emulator_faults.py). A scheduled scenario starts with
``cluster.clock_at_server_time()``: the server stamps creationTimestamp with its own clock.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta

import pytest

from rbak.repo.catalog import list_backups, load_manifest
from rbak.storage.url import open_storage
from rbak_operator.decide.naming import manual_run_name

import support.sparkcrd as sparkcrd
from support.op_e2e import (API, backup_id, bucket_root as _bucket_root, create_backup,
                             damage_a_segment as _damage_a_segment, fmt as _fmt, good_and_failed_run,
                             metric_samples, restart_with_metrics, s3, trigger, wait_run)
from support.opcluster import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def e2e_scheduled_backup_status_shows_manifest_counts(cluster, env):
    cluster.clock_at_server_time()
    env.broker.publish_n(env.vhost, "orders", 25, declare={})
    name = f"{env.tag}-sched"
    create_backup(cluster, env, name, schedule="*/5 * * * *", broker=env.cluster_broker,
                  validate={"enabled": True, "deep": True})
    wait_for(lambda: cluster.status(name).get("nextScheduleTime"), 30, what="nextScheduleTime", diag=cluster.logs)
    assert cluster.jobs(name) == []
    slot = cluster.next_slot()
    job = f"{name}-{slot:%Y%m%d-%H%M}"
    run = wait_run(cluster, name, job=job)
    assert run["phase"] == "Succeeded", cluster.logs()
    bid = backup_id(cluster, name, job)
    assert run["backupId"] == bid
    manifest = load_manifest(s3(env), bid)
    assert manifest.is_complete and manifest.total_messages == 25
    assert run["messages"] == 25 == manifest.total_messages
    assert run["bytes"] == manifest.total_bytes and run["segments"] == manifest.total_segments
    assert run["queues"] == 1 and run["trigger"] == "schedule"
    # Validated in the run's own pod: the backup as init container, `rbak validate --deep` after it.
    assert (run["validation"], run["validationRun"], run["validationEngine"]) == ("Passed", job, "job")
    pod = cluster.http.get("v1", "pods", f"{job}-pod")["spec"]
    assert [c["args"][0] for c in pod["initContainers"]] == ["backup"]
    assert [c["args"][0] for c in pod["containers"]] == ["validate"] and "--deep" in pod["containers"][0]["args"]
    out = cluster.runner.outputs[job]
    assert out.index("$ backup ") < out.index("$ validate ") and f"backup {bid} is valid (deep: {manifest.total_segments} segments checked)" in out, out
    assert run["scheduledTime"] == _fmt(slot)
    st = wait_for(lambda: (s := cluster.status(name)).get("phase") == "Succeeded" and s, 30, what="phase")
    assert st["lastBackupId"] == bid and st["lastScheduleTime"] == _fmt(slot)
    assert st["nextScheduleTime"] == _fmt(slot + timedelta(minutes=5))
    assert {c["type"]: c["status"] for c in st["conditions"]} == {"Ready": "True", "Progressing": "False"}
    assert env.broker.message_count(env.vhost, "orders") == 25  # the source is untouched
    reasons = wait_for(lambda: {e["reason"] for e in cluster.events(name)} >= {"BackupStarted", "BackupSucceeded"}
                       and {e["reason"] for e in cluster.events(name)}, 20, what="events")
    assert "BackupFailed" not in reasons
    assert cluster.jobs(name) == [job]


def e2e_on_demand_trigger_runs_once_per_value(cluster, env):
    env.broker.publish_n(env.vhost, "q1", 3, declare={})
    name = f"{env.tag}-manual"
    create_backup(cluster, env, name)
    trigger(cluster, name, "first")
    run = wait_run(cluster, name, phase="Succeeded")
    assert run["trigger"] == "manual" and run["messages"] == 3
    assert cluster.status(name)["lastManualTrigger"] == "first"
    time.sleep(2)  # same value again: nothing new
    assert len(cluster.jobs(name)) == 1
    trigger(cluster, name, "second")
    wait_for(lambda: len(cluster.jobs(name)) == 2, 30, what="second job", diag=cluster.logs)
    wait_for(lambda: len(cluster.status(name).get("history") or []) == 2, 90, what="two runs", diag=cluster.logs)
    assert len([b for b in list_backups(s3(env)) if b.complete]) == 2


def e2e_suspend_skips_slots_and_resume_does_not_fire_them(cluster, env):
    cluster.clock_at_server_time()
    name = f"{env.tag}-susp"
    create_backup(cluster, env, name, schedule="*/5 * * * *", suspend=True)
    wait_for(lambda: cluster.status(name).get("phase") == "Suspended", 30, what="Suspended", diag=cluster.logs)
    skipped = cluster.next_slot()
    wait_for(lambda: cluster.status(name).get("lastScheduleTime") == _fmt(skipped), 30, what="slot passed while suspended")
    assert cluster.jobs(name) == []
    cluster.http.patch(API, "rabbitmqbackups", name, {"spec": {"suspend": False}})
    wait_for(lambda: cluster.status(name).get("nextScheduleTime") == _fmt(skipped + timedelta(minutes=5)), 30,
             what="resumed", diag=cluster.logs)
    time.sleep(2)
    assert cluster.jobs(name) == []  # the slot missed while suspended is not run on resume
    slot = cluster.next_slot()
    wait_run(cluster, name, job=f"{name}-{slot:%Y%m%d-%H%M}", phase="Succeeded")


def e2e_operator_killed_across_a_slot_runs_it_exactly_once(cluster, env):
    cluster.clock_at_server_time()
    env.broker.publish_n(env.vhost, "q", 2, declare={})
    name = f"{env.tag}-restart"
    create_backup(cluster, env, name, schedule="*/5 * * * *", startingDeadlineSeconds=600)
    wait_for(lambda: cluster.status(name).get("nextScheduleTime"), 30, what="scheduled", diag=cluster.logs)
    cluster.operator.kill()
    slot = cluster.next_slot()
    time.sleep(1)
    assert cluster.jobs(name) == []
    cluster.operator = cluster.start_operator()
    job = f"{name}-{slot:%Y%m%d-%H%M}"
    wait_run(cluster, name, job=job, phase="Succeeded", timeout=120)
    # A second restart with the clock still inside the slot's deadline: no second run.
    cluster.operator.kill()
    cluster.operator = cluster.start_operator()
    wait_for(lambda: f"{name}: reconcile loop started" in cluster.operator.log(), 60, what="operator up", diag=cluster.logs)
    time.sleep(4)
    assert cluster.jobs(name) == [job]
    assert cluster.runner.started.count(job) == 1


def e2e_running_status_is_reconciled_from_the_job_after_a_crash(cluster, env):
    env.broker.publish_n(env.vhost, "q", 4, declare={})
    name = f"{env.tag}-crash"
    create_backup(cluster, env, name)
    trigger(cluster, name, "go")
    wait_for(lambda: cluster.status(name).get("phase") == "Running", 30, what="Running", diag=cluster.logs)
    cluster.operator.kill()
    job = cluster.jobs(name)[0]
    wait_for(lambda: any(c.get("type") == "Complete" for c in
                         ((cluster.http.get("batch/v1", "jobs", job) or {}).get("status") or {}).get("conditions") or []),
             90, what="job complete while the operator is down", diag=cluster.logs)
    assert cluster.status(name)["phase"] == "Running"
    cluster.operator = cluster.start_operator()
    run = wait_run(cluster, name, job=job, phase="Succeeded", timeout=60)
    assert run["messages"] == 4


def e2e_failing_backup_reports_the_cause(cluster, env):
    env.broker.publish_n(env.vhost, "q", 1, declare={})
    name = f"{env.tag}-fail"
    broker = dict(env.url_broker, credentialsSecretRef={"name": f"{env.tag}-bad"})
    create_backup(cluster, env, name, broker=broker, validate={"enabled": True})
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Failed")
    # The backup is the pod's init container: it failed, so the validation container never ran.
    assert "$ validate" not in cluster.runner.outputs[run["jobName"]] and "validation" not in run
    pod = cluster.http.get("v1", "pods", f"{run['jobName']}-pod")["status"]
    # (a real API server drops the empty list: omitempty)
    assert [c["name"] for c in pod["initContainerStatuses"]] == ["rbak"] and pod.get("containerStatuses", []) == []
    text = (run.get("message") or "").lower()
    assert any(w in text for w in ("access_refused", "authentication", "login", "401", "not authorised", "unauthorized")), run
    st = wait_for(lambda: (s := cluster.status(name)).get("phase") == "Failed" and s, 30, what="Failed phase")
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "AuthenticationFailed" == run["reason"], (ready, run)
    assert run["message"][:40] in ready["message"]
    assert "definitely-wrong" not in json.dumps(st)  # the password never reaches the status
    wait_for(lambda: any(e["reason"] == "BackupFailed" and e.get("type") == "Warning" for e in cluster.events(name)), 20,
             what="warning event")
    assert [b for b in list_backups(s3(env)) if b.complete] == []


class _Hook:
    """A PodRunner hook acting once when ``container`` of ``run`` is about to start."""

    def __init__(self, cluster, run: str, container: str, action) -> None:
        self.cluster, self.run, self.container, self.action = cluster, run, container, action
        self.result, self.error, self.fired = None, None, threading.Event()

    def __call__(self, run: str, container: str) -> None:
        if (run, container) != (self.run, self.container) or self.fired.is_set():
            return
        try:
            self.result = self.action()
        except BaseException as e:  # noqa: BLE001 - reported by the test, not lost in the runner's thread
            self.error = e
        self.fired.set()

    def __enter__(self) -> "_Hook":
        self.cluster.runner.hooks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self.cluster.runner.hooks.remove(self)
        assert self.error is None, self.error


def e2e_job_validation_fails_on_a_damaged_segment(cluster, env):
    """Validation in the run's pod: a segment damaged after the backup container wrote it and
    before the validation container starts fails the run, naming the key."""
    env.broker.publish_n(env.vhost, "good", 5, declare={})
    env.broker.publish_n(env.vhost, "bad", 7, declare={})
    name = f"{env.tag}-jval"
    create_backup(cluster, env, name, validate={"enabled": True, "deep": True})
    job = manual_run_name(name, "1")
    with _Hook(cluster, job, "validate", lambda: _damage_a_segment(env, backup_id(cluster, name, job), "bad")) as hook:
        trigger(cluster, name, "1")
        run = wait_run(cluster, name, job=job, phase="Failed")
    assert hook.fired.is_set()
    bad_key = hook.result
    good_key = next(q for q in load_manifest(_bucket_root(env), backup_id(cluster, name, job), env.bucket.prefix).queues
                    if q.name == "good").segments[0].key
    assert (run["validation"], run["validationRun"], run["validationEngine"]) == ("Failed", job, "job"), run
    assert run["reason"] == "ValidationFailed" and run["message"].startswith("validation failed: "), run
    assert bad_key in run["message"] and good_key not in run["message"], run
    assert "SHA-256 mismatch" in run["message"] or "CRC32" in run["message"], run
    assert run["messages"] == 12 and run["queues"] == 2  # the backup was written: counts from its manifest
    st = wait_for(lambda: (s := cluster.status(name)).get("phase") == "Failed" and s, 30, what="Failed phase")
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ValidationFailed" and bad_key in ready["message"]
    assert st.get("lastBackupId") is None  # a backup that does not validate is not the last good one
    ev = wait_for(lambda: [e for e in cluster.events(name) if e["reason"] == "ValidationFailed"], 20,
                  what="ValidationFailed event", diag=cluster.logs)
    assert ev[0]["type"] == "Warning" and bad_key in ev[0]["message"]
    assert not any(e["reason"] == "BackupFailed" for e in cluster.events(name))


def _wait_validation(cluster, name: str, job: str, outcome: str, timeout: float = 180) -> dict:
    def done():
        lr = cluster.status(name).get("lastRun") or {}
        if lr.get("jobName") != job:
            return None
        if lr.get("validation") in ("Passed", "Failed") and lr["validation"] != outcome:
            raise AssertionError(f"{job}: validation {lr['validation']}, expected {outcome}: {lr}\n{cluster.logs()}")
        return lr if lr.get("validation") == outcome else None
    return wait_for(done, timeout, what=f"{job} validation {outcome}", diag=cluster.logs)


def _reports(env, backup_id: str) -> list[dict]:
    root = _bucket_root(env)
    keys = [k for k in root.list(f"{env.bucket.prefix}/{backup_id}/validation/") if k.endswith(".json")]
    return [dict(json.loads(root.get(k)), _key=k) for k in keys]


def e2e_spark_validation_passes_then_names_a_damaged_segment(cluster, env):
    """validate.sparkThresholdBytes: 0 -> every finished run is validated by a SparkApplication running
    spark/validate.py (Spark in local mode here); its JSON report lands next to the backup."""
    cluster.needs_own_crd("sparkapplications.sparkoperator.k8s.io")
    env.broker.publish_n(env.vhost, "alpha", 6, declare={})
    env.broker.publish_n(env.vhost, "beta", 4, declare={})
    name = f"{env.tag}-sval"
    create_backup(cluster, env, name, validate={"enabled": True, "sparkThresholdBytes": 0},
                  spark={"executorInstances": 1, "executorMemory": "512m"})
    job = manual_run_name(name, "1")
    app_name = f"{job}-validate"
    release = threading.Event()
    # Hold the driver until the test has seen the Pending state (spark-operator queueing it, in effect).
    with _Hook(cluster, app_name, "spark-kubernetes-driver", lambda: release.wait(120)):
        trigger(cluster, name, "1")
        run = wait_run(cluster, name, job=job, phase="Succeeded")
        pending = _wait_validation(cluster, name, job, "Pending", 30)
        release.set()
    job_pod = cluster.http.get("batch/v1", "jobs", job)["spec"]["template"]["spec"]
    assert "initContainers" not in job_pod  # validation is decided after the run, from its size
    assert (pending["validationEngine"], pending["validationRun"]) == ("spark", app_name)
    assert run["messages"] == 10 and run["queues"] == 2
    app = cluster.http.get("sparkoperator.k8s.io/v1beta2", "sparkapplications", app_name)
    assert sparkcrd.problems(app) == []  # what kubeflow spark-operator's CRD accepts
    assert (app["apiVersion"], app["kind"]) == ("sparkoperator.k8s.io/v1beta2", "SparkApplication")
    spec = app["spec"]
    assert spec["mainApplicationFile"] == "local:///opt/rbak/spark/validate.py" and spec["type"] == "Python"
    args = spec["arguments"]
    assert args[args.index("--backup-id") + 1] == backup_id(cluster, name, job) and args[args.index("--prefix") + 1] == env.bucket.prefix
    assert "endpoint=" in args[args.index("--path") + 1] and spec["executor"]["instances"] == 1
    owner = app["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("RabbitMQBackup", name)
    envs = {e["name"] for e in spec["driver"]["env"]} & {e["name"] for e in spec["executor"]["env"]}
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= envs
    assert "testing" not in json.dumps(spec)  # credentials only through secretKeyRef

    passed = _wait_validation(cluster, name, job, "Passed")
    assert passed["phase"] == "Succeeded" and passed["validationRun"] == app_name
    assert next(h for h in cluster.status(name)["history"] if h["jobName"] == job)["validation"] == "Passed"
    bid = backup_id(cluster, name, job)
    (report,) = _reports(env, bid)
    m = load_manifest(_bucket_root(env), bid, env.bucket.prefix)
    assert report["backup_id"] == bid and report["ok"] is True and report["deep"] is True
    assert sorted(s["key"] for s in report["segments"]) == sorted(s.key for q in m.queues for s in q.segments)
    assert report["summary"]["records"] == 10 == m.total_messages

    # Second run: a segment is damaged after the backup, before the driver starts.
    job2 = manual_run_name(name, "2")
    with _Hook(cluster, f"{job2}-validate", "spark-kubernetes-driver",
               lambda: _damage_a_segment(env, backup_id(cluster, name, job2), "beta")) as hook:
        trigger(cluster, name, "2")
        failed = _wait_validation(cluster, name, job2, "Failed")
    bad_key = hook.result
    good_key = next(q for q in load_manifest(_bucket_root(env), backup_id(cluster, name, job2), env.bucket.prefix).queues
                    if q.name == "alpha").segments[0].key
    assert failed["phase"] == "Succeeded" and failed["validationEngine"] == "spark"
    # spark-operator's errorMessage only has the driver's exit code: the cause comes from the stored report.
    msg = failed["message"]
    assert msg.startswith("validation failed: ") and bad_key in msg and good_key not in msg, failed
    app2 = cluster.http.get("sparkoperator.k8s.io/v1beta2", "sparkapplications", f"{job2}-validate")
    assert "ExitCode: 1" in app2["status"]["applicationState"]["errorMessage"]
    (report2,) = _reports(env, backup_id(cluster, name, job2))
    assert report2["ok"] is False and [s["key"] for s in report2["segments"] if not s["ok"]] == [bad_key]
    assert report2["_key"] in msg
    reasons = wait_for(lambda: (r := [e["reason"] for e in cluster.events(name)]) and "ValidationFailed" in r and r,
                       20, what="events")
    assert {"ValidationStarted", "ValidationPassed", "ValidationFailed"} <= set(reasons)
    ev = next(e for e in cluster.events(name) if e["reason"] == "ValidationFailed")
    assert ev["type"] == "Warning" and bad_key in ev["message"]
    # The first backup's outcome stays as it was.
    assert next(h for h in cluster.status(name)["history"] if h["jobName"] == job)["validation"] == "Passed"


def e2e_retention_deletes_the_oldest_backup(cluster, env):
    env.broker.publish_n(env.vhost, "q", 2, declare={})
    name = f"{env.tag}-ret"
    create_backup(cluster, env, name, retention={"keepLast": 2})
    for i in range(3):
        trigger(cluster, name, f"run-{i}")
        wait_for(lambda: len(cluster.status(name).get("history") or []) == i + 1 and
                 (cluster.status(name).get("lastRun") or {}).get("phase") == "Succeeded", 90, what=f"run {i}",
                 diag=cluster.logs)
    history = cluster.status(name)["history"]
    oldest = history[-1]["backupId"]
    wait_for(lambda: (cluster.status(name).get("retention") or {}).get("deletedTotal") == 1, 30, what="retention",
             diag=cluster.logs)
    left = {b.backup_id for b in list_backups(s3(env))}
    assert left == {history[0]["backupId"], history[1]["backupId"]}
    assert oldest not in left and not list(s3(env).list(f"{oldest}/"))
    assert cluster.status(name)["retention"]["lastDeleted"] == [oldest]


def e2e_restore_from_latest_backup_puts_messages_back(cluster, env):
    bodies = [f"m{i}".encode() for i in range(10)]
    for b in bodies:
        env.broker.publish(env.vhost, "orders", [b], declare={})
    name = f"{env.tag}-src"
    create_backup(cluster, env, name)
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Succeeded")
    assert run["messages"] == 10
    env.broker.drain_queue(env.vhost, "orders")
    assert env.broker.message_count(env.vhost, "orders") == 0
    rname = f"{env.tag}-restore"
    cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore",
                                                  "metadata": {"name": rname}, "spec": {"backupRef": {"name": name}}})
    st = wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {}).get("phase")
                  in ("Succeeded", "Failed") and s, 120, what="restore", diag=cluster.logs)
    assert st["phase"] == "Succeeded", st
    assert st["backupId"] == run["backupId"] and st["engine"] == "job" and st["messages"] == 10
    assert env.broker.read_bodies(env.vhost, "orders") == bodies


def e2e_restore_with_the_spark_engine(cluster, env):
    """engine: spark -> a SparkApplication running spark/restore.py (Spark in local mode here)."""
    cluster.needs_own_crd("sparkapplications.sparkoperator.k8s.io")
    bodies = [f"s{i}".encode() for i in range(5)]
    env.broker.publish(env.vhost, "events", bodies, declare={})
    name = f"{env.tag}-sp"
    create_backup(cluster, env, name)
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Succeeded")
    env.broker.drain_queue(env.vhost, "events")
    rname = f"{env.tag}-sprestore"
    cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore", "metadata": {"name": rname},
                                                  "spec": {"backupRef": {"name": name}, "engine": "spark"}})
    st = wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {}).get("phase")
                  in ("Succeeded", "Failed") and s, 240, what="spark restore", diag=cluster.logs)
    assert st["phase"] == "Succeeded", (st, cluster.runner.outputs.get(f"spark:{st.get('sparkApplicationName')}", "")[-3000:])
    assert st["engine"] == "spark" and st["backupId"] == run["backupId"]
    app = cluster.http.get("sparkoperator.k8s.io/v1beta2", "sparkapplications", st["sparkApplicationName"])
    assert app["spec"]["mainApplicationFile"] == "local:///opt/rbak/spark/restore.py"
    assert sparkcrd.problems(app) == []  # what kubeflow spark-operator's CRD accepts
    assert env.broker.read_bodies(env.vhost, "events") == bodies
    out = cluster.runner.outputs[f"spark:{st['sparkApplicationName']}"]
    assert "5 confirmed" in out and "local" in out, out[-2000:]


def e2e_two_operators_one_slot_one_run(cluster, env):
    cluster.clock_at_server_time()
    name = f"{env.tag}-twin"
    create_backup(cluster, env, name, schedule="*/5 * * * *")
    second = cluster.start_operator()
    try:
        wait_for(lambda: cluster.status(name).get("nextScheduleTime"), 30, what="scheduled")
        time.sleep(3)  # both operators are up and ticking
        slot = cluster.next_slot()
        job = f"{name}-{slot:%Y%m%d-%H%M}"
        wait_run(cluster, name, job=job, phase="Succeeded")
        time.sleep(2)
        assert cluster.jobs(name) == [job] and cluster.runner.started.count(job) == 1
    finally:
        second.stop()


def e2e_deletion_retain_has_no_finalizer_and_keeps_backups(cluster, env):
    env.broker.publish_n(env.vhost, "q", 1, declare={})
    name = f"{env.tag}-keep"
    create_backup(cluster, env, name)
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Succeeded")
    assert not cluster.backup(name)["metadata"].get("finalizers")
    cluster.http.delete(API, "rabbitmqbackups", name)
    wait_for(lambda: cluster.http.get(API, "rabbitmqbackups", name) is None, 10, what="object gone")
    assert load_manifest(s3(env), run["backupId"]).is_complete  # data kept


def e2e_deletion_policy_delete_removes_backups_and_never_hangs(cluster, env):
    env.broker.publish_n(env.vhost, "q", 1, declare={})
    name = f"{env.tag}-del"
    create_backup(cluster, env, name, deletionPolicy="delete")
    wait_for(lambda: "rbak.io/finalizer" in (cluster.backup(name)["metadata"].get("finalizers") or []), 30,
             what="finalizer", diag=cluster.logs)
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Succeeded")
    cluster.http.delete(API, "rabbitmqbackups", name)
    wait_for(lambda: cluster.http.get(API, "rabbitmqbackups", name) is None, 30, what="object gone", diag=cluster.logs)
    assert not list(s3(env).list(f"{run['backupId']}/"))
    # Its storage Secret already gone (namespace teardown order): deletion still completes.
    name2 = f"{env.tag}-del2"
    storage = {"s3": dict(env.storage["s3"], credentialsSecretRef={"name": f"{env.tag}-no-such-secret"})}
    create_backup(cluster, env, name2, deletionPolicy="delete", storage=storage)
    wait_for(lambda: "rbak.io/finalizer" in (cluster.backup(name2)["metadata"].get("finalizers") or []), 30,
             what="finalizer")
    cluster.http.delete(API, "rabbitmqbackups", name2)
    wait_for(lambda: cluster.http.get(API, "rabbitmqbackups", name2) is None, 30, what="object gone", diag=cluster.logs)
    assert any(e["reason"] == "BackupsKept" for e in cluster.events(name2))

def e2e_encrypted_backup_validates_and_restores_with_keys_from_a_secret(cluster, env):
    """spec.encryption: the Job pods get the keyring from a Secret (secretKeyRef, no RBAC); every stored
    object but the manifest is sealed; in-pod deep validation opens them; a backupRef restore inherits the keys."""
    import base64

    from rbak.repo.catalog import load_manifest
    from rbak.sealing.crypto import MAGIC

    bodies = [f"secret-{i}".encode() for i in range(12)]
    env.broker.publish(env.vhost, "pii", bodies, declare={})
    key = base64.b64encode(os.urandom(32)).decode()
    cluster.http.secret(f"{env.tag}-keys", {"keyring": f"k-2026: {key}\n"})
    name = f"{env.tag}-enc"
    create_backup(cluster, env, name, validate={"enabled": True, "deep": True},
                  encryption={"keyId": "k-2026", "keysSecretRef": {"name": f"{env.tag}-keys"},
                              "serverSide": {"mode": "AES256"}})
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Succeeded", timeout=120)
    assert run["messages"] == 12 and run.get("validation") == "Passed", run
    st = open_storage(env.bucket.url_with_prefix(""))
    m = load_manifest(st, run["backupId"], env.bucket.prefix)
    assert m.encryption is not None and m.encryption.key_id == "k-2026"
    seg = m.queues[0].segments[0]
    assert st.get(seg.key).startswith(MAGIC) and b"secret-" not in st.get(seg.key)
    env.broker.drain_queue(env.vhost, "pii")
    rname = f"{env.tag}-encr"
    cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore",
                                                  "metadata": {"name": rname}, "spec": {"backupRef": {"name": name}}})
    rst = wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {}).get("phase")
                   in ("Succeeded", "Failed") and s, 120, what="restore", diag=cluster.logs)
    assert rst["phase"] == "Succeeded", rst
    assert env.broker.read_bodies(env.vhost, "pii") == bodies


def e2e_per_resource_gauges_outlive_the_job(cluster, env):
    """The operator's /metrics carries the last run of each RabbitMQBackup (from the status it wrote),
    labelled rbak_namespace/backup, after the Job is gone; a failed run's reason too."""
    port = restart_with_metrics(cluster)
    name, bad = good_and_failed_run(cluster, env, "met")

    def scrape() -> dict:
        return {(n, tuple(sorted(labels.items()))): v for n, labels, v in metric_samples(port)}

    lab = (("backup", name), ("rbak_namespace", cluster.http.ns))
    got = wait_for(lambda: (m := scrape()).get(("rbak_backup_last_messages", lab)) == 3 and m, 30, what="gauges",
                   diag=cluster.logs)
    assert got[("rbak_backup_schedule_period_seconds", lab)] == 86400
    assert got[("rbak_backup_last_run_failed", tuple(sorted(lab + (("reason", ""),))))] == 0
    assert got[("rbak_backup_last_success_timestamp_seconds", lab)] > 0
    failed = [(k, v) for k, v in got.items() if k[0] == "rbak_backup_last_run_failed" and ("backup", bad) in k[1]]
    assert len(failed) == 1 and failed[0][1] == 1 and dict(failed[0][0][1])["reason"], failed


def e2e_credentials_as_the_rabbitmq_operators_publish_them(cluster, env):
    """A RabbitmqCluster whose status names its default-user Secret (a decoy <name>-default-user with a wrong
    password is ignored), and a messaging-topology-operator connectionSecret (uri, username, password)."""
    cluster.needs_own_crd("rabbitmqclusters.rabbitmq.com")
    b, http, tag = env.broker, cluster.http, env.tag
    b.publish_n(env.vhost, "q1", 4, declare={})
    rc = f"{tag}-rc"
    http.secret(f"{tag}-rc-admin", {"user": b.user, "pass": b.password, "host": b.host, "port": str(b.amqp_port)})
    http.secret(f"{rc}-default-user", {"username": b.user, "password": "decoy-wrong", "host": b.host,
                                       "port": str(b.amqp_port)})
    http.create("rabbitmq.com/v1beta1", "rabbitmqclusters", {
        "apiVersion": "rabbitmq.com/v1beta1", "kind": "RabbitmqCluster", "metadata": {"name": rc}, "spec": {}})
    http.patch("rabbitmq.com/v1beta1", "rabbitmqclusters", rc, {"status": {"defaultUser": {"secretReference": {
        "name": f"{tag}-rc-admin", "namespace": cluster.http.ns,
        "keys": {"username": "user", "password": "pass", "host": "host", "port": "port"}}}}}, sub="status")
    by_status = f"{tag}-bystatus"
    create_backup(cluster, env, by_status, broker={"rabbitmqClusterReference": {"name": rc,
                                                                              "managementPort": b.mgmt_port}})
    http.secret(f"{tag}-topo", {"uri": b.management_url, "username": b.user, "password": b.password})
    by_topo = f"{tag}-topo"
    create_backup(cluster, env, by_topo, broker={"rabbitmqClusterReference": {
        "connectionSecret": {"name": f"{tag}-topo"}, "amqpPort": b.amqp_port}})
    for name in (by_status, by_topo):
        trigger(cluster, name, "1")
    for name in (by_status, by_topo):
        run = wait_run(cluster, name, phase="Succeeded")
        assert run["messages"] == 4, (name, run)
    job = cluster.http.get("batch/v1", "jobs", cluster.jobs(by_status)[0])
    text = json.dumps(job)
    assert f"{tag}-rc-admin" in text and f"{rc}-default-user" not in text


def e2e_two_backups_of_one_source_never_both_read_at_once(cluster, env):
    """Issue 27: two RabbitMQBackups of one cluster and vhost on the same schedule. The operator
    holds back the second while the first's run is active (ScheduleSkipped); if both Jobs start
    anyway, rbak's lease refuses one (exit 4, naming the holder). Never a success with less."""
    cluster.clock_at_server_time()
    n = 2000
    env.broker.publish_n(env.vhost, "pair", n, declare={})
    names = [f"{env.tag}-pair-a", f"{env.tag}-pair-b"]
    for name in names:
        create_backup(cluster, env, name, schedule="*/5 * * * *", broker=env.cluster_broker)
    for name in names:
        wait_for(lambda name=name: cluster.status(name).get("nextScheduleTime"), 30, what="scheduled", diag=cluster.logs)
    slot = cluster.next_slot()
    outcome = {}

    def settled(name):
        st = cluster.status(name)
        job = f"{name}-{slot:%Y%m%d-%H%M}"
        run = st.get("lastRun") or {}
        if run.get("jobName") == job and run.get("phase") in ("Succeeded", "Failed"):
            return ("run", run)
        if st.get("lastMissedTime") == _fmt(slot) and not cluster.jobs(name):
            return ("skipped", st)
        return None

    for name in names:
        outcome[name] = wait_for(lambda name=name: settled(name), 120, what=f"{name} slot settled", diag=cluster.logs)
    succeeded = [name for name, (kind, run) in outcome.items() if kind == "run" and run["phase"] == "Succeeded"]
    assert succeeded, outcome
    for name, (kind, info) in outcome.items():
        if kind == "run" and info["phase"] == "Succeeded":
            assert info["messages"] == n and "backupState" not in info, info
            assert load_manifest(s3(env), info["backupId"]).total_messages == n
        elif kind == "run":  # both Jobs started: the lease refused this one before it wrote anything
            assert "Backup lease" in (info.get("message") or ""), info
        else:
            other = next(x for x in names if x != name)
            reasons = [e.get("message") or "" for e in cluster.events(name) if e.get("reason") == "ScheduleSkipped"]
            assert any(other in m and "same source" in m for m in reasons), reasons
    assert env.broker.message_count(env.vhost, "pair") == n
