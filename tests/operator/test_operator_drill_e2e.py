"""Restore drills end to end: the real operator (kopf) on a real API server (``e2e_kube``), the
local kubelet running the drill Job's ``rbak drill`` against RabbitMQ 3.10 and moto S3 (see
test_operator_e2e).

A drill slot of ``spec.verify.restoreDrill`` restores the newest complete backup into a scratch
vhost, and the result reaches ``status.restoreDrill``, an event and the operator's /metrics;
a damaged backup fails the drill naming the queue. Either way the scratch vhost is gone and the
source vhost keeps its messages."""

from __future__ import annotations

import urllib.request

import pytest
from support.opcluster import wait_for
from rbak_operator.decide.naming import manual_run_name
from support.s3 import free_port
from support.op_e2e import (
    Cluster,
    backup_id,
    damage_a_segment as _damage_a_segment,
    create_backup,
    trigger,
    wait_run,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_s3, e2e_kube):
    c = Cluster(tmp_path_factory.mktemp("drill-cluster"), kube=e2e_kube)
    c.metrics_port = free_port()
    c.operator.kill()
    c.operator = c.start_operator({"RBAK_METRICS_PORT": str(c.metrics_port), "RBAK_METRICS_BIND": "127.0.0.1"})
    try:
        yield c
    finally:
        c.close()


def _scrape(cluster) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _drill_gauge(cluster, name: str) -> dict:
    return {dict(k[1]).get("reason", ""): v for k, v in _scrape(cluster).items()
            if k[0] == "rbak_backup_restore_drill_failed" and ("backup", name) in k[1]}


def _backup_then_drill(cluster, env, name: str, damage: str | None = None, on_demand: bool = False
                       ) -> tuple[str, dict]:
    if not on_demand:
        cluster.clock_at_server_time()  # the server stamps creationTimestamp: the drill's first slot counts from it
    create_backup(cluster, env, name, verify={"restoreDrill": {"schedule": "*/5 * * * *"}})
    trigger(cluster, name, "1")
    job = manual_run_name(name, "1")
    wait_run(cluster, name, job=job, phase="Succeeded")
    job = backup_id(cluster, name, job)  # the backup the drill restores (named after the run)
    if damage:
        _damage_a_segment(env, job, damage)
    if on_demand:  # kubectl annotate rbak NAME rbak.io/drill-now=...
        cluster.http.patch("rbak.io/v1alpha1", "rabbitmqbackups", name,
                           {"metadata": {"annotations": {"rbak.io/drill-now": "1"}}})
        slot = "rbak.io/drill-now=1"
    else:
        slot = cluster.next_slot()
    drill = wait_for(lambda: (d := cluster.status(name).get("restoreDrill") or {}).get("result")
                     and d.get("lastJob") and not d.get("active") and d, 180,
                     what=f"{name} drill of slot {slot}", diag=cluster.logs)
    return job, drill


def _counts(env) -> dict:
    return {q: env.broker.message_count(env.vhost, q) for q in ("orders", "payments")}


def _drill_vhosts(broker, job: str) -> set:
    """The scratch vhosts of drills of backup ``job`` (other tests' drills may run meanwhile)."""
    return {v["name"] for v in broker.api("GET", "/api/vhosts") if v["name"].startswith(f"rbak-drill-{job}-")}


def _fill(env) -> None:
    env.broker.publish_n(env.vhost, "orders", 9, declare={})
    env.broker.publish_n(env.vhost, "payments", 6, declare={"x-queue-type": "quorum"})


def test_a_drill_passes_on_a_good_backup(cluster, env):
    _fill(env)
    before = _counts(env)
    name = f"{env.tag}-drill"
    job, d = _backup_then_drill(cluster, env, name)
    assert d["result"] == "Passed" and d["reason"] == "DrillPassed", (d, cluster.logs())
    assert d["backupId"] == job and d["queues"] == 2 and d["messages"] == 15 and d["failedQueues"] == []
    assert d["scratchVhost"].startswith(f"rbak-drill-{job}-") and not env.broker.vhost_exists(d["scratchVhost"])
    assert _drill_vhosts(env.broker, job) == set() and _counts(env) == before
    ev = wait_for(lambda: [e for e in cluster.events(name) if e["reason"] == "RestoreDrillPassed"], 20,
                  what="RestoreDrillPassed event", diag=cluster.logs)
    assert ev[0]["type"] == "Normal" and job in ev[0]["message"]
    assert wait_for(lambda: _drill_gauge(cluster, name) == {"": 0.0}, 20, what="drill gauge 0", diag=cluster.logs)
    assert d["nextRunTime"] > d["lastScheduleTime"]


def test_a_drill_finds_a_damaged_backup_and_names_the_queue(cluster, env):
    _fill(env)
    before = _counts(env)
    name = f"{env.tag}-dmg"
    job, d = _backup_then_drill(cluster, env, name, damage="payments", on_demand=True)
    assert d["result"] == "Failed" and d["reason"] == "DrillFailed", (d, cluster.logs())
    assert d["failedQueues"] == [f"{env.vhost}/payments"] and "'payments'" in d["message"] and job in d["message"]
    assert not env.broker.vhost_exists(d["scratchVhost"]) and _drill_vhosts(env.broker, job) == set()
    assert _counts(env) == before
    ev = wait_for(lambda: [e for e in cluster.events(name) if e["reason"] == "RestoreDrillFailed"], 20,
                  what="RestoreDrillFailed event", diag=cluster.logs)
    assert ev[0]["type"] == "Warning" and "payments" in ev[0]["message"]
    assert wait_for(lambda: _drill_gauge(cluster, name) == {"DrillFailed": 1.0}, 20, what="drill gauge 1",
                    diag=cluster.logs)
    st = cluster.status(name)
    assert d["lastJob"].startswith(f"{name}-drill-manual-") and d["lastManualTrigger"] == "1"
    assert st["lastRun"]["phase"] == "Succeeded"  # the backup run itself is not rewritten by its drill


def test_drill_api_calls_are_within_the_declared_rbac(cluster, env):
    """The drills' calls (Jobs, ConfigMaps, pods, Secrets, events, status) are all in the chart's RBAC.
    The test runs its own drill: it must not depend on which tests ran before it."""
    from rbak_operator.kube.api_calls import used_api_calls

    cluster.needs_audit_log()
    _fill(env)
    _backup_then_drill(cluster, env, f"{env.tag}-rbac", on_demand=True)
    made = cluster.emu.api_calls()
    assert not made - used_api_calls(), sorted(made - used_api_calls())
    assert {("batch", "jobs", "create"), ("", "configmaps", "create"), ("rbak.io", "rabbitmqbackups/status", "patch"),
            ("", "events", "create")} <= made
