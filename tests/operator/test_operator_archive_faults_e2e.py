"""RabbitMQArchive faults: the operator and the archiver's pod survive each other's restarts with nothing
lost (issue 48, "Faults"), on the real API server, a real broker's stream (3.10.8) and moto S3.

As a user meets it: an archive runs while a publisher sends at a steady rate. The operator is SIGKILLed;
the archiver does not need it, so the storage keeps gaining ticks. While the operator is down the
archiver's pod is SIGKILLed too, and the Deployment (the local kubelet) replaces it. The operator comes
back: it adopts the Deployment and ConfigMap it finds (no second one, no update, no new event), its status
catches up from the storage, and a RabbitMQRestore of the archive holds every message published, once, in
order."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest
from rbak_operator.decide.archive import L_ARCHIVE, labels
from rbak_operator.decide.times import parse_time
from rbak_operator.reconcile.archive import newest_tick
from support.backups import fast_publish
from support.brokers import unique_name
from support.op_e2e import API, ARCHIVE_FAST, Cluster, bucket_root
from support.opcluster import wait_for
from test_operator_archive_e2e import _cond, _create_archive, _status, _stream, _where

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_s3, e2e_kube):
    """The operator polls the archive's storage every second and writes moved offsets at once."""
    c = Cluster(tmp_path_factory.mktemp("cluster-archive-faults"), kube=e2e_kube, operator_env=ARCHIVE_FAST)
    try:
        yield c
    finally:
        c.close()


class Publisher:
    """Publishes ``batch`` messages every ``every`` seconds (with confirms) until stopped; ``sent`` holds the
    confirmed bodies in order."""

    def __init__(self, broker, vhost: str, queue: str, batch: int = 20, every: float = 0.2) -> None:
        self.broker, self.vhost, self.queue, self.batch, self.every = broker, vhost, queue, batch, every
        self.sent: list[bytes] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def publish(self, n: int) -> None:
        bodies = [b"m-%d" % (len(self.sent) + i) for i in range(n)]
        fast_publish(self.broker, self.vhost, self.queue, bodies)
        self.sent.extend(bodies)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.publish(self.batch)
                self._stop.wait(self.every)
        except BaseException as e:  # noqa: BLE001 - said by stop(), in the test's thread
            self.error = e

    def start(self) -> "Publisher":
        self._thread.start()
        return self

    def halt(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def stop(self) -> list[bytes]:
        """Stop publishing; every message it sent, once the publisher said no error."""
        self.halt()
        assert self.error is None, f"the publisher failed: {self.error!r}"
        return list(self.sent)


def _owned(cluster: Cluster, api: str, plural: str, name: str) -> list[str]:
    """The names of the objects of ``plural`` labelled as this archive's (what ``kubectl get -l`` shows)."""
    want = labels(name)[L_ARCHIVE]
    return sorted(o["metadata"]["name"] for o in cluster.http.items(api, plural)
                  if ((o["metadata"].get("labels") or {}).get(L_ARCHIVE)) == want)


def _reasons(cluster: Cluster, name: str) -> list[str]:
    return sorted(e.get("reason", "") for e in cluster.events(name) if e.get("reason", "").startswith("Archiver"))


def test_operator_and_archiver_pod_survive_each_others_restarts(cluster, env, rmq310):
    broker, vhost = rmq310, env.vhost
    broker.declare_queue(vhost, "events.f", arguments={"x-queue-type": "stream"})
    pub = Publisher(broker, vhost, "events.f")
    pub.publish(100)
    name = f"{env.tag}-flt"
    deployment, diag = _create_archive(cluster, env, broker, name)

    def tick():
        t = newest_tick(bucket_root(env), env.bucket.prefix, name)
        assert t is not None
        return t

    fresh = unique_name("test-op-flt")
    try:
        wait_for(_where(cluster, name, lambda s: _cond(s, "RPOMet") == "True" and _stream(s).get("archivedOffset") == 99),
                 timeout=60, what="RPOMet with the first 100 archived", diag=diag)
        dep = cluster.http.get("apps/v1", "deployments", deployment)
        cm = cluster.http.get("v1", "configmaps", deployment)
        assert _owned(cluster, "apps/v1", "deployments", name) == [deployment]
        assert _owned(cluster, "v1", "configmaps", name) == [deployment]
        first_pod = cluster.runner.pod_starts[-1]
        pub.start()
        wait_for(_where(cluster, name, lambda s: (_stream(s).get("archivedOffset") or 0) >= 199), timeout=30,
                 what="the steady publisher's messages archived", diag=diag)

        # 1. the operator SIGKILLed: the archiver keeps archiving (the storage gains ticks, offsets move)
        cluster.operator.kill()
        down = tick()
        status_down = _status(cluster, name)
        wait_for(lambda: (t := tick()).sequence > down.sequence + 2
                 and t.streams[0].info.last_offset > down.streams[0].info.last_offset, timeout=30,
                 what="ticks with new offsets while the operator is down", diag=diag)
        # nobody writes the status meanwhile
        assert _status(cluster, name) == status_down

        # while the operator is down, the archiver's pod is SIGKILLed: the Deployment replaces it and the
        # replacement archives (a newer generation's ticks, past what the killed pod had archived)
        assert cluster.runner.pod_starts[-1] == first_pod
        killed = cluster.runner.kill_deployment_pod(deployment)
        at_kill = tick()
        wait_for(lambda: cluster.runner.pod_starts[-1] != killed, timeout=30, what="a replacement pod", diag=diag)
        wait_for(lambda: (t := tick()).generation > at_kill.generation
                 and t.streams[0].info.last_offset > at_kill.streams[0].info.last_offset, timeout=60,
                 what="the replacement's ticks", diag=diag)
        assert cluster.runner.pod_starts == [first_pod, cluster.runner.pod_starts[-1]]
        assert cluster.operators[-1].proc.poll() is not None  # still down all along

        # 2. the operator back: it adopts what it finds, its status catches up from the storage
        restarted = datetime.now(timezone.utc)
        cluster.operator = cluster.start_operator()
        st = wait_for(_where(cluster, name, lambda s: parse_time(s.get("recoverableUntil") or "1970-01-01T00:00:00Z")
                             > restarted and _cond(s, "RPOMet") == "True"),
                      timeout=60, what="recoverableUntil past the restart, RPOMet True", diag=diag)
        assert st["generation"] > status_down["generation"]
        sent = pub.stop()
        st = wait_for(_where(cluster, name, lambda s: _stream(s).get("archivedOffset") == len(sent) - 1
                             and _stream(s).get("committedOffset") == len(sent) - 1 and _cond(s, "RPOMet") == "True"),
                      timeout=60, what=f"archivedOffset {len(sent) - 1}, the last published", diag=diag)
        assert st["phase"] == "Archiving" and _cond(st, "Ready") == "True" and _cond(st, "Degraded") == "False"
        assert st["gapMessages"] == 0 and st["streamCount"] == 1 and st["lagSeconds"] <= 5
        # the same Deployment and ConfigMap, not re-created nor updated: exact counts, uids, versions, events
        assert _owned(cluster, "apps/v1", "deployments", name) == [deployment]
        assert _owned(cluster, "v1", "configmaps", name) == [deployment]
        dep2 = cluster.http.get("apps/v1", "deployments", deployment)
        cm2 = cluster.http.get("v1", "configmaps", deployment)
        assert (dep2["metadata"]["uid"], dep2["metadata"]["resourceVersion"], dep2["metadata"]["generation"]) == (
            dep["metadata"]["uid"], dep["metadata"]["resourceVersion"], dep["metadata"]["generation"])
        assert (cm2["metadata"]["uid"], cm2["metadata"]["resourceVersion"]) == (
            cm["metadata"]["uid"], cm["metadata"]["resourceVersion"])
        assert _reasons(cluster, name) == ["ArchiverCreated"]
        assert len(cluster.runner.pod_starts) == 2  # the operator's return started no pod either

        # 3. nothing lost: a RabbitMQRestore of the archive (up to its recoverable-until) into a fresh vhost
        # holds every message published, exactly once, in order
        broker.create_vhost(fresh)
        broker.declare_queue(fresh, "events.f", arguments={"x-queue-type": "stream"})
        rname = f"{env.tag}-fltr"
        cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore",
                                                      "metadata": {"name": rname},
                                                      "spec": {"archiveRef": {"name": name},
                                                               "vhostMapping": {vhost: fresh}}})
        rst = wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {})
                       .get("phase") in ("Succeeded", "Failed") and s, timeout=90, what="the restore", diag=diag)
        assert rst["phase"] == "Succeeded", rst
        assert rst["backupId"] == st["generation"]
        assert [m.body for m in broker.read_stream(fresh, "events.f", "first")] == sent
    finally:
        pub.halt()
        cluster.http.delete(API, "rabbitmqarchives", name)
        cluster.http.delete("apps/v1", "deployments", deployment)  # no garbage collector on this server
        wait_for(lambda: deployment not in cluster.runner.deployment_pods, timeout=60, what="the pod stopped")
        broker.delete_vhost(fresh)


def test_a_configmap_deleted_by_hand_is_restored_when_the_operator_starts(cluster, env, rmq310):
    """The archiver's ConfigMap deleted while its Deployment stays: a replacement pod could not start. The
    operator's next start (as its 6-hourly resync) writes it back, with the same data, and says so; the
    Deployment is left as it was."""
    broker, vhost = rmq310, env.vhost
    broker.declare_queue(vhost, "events.c", arguments={"x-queue-type": "stream"})
    name = f"{env.tag}-cm"
    deployment, diag = _create_archive(cluster, env, broker, name)
    try:
        wait_for(lambda: cluster.http.get("v1", "configmaps", deployment), timeout=60, what="the ConfigMap", diag=diag)
        # the operator posts its event after the objects: killed before it (a loaded machine), it never says it
        wait_for(lambda: "ArchiverCreated" in _reasons(cluster, name), timeout=30, what="the first event", diag=diag)
        cm = cluster.http.get("v1", "configmaps", deployment)
        dep = cluster.http.get("apps/v1", "deployments", deployment)
        cluster.operator.kill()
        cluster.http.delete("v1", "configmaps", deployment)
        assert cluster.http.get("v1", "configmaps", deployment) is None
        cluster.operator = cluster.start_operator()
        back = wait_for(lambda: cluster.http.get("v1", "configmaps", deployment), timeout=60,
                        what="the ConfigMap restored", diag=diag)
        assert back["data"] == cm["data"] and back["metadata"]["uid"] != cm["metadata"]["uid"]
        wait_for(lambda: "ArchiverConfigRestored" in _reasons(cluster, name), timeout=30, what="the event", diag=diag)
        assert _reasons(cluster, name) == ["ArchiverConfigRestored", "ArchiverCreated"]
        dep2 = cluster.http.get("apps/v1", "deployments", deployment)
        assert (dep2["metadata"]["uid"], dep2["metadata"]["resourceVersion"]) == (
            dep["metadata"]["uid"], dep["metadata"]["resourceVersion"])
    finally:
        cluster.http.delete(API, "rabbitmqarchives", name)
        cluster.http.delete("apps/v1", "deployments", deployment)  # no garbage collector on this server
        wait_for(lambda: deployment not in cluster.runner.deployment_pods, timeout=60, what="the pod stopped")
