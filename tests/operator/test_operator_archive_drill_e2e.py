"""A RabbitMQArchive's restore drill and deletion end to end: the real operator on the real API server, the local kubelet
running the archiver's Deployment and the drill's Job (``rbak drill --archive``), RabbitMQ 3.10.8 and moto S3.

The drill restores the archive's state of a few seconds ago into a scratch vhost and compares it with the
live stream; status.restoreDrill shows the recovery point achieved beside rpoSeconds, the RTO and the signed
evidence, which ``rbak drill verify`` accepts (and refuses once tampered with). With the archiver stopped and
the live stream replaced by other records, the next drill fails naming the stream and the offset. With
deletionPolicy delete, the generations are deleted only once the archiver's pod is gone."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from urllib.parse import quote, urlsplit

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.backups import fast_publish
from support.holdproxy import HoldProxy
from support.kplugin import console_script, plugin_env
from support.op_e2e import API, Cluster, bucket_root
from support.opcluster import wait_for
from test_operator_archive_e2e import _cond, _operator_calls, _status, cluster  # noqa: F401 (cluster: the fixture)

from rbak.repo.evidence import fingerprint
from rbak_operator.kube.api_calls import used_api_calls
from rbak_operator.reconcile.archive import newest_tick

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

LOOKBACK = 3


def _drill_of(cluster: Cluster, name: str, trigger: str):
    """A waiter: status.restoreDrill once the drill the trigger started is recorded."""
    def probe():
        d = _status(cluster, name).get("restoreDrill") or {}
        return d if d.get("lastManualTrigger") == trigger and d.get("lastJob") in (d.get("recordedJobs") or []) \
            and not d.get("active") and d.get("result") else None
    return probe


def _verify(path: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", "drill", "verify", path, *extra], capture_output=True,
                          text=True, timeout=120)


def test_an_archive_drill_measures_the_recovery_point_and_finds_a_mismatch(cluster, env, rmq310, tmp_path):
    broker, vhost = rmq310, env.vhost
    broker.declare_queue(vhost, "events.a", arguments={"x-queue-type": "stream"})
    fast_publish(broker, vhost, "events.a", [b"a-%d" % i for i in range(100)])
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    pub = tmp_path / "pub.pem"
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    cluster.http.secret(f"{env.tag}-sign", {"signing.pem": pem})
    name = f"{env.tag}-drl"
    deployment = f"rbak-archive-{name}"
    spec = {"broker": {"amqpUrl": f"amqp://{broker.host}:{broker.amqp_port}/{quote(vhost, safe='')}",
                       "managementUrl": broker.management_url, "credentialsSecretRef": {"name": f"{env.tag}-rmq"}},
            "queues": {"vhosts": [vhost]}, "storage": env.storage, "rpoSeconds": 10, "maxDelaySeconds": 1,
            "verify": {"restoreDrill": {"schedule": "0 0 1 1 *", "lookbackSeconds": LOOKBACK,
                                        "signingKeySecretRef": {"name": f"{env.tag}-sign"}}}}
    cluster.http.create(API, "rabbitmqarchives", {"apiVersion": API, "kind": "RabbitMQArchive",
                                                  "metadata": {"name": name}, "spec": spec})
    diag = lambda: f"{_status(cluster, name)}\n{cluster.runner.deployment_output(deployment)[-3000:]}\n{cluster.logs()}"  # noqa: E731
    try:
        wait_for(lambda: (s := _status(cluster, name)) and _cond(s, "RPOMet") == "True"
                 and (s.get("streams") or [{}])[0].get("archivedOffset") == 99, timeout=120,
                 what="the 100 records archived", diag=diag)
        # every record is archived (stamped) before `seen`; once the recoverable-until passes seen + lookback
        # (an idle archive's moves with its idle ticks), the drill's point (now - lookback) is after them all
        # (the status writes an idle archive's recoverable-until rarely: read the newest tick)
        seen = int((time.time() + LOOKBACK + 1) * 1000)
        wait_for(lambda: (newest_tick(bucket_root(env), env.bucket.prefix, name).recoverable_until or 0) > seen,
                 timeout=120, what="the recoverable-until past the look-back", diag=diag)
        # kubectl rbak drill --archive: requested the way a user asks the operator, followed to its result
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        console_script(bin_dir)
        r = subprocess.run(["kubectl-rbak", "drill", "--archive", name, "-n", cluster.http.ns],
                           env=plugin_env(cluster.emu.kube, bin_dir), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (r.stdout, r.stderr, diag())
        out = r.stdout.splitlines()
        m = re.fullmatch(rf"rabbitmqarchive/{name}: restore drill requested \(rbak\.io/drill-now=(\S+)\)", out[0])
        assert m, out
        d = wait_for(_drill_of(cluster, name, m.group(1)), timeout=30, what="the drill recorded", diag=diag)
        run = d["lastJob"]
        assert out[1] == f"job/{run}" and all(line == f"job/{run}: running (archive {name})" for line in out[2:-1])
        assert out[-1] == (f"job/{run}: Passed: {d['message']} (generation {d['backupId']}, recovery point achieved "
                           f"{d['recoveryPointSeconds']}s, RTO {d['restoreSeconds']}s, scratch vhost "
                           f"{d['scratchVhost']}, signed by {d['signer']})"), out
        assert d["result"] == "Passed", d
        assert d["reason"] == "DrillPassed" and d["streams"] == 1 and d["messages"] == 100 and d["failedStreams"] == []
        assert d["message"].startswith(f"1 stream(s) restored up to {d['restorePoint']} into a scratch vhost")
        # the recovery point achieved, beside the objective (rpoSeconds 10), and the RTO
        assert isinstance(d["recoveryPointSeconds"], (int, float)) and 0 <= d["recoveryPointSeconds"] <= 10, d
        assert d["restoreSeconds"] > 0 and d["backupId"].startswith(f"{name}.")
        assert d["signer"] == fingerprint(key.public_key())
        assert d["evidenceKey"].startswith(f"{env.bucket.prefix}/{d['backupId']}/drills/")
        assert d["evidenceKey"].endswith(f"-{d['lastJob']}.json")

        report = bucket_root(env).get(d["evidenceKey"])
        stored = tmp_path / "report.json"
        stored.write_bytes(report)
        r = json.loads(report)
        a = r["archive"]
        assert a["recovery_point_secs"] == d["recoveryPointSeconds"] and a["restore_secs"] == d["restoreSeconds"]
        assert (a["streams"][0]["first_offset"], a["streams"][0]["last_offset"], a["streams"][0]["live_count"]) == (
            0, 99, 100)
        v = _verify(str(stored), "--public-key", str(pub))
        assert v.returncode == 0, v.stderr
        assert f"recovery point achieved {a['recovery_point_secs']} s" in v.stdout
        r["archive"]["streams"][0]["live_count"] = 101
        (tmp_path / "tampered.json").write_text(json.dumps(r))
        t = _verify(str(tmp_path / "tampered.json"), "--public-key", str(pub))
        assert t.returncode != 0 and "field archive.streams[0].live_count was changed after signing" in t.stderr

        # the archiver stopped, the live stream replaced by other records: the next drill fails at offset 0
        cluster.http.patch(API, "rabbitmqarchives", name, {"spec": {"suspend": True}})
        wait_for(lambda: deployment not in cluster.runner.deployment_pods, timeout=60, what="the pod stopped",
                 diag=diag)
        broker.delete_queue(vhost, "events.a")
        broker.declare_queue(vhost, "events.a", arguments={"x-queue-type": "stream"})
        fast_publish(broker, vhost, "events.a", [b"other-%d" % i for i in range(100)])
        cluster.http.patch(API, "rabbitmqarchives", name, {"metadata": {"annotations": {"rbak.io/drill-now": "2"}}})
        d = wait_for(_drill_of(cluster, name, "2"), timeout=180, what="the second drill recorded", diag=diag)
        assert d["result"] == "Failed" and d["reason"] == "DrillFailed", d
        assert d["failedStreams"] == [f"{vhost}/events.a"]
        assert d["message"] == (f"archive {name!r}: stream 'events.a' in vhost {vhost!r}: record at offset 0 "
                                "restored with another hash than the live stream's")
        if not cluster.external:
            made = _operator_calls(cluster)
            assert not made - used_api_calls(), sorted(made - used_api_calls())
            assert ("batch", "jobs", "create") in made
    finally:
        cluster.http.delete(API, "rabbitmqarchives", name)
        cluster.http.delete("apps/v1", "deployments", deployment)
        wait_for(lambda: deployment not in cluster.runner.deployment_pods, timeout=60, what="the pod stopped")


def test_deletion_waits_for_the_archiver_pod_before_deleting_the_archive(cluster, env, rmq310):
    """deletionPolicy delete: the archiver's SIGTERM flush (its generation's manifest, held 10 s by the storage)
    lands before the operator deletes the generations, so nothing of the archive is left behind."""
    broker, vhost = rmq310, env.vhost
    broker.declare_queue(vhost, "events.d", arguments={"x-queue-type": "stream"})
    fast_publish(broker, vhost, "events.d", [b"d-%d" % i for i in range(20)])
    ep = urlsplit(env.bucket.endpoint)
    proxy = HoldProxy(ep.hostname or "127.0.0.1", ep.port or 80)
    name = f"{env.tag}-del"
    deployment = f"rbak-archive-{name}"
    spec = {"broker": {"amqpUrl": f"amqp://{broker.host}:{broker.amqp_port}/{quote(vhost, safe='')}",
                       "managementUrl": broker.management_url, "credentialsSecretRef": {"name": f"{env.tag}-rmq"}},
            "queues": {"vhosts": [vhost]}, "storage": {"s3": {**env.storage["s3"], "endpoint": proxy.url}},
            "rpoSeconds": 10, "maxDelaySeconds": 1, "deletionPolicy": "delete"}
    cluster.http.create(API, "rabbitmqarchives", {"apiVersion": API, "kind": "RabbitMQArchive",
                                                  "metadata": {"name": name}, "spec": spec})
    diag = lambda: f"{_status(cluster, name)}\n{cluster.runner.deployment_output(deployment)[-3000:]}\n{cluster.logs()}"  # noqa: E731
    root = bucket_root(env)

    def stored() -> list[str]:
        return [k for k in root.list(f"{env.bucket.prefix}/") if k.startswith(f"{env.bucket.prefix}/{name}.")]

    try:
        wait_for(lambda: (_status(cluster, name).get("streams") or [{}])[0].get("archivedOffset") == 19,
                 timeout=120, what="the records archived", diag=diag)
        assert stored()
        gen = _status(cluster, name)["generation"]
        # the archiver's last write on SIGTERM: its generation's manifest (a PUT: the operator's reads pass)
        proxy.hold_next(f"PUT /{env.bucket.bucket}/{env.bucket.prefix}/{gen}/manifest.json".encode(), 10)
        cluster.http.delete(API, "rabbitmqarchives", name)
        wait_for(lambda: proxy.holding.is_set(), timeout=60, what="the archiver's manifest upload held", diag=diag)
        time.sleep(3)
        assert stored(), "the generations were deleted while the archiver was still writing"
        wait_for(lambda: cluster.http.get(API, "rabbitmqarchives", name) is None, timeout=120,
                 what="the archive object gone", diag=diag)
        assert proxy.held == 1 and deployment not in cluster.runner.deployment_pods
        time.sleep(2)
        assert stored() == [], "left behind after the deletion"
    finally:
        cluster.http.delete(API, "rabbitmqarchives", name)
        cluster.http.delete("apps/v1", "deployments", deployment)
        wait_for(lambda: deployment not in cluster.runner.deployment_pods, timeout=60, what="the pod stopped")
        proxy.close()
