"""RabbitMQArchive end to end: the real operator on the real API server, the local kubelet running the
archiver's Deployment as a long-running process, a real broker's stream (3.10.8) and moto S3 behind a
proxy that can hold one upload (the storage unreachable for a while).

One archive lives through the phases a user meets, so the archiver starts once: the status shows RPOMet
and a recoverableUntil that advances; the archiver's pod is SIGKILLed mid-publish and replaced; the
storage holds a segment upload, RPOMet turns false and the chart's RbakArchiveRPOBreached expression fires
on the operator's live metrics (and the archiver pod's own lag metric is over the objective), then all
recover; a restore of the archive holds
every message published, once, in order."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from urllib.parse import quote, urlsplit

import pytest
from support.backups import fast_publish
from support.brokers import unique_name
from support.holdproxy import HoldProxy
from support.kplugin import console_script, plugin_env
from rbak_operator.kube.api_calls import used_api_calls
from rbak_operator.reconcile.archive import newest_tick
from support.op_e2e import API, Cluster, bucket_root
from support.opcluster import wait_for
from support.promql_eval import evaluate, scrape
from support.s3 import free_port
from support.ship import prometheus_rules

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_s3, e2e_kube):
    """This module's operator polls the archive's storage every second and writes moved offsets at once."""
    port = free_port()  # the operator's /metrics: the chart's alert expressions are evaluated on it
    c = Cluster(tmp_path_factory.mktemp("cluster"), kube=e2e_kube, operator_env={
        "RBAK_OPERATOR_ARCHIVE_POLL_SECONDS": "1", "RBAK_OPERATOR_ARCHIVE_PROGRESS_SECONDS": "0",
        "RBAK_ARCHIVE_METRICS_PORT": "0", "RBAK_METRICS_PORT": str(port), "RBAK_METRICS_BIND": "127.0.0.1"})
    c.metrics_port = port
    try:
        yield c
    finally:
        c.close()


def _status(cluster: Cluster, name: str) -> dict:
    return (cluster.http.get(API, "rabbitmqarchives", name) or {}).get("status") or {}


def _where(cluster: Cluster, name: str, pred):
    """A waiter: the status once ``pred(status)`` holds, else None."""
    def probe():
        s = _status(cluster, name)
        return s if pred(s) else None
    return probe


def _cond(status: dict, ctype: str) -> str | None:
    return next((c["status"] for c in status.get("conditions") or [] if c["type"] == ctype), None)


def _stream(status: dict) -> dict:
    return (status.get("streams") or [{}])[0]


def _operator_calls(cluster: Cluster) -> set[tuple[str, str, str]]:
    """(group, resource, verb) the operator process made: the server's audit log without the test's, the
    local kubelet's, kubectl's and kubectl rbak's requests, and those of other test modules sharing the server
    (before this cluster started, or a test helper's ``urllib``)."""
    out = set()
    for ev in cluster.emu.kube.audit_events():
        agent, ref = ev.get("userAgent", ""), ev.get("objectRef") or {}
        if agent.startswith(("python-requests", "kubectl/", "kubectl-rbak", "Python-urllib")) or not ref.get("resource") \
                or ev["requestReceivedTimestamp"] < cluster.emu.since \
                or (ev.get("user") or {}).get("username") == "system:apiserver":
            continue
        out.add((ref.get("apiGroup", ""), ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else ""),
                 ev["verb"]))
    return out


def _rpo_alert(cluster: Cluster, name: str) -> list:
    """The samples RbakArchiveRPOBreached's expression returns for this archive now (its ``for:`` aside)."""
    rule = next(r for r in prometheus_rules() if r["alert"] == "RbakArchiveRPOBreached")
    samples = evaluate(rule["expr"], scrape(f"http://127.0.0.1:{cluster.metrics_port}/metrics"))
    return [(lab, v) for lab, v in samples if lab.get("archive") == name and lab.get("rbak_namespace") == cluster.http.ns]


def _pod_lag(cluster: Cluster, deployment: str) -> float:
    """The archiver pod's largest ``rbak_archive_lag_seconds`` (its --metrics-port: 0 here, so any free port,
    which its log names)."""
    ports = re.findall(r"metrics on http://[^:]+:(\d+)/metrics", cluster.runner.deployment_output(deployment))
    assert ports, "the archiver's log names no metrics port"
    lags = [v for _, v in scrape(f"http://127.0.0.1:{ports[-1]}/metrics").get("rbak_archive_lag_seconds", [])]
    return max(lags) if lags else 0.0


def _restore(broker, env, generation: str, src: str, dst: str, tmp_path) -> dict:
    cfg = tmp_path / "restore.json"
    cfg.write_text(json.dumps({
        "mode": "restore", "backup_id": generation,
        "target": {"amqp_url": broker.amqp_url(dst), "management_url": broker.management_url},
        "storage": {"backend": "s3", "bucket": env.bucket.bucket, "prefix": env.bucket.prefix,
                    "endpoint": env.bucket.endpoint, "path_style": True, "region": "us-east-1"},
        "restore": {"vhost_mapping": {src: dst}}}))
    r = subprocess.run([sys.executable, "-m", "rbak", "restore", "--config", str(cfg), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    return json.loads(r.stdout)


def _create_archive(cluster: Cluster, env, broker, name: str, storage: dict | None = None):
    """A RabbitMQArchive of ``env.vhost`` (objective 5 s, ticks every second); its Deployment's name and a
    diagnostic (status, the archiver's log, the operator's) for the waits."""
    spec = {"broker": {"amqpUrl": f"amqp://{broker.host}:{broker.amqp_port}/{quote(env.vhost, safe='')}",
                       "managementUrl": broker.management_url, "credentialsSecretRef": {"name": f"{env.tag}-rmq"}},
            "queues": {"vhosts": [env.vhost]}, "storage": storage or env.storage, "rpoSeconds": 5, "maxDelaySeconds": 1}
    cluster.http.create(API, "rabbitmqarchives", {"apiVersion": API, "kind": "RabbitMQArchive",
                                                  "metadata": {"name": name}, "spec": spec})
    deployment = f"rbak-archive-{name}"
    return deployment, lambda: (f"{_status(cluster, name)}\n{cluster.runner.deployment_output(deployment)[-3000:]}"
                                f"\n{cluster.logs()}")


def test_archive_status_pod_killed_storage_held_and_exact_restore(cluster, env, rmq310, tmp_path):
    broker, vhost = rmq310, env.vhost
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    console_script(bin_dir)
    penv = plugin_env(cluster.emu.kube, bin_dir)

    def plugin(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl-rbak", *args, "-n", cluster.http.ns], env=penv, capture_output=True,
                              text=True, timeout=300, check=False)

    broker.declare_queue(vhost, "events.a", arguments={"x-queue-type": "stream"})
    sent: list[bytes] = []

    def publish(n: int) -> None:
        batch = [b"a-%d" % (len(sent) + i) for i in range(n)]
        fast_publish(broker, vhost, "events.a", batch)
        sent.extend(batch)

    ep = urlsplit(env.bucket.endpoint)
    proxy = HoldProxy(ep.hostname or "127.0.0.1", ep.port or 80)
    name = f"{env.tag}-arc"
    storage = {"s3": {**env.storage["s3"], "endpoint": proxy.url}}
    publish(200)
    deployment, diag = _create_archive(cluster, env, broker, name, storage)
    try:
        dep = wait_for(lambda: cluster.http.get("apps/v1", "deployments", deployment), timeout=60,
                       what="the archiver's Deployment", diag=diag)
        assert dep["spec"]["replicas"] == 1
        assert dep["spec"]["template"]["spec"]["containers"][0]["args"][:3] == [
            "archive", "--config", "/etc/rbak/config.yaml"]

        # 1. the status shows the objective met and a recoverable-until that advances
        st = wait_for(_where(cluster, name, lambda s: _cond(s, "RPOMet") == "True"
                                 and _stream(s).get("archivedOffset") == 199),
                      timeout=120, what="RPOMet with the first 200 archived", diag=diag)
        assert st["phase"] == "Archiving" and _cond(st, "Ready") == "True" and _cond(st, "Degraded") == "False"
        assert st["streamCount"] == 1 and st["gapMessages"] == 0 and st["lagSeconds"] <= 5
        assert _stream(st)["name"] == "events.a" and _stream(st)["vhost"] == vhost
        first_ru = st["recoverableUntil"]
        time.sleep(1.1)  # recoverableUntil has whole seconds
        publish(100)
        st = wait_for(_where(cluster, name, lambda s: _stream(s).get("archivedOffset") == 299
                                 and s.get("recoverableUntil", "") > first_ru),
                      timeout=120, what="recoverableUntil to advance", diag=diag)
        time.sleep(1)  # an instant after every record so far was read, before any later one
        point = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        before_point = list(sent)
        time.sleep(1)

        # 2. the archiver's pod killed mid-publish: a replacement resumes
        publish(100)
        killed = cluster.runner.kill_deployment_pod(deployment)
        publish(100)
        wait_for(lambda: cluster.runner.pod_starts[-1] != killed, timeout=60, what="a replacement pod", diag=diag)
        publish(100)
        wait_for(lambda: _stream(_status(cluster, name)).get("archivedOffset") == len(sent) - 1
                 and _cond(_status(cluster, name), "RPOMet") == "True",
                 timeout=120, what="the replacement to catch up", diag=diag)

        # 3. the storage holds the next segment upload for 40 s: the objective is missed, then met again
        proxy.hold_next(b"segment-", 40)
        publish(50)
        st = wait_for(_where(cluster, name, lambda s: _cond(s, "RPOMet") == "False"),
                      timeout=60, what="RPOMet false while the storage holds the upload", diag=diag)
        assert st["phase"] == "Lagging" and st["lagSeconds"] > 5
        assert proxy.held == 1
        # the chart's RbakArchiveRPOBreached expression, on the operator's live metrics, fires for this archive
        firing = _rpo_alert(cluster, name)
        assert firing and firing[0][1] > 5, firing
        # and the archiver's own metrics (its --metrics-port) say the same: its lag is over the objective
        wait_for(lambda: _pod_lag(cluster, deployment) > 5, timeout=30, what="the pod's lag over the objective",
                 diag=diag)
        st = wait_for(_where(cluster, name, lambda s: _cond(s, "RPOMet") == "True"
                                 and _stream(s).get("archivedOffset") == len(sent) - 1),
                      timeout=120, what="RPOMet true again after the storage answered", diag=diag)
        wait_for(lambda: _rpo_alert(cluster, name) == [], timeout=30, what="the alert expression to stop firing",
                 diag=diag)
        wait_for(lambda: _pod_lag(cluster, deployment) <= 5, timeout=30, what="the pod's lag within the objective",
                 diag=diag)
        assert _cond(st, "Degraded") == "False" and st["gapMessages"] == 0

        # a restore of the newest generation (the chain walks back through the killed pod's) holds all
        fresh, at_point = unique_name("test-op-fresh"), unique_name("test-op-pit")
        for v in (fresh, at_point):
            broker.create_vhost(v)
            broker.declare_queue(v, "events.a", arguments={"x-queue-type": "stream"})
        try:
            out = _restore(broker, env, st["generation"], vhost, fresh, tmp_path)
            assert out["ok"], out
            assert [m.body for m in broker.read_stream(fresh, "events.a", "first")] == sent
            # kubectl rbak restore --archive: a RabbitMQRestore of every stream up to the instant, nothing after
            rname = f"{env.tag}-pit"
            r = plugin("restore", "--archive", name, "--pitr", point, "--to-vhost", f"{vhost}={at_point}",
                       "--name", rname)
            assert r.returncode == 0, (r.stdout, r.stderr, diag())
            assert r.stdout.splitlines()[0] == f"rabbitmqrestore/{rname} created (rabbitmqarchive/{name} up to {point})"
            assert r.stdout.splitlines()[-1].startswith(f"rabbitmqrestore/{rname}: Succeeded: backup {name}.")
            obj = cluster.http.get(API, "rabbitmqrestores", rname)
            assert obj["spec"] == {"archiveRef": {"name": name, "pointInTime": point},
                                   "vhostMapping": {vhost: at_point}, **{k: v for k, v in obj["spec"].items()
                                                                         if k not in ("archiveRef", "vhostMapping")}}
            rst = obj["status"]
            assert rst["phase"] == "Succeeded", rst
            assert rst["pointInTime"] == point and rst["backupId"].startswith(name + ".")
            assert [m.body for m in broker.read_stream(at_point, "events.a", "first")] == before_point
            # kubectl rbak status and describe show the archive
            r = plugin("status", name)
            assert r.returncode == 0, r.stderr
            row = next(line.split() for line in r.stdout.splitlines() if line.startswith(name + " "))
            now_st = _status(cluster, name)
            assert row == [name, "Archiving", "5s", f"{now_st['lagSeconds']}s", now_st["recoverableUntil"], "1", "0"]
            r = plugin("describe", "--archive", name)
            assert r.returncode == 0, r.stderr
            out = r.stdout.splitlines()
            assert out[0].startswith(f"Archive:     rabbitmqarchive/{name}: Archiving, lag ") and "RPOMet True" in out[0]
            assert f"Stream:      {vhost}/events.a: archived to offset {len(sent) - 1}," in r.stdout
            assert any(line.startswith(f"Archive:     {name} (open, ") and "recoverable until 20" in line for line in out)
            # every call the operator made is in its declared RBAC (the new verbs: Deployments, ConfigMap updates)
            if not cluster.external:  # an existing cluster's audit log is not ours to read
                made = _operator_calls(cluster)
                assert not made - used_api_calls(), sorted(made - used_api_calls())
                assert {("apps", "deployments", "create"), ("rbak.io", "rabbitmqarchives/status", "patch")} <= made
        finally:
            broker.delete_vhost(fresh)
            broker.delete_vhost(at_point)
    finally:
        cluster.http.delete(API, "rabbitmqarchives", name)
        cluster.http.delete("apps/v1", "deployments", deployment)  # no garbage collector on this server
        wait_for(lambda: deployment not in cluster.runner.deployment_pods, timeout=60, what="the pod stopped")
        proxy.close()


def test_suspend_scales_to_zero_and_a_gap_retention_made_is_degraded(cluster, env, rmq310):
    """Suspended, the archiver's pod stops; the stream's retention removes what it had not read; resumed,
    the archive records the gap and the status says Degraded, naming the stream and the exact offsets."""
    broker, vhost = rmq310, env.vhost
    broker.declare_queue(vhost, "r", arguments={"x-queue-type": "stream", "x-max-length-bytes": 30_000,
                                                 "x-stream-max-segment-size-bytes": 5_000})
    body = b"x" * 900
    fast_publish(broker, vhost, "r", [body + b"%04d" % i for i in range(10)])
    name = f"{env.tag}-ret"
    deployment, diag = _create_archive(cluster, env, broker, name)
    try:
        wait_for(_where(cluster, name, lambda s: (_stream(s).get("archivedOffset") or -1) >= 9 and _cond(s, "RPOMet") == "True"),
                 timeout=120, what="the first records archived", diag=diag)
        cluster.http.patch(API, "rabbitmqarchives", name, {"spec": {"suspend": True}})
        wait_for(lambda: cluster.http.get("apps/v1", "deployments", deployment)["spec"]["replicas"] == 0
                 and deployment not in cluster.runner.deployment_pods, timeout=60, what="the pod stopped", diag=diag)
        # what the stopped archiver's last tick names (its SIGTERM flush included): the status follows it
        tick = newest_tick(bucket_root(env), env.bucket.prefix, name)
        archived_last = tick.streams[0].info.last_offset
        assert archived_last is not None and archived_last >= 9
        wait_for(_where(cluster, name, lambda s: s.get("phase") == "Suspended"
                        and _stream(s).get("archivedOffset") == archived_last), timeout=60, what="Suspended", diag=diag)
        for i in range(10, 300, 10):  # nobody reads: segments roll over and retention drops the oldest
            fast_publish(broker, vhost, "r", [body + b"%04d" % j for j in range(i, i + 10)])
        wait_for(lambda: broker.read_stream(vhost, "r")[0].headers["x-stream-offset"] > archived_last + 2,
                 timeout=60, what="retention to remove the first segments")
        first_left = int(broker.read_stream(vhost, "r", "first")[0].headers["x-stream-offset"])
        cluster.http.patch(API, "rabbitmqarchives", name, {"spec": {"suspend": False}})
        st = wait_for(_where(cluster, name, lambda s: _cond(s, "Degraded") == "True"), timeout=120,
                      what="Degraded after the gap", diag=diag)
        gap = f"{vhost}/r offsets {archived_last + 1}..{first_left - 1} ({first_left - 1 - archived_last} messages)"
        degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
        assert degraded["reason"] == "GapRecorded"
        assert degraded["message"].startswith(f"retention removed messages before the archive read them: {gap} between ")
        assert st["gapMessages"] == first_left - 1 - archived_last
    finally:
        cluster.http.delete(API, "rabbitmqarchives", name)
        cluster.http.delete("apps/v1", "deployments", deployment)
        wait_for(lambda: deployment not in cluster.runner.deployment_pods, timeout=60, what="the pod stopped")
