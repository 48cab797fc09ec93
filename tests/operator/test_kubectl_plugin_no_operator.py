"""``kubectl rbak`` on a cluster where no operator runs: the CRDs are installed (as shipped) on the
real API server (``kube_api``) but no operator process is started. ``backup``, ``drill`` and
``restore`` ask for work and then say, after ``--pickup-timeout`` rather than the hour of
``--timeout``, that nobody acted on the request, naming what they checked, and exit 1."""

from __future__ import annotations

import re
import subprocess

import pytest
from support.brokers import unique_name
from support.kplugin import console_script, plugin_env
from support.op_e2e import API
from support.opcluster import KubeHttp, RealServer
from support.restores import build_backup, make_records
from support.s3 import create_bucket

from rbak.storage.url import open_storage
from rbak_operator.reconcile.drill import manual_run_name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PODS = "kubectl get pods -A -l app.kubernetes.io/part-of=rbak,app.kubernetes.io/component=operator"


@pytest.fixture(scope="module")
def idle(tmp_path_factory, kube_api, moto_s3):
    """A RabbitMQBackup (drills on) whose storage holds one complete backup, and no operator."""
    tmp = tmp_path_factory.mktemp("kplugin-idle")
    RealServer(kube_api)  # the CRDs, nothing that acts on them
    http = KubeHttp(kube_api)
    tag = unique_name("kpi")
    bucket = create_bucket(moto_s3, unique_name("bucket"), prefix="backups")
    build_backup(open_storage(bucket.url_with_prefix("")), f"{tag}-b1",
                 [("shop", "orders", "classic", make_records("shop", "orders", [b"a", b"b"]))], prefix="backups")
    http.secret(f"{tag}-s3", {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    name = f"{tag}-nightly"
    http.create(API, "rabbitmqbackups", {"apiVersion": API, "kind": "RabbitMQBackup", "metadata": {"name": name},
                                         "spec": {
        "broker": {"amqpUrl": "amqp://127.0.0.1:5672/%2f", "managementUrl": "http://127.0.0.1:15672",
                   "credentialsSecretRef": {"name": f"{tag}-rmq"}},
        "storage": {"s3": {"bucket": bucket.bucket, "prefix": bucket.prefix, "endpoint": bucket.endpoint,
                           "pathStyle": True, "region": "us-east-1", "credentialsSecretRef": {"name": f"{tag}-s3"}}},
        "verify": {"restoreDrill": {"schedule": "0 4 * * *"}}}})
    archive = f"{tag}-orders"  # a RabbitMQArchive with drills on, and one without
    for aname, verify in ((archive, {"verify": {"restoreDrill": {"schedule": "0 4 * * *"}}}), (f"{tag}-quiet", {})):
        http.create(API, "rabbitmqarchives", {"apiVersion": API, "kind": "RabbitMQArchive",
                                              "metadata": {"name": aname}, "spec": {
            "broker": {"amqpUrl": "amqp://127.0.0.1:5672/%2f", "managementUrl": "http://127.0.0.1:15672",
                       "credentialsSecretRef": {"name": f"{tag}-rmq"}},
            "storage": {"s3": {"bucket": bucket.bucket, "prefix": bucket.prefix, "endpoint": bucket.endpoint,
                               "pathStyle": True, "region": "us-east-1"}}, **verify}})
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    console_script(bin_dir)
    env = plugin_env(kube_api, bin_dir)
    try:
        yield type("Idle", (), {"name": name, "backup_id": f"{tag}-b1", "env": env, "http": http, "archive": archive,
                                "quiet": f"{tag}-quiet"})
    finally:
        for plural in ("rabbitmqrestores", "rabbitmqbackups", "rabbitmqarchives"):
            for o in http.items(API, plural):
                if o["metadata"]["name"].startswith(tag):
                    http.delete(API, plural, o["metadata"]["name"])


def run(idle, *args: str) -> subprocess.CompletedProcess:
    # --timeout an hour: only the pickup check can end these in the test's time
    return subprocess.run(["kubectl-rbak", *args, "--pickup-timeout", "3", "--timeout", "3600"], env=idle.env,
                          capture_output=True, text=True, timeout=240, check=False)


@pytest.mark.parametrize("command, what, ack", [
    ("backup", "backup", "status.lastManualTrigger"),
    ("drill", "restore drill", "status.restoreDrill.lastManualTrigger"),
])
def test_a_request_nobody_acts_on_is_named_within_the_pickup_timeout(idle, command, what, ack):
    r = run(idle, command, idle.name)
    assert r.returncode == 1, r
    out = r.stdout.splitlines()
    m = re.fullmatch(rf"rabbitmqbackup/{idle.name}: {what} requested \((rbak\.io/\S+-now)=(\S+)\)", out[0])
    assert m and len(out) == 2 and out[1].startswith(f"job/{idle.name}-"), out
    annotation, value = m.groups()
    body = idle.http.get(API, "rabbitmqbackups", idle.name)
    assert body["metadata"]["annotations"][annotation] == value and not body.get("status")  # the request stays
    assert r.stderr == (f"error: no rbak operator acted on the request within 3s: RabbitMQBackup default/{idle.name} "
                        f"still has {annotation}={value} and its status is unchanged since it was set ({ack} is "
                        f"unset); the request stays: an operator that starts runs it. Is the operator running? "
                        f"{PODS}\n")


def test_an_archive_drill_nobody_acts_on_is_named_within_the_pickup_timeout(idle):
    """``drill --archive``: the request is the archive's own annotation, its Job named as the operator names it."""
    r = run(idle, "drill", "--archive", idle.archive)
    assert r.returncode == 1, r
    out = r.stdout.splitlines()
    m = re.fullmatch(rf"rabbitmqarchive/{idle.archive}: restore drill requested \(rbak\.io/drill-now=(\S+)\)", out[0])
    assert m and out[1:] == [f"job/{manual_run_name(idle.archive + '-archive', m.group(1))}"], out
    body = idle.http.get(API, "rabbitmqarchives", idle.archive)
    assert body["metadata"]["annotations"]["rbak.io/drill-now"] == m.group(1) and not body.get("status")
    assert r.stderr == (f"error: no rbak operator acted on the request within 3s: RabbitMQArchive "
                        f"default/{idle.archive} still has rbak.io/drill-now={m.group(1)} and its status is unchanged "
                        "since it was set (status.restoreDrill.lastManualTrigger is unset); the request stays: an "
                        f"operator that starts runs it. Is the operator running? {PODS}\n")


@pytest.mark.parametrize("args, error", [
    (["drill", "--archive", "{quiet}"], "RabbitMQArchive default/{quiet}: spec.verify.restoreDrill is not enabled "
                                        "(it needs a schedule): the operator runs no drill for it"),
    (["drill", "--archive", "nope"], 'RabbitMQArchive "nope" not found in namespace "default"'),
])
def test_an_archive_drill_that_cannot_run_is_refused_before_any_request(idle, args, error):
    r = run(idle, *[a.format(quiet=idle.quiet) for a in args])
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"error: {error.format(quiet=idle.quiet)}\n")
    assert "annotations" not in idle.http.get(API, "rabbitmqarchives", idle.quiet)["metadata"]


def test_a_restore_nobody_acts_on_is_named_within_the_pickup_timeout(idle):
    rname = f"{idle.name}-r1"
    r = run(idle, "restore", idle.name, "--backup-id", idle.backup_id, "--name", rname)
    assert r.returncode == 1, r
    assert r.stdout == f"rabbitmqrestore/{rname} created (backup {idle.backup_id} of rabbitmqbackup/{idle.name})\n"
    assert not idle.http.get(API, "rabbitmqrestores", rname).get("status")
    assert r.stderr == (f"error: no rbak operator acted on the request within 3s: RabbitMQRestore default/{rname} "
                        "has no status yet (an operator writes it on first sight); the object stays: an operator "
                        f"that starts restores it. Is the operator running? {PODS}\n")


def test_pickup_timeout_must_be_positive(idle):
    r = subprocess.run(["kubectl-rbak", "backup", idle.name, "--pickup-timeout", "0"], env=idle.env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "error: --pickup-timeout: must be a positive number of "
                                                         "seconds\n")
