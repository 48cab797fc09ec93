"""A RabbitMQBackup's backups are its own (issue 44), on the real API server with the local kubelet:
two objects of one name in two namespaces, on two clusters, sharing one storage prefix."""

from __future__ import annotations

import uuid

import pytest

from rbak.repo.catalog import list_backups, load_manifest
from rbak.format.segment import decode_segment

from support.op_e2e import API, backup_id, create_backup, s3, trigger, wait_run
from support.opcluster import KubeHttp, PodRunner, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]


def _bodies(env, bid: str) -> dict[tuple[str, str], list[bytes]]:
    """Every queue's message bodies in backup ``bid`` (read back from the segments)."""
    root = s3(env)
    m = load_manifest(root, bid)
    return {(q.vhost, q.name): [r.body for seg in q.segments for r in decode_segment(root.get(seg.key), seg.key).records]
            for q in m.queues}


@pytest.fixture
def twin_ns(cluster, e2e_kube, env, rmq40, vhost_factory):
    """A second namespace with its own kubelet, its Secrets and a vhost on the 4.0 broker."""
    if cluster.external:
        pytest.skip("creates a namespace of its own")
    ns = f"twin-{uuid.uuid4().hex[:8]}"
    e2e_kube.kubectl("create", "namespace", ns)
    http = KubeHttp(e2e_kube, ns)
    http.secret(f"{env.tag}-s3", {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    http.secret(f"{env.tag}-rmq", {"username": rmq40.user, "password": rmq40.password})
    runner = PodRunner(http).start()
    vhost = vhost_factory(rmq40)
    box = type("Twin", (), {"ns": ns, "http": http, "runner": runner, "vhost": vhost, "broker": rmq40})()
    try:
        yield box
    finally:
        for o in http.items(API, "rabbitmqrestores") + http.items(API, "rabbitmqbackups"):
            plural = "rabbitmqrestores" if o["kind"] == "RabbitMQRestore" else "rabbitmqbackups"
            http.patch(API, plural, o["metadata"]["name"], {"metadata": {"finalizers": None}})
            http.delete(API, plural, o["metadata"]["name"])
        runner.stop()


def _status(http, name: str) -> dict:
    return (http.get(API, "rabbitmqbackups", name) or {}).get("status") or {}


def _wait(http, name: str, value: str) -> dict:
    """The finished run of trigger ``value`` of ``name`` in ``http``'s namespace."""
    from rbak_operator.decide.naming import manual_run_name

    job = manual_run_name(name, value)
    return wait_for(lambda: (lr := _status(http, name).get("lastRun") or {}).get("jobName") == job
                    and lr.get("phase") in ("Succeeded", "Failed") and lr, 120, what=f"{http.ns}/{job}")


def test_same_named_objects_in_two_namespaces_keep_their_own_backups(cluster, env, twin_ns):
    t = twin_ns
    mine = [f"a-{i}".encode() for i in range(5)]
    theirs = [f"b-{i}".encode() for i in range(4)]
    env.broker.publish(env.vhost, "q", mine, declare={})
    t.broker.publish(t.vhost, "q", theirs, declare={})
    name = f"{env.tag}-twin"
    create_backup(cluster, env, name, deletionPolicy="delete")
    other = {"amqpUrl": f"amqp://{t.broker.host}:{t.broker.amqp_port}/%2f", "managementUrl": t.broker.management_url,
             "credentialsSecretRef": {"name": f"{env.tag}-rmq"}}
    t.http.create(API, "rabbitmqbackups", {"apiVersion": API, "kind": "RabbitMQBackup", "metadata": {"name": name},
                                           "spec": {"broker": other, "storage": env.storage,
                                                    "queues": {"vhosts": [t.vhost]}, "validate": {"enabled": False}}})
    wait_for(lambda: "rbak.io/finalizer" in (cluster.backup(name)["metadata"].get("finalizers") or []), 30,
             what="finalizer", diag=cluster.logs)

    # at once, with one trigger value: two Jobs of one name, two backups
    trigger(cluster, name, "1")
    t.http.patch(API, "rabbitmqbackups", name, {"metadata": {"annotations": {"rbak.io/backup-now": "1"}}})
    a1, b1 = wait_run(cluster, name, phase="Succeeded", timeout=120), _wait(t.http, name, "1")
    assert b1["phase"] == "Succeeded" and a1["jobName"] == b1["jobName"], (a1, b1, cluster.logs())
    assert a1["backupId"] == backup_id(cluster, name, a1["jobName"]) != b1["backupId"]
    assert (a1["messages"], b1["messages"]) == (5, 4)
    assert _bodies(env, a1["backupId"]) == {(env.vhost, "q"): mine}
    assert _bodies(env, b1["backupId"]) == {(t.vhost, "q"): theirs}
    for run, ns, vhost in ((a1, cluster.http.ns, env.vhost), (b1, t.ns, t.vhost)):
        origin = load_manifest(s3(env), run["backupId"]).origin
        meta = (cluster.http if ns == cluster.http.ns else t.http).get(API, "rabbitmqbackups", name)["metadata"]
        assert (origin.owner.namespace, origin.owner.name, origin.owner.uid) == (ns, name, meta["uid"])
        assert origin.vhosts == (vhost,)

    # one after the other: the other namespace's run first, this one's last (the newest in the prefix)
    t.http.patch(API, "rabbitmqbackups", name, {"metadata": {"annotations": {"rbak.io/backup-now": "2"}}})
    b2 = _wait(t.http, name, "2")
    trigger(cluster, name, "2")
    a2 = wait_for(lambda: (r := cluster.status(name).get("lastRun") or {}).get("backupId") not in (None, a1["backupId"])
                  and r.get("phase") == "Succeeded" and r, 120, what="second run", diag=cluster.logs)
    assert b2["phase"] == "Succeeded" and _bodies(env, b2["backupId"]) == {(t.vhost, "q"): theirs}
    assert _bodies(env, a2["backupId"]) == {(env.vhost, "q"): mine}
    newest = max((e for e in list_backups(s3(env)) if e.complete), key=lambda e: e.completed_at)
    assert newest.backup_id == a2["backupId"]

    # backupRef without backupId in the other namespace: the newest backup OF THAT OBJECT, its cluster's messages
    t.broker.drain_queue(t.vhost, "q")
    t.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore",
                                            "metadata": {"name": f"{env.tag}-back"},
                                            "spec": {"backupRef": {"name": name}}})
    st = wait_for(lambda: (s := (t.http.get(API, "rabbitmqrestores", f"{env.tag}-back") or {}).get("status") or {})
                  .get("phase") in ("Succeeded", "Failed") and s, 120, what="restore", diag=cluster.logs)
    assert st["phase"] == "Succeeded" and st["backupId"] == b2["backupId"], (st, cluster.logs())
    assert t.broker.read_bodies(t.vhost, "q") == theirs
    assert env.broker.read_bodies(env.vhost, "q") == mine  # the other cluster untouched

    # deletionPolicy delete in this namespace: only this object's backups go
    cluster.http.delete(API, "rabbitmqbackups", name)
    wait_for(lambda: cluster.http.get(API, "rabbitmqbackups", name) is None, 60, what="object gone", diag=cluster.logs)
    left = {e.backup_id for e in list_backups(s3(env))}
    assert left == {b1["backupId"], b2["backupId"]}
