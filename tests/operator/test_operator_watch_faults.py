"""Event-driven reconciliation under watch faults, on the real API server (issue 30).

The operator runs a pass when something changes and otherwise sleeps until its next slot or the
safety resync, which is a day here: no periodic pass can hide a missed event. Its watches end
every 3 s (``RBAK_OPERATOR_WATCH_TIMEOUT_SECONDS``; the server closes them, kopf resumes from the
last resourceVersion). Cases: runs while watches keep ending, a Job deleted mid-run, a Job that
exists before its owner, and a burst of slots with the operator killed halfway (each slot's Job
exactly once). A restart in the middle of a run is
test_operator_real_apiserver.py::test_running_status_is_reconciled_from_the_job_after_a_crash.
A ``410 Gone`` needs a compacted resourceVersion the server will not produce on demand: kopf
answers it by listing again, the same path as its start-up.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from rbak_operator.decide import bodies
from rbak_operator.decide.naming import manual_run_name, scheduled_run_name
from support.op_e2e import API, Cluster, create_backup, trigger, wait_run
from support.opcluster import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(400)]

OPERATOR_ENV = {"RBAK_OPERATOR_RESYNC_SECONDS": "86400", "RBAK_OPERATOR_WATCH_TIMEOUT_SECONDS": "3"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_s3, e2e_kube):
    # The fake clock starts at the server's time: the server stamps creationTimestamp itself.
    c = Cluster(tmp_path_factory.mktemp("cluster-faults"), kube=e2e_kube, operator_env=OPERATOR_ENV)
    try:
        yield c
    finally:
        c.close()


def _operator_watches(cluster, resource: str) -> int:
    return sum(1 for ev in cluster.emu.kube.audit_events()
               if ev.get("verb") == "watch" and (ev.get("objectRef") or {}).get("resource") == resource
               and ev.get("stage") == "ResponseComplete" and not ev.get("userAgent", "").startswith("kubectl/")
               and ev.get("requestReceivedTimestamp", "") >= cluster.emu.since)


def test_runs_complete_while_the_watches_keep_ending(cluster, env):
    cluster.needs_audit_log()  # counts the ended watches there
    env.broker.publish_n(env.vhost, "q", 4, declare={})
    name = f"{env.tag}-rewatch"
    create_backup(cluster, env, name)
    trigger(cluster, name, "1")
    assert wait_run(cluster, name, job=manual_run_name(name, "1"), phase="Succeeded", timeout=120)["messages"] == 4
    # the server ends the watches on Jobs and RabbitMQBackups; kopf resumes them
    ended = {r: _operator_watches(cluster, r) for r in ("jobs", "rabbitmqbackups")}
    wait_for(lambda: all(_operator_watches(cluster, r) >= n + 2 for r, n in ended.items()), 60,
             what="two more ended watches")
    trigger(cluster, name, "2")
    assert wait_run(cluster, name, job=manual_run_name(name, "2"), phase="Succeeded", timeout=120)["messages"] == 4


def test_a_job_deleted_mid_run_leaves_no_run_active(cluster, env, tmp_path):
    env.broker.publish_n(env.vhost, "q", 2, declare={})
    name = f"{env.tag}-deljob"
    create_backup(cluster, env, name)
    gate = tmp_path / "gate"  # the pod waits after its first queue until this file exists
    cluster.runner.extra_env = {"PYTHONPATH": str(GATE_DIR), "RBAK_TEST_PROGRESS_GATE": str(gate)}
    try:
        trigger(cluster, name, "1")
        job = manual_run_name(name, "1")
        wait_for(lambda: cluster.status(name).get("active") == [job], 60, what="run active", diag=cluster.logs)
        cluster.http.delete("batch/v1", "jobs", job)
        st = wait_for(lambda: (s := cluster.status(name)).get("active") == [] and s, 60,
                      what="the deleted run no longer active", diag=cluster.logs)
        assert st["phase"] != "Running", st
    finally:
        gate.touch()
        cluster.runner.extra_env = {}


def test_a_finished_job_that_exists_before_its_owner_is_recorded(cluster, env):
    name = f"{env.tag}-early"
    job = manual_run_name(name, "x")
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = bodies.backup_run_labels(name, "manual")
    cluster.runner.seen.add(job)  # nobody runs it: it has already finished
    cluster.http.create("batch/v1", "jobs", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job, "labels": labels, "annotations": {bodies.A_BACKUP_ID: job},
                     "ownerReferences": [{"apiVersion": API, "kind": "RabbitMQBackup", "name": name,
                                          "uid": "00000000-0000-0000-0000-000000000000"}]},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "backup", "image": "rbak:test"}]}}}})
    cluster.http.patch("batch/v1", "jobs", job, {"status": {
        "active": 0, "succeeded": 1, "startTime": now, "completionTime": now,
        "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": now}]}}, sub="status")
    create_backup(cluster, env, name)
    run = wait_run(cluster, name, job=job, phase="Succeeded", timeout=60)
    assert run["trigger"] == "manual"


def test_a_burst_of_slots_makes_each_job_exactly_once_across_an_operator_kill(cluster, env):
    n = 12
    slot = (cluster.now + timedelta(minutes=10)).replace(second=0)
    names = [f"{env.tag}-burst-{i}" for i in range(n)]
    for i, name in enumerate(names):  # one source each (a shared one holds the others back: ScheduleSkipped)
        create_backup(cluster, env, name, schedule=f"{slot.minute} {slot.hour} * * *",
                      queues={"vhosts": [f"{env.vhost}-{i}"]})
    for name in names:
        wait_for(lambda: cluster.status(name).get("nextScheduleTime") == slot.strftime("%Y-%m-%dT%H:%M:%SZ"), 60,
                 what=f"{name} scheduled", diag=cluster.logs)
    cluster.runner.seen.update(scheduled_run_name(x, slot) for x in names)  # Jobs are made, not run
    cluster.set_clock(slot + timedelta(seconds=2))
    wait_for(lambda: len(cluster.jobs(f"{env.tag}-burst")) >= 1, 60, what="the burst started", diag=cluster.logs)
    cluster.operator.kill()
    cluster.operator = cluster.start_operator()
    want = {scheduled_run_name(x, slot) for x in names}
    got = wait_for(lambda: (j := set(cluster.jobs(f"{env.tag}-burst"))) >= want and j, 120,
                   what=f"{n} Jobs", diag=cluster.logs)
    assert got == want
    for name in names:
        st = wait_for(lambda: (s := cluster.status(name)).get("active") and s, 30, what=f"{name} active")
        assert st["active"] == [scheduled_run_name(name, slot)]
        assert st["lastScheduleTime"] == slot.strftime("%Y-%m-%dT%H:%M:%SZ")


from test_operator_progress_e2e import GATE_DIR  # noqa: E402
