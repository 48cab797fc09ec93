"""Every pod role in the real image, run as Kubernetes runs it (``support.container.Role``):
``--user 1000:1000``, a read-only root filesystem with a tmpfs ``/tmp``, the config mounted
read-only where the ConfigMap goes (``/etc/rbak``), the state emptyDir (``/var/run/rbak``),
credentials in the environment as the Secret refs give them, ``--network host`` for the CI
brokers, moto and the API server.

The images are ``.ci/image``'s ``rbak:ci`` and ``rbak:ci-spark``: without them (or podman) these
tests skip on a developer's machine and fail with ``CI=true``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import quote

import pika
import pytest
import yaml

from rbak.repo.catalog import load_manifest
from rbak.storage.url import open_storage
from support import container
from support.container import IMAGE, SPARK_IMAGE, Role
from support.require import require_that

# One worker builds the module's round trip once (a backup and a restore in the image).
pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.timeout(900), pytest.mark.xdist_group("image-roles")]

CONFIG_DIR = "/etc/rbak"  # where the operator mounts the run's ConfigMap
STATE_DIR = "/var/run/rbak"  # the Job's emptyDir
JOB_COMMAND = ["python", "-m", "rbak"]  # the Jobs' container command (rbak_operator.decide.bodies)


@pytest.fixture(scope="module")
def image():
    require_that(container.image_problem(IMAGE))
    return IMAGE


@pytest.fixture(scope="module")
def spark_image():
    require_that(container.image_problem(SPARK_IMAGE))
    return SPARK_IMAGE


def s3_env() -> dict[str, str]:
    """What the S3 credentials Secret gives the pod (moto accepts any key)."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true"}


def broker_env(broker) -> dict[str, str]:
    """What the broker credentials Secret gives the pod: the config interpolates them."""
    return {"RABBITMQ_USERNAME": broker.user, "RABBITMQ_PASSWORD": broker.password}


def config_dir(tmp_path: Path, name: str, cfg: dict) -> Path:
    """A ConfigMap's volume: one file, rbak.yaml, readable by anyone (a kubelet's 0644)."""
    d = tmp_path / name
    d.mkdir()
    (d / "rbak.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    d.chmod(0o755)
    (d / "rbak.yaml").chmod(0o644)
    return d


def broker_section(broker, vhost: str | None) -> dict:
    """``vhost`` None: a URL naming no vhost (a restore then goes where its vhost_mapping says)."""
    path = "" if vhost is None else "/" + quote(vhost, safe="")
    return {"amqp_url": f"amqp://{broker.host}:{broker.amqp_port}{path}",
            "management_url": broker.management_url, "stream_port": broker.stream_port,
            "management_username": "${RABBITMQ_USERNAME}", "management_password": "${RABBITMQ_PASSWORD}"}


def storage_section(bucket) -> dict:
    return {"backend": "s3", "bucket": bucket.bucket, "prefix": bucket.prefix, "endpoint": bucket.endpoint,
            "path_style": True, "region": "us-east-1"}


MESSAGES = [  # (body, properties): binary bodies, every kind of property the round trip must keep
    (b"order-0", pika.BasicProperties(delivery_mode=2, content_type="text/plain", message_id="m-0",
                                      correlation_id="c-0", headers={"n": 0, "kind": "first"})),
    (bytes(range(256)), pika.BasicProperties(delivery_mode=2, content_type="application/octet-stream",
                                             message_id="m-1", headers={"n": 1, "nested": {"a": [1, "two"]}})),
    (b"\x00" * 3 + "grüße".encode(), pika.BasicProperties(delivery_mode=2, type="greeting", app_id="img",
                                                           timestamp=1700000000, headers={"n": 2})),
] + [(f"bulk-{i}".encode() * (1 + i % 5), pika.BasicProperties(delivery_mode=2, message_id=f"b-{i}"))
     for i in range(200)]
QUORUM = [f"payment-{i}".encode() for i in range(50)]


def read_all(broker, vhost: str, queue: str) -> list[tuple[bytes, dict]]:
    """Every message of ``queue`` (consumed: the queue is the test's own), body and properties."""
    conn = broker.connect(vhost)
    try:
        ch = conn.channel()
        out = []
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append((body, props_dict(props)))
    finally:
        conn.close()


def last_json(output: str) -> dict:
    """The last JSON object a ``--json`` command printed (log lines on stderr come around it)."""
    lines = output.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            try:
                return json.JSONDecoder().raw_decode("\n".join(lines[i:]))[0]
            except ValueError:
                continue
    raise AssertionError(f"no JSON object in the output:\n{container.tail(output)}")


def props_dict(p: pika.BasicProperties) -> dict:
    return {k: getattr(p, k) for k in ("content_type", "message_id", "correlation_id", "headers", "type", "app_id",
                                        "timestamp", "delivery_mode")}


@pytest.fixture(scope="module")
def round_trip(image, moto_s3, tmp_path_factory):
    """A backup Job and a restore Job in the image on RabbitMQ 4.3 (AMQP 1.0 restores: Proton's
    C engine in the image), S3 on moto: the source vhost's queues restored into a second vhost."""
    from support.brokers import BROKERS, unique_name
    from support.require import unavailable
    from support.s3 import create_bucket

    tmp = tmp_path_factory.mktemp("roles")
    broker = BROKERS["rmq43"]
    if reason := broker.unreachable_reason():
        unavailable(reason)
    src, dst = unique_name("test-img-src"), unique_name("test-img-dst")
    broker.create_vhost(src)
    broker.create_vhost(dst)
    bucket = create_bucket(moto_s3, f"bucket-{unique_name('img')}", "jobs")
    try:
        for body, props in MESSAGES:
            broker.publish(src, "orders", [body], properties=props, declare={})
        broker.publish(src, "payments", QUORUM, declare={"x-queue-type": "quorum"})
        backup_id = "img-backup-1"
        backup_cfg = config_dir(tmp, "backup-config", {
            "mode": "backup", "backup_id": backup_id, "source": {**broker_section(broker, src),
                                                                  "queues": {"vhosts": [src]}},
            "storage": storage_section(bucket), "backup": {"include_definitions": True},
            "offset_storage": {"path": "${RBAK_STATE_DIR}/offsets.db"}})
        env = {**broker_env(broker), **s3_env(), "RBAK_STATE_DIR": STATE_DIR}
        backup = Role("backup Job", image, env=env, mounts={CONFIG_DIR: str(backup_cfg)}, writable=[STATE_DIR])
        b = backup.run(["backup", "--config", f"{CONFIG_DIR}/rbak.yaml", "--json"], entrypoint=JOB_COMMAND)
        restore_cfg = config_dir(tmp, "restore-config", {
            "mode": "restore", "backup_id": backup_id, "target": broker_section(broker, None),
            "storage": storage_section(bucket),
            "restore": {"vhost_mapping": {src: dst}, "restore_definitions": True,
                        "definitions_selection": {"vhosts": [src]},
                        "checkpoint_state": "${RBAK_STATE_DIR}/restore-checkpoint.db"}})
        restore = Role("restore Job", image, env=env, mounts={CONFIG_DIR: str(restore_cfg)}, writable=[STATE_DIR])
        r = restore.run(["restore", "--config", f"{CONFIG_DIR}/rbak.yaml", "--json"], entrypoint=JOB_COMMAND)
        yield type("RoundTrip", (), {"broker": broker, "src": src, "dst": dst, "bucket": bucket, "backup_id": backup_id,
                                     "backup": b, "restore": r, "env": env, "tmp": tmp})()
    finally:
        for v in (src, dst):
            broker.delete_vhost(v)


def test_backup_job_in_the_image_writes_a_complete_backup(round_trip):
    rt = round_trip
    m = load_manifest(open_storage(str(rt.bucket)), rt.backup_id)
    assert m.is_complete, rt.backup.describe()
    counts = {q.name: q.message_count for q in m.queues}
    assert counts == {"orders": len(MESSAGES), "payments": len(QUORUM)}, counts
    # the C speedup and the Job's user, from inside the image
    out = Role("probe", IMAGE).run(
        ["-c", "import os, rbak.format._speedups as s; print(os.getuid(), os.getgid(), s.__file__)"],
        entrypoint=["python"]).output.split()
    assert out[:2] == ["1000", "1000"] and out[2].startswith("/opt/rbak/lib/python3.11/site-packages/rbak/"), out


def test_restore_job_in_the_image_puts_back_exact_messages(round_trip):
    rt = round_trip
    got = read_all(rt.broker, rt.dst, "orders")
    want = [(body, props_dict(props)) for body, props in MESSAGES]
    assert [b for b, _ in got] == [b for b, _ in want], rt.restore.describe()
    for (body, gp), (_, wp) in zip(got, want):
        assert gp == wp, (body[:20], gp, wp)
    assert rt.broker.read_bodies(rt.dst, "payments") == QUORUM  # in order: the queue's first read
    info = rt.broker.queue_info(rt.dst, "payments")
    assert info["type"] == "quorum", info  # declared by the restored definitions
    summary = last_json(rt.restore.output)
    assert summary["ok"] is True and summary["confirmed"] == len(MESSAGES) + len(QUORUM), rt.restore.describe()
    assert {(q["target_vhost"], q["target_queue"], q["status"], q["confirmed"]) for q in summary["queues"]} == {
        (rt.dst, "orders", "restored", len(MESSAGES)), (rt.dst, "payments", "restored", len(QUORUM))}, summary


def test_validate_deep_in_the_image(round_trip):
    rt = round_trip
    url = str(rt.bucket)
    res = Role("validate Job", IMAGE, env=s3_env()).run(
        ["validate", "--path", url, "--backup-id", rt.backup_id, "--deep"], entrypoint=JOB_COMMAND)
    assert f"backup {rt.backup_id} is valid (deep:" in res.output, res.describe()
    # and a damaged segment is named, exit 1
    m = load_manifest(open_storage(url), rt.backup_id)
    seg = next(q for q in m.queues if q.name == "orders").segments[0].key
    key = f"{rt.bucket.prefix.strip('/')}/{seg}"  # the object under the storage's prefix
    client = rt.bucket.client()
    good = client.get_object(Bucket=rt.bucket.bucket, Key=key)["Body"].read()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    client.put_object(Bucket=rt.bucket.bucket, Key=key, Body=bytes(bad))
    try:
        res = Role("validate Job", IMAGE, env=s3_env()).run(
            ["validate", "--path", url, "--backup-id", rt.backup_id, "--deep"], entrypoint=JOB_COMMAND, expect=1)
        assert seg in res.output, res.describe()
    finally:
        client.put_object(Bucket=rt.bucket.bucket, Key=key, Body=good)


def test_drill_in_the_image(round_trip):
    rt = round_trip
    cfg = config_dir(rt.tmp, "drill-config", {
        "mode": "backup", "source": {**broker_section(rt.broker, rt.src), "queues": {"vhosts": [rt.src]}},
        "storage": storage_section(rt.bucket), "drill": {"scratch_vhost_prefix": "rbak-drill-img"}})
    res = Role("drill Job", IMAGE, env={**broker_env(rt.broker), **s3_env(), "RBAK_STATE_DIR": STATE_DIR},
               mounts={CONFIG_DIR: str(cfg)}, writable=[STATE_DIR]).run(
        ["drill", "--config", f"{CONFIG_DIR}/rbak.yaml", "--backup-id", rt.backup_id, "--json"],
        entrypoint=JOB_COMMAND)
    rep = last_json(res.output)
    assert rep["passed"] is True and rep["backup_id"] == rt.backup_id, res.describe()
    by = {q["queue"]: q for q in rep["queues"]}
    assert by["orders"]["expected_count"] == by["orders"]["actual_count"] == len(MESSAGES)
    assert by["payments"]["expected_count"] == by["payments"]["actual_count"] == len(QUORUM)
    assert all(q["hash_match"] for q in rep["queues"]), rep
    assert rep["scratch_vhost_removed"] and not rt.broker.vhost_exists(rep["scratch_vhost"])


def test_spark_validate_job_in_the_spark_image(round_trip, spark_image):
    """spark/validate.py through the entrypoint's ``driver`` role, Spark in local mode, Debian's JRE."""
    rt = round_trip
    res = Role("Spark driver", spark_image, env={**s3_env(), "RBAK_STATE_DIR": "/tmp",
                                                 "SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1"}).run(
        ["driver", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.jars.ivy=/tmp/.ivy2", "local:///opt/rbak/spark/validate.py",
         "--path", str(rt.bucket), "--backup-id", rt.backup_id, "--no-report"], timeout=600)
    records = len(MESSAGES) + len(QUORUM)
    assert f"validate {rt.backup_id} (local[2]): " in res.output, res.describe()
    line = next(x for x in res.output.splitlines() if x.startswith(f"validate {rt.backup_id} "))
    assert f", {records} records, " in line and line.endswith(": OK"), res.describe()


def test_operator_in_the_image_takes_the_lease_and_creates_the_backup_job(image, kube_api, tmp_path):
    """The chart's Deployment env through the entrypoint's ``operator`` role, against the real API
    server: it takes the chart's Lease as its pod and makes the Job of an on-demand backup."""
    from support.ship import find, manifests, render_chart

    ns, release_ns = "img-ops", "rbak-system"
    objs = manifests(render_chart({"watchNamespaces": [ns], "operator": {"leaderElection": {"enabled": True}}},
                                 namespace=release_ns))
    c = find(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == ["operator"]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    pod = "rbak-operator-7c9d5b8f6-img01"
    env.update({"POD_NAME": pod, "POD_NAMESPACE": release_ns, "KUBECONFIG": str(kube_api.kubeconfig)})
    root = Path(__file__).resolve().parents[2]
    kube_api.kubectl("apply", "-f", str(root / "crds"))  # as the operator's e2e harness applies them
    kube_api.wait_established("rabbitmqbackups.rbak.io", "rabbitmqrestores.rbak.io")
    for n in (ns, release_ns):
        kube_api.kubectl("create", "namespace", n, check=False)
    kube_api.kubectl("-n", ns, "create", "secret", "generic", "s3", "--from-literal=AWS_ACCESS_KEY_ID=testing",
                     "--from-literal=AWS_SECRET_ACCESS_KEY=testing", check=False)
    kube_api.kubectl("-n", ns, "create", "secret", "generic", "rmq", "--from-literal=username=guest",
                     "--from-literal=password=guest", check=False)
    body = {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQBackup",
            "metadata": {"name": "img-on-demand", "namespace": ns},
            "spec": {"broker": {"amqpUrl": "amqp://127.0.0.1:5672/%2f", "managementUrl": "http://127.0.0.1:15672",
                                "credentialsSecretRef": {"name": "rmq"}},
                     "storage": {"s3": {"bucket": "never-used", "endpoint": "http://127.0.0.1:9",
                                        "region": "us-east-1", "credentialsSecretRef": {"name": "s3"}}},
                     "validate": {"enabled": False}}}
    kube_api.kubectl("apply", "-f", "-", input=json.dumps(body))
    files = {str(kube_api.kubeconfig): str(kube_api.kubeconfig), str(kube_api.ca_file): str(kube_api.ca_file)}
    op = Role("operator", image, env=env, mounts=files).start(["operator"])
    try:
        def lease():
            p = kube_api.kubectl("-n", release_ns, "get", "lease", env["RBAK_LEASE_NAME"], "-o", "json", check=False)
            return json.loads(p.stdout) if p.returncode == 0 else None

        def wait(pred, what, timeout=180):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                got = pred()
                if got:
                    return got
                assert op.alive(), f"{op.describe()}\n(the operator exited while waiting for {what})"
                time.sleep(1)
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; {op.describe()}")

        held = wait(lambda: (lease() or {}).get("spec", {}).get("holderIdentity") == pod and lease(), "the Lease")
        assert held["spec"]["holderIdentity"] == pod
        kube_api.kubectl("-n", ns, "annotate", "rabbitmqbackup", "img-on-demand", "rbak.io/backup-now=img-1",
                         "--overwrite")

        def job():
            p = kube_api.kubectl("-n", ns, "get", "jobs", "-l", "rbak.io/backup=img-on-demand", "-o", "json")
            items = json.loads(p.stdout)["items"]
            return items[0] if items else None

        made = wait(job, "the on-demand backup's Job")
        c = made["spec"]["template"]["spec"]["containers"][0]
        assert c["image"] == env["RBAK_IMAGE"] and c["command"] == JOB_COMMAND and c["args"][0] == "backup", c
        owner = made["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("RabbitMQBackup", "img-on-demand")
    finally:
        # the object goes while its operator still runs (its finalizer): the test API server has no
        # namespace controller, so one left behind would be reconciled by every later test's operator
        kube_api.kubectl("-n", ns, "delete", "rabbitmqbackup", "img-on-demand", "--timeout=60s", check=False)
        op.remove()
        kube_api.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_a_failing_role_names_the_role_the_command_and_its_last_log_lines(image):
    """What CI prints when a role fails: here a backup Job whose ConfigMap is missing (exit 2)."""
    role = Role("backup Job", image, env={"RBAK_STATE_DIR": STATE_DIR}, writable=[STATE_DIR])
    with pytest.raises(AssertionError) as err:
        role.run(["backup", "--config", f"{CONFIG_DIR}/rbak.yaml", "--json"], entrypoint=JOB_COMMAND)
    text = str(err.value)
    assert text.startswith("role backup Job: `") and " exited 2; the container's last log lines:" in text, text
    assert f"{image} backup --config {CONFIG_DIR}/rbak.yaml --json`" in text, text
    assert f"{CONFIG_DIR}/rbak.yaml" in text.split("last log lines:", 1)[1], text  # rbak's one error line
