"""The real operator process (kopf) against a real Kubernetes API server (``kube_api``), with the
local kubelet (``PodRunner``) running each Job's pod against the real RabbitMQ 3.10 and moto S3.

Unlike kmock's emulator the server validates what the operator writes (schemas, CEL rules,
spark-operator's CRD schema for SparkApplications), sets creationTimestamp, uid and
resourceVersion itself, keeps status apart behind /status and filters label selectors. The
operator's fake clock starts at the server's time, and a scheduled scenario sets it back there
first (``Cluster.clock_at_server_time``): the server stamps creationTimestamp with its own clock.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from rbak_operator.api_calls import used_api_calls
from support.op_e2e import API, create_backup, s3, trigger, wait_run
from support.opcluster import wait_for

from rbak.catalog import list_backups

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(400)]

# The scenarios of test_operator_e2e.py (``e2e_*`` there) run here, on the real server.
from test_operator_e2e import (  # noqa: E402,F401 (collected by pytest)
    e2e_credentials_as_the_rabbitmq_operators_publish_them as test_credentials_as_the_rabbitmq_operators_publish_them,
    e2e_deletion_policy_delete_removes_backups_and_never_hangs as test_deletion_policy_delete_removes_backups_and_never_hangs,
    e2e_deletion_retain_has_no_finalizer_and_keeps_backups as test_deletion_retain_has_no_finalizer_and_keeps_backups,
    e2e_encrypted_backup_validates_and_restores_with_keys_from_a_secret as test_encrypted_backup_validates_and_restores_with_keys_from_a_secret,
    e2e_failing_backup_reports_the_cause as test_failing_backup_reports_the_cause,
    e2e_job_validation_fails_on_a_damaged_segment as test_job_validation_fails_on_a_damaged_segment,
    e2e_on_demand_trigger_runs_once_per_value as test_on_demand_trigger_runs_once_per_value,
    e2e_operator_killed_across_a_slot_runs_it_exactly_once as test_operator_killed_across_a_slot_runs_it_exactly_once,
    e2e_per_resource_gauges_outlive_the_job as test_per_resource_gauges_outlive_the_job,
    e2e_restore_from_latest_backup_puts_messages_back as test_restore_from_latest_backup_puts_messages_back,
    e2e_restore_with_the_spark_engine as test_restore_with_the_spark_engine,
    e2e_retention_deletes_the_oldest_backup as test_retention_deletes_the_oldest_backup,
    e2e_running_status_is_reconciled_from_the_job_after_a_crash as test_running_status_is_reconciled_from_the_job_after_a_crash,
    e2e_scheduled_backup_status_shows_manifest_counts as test_scheduled_backup_status_shows_manifest_counts,
    e2e_spark_validation_passes_then_names_a_damaged_segment as test_spark_validation_passes_then_names_a_damaged_segment,
    e2e_suspend_skips_slots_and_resume_does_not_fire_them as test_suspend_skips_slots_and_resume_does_not_fire_them,
    e2e_two_backups_of_one_source_never_both_read_at_once as test_two_backups_of_one_source_never_both_read_at_once,
    e2e_two_operators_one_slot_one_run as test_two_operators_one_slot_one_run,
)


def test_on_demand_backup_end_to_end(cluster, env):
    env.broker.publish_n(env.vhost, "q1", 3, declare={})
    name = f"{env.tag}-manual"
    created = create_backup(cluster, env, name)
    assert created["metadata"]["uid"].count("-") == 4  # a server-made uid, not the emulator's
    trigger(cluster, name, "first")
    run = wait_run(cluster, name, phase="Succeeded", timeout=120)
    assert run["trigger"] == "manual" and run["messages"] == 3
    st = cluster.status(name)
    assert st["lastManualTrigger"] == "first" and st["phase"] == "Succeeded", st
    [backup] = [b for b in list_backups(s3(env)) if b.complete]
    assert st["lastBackupId"] == backup.backup_id
    jobs = [j for j in cluster.http.items("batch/v1", "jobs") if j["metadata"]["name"].startswith(name + "-")]
    assert len(jobs) == 1
    owner = jobs[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("RabbitMQBackup", name, created["metadata"]["uid"])
    reasons = wait_for(lambda: {e["reason"] for e in cluster.events(name)} >= {"BackupStarted", "BackupSucceeded"}
                       and {e["reason"] for e in cluster.events(name)}, 30, what="events", diag=cluster.logs)
    assert "BackupFailed" not in reasons
    # what a user sees
    out = cluster.emu.kube.kubectl("-n", cluster.http.ns, "get", "rabbitmqbackups", name, "-o", "wide").stdout
    assert "<invalid>" not in out and "Succeeded" in out and backup.backup_id in out, out


def test_failed_run_reports_the_broker_refusal(cluster, env):
    name = f"{env.tag}-bad"
    create_backup(cluster, env, name, broker=dict(env.url_broker, credentialsSecretRef={"name": f"{env.tag}-bad"}))
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Failed", timeout=120)
    assert run["phase"] == "Failed"
    assert cluster.status(name)["phase"] == "Failed"
    assert "BackupFailed" in {e["reason"] for e in wait_for(lambda: cluster.events(name), 30, what="events")}


def test_invalid_backup_never_reaches_the_operator(cluster, env):
    """The server refuses it: the operator sees nothing and creates nothing."""
    body = {"apiVersion": API, "kind": "RabbitMQBackup", "metadata": {"name": f"{env.tag}-six"},
            "spec": {"broker": env.url_broker, "storage": env.storage, "schedule": "0 0 2 * * *"}}
    with pytest.raises(AssertionError, match="6-field values with a leading seconds field are not supported"):
        cluster.http.create(API, "rabbitmqbackups", body)
    assert cluster.backup(f"{env.tag}-six") == {}


def test_api_calls_are_within_the_declared_rbac(cluster, env):
    """From the server's audit log: every call the operator process made (kopf's and ours) is in
    api_calls.USED_API_CALLS, the list the Helm chart's RBAC is checked against.
    The test makes its own run first: it must not depend on which tests ran before it."""
    cluster.needs_audit_log()
    name = f"{env.tag}-rbac"
    create_backup(cluster, env, name)
    trigger(cluster, name, "1")
    wait_run(cluster, name, phase="Succeeded")
    made = cluster.emu.api_calls()
    unexpected = made - used_api_calls()
    assert not unexpected, f"operator used calls missing from api_calls.USED_API_CALLS: {sorted(unexpected)}"
    for call in [("batch", "jobs", "create"), ("rbak.io", "rabbitmqbackups/status", "patch"),
                 ("", "configmaps", "create"), ("rbak.io", "rabbitmqbackups", "watch"), ("", "events", "create"),
                 ("", "secrets", "get")]:
        assert call in made, (call, json.dumps(sorted(made)))


def _pod_pid(marker: str) -> int:
    """The local pod process whose environment holds ``marker`` (the PodRunner runs it as a child)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "environ").read_bytes().split(b"\0"):
                    return int(d.name)
            except OSError:
                continue
    raise AssertionError(f"no process with {marker}")


def test_deletion_while_a_progress_read_is_in_flight_is_not_held_for_a_minute(cluster, env, tmp_path):
    """kopf cannot cancel a timer's sync tick: when the object is deleted mid-tick, kopf keeps the
    finalizer and re-checks the timer only on the object's next event or after
    ``settings.background.cancellation_polling`` (60 s by default). After a deletion nothing else
    writes the object (a tick whose progress did not change writes nothing), so the object stayed
    a minute: the case behind the flaky deletionPolicy-delete test under load. Here the tick is
    held deterministically: the Job's pod is stopped (its progress no longer changes) and the
    tick's storage read is held by a proxy while the object is deleted."""
    from urllib.parse import urlsplit

    from rbak.keys import progress_prefix
    from rbak.progress import latest_progress
    from rbak_operator.progress_status import fmt_epoch
    from support.holdproxy import HoldProxy
    from test_operator_progress_e2e import GATE_DIR

    env.broker.publish_n(env.vhost, "q1", 2, declare={})
    env.broker.publish_n(env.vhost, "q2", 2, declare={})
    moto = urlsplit(env.storage["s3"]["endpoint"])
    proxy = HoldProxy(moto.hostname, moto.port)
    gate = tmp_path / "gate"
    cluster.runner.extra_env = {"PYTHONPATH": str(GATE_DIR), "RBAK_TEST_PROGRESS_GATE": str(gate)}
    pid, run = None, ""
    try:
        name = f"{env.tag}-delheld"
        create_backup(cluster, env, name, deletionPolicy="delete",
                      storage={"s3": dict(env.storage["s3"], endpoint=proxy.url)})
        wait_for(lambda: "rbak.io/finalizer" in (cluster.backup(name)["metadata"].get("finalizers") or []), 30,
                 what="finalizer", diag=cluster.logs)
        trigger(cluster, name, "1")
        reached = Path(f"{gate}.backup.reached")
        wait_for(reached.exists, 60, what="the run held after its first queue", diag=cluster.logs)
        run = reached.read_text()
        pid = _pod_pid(f"RBAK_TEST_PROGRESS_GATE={gate}")
        os.kill(pid, signal.SIGSTOP)  # its progress reporter stops too: the newest record stays the newest
        st = s3(env)
        newest = lambda: latest_progress(st, None, "backup", run)  # noqa: E731
        wait_for(lambda: (rec := newest()) is not None
                 and (cluster.status(name).get("progress") or {}).get("updateTime") == fmt_epoch(rec.updated_at),
                 30, what="the newest progress record in the status", diag=cluster.logs)
        prefix = f"prefix={env.bucket.prefix}%2F{progress_prefix(None, 'backup', run).replace('/', '%2F')}"
        proxy.hold_next(prefix.encode(), 5)
        wait_for(proxy.holding.is_set, 30, what="a progress read in flight", diag=cluster.logs)
        cluster.http.delete(API, "rabbitmqbackups", name)
        start = time.monotonic()
        wait_for(lambda: cluster.http.get(API, "rabbitmqbackups", name) is None, 90, what="object gone",
                 diag=cluster.logs)
        took = time.monotonic() - start
        assert proxy.held == 1
        # the bug held it 60 s (kopf's poll); now: the 5 s read plus a 1 s poll, with a margin for load
        assert took < 40, f"the deleted object stayed {took:.0f} s: held until kopf's next poll of its timer"
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        gate.touch()
        cluster.runner.extra_env = {}
        if run:  # the pod writes through the proxy until it ends
            wait_for(lambda: run in cluster.runner.outputs, 60, what="the held run ended")
        proxy.close()
