"""The operator end to end: a kmock emulator, the local kubelet/spark-operator runner and real operator
processes, with the helpers the e2e test modules share (fixtures: tests/operator/conftest.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from rbak.repo.catalog import load_manifest
from rbak.storage.url import open_storage
from rbak_operator.decide.times import parse_time
from support.opcluster import Emulator, Http, KubeHttp, Operator, PodRunner, RealServer, wait_for


API = "rbak.io/v1alpha1"


# the archive e2e modules' operator: the archive's storage polled every second, moved offsets written at once
ARCHIVE_FAST = {"RBAK_OPERATOR_ARCHIVE_POLL_SECONDS": "1", "RBAK_OPERATOR_ARCHIVE_PROGRESS_SECONDS": "0",
                "RBAK_ARCHIVE_METRICS_PORT": "0"}

START = datetime(2030, 1, 1, 0, 0, 30, tzinfo=timezone.utc)


def fmt(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


class Cluster:
    """The operator, the local kubelet and an API server: kmock's emulator, or with ``kube``
    (a ``support.kubeapi.KubeApi``) the real one."""

    def __init__(self, tmp: Path, kube=None, start: datetime | None = None,
                 operator_env: dict[str, str] | None = None, job_image: str | None = None) -> None:
        self.tmp = tmp
        self.real = kube is not None
        if kube is None:
            self.emu = Emulator().start()
            self.http = Http(self.emu.url)
        else:
            self.emu = RealServer(kube)
            self.http = KubeHttp(kube, self.emu.namespace)
        self.external = self.real and self.emu.external
        self.kubeconfig = self.emu.kubeconfig(tmp / "kubeconfig")
        self.clock_file = tmp / "clock"
        # A real server stamps creationTimestamp with its own clock: the fake one starts there.
        self.now = start or (self.http.server_time() - timedelta(seconds=1) if self.real else START)
        self.clock_file.write_text(fmt(self.now))
        # ``job_image``: the operator names it in its Jobs and the local kubelet runs them in it.
        self.runner = PodRunner(self.http, container_mode=job_image is not None).start()
        if job_image is not None:
            self.runner.images |= {job_image, f"{job_image}-spark"}  # this node has them: no ImagePullBackOff
            operator_env = {"RBAK_IMAGE": job_image, **(operator_env or {})}
        self.operators: list[Operator] = []
        # On an existing cluster the operator keeps to the test namespace: it never touches the rest.
        self.operator_env = {**({"RBAK_OPERATOR_NAMESPACES": self.http.ns} if self.external else {}),
                             **(operator_env or {})}
        self.operator = self.start_operator()

    def start_operator(self, extra_env: dict[str, str] | None = None) -> Operator:
        op = Operator(self.kubeconfig, self.clock_file, self.tmp / f"operator-{len(self.operators)}.log",
                      {**self.operator_env, **(extra_env or {})}).start()
        self.operators.append(op)
        return op

    def set_clock(self, dt: datetime) -> None:
        assert dt >= self.now
        self.now = dt
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(fmt(dt))
        tmp.replace(self.clock_file)  # atomic: the operator never reads a half-written clock

    def needs_audit_log(self) -> None:
        """Skip on an existing cluster (``RBAK_E2E_KUBECONFIG``): the test reads the server's audit log."""
        if self.external:
            pytest.skip("reads the API server's audit log, which only the test suite's own server exposes")

    def needs_own_crd(self, crd: str) -> None:
        """Skip when ``crd`` (another operator's) was on the existing cluster before the tests: that
        operator would act on the test's objects (a RabbitmqCluster, a SparkApplication)."""
        if self.real and crd in self.emu.preexisting:
            pytest.skip(f"the cluster runs the operator of {crd}, which would act on this test's objects")

    def clock_at_server_time(self) -> None:
        """Set the fake clock back to the API server's time, for a test of schedule slots on a real
        server: the server stamps creationTimestamp with its own clock, so with a fake clock that
        earlier tests moved ahead, every slot between an object's creation and that fake now would
        be due at once. Only between tests: the objects of earlier tests are gone (``env`` deletes
        them), so no reconcile loop sees time go back. The emulator stamps creationTimestamp from
        the fake clock (``create_backup``): nothing to do there."""
        if not self.real:
            return
        self.now = self.http.server_time() - timedelta(seconds=1)  # the Date header has whole seconds
        self.set_clock(self.now)

    def next_slot(self, minutes: int = 5) -> datetime:
        """Move the clock 2 s past the next multiple of ``minutes``; return that slot. On a real server
        the slot is also after the server's own now: an object created as the real clock crossed a
        multiple (a loaded CI run) has its creationTimestamp on that slot, and the operator counts
        only slots after creation (the test then waited for a slot that was never due)."""
        floor = self.now
        if self.real:
            floor = max(floor, self.http.server_time())
        base = floor.replace(second=0, microsecond=0) + timedelta(minutes=1)
        while base.minute % minutes:
            base += timedelta(minutes=1)
        self.set_clock(base + timedelta(seconds=2))
        return base

    def backup(self, name: str) -> dict:
        return self.http.get(API, "rabbitmqbackups", name) or {}

    def status(self, name: str) -> dict:
        return self.backup(name).get("status") or {}

    def jobs(self, prefix: str) -> list[str]:
        return sorted(j["metadata"]["name"] for j in self.http.items("batch/v1", "jobs") if j["metadata"]["name"].startswith(prefix + "-"))

    def events(self, name: str) -> list[dict]:
        return [e for e in self.http.items("v1", "events") if (e.get("involvedObject") or {}).get("name") == name]

    def logs(self) -> str:
        out = []
        for op in self.operators:
            out.append(f"--- {op.log_path.name}\n" + op.log()[-6000:])
        out.append("--- runner\n" + "\n".join(f"{k}:\n{v[-3000:]}" for k, v in self.runner.outputs.items()))
        return "\n".join(out)

    def close(self) -> None:
        for op in self.operators:
            op.stop()
        self.runner.stop()
        self.emu.stop()


def create_backup(cluster: Cluster, env, name: str, **spec) -> dict:
    body = {"apiVersion": API, "kind": "RabbitMQBackup",
            "metadata": {"name": name, "creationTimestamp": fmt(cluster.now)},
            "spec": {"broker": env.url_broker, "storage": env.storage, "queues": {"vhosts": [env.vhost]},
                     "validate": {"enabled": False}, **spec}}  # validation in one test only: pods cost seconds
    made = cluster.http.create(API, "rabbitmqbackups", body)
    # A real server's creationTimestamp may be past the fake now: the next slot counts from there.
    created = parse_time(made["metadata"]["creationTimestamp"])
    if created > cluster.now:
        cluster.set_clock(created)
    return made


def backup_id(cluster: Cluster, name: str, job: str) -> str:
    """The backup id of run ``job`` of RabbitMQBackup ``name``: the Job's name and the object's tag
    (its namespace and uid), as the operator makes it (``naming.run_backup_id``)."""
    from rbak_operator.decide.naming import run_backup_id

    meta = cluster.backup(name)["metadata"]
    return run_backup_id(job, meta["namespace"], meta.get("uid"))


def trigger(cluster: Cluster, name: str, value: str) -> None:
    cluster.http.patch(API, "rabbitmqbackups", name, {"metadata": {"annotations": {"rbak.io/backup-now": value}}})


def wait_run(cluster: Cluster, name: str, job: str | None = None, phase: str | None = None, timeout: float = 90) -> dict:
    def done():
        lr = cluster.status(name).get("lastRun") or {}
        if job is not None and lr.get("jobName") != job:
            return None
        if phase is not None and lr.get("phase") != phase:
            return None
        return lr or None
    return wait_for(done, timeout, what=f"{name} run {job or ''} {phase or ''}", diag=cluster.logs)


def s3(env):
    return open_storage(str(env.bucket))


def bucket_root(env):
    """The backup storage as the runs see it: the bucket root, keys carrying the prefix."""
    return open_storage(env.bucket.url_with_prefix(""))


def damage_a_segment(env, backup_id: str, queue: str) -> str:
    """Flip one byte in the middle of ``queue``'s first segment, behind rbak's back; returns its key."""
    m = load_manifest(bucket_root(env), backup_id, env.bucket.prefix)
    key = next(q for q in m.queues if q.name == queue).segments[0].key
    data = bytearray(env.bucket.get(key))
    data[len(data) // 2] ^= 0xFF
    env.bucket.client().put_object(Bucket=env.bucket.bucket, Key=key, Body=bytes(data))
    return key


def restart_with_metrics(cluster: Cluster) -> int:
    """Restart the operator exporting its metrics on a free local port; returns the port."""
    from support.s3 import free_port

    port = free_port()
    cluster.operator.kill()
    cluster.operator = cluster.start_operator({"RBAK_METRICS_PORT": str(port), "RBAK_METRICS_BIND": "127.0.0.1"})
    return port


def good_and_failed_run(cluster: Cluster, env, stem: str) -> tuple[str, str]:
    """Two RabbitMQBackups run once on demand: ``<tag>-<stem>`` succeeds (3 messages, a daily schedule),
    ``<tag>-<stem>bad`` fails (wrong credentials). Returns their names once both runs ended."""
    env.broker.publish_n(env.vhost, "q", 3, declare={})
    name, bad = f"{env.tag}-{stem}", f"{env.tag}-{stem}bad"
    create_backup(cluster, env, name, schedule="0 3 * * *")
    create_backup(cluster, env, bad, broker=dict(env.url_broker, credentialsSecretRef={"name": f"{env.tag}-bad"}))
    trigger(cluster, name, "1")
    trigger(cluster, bad, "1")
    wait_run(cluster, name, phase="Succeeded")
    wait_run(cluster, bad, phase="Failed")
    return name, bad


def metric_samples(port: int) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample the operator's /metrics serves now."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]
