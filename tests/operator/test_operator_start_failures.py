"""Runs that cannot start fail with the pod's reason (issue 44), on the real API server. The local kubelet
keeps such a pod waiting as a real kubelet does (a missing Secret: CreateContainerConfigError; an image
it cannot pull: ImagePullBackOff), never a terminated container; past the start bound
(``RBAK_OPERATOR_START_TIMEOUT_SECONDS``, 300 s by default, on the operator's fake clock here) the
operator marks the run Failed, the Job gets a deadline (the kubelet then plays the Job controller:
DeadlineExceeded, the pod deleted), and the next run is not blocked."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from rbak_operator.decide.times import parse_time
from rbak_operator.decide.naming import manual_run_name
from rbak_operator.decide.status import A_START_FAILED, START_TIMEOUT

from support.op_e2e import API, create_backup, trigger, wait_run
from support.opcluster import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]


def _waiting(cluster, job: str) -> dict:
    """The waiting state of the run's pod, once the kubelet reported it."""
    def probe():
        pod = cluster.http.get("v1", "pods", f"{job}-pod") or {}
        st = pod.get("status") or {}
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            if (cs.get("state") or {}).get("waiting"):
                return dict(cs["state"]["waiting"], phase=st.get("phase"), created=pod["metadata"]["creationTimestamp"])
        return None
    return wait_for(probe, 60, what=f"{job} pod waiting", diag=cluster.logs)


def _fails_past_the_bound(cluster, env, name: str, job: str) -> tuple[dict, dict]:
    w = _waiting(cluster, job)
    assert w["phase"] == "Pending"
    # before the bound: still running, nothing failed
    assert cluster.status(name).get("active") == [job] and cluster.status(name).get("phase") == "Running"
    cluster.set_clock(max(cluster.now, parse_time(w["created"]) + timedelta(seconds=START_TIMEOUT + 2)))
    run = wait_run(cluster, name, job=job, phase="Failed", timeout=60)
    return w, run


def test_missing_secret_fails_the_run_naming_it_and_the_next_run_goes(cluster, env):
    cluster.clock_at_server_time()
    env.broker.publish_n(env.vhost, "q", 2, declare={})
    name = f"{env.tag}-nosecret"
    secret = f"{env.tag}-later"
    create_backup(cluster, env, name, broker=dict(env.url_broker, credentialsSecretRef={"name": secret}))
    trigger(cluster, name, "1")
    job = manual_run_name(name, "1")
    w, run = _fails_past_the_bound(cluster, env, name, job)
    assert (w["reason"], w["message"]) == ("CreateContainerConfigError", f'secret "{secret}" not found'), w
    assert run["reason"] == "SecretMissing", run
    assert "CreateContainerConfigError" in run["message"] and f'secret "{secret}" not found' in run["message"], run
    st = wait_for(lambda: (s := cluster.status(name)).get("phase") == "Failed" and s, 30, what="Failed", diag=cluster.logs)
    assert st["active"] == [] and next(c for c in st["conditions"] if c["type"] == "Ready")["reason"] == "SecretMissing"
    j = cluster.http.get("batch/v1", "jobs", job)
    assert json.loads(j["metadata"]["annotations"][A_START_FAILED])["reason"] == "SecretMissing"
    assert j["spec"]["activeDeadlineSeconds"] >= 1
    # the Job controller's part (the kubelet plays it): the Job fails, the pod goes
    wait_for(lambda: any(c.get("reason") == "DeadlineExceeded" for c in
                         ((cluster.http.get("batch/v1", "jobs", job) or {}).get("status") or {}).get("conditions") or []),
             30, what="DeadlineExceeded")
    wait_for(lambda: cluster.http.get("v1", "pods", f"{job}-pod") is None, 30, what="pod deleted")
    ev = wait_for(lambda: [e for e in cluster.events(name) if e["reason"] == "BackupFailed"], 30, what="event")
    assert "SecretMissing" in ev[0]["message"] and secret in ev[0]["message"]
    # the Secret made: the next run is not blocked and succeeds
    cluster.http.secret(secret, {"username": env.broker.user, "password": env.broker.password})
    trigger(cluster, name, "2")
    ok = wait_run(cluster, name, job=manual_run_name(name, "2"), phase="Succeeded", timeout=120)
    assert ok["messages"] == 2
    if not cluster.external:  # the Job's mark and deadline: a call the chart's RBAC grants (api_calls.py)
        from rbak_operator.kube.api_calls import used_api_calls

        made = cluster.emu.api_calls()
        assert ("batch", "jobs", "patch") in made and not made - used_api_calls(), sorted(made - used_api_calls())


def test_an_image_that_cannot_be_pulled_fails_the_run(cluster, env):
    cluster.clock_at_server_time()
    name = f"{env.tag}-noimage"
    create_backup(cluster, env, name, image="registry.invalid/rbak:nope")
    trigger(cluster, name, "1")
    job = manual_run_name(name, "1")
    w, run = _fails_past_the_bound(cluster, env, name, job)
    assert (w["reason"], w["message"]) == ("ImagePullBackOff", 'Back-off pulling image "registry.invalid/rbak:nope"'), w
    assert run["reason"] == "ImagePull" and "registry.invalid/rbak:nope" in run["message"], run
    # the failure metric's label says so too
    from rbak_operator.metrics import resources as rm

    got = {(m, lab.get("reason")): v for m, lab, v in rm.samples("backup", cluster.backup(name))}
    assert got[("rbak_backup_last_run_failed", "ImagePull")] == 1.0


def test_a_restore_whose_pod_cannot_start_fails(cluster, env):
    cluster.clock_at_server_time()
    env.broker.publish_n(env.vhost, "r", 1, declare={})
    name = f"{env.tag}-src"
    create_backup(cluster, env, name)
    trigger(cluster, name, "1")
    bid = wait_run(cluster, name, phase="Succeeded", timeout=120)["backupId"]
    rname = f"{env.tag}-rs"
    target = dict(env.url_broker, credentialsSecretRef={"name": f"{env.tag}-nope"})
    cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore", "metadata": {"name": rname},
                                                  "spec": {"backupRef": {"name": name, "backupId": bid}, "target": target}})
    job = wait_for(lambda: ((cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {}).get("jobName"),
                   60, what="restore job")
    w = _waiting(cluster, job)
    assert w["reason"] == "CreateContainerConfigError"
    cluster.set_clock(max(cluster.now, parse_time(w["created"]) + timedelta(seconds=START_TIMEOUT + 2)))
    st = wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {})
                  .get("phase") == "Failed" and s, 60, what="restore failed", diag=cluster.logs)
    assert st["reason"] == "SecretMissing" and f"{env.tag}-nope" in st["message"], st


def test_errors_name_the_spec_fields_and_the_reason_is_specific(cluster, env):
    """A vhost that does not exist and a restore into a queue that holds messages: the reason says which
    (VhostMissing, TargetNotEmpty: also the metric's label), the message names the spec's fields, never the
    run's config keys (source.queues.vhosts, restore.allow_non_empty: no RabbitMQRestore field)."""
    from rbak_operator.metrics import resources as rm

    name = f"{env.tag}-novhost"
    create_backup(cluster, env, name, queues={"vhosts": [f"{env.vhost}-missing"]})
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Failed", timeout=120)
    assert run["reason"] == "VhostMissing", run
    assert "spec.queues.vhosts" in run["message"] and "source." not in run["message"], run
    got = {(m, lab.get("reason")): v for m, lab, v in rm.samples("backup", cluster.backup(name))}
    assert got[("rbak_backup_last_run_failed", "VhostMissing")] == 1.0

    env.broker.publish_n(env.vhost, "full", 3, declare={})
    src = f"{env.tag}-full"
    create_backup(cluster, env, src)
    trigger(cluster, src, "1")
    bid = wait_run(cluster, src, phase="Succeeded", timeout=120)["backupId"]
    rname = f"{env.tag}-into-full"  # the queue still holds its 3 messages
    cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore", "metadata": {"name": rname},
                                                  "spec": {"backupRef": {"name": src, "backupId": bid}}})
    st = wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {})
                  .get("phase") in ("Succeeded", "Failed") and s, 120, what="restore", diag=cluster.logs)
    assert (st["phase"], st["reason"]) == ("Failed", "TargetNotEmpty"), st
    assert "allow_non_empty" not in st["message"] and "spec.vhostMapping" in st["message"], st
    assert env.broker.message_count(env.vhost, "full") == 3  # nothing added
