"""Live progress and per-resource gauges end to end: the real operator (kopf) against the real API server,
Jobs run by the local kubelet against RabbitMQ 3.10 and moto S3 (see test_operator_e2e.py).

The Job pods are held after their first finished queue by a ``sitecustomize`` gate
(``data/progress_gate``) until the test has seen the progress in the resource's status, so the
"while the Job runs" part is deterministic, with no timing assertion. The pods have no Kubernetes
credentials at all: the progress reaches the status through the storage.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rbak.repo.catalog import list_backups
from rbak_operator.crds import schema as crds

from support.opcluster import wait_for
from rbak_operator.decide.naming import run_backup_id
from support.op_e2e import (API, backup_id, create_backup, good_and_failed_run, metric_samples, restart_with_metrics, s3,
                            trigger, wait_run)

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(400)]

GATE_DIR = Path(__file__).parent / "data" / "progress_gate"


def column(kind: str, name: str, obj: dict):
    """What ``kubectl get`` prints in a printer column: its jsonPath evaluated on the object."""
    crd = next(c for c in crds.all_crds().values() if c["spec"]["names"]["kind"] == kind)
    path = next(c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if c["name"] == name)
    v = obj
    for part in path.strip(".").split("."):
        v = (v or {}).get(part)
    return v


@pytest.fixture
def gate(cluster, tmp_path):
    path = tmp_path / "gate"
    cluster.runner.extra_env = {"PYTHONPATH": str(GATE_DIR), "RBAK_TEST_PROGRESS_GATE": str(path)}
    try:
        yield path
    finally:
        path.touch()  # never leave a pod waiting
        cluster.runner.extra_env = {}


def test_backup_progress_in_status_while_the_job_runs_then_cleared(cluster, env, gate):
    env.broker.publish_n(env.vhost, "a", 30, declare={})
    env.broker.publish_n(env.vhost, "b", 40, declare={})
    name = f"{env.tag}-prog"
    create_backup(cluster, env, name)
    trigger(cluster, name, "1")
    reached = Path(str(gate) + ".backup.reached")
    wait_for(reached.exists, 90, what="the backup Job held after its first queue", diag=cluster.logs)
    bid = reached.read_text()  # the run reports under its backup id: the Job's name and the object's tag
    job = bid.rsplit("-", 1)[0]
    assert bid == backup_id(cluster, name, job)

    def shown():
        obj = cluster.backup(name)
        p = (obj.get("status") or {}).get("progress") or {}
        return obj if p.get("queuesDone") == 1 and p.get("currentQueue") else None

    obj = wait_for(shown, 30, what="progress in the status", diag=cluster.logs)
    p = obj["status"]["progress"]
    assert obj["status"]["active"] == [job] and p["runName"] == job and p["state"] == "Running"
    assert p["queuesTotal"] == 2 and "messagesTotal" not in p  # a backup's total is only known queue by queue
    assert 30 <= p["messages"] <= 70 and p["bytes"] > 0 and p["rate"].endswith("msg/s")
    assert p["currentQueue"] in (f"{env.vhost}/a", f"{env.vhost}/b")
    # kubectl get rabbitmqbackups: the columns resolve on the object
    assert column("RabbitMQBackup", "Progress", obj).startswith("1/2 queues, ")
    assert column("RabbitMQBackup", "Rate", obj) == p["rate"]
    assert column("RabbitMQBackup", "Current Queue", obj) == p["currentQueue"]
    pod = cluster.http.get("v1", "pods", f"{job}-pod")["spec"]
    main = pod["containers"][0]
    assert {"name": "RBAK_PROGRESS_ID", "value": bid} in main["env"] and "serviceAccountName" not in pod

    gate.touch()
    run = wait_run(cluster, name, job=job, phase="Succeeded")
    assert run["messages"] == 70
    st = wait_for(lambda: s if "progress" not in (s := cluster.status(name)) and not s.get("active") else None, 30,
                  what="progress cleared", diag=cluster.logs)
    assert column("RabbitMQBackup", "Progress", {"status": st}) is None
    storage = s3(env)
    assert [k for k in storage.list("") if "/_progress/" in f"/{k}"] == []  # the Job removed its records
    assert [b.backup_id for b in list_backups(storage)] == [bid]


def test_restore_progress_in_status_while_the_job_runs_then_cleared(cluster, env, gate):
    env.broker.publish_n(env.vhost, "a", 20, declare={})
    env.broker.publish_n(env.vhost, "b", 25, declare={})
    name = f"{env.tag}-rprog"
    create_backup(cluster, env, name)
    gate.touch()  # the backup runs through
    trigger(cluster, name, "1")
    wait_run(cluster, name, phase="Succeeded")
    gate.unlink()
    for q in ("a", "b"):
        env.broker.drain_queue(env.vhost, q)
    rname = f"{env.tag}-rprog-r"
    cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore",
                                                  "metadata": {"name": rname}, "spec": {"backupRef": {"name": name}}})
    reached = Path(str(gate) + ".restore.reached")
    wait_for(reached.exists, 90, what="the restore Job held after its first queue", diag=cluster.logs)

    def shown():
        obj = cluster.http.get(API, "rabbitmqrestores", rname) or {}
        p = (obj.get("status") or {}).get("progress") or {}
        return obj if p.get("queuesDone", 0) >= 1 else None

    obj = wait_for(shown, 30, what="restore progress in the status", diag=cluster.logs)
    p, st = obj["status"]["progress"], obj["status"]
    meta = cluster.http.get(API, "rabbitmqrestores", rname)["metadata"]
    assert st["phase"] == "Running" and p["runName"] == st["jobName"]
    assert reached.read_text() == run_backup_id(st["jobName"], meta["namespace"], meta["uid"])  # unique across namespaces
    assert (p["queuesTotal"], p["messagesTotal"]) == (2, 45) and 20 <= p["messages"] <= 45
    assert column("RabbitMQRestore", "Progress", obj) == p["summary"] and "/2 queues" in p["summary"]
    assert column("RabbitMQRestore", "Rate", obj) == p["rate"]

    gate.touch()
    st = wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {}).get(
        "phase") in ("Succeeded", "Failed") and s, 120, what="restore", diag=cluster.logs)
    assert st["phase"] == "Succeeded" and "progress" not in st, st
    assert env.broker.message_count(env.vhost, "a") == 20 and env.broker.message_count(env.vhost, "b") == 25


def test_gauges_of_deleted_resources_are_dropped(cluster, env):
    port = restart_with_metrics(cluster)
    name, bad = good_and_failed_run(cluster, env, "gone")
    env.broker.drain_queue(env.vhost, "q")
    rname = f"{env.tag}-gone-r"
    cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore",
                                                  "metadata": {"name": rname}, "spec": {"backupRef": {"name": name}}})

    def series(key: str, value: str) -> list:
        return [(n, labels) for n, labels, _v in metric_samples(port) if labels.get(key) == value]

    wait_for(lambda: len(series("restore", rname)) >= 4, 120, what="restore gauges", diag=cluster.logs)
    wait_for(lambda: len(series("backup", bad)) >= 1, 30, what="failed backup gauges", diag=cluster.logs)
    before = series("backup", name)
    assert {n for n, _ in before} >= {"rbak_backup_last_messages", "rbak_backup_schedule_period_seconds",
                                      "rbak_backup_last_run_failed"}
    cluster.http.delete(API, "rabbitmqrestores", rname)
    cluster.http.delete(API, "rabbitmqbackups", bad)  # its series carries a reason label: dropped too
    wait_for(lambda: not series("restore", rname) and not series("backup", bad), 30, what="series dropped",
             diag=cluster.logs)
    assert series("backup", name) == before  # the others' series stay
    cluster.http.delete(API, "rabbitmqbackups", name)
    wait_for(lambda: not series("backup", name), 30, what="series dropped", diag=cluster.logs)
