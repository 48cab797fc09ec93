"""The shipped CRDs, chart and examples against a real Kubernetes API server, driven by kubectl.

Everything offline (YAML loaded, schemas checked by jsonschema, CEL evaluated by a Python
library) passed while every real cluster refused the backup CRD: here the upstream
server compiles the CEL rules, validates objects, renders printer columns and answers
`kubectl explain`, so what these tests see is what a user's cluster does.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from support.dotted import DEL, set_path
from support.kubeapi import KubeApi
from support.ship import manifests, render_chart

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
EXAMPLES = ROOT / "examples"
BACKUP_CRD = "rabbitmqbackups.rbak.io"
RESTORE_CRD = "rabbitmqrestores.rbak.io"
ARCHIVE_CRD = "rabbitmqarchives.rbak.io"


@pytest.fixture(scope="module")
def kube(kube_api: KubeApi) -> Iterator[KubeApi]:
    """The server with crds/ applied as shipped (and established)."""
    kube_api.kubectl("apply", "-f", str(CRDS))
    kube_api.wait_established(BACKUP_CRD, RESTORE_CRD, ARCHIVE_CRD)
    yield kube_api
    for ns in _made:  # the operator tests on this server must not reconcile these (unreachable storages)
        kube_api.delete_rbak_objects(ns)


_made: list[str] = []


def _namespace(kube: KubeApi) -> str:
    ns = f"t-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", ns)
    _made.append(ns)
    return ns


def _backup(name: str, **spec) -> dict:
    """The documented nightly backup (a valid object), renamed, with ``spec`` fields replaced."""
    obj = yaml.safe_load((ROOT / "docs" / "examples" / "rabbitmqbackup-cluster-s3.yaml").read_text())
    obj["metadata"] = {"name": name}
    obj["spec"].update(spec)
    return obj


def _apply(kube: KubeApi, ns: str, obj: dict, check: bool = True):
    return kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj), check=check)


def test_shipped_crds_are_accepted_and_established(kube: KubeApi):
    """`kubectl apply -f crds/` as a user does: the server compiles every CEL rule."""
    out = kube.kubectl("get", "crd", BACKUP_CRD, RESTORE_CRD, ARCHIVE_CRD, "-o", "json").stdout
    for crd in json.loads(out)["items"]:
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds.get("Established") == "True", crd["metadata"]["name"]
        assert conds.get("NamesAccepted") == "True", crd["metadata"]["name"]
        assert "NonStructuralSchema" not in conds, crd["status"]["conditions"]
    # the same files again are unchanged (idempotent apply, nothing the server rewrote away)
    again = kube.kubectl("apply", "-f", str(CRDS)).stdout
    assert again.count("unchanged") == 3, again


def test_crds_server_side_apply(kube: KubeApi):
    r = kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    assert "serverside-applied" in r.stdout, r.stdout


@pytest.mark.parametrize("values", [{}, {"operator": {"replicas": 2}}], ids=["one-replica", "two-replicas"])
def test_chart_rendered_applies_server_side(kube: KubeApi, values: dict):
    """`helm template` piped to `kubectl apply --server-side`: every kind this server serves (with two
    replicas also the Lease Role and the downward-API env of leader election)."""
    ns = _namespace(kube)
    objs = manifests(render_chart(values, namespace=ns))
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"} <= kinds
    if values:
        assert {"Role", "RoleBinding"} <= kinds
    # monitoring.coreos.com (Prometheus operator) is not installed here, as on many clusters
    served = [o for o in objs if not o["apiVersion"].startswith("monitoring.coreos.com/")]
    text = yaml.safe_dump_all(served)
    r = kube.kubectl("apply", "--server-side", "--field-manager=helm", "-n", ns, "-f", "-", input=text)
    assert r.stdout.count("serverside-applied") == len(served), r.stdout
    dep = json.loads(kube.kubectl("get", "deployment", "-n", ns, "-o", "json", "--show-managed-fields").stdout)["items"]
    assert [d["metadata"]["name"] for d in dep] == [o["metadata"]["name"] for o in served if o["kind"] == "Deployment"]
    managers = {m["manager"] for m in dep[0]["metadata"]["managedFields"]}
    assert "helm" in managers
    env = {e["name"]: e for e in dep[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    if values:
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["RBAK_LEASE_NAMESPACE"]["value"] == ns and "RBAK_OPERATOR_STANDALONE" not in env
        roles = json.loads(kube.kubectl("get", "roles", "-n", ns, "-o", "json").stdout)["items"]
        assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]} in [
            r for role in roles for r in role["rules"]], roles
    else:
        assert env["RBAK_OPERATOR_STANDALONE"]["value"] == "1"
    # applying the same manifests again changes nothing
    r = kube.kubectl("apply", "--server-side", "--field-manager=helm", "-n", ns, "-f", "-", input=text)
    assert r.returncode == 0


def test_examples_apply_one_by_one_and_as_kustomize_overlay(kube: KubeApi):
    ns = _namespace(kube)
    files = sorted(EXAMPLES.glob("*.yaml"))
    files = [f for f in files if f.name != "kustomization.yaml"]
    assert len(files) >= 3
    for f in files:
        r = kube.kubectl("apply", "-n", ns, "-f", str(f))
        assert "created" in r.stdout, (f, r.stdout)
    # the overlay puts everything into its own namespace
    overlay_ns = yaml.safe_load((EXAMPLES / "kustomization.yaml").read_text())["namespace"]
    kube.kubectl("create", "namespace", overlay_ns, check=False)
    r = kube.kubectl("apply", "-k", str(EXAMPLES))
    docs = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    want = sorted(f"{d['kind'].lower()}.rbak.io/{d['metadata']['name']}" for d in docs)
    assert sorted(line.split()[0] for line in r.stdout.splitlines()) == want, r.stdout
    assert all(line.endswith(" created") for line in r.stdout.splitlines()), r.stdout
    got = kube.kubectl("get", "rabbitmqbackups,rabbitmqrestores,rabbitmqarchives", "-n", overlay_ns, "-o", "name").stdout.split()
    assert sorted(got) == want, got


@pytest.mark.parametrize("path", sorted((ROOT / "docs" / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_docs_examples_apply(kube: KubeApi, path: Path):
    ns = _namespace(kube)
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for d in docs:  # they name their own namespace
        d["metadata"]["namespace"] = ns
    r = kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    assert r.stdout.count(" created") == len(docs), r.stdout


def _refused(kube: KubeApi, obj: dict) -> str:
    ns = _namespace(kube)
    r = _apply(kube, ns, obj, check=False)
    assert r.returncode != 0, f"the server accepted {obj}: {r.stdout}"
    assert "is invalid" in r.stderr, r.stderr
    assert kube.kubectl("get", "rabbitmqbackups", "-n", ns, "-o", "name").stdout == ""
    return r.stderr



# (field, value, what the API server says): every kind of rule the schema claims.
BAD_BACKUPS = [
    ("spec.schedule", "0 30 2 * * *",
     'spec.schedule: Invalid value: "0 30 2 * * *": schedule must be a standard 5-field cron expression'),
    ("spec.schedule", "30 2 * *", "6-field values with a leading seconds field are not supported"),
    ("spec.verify.restoreDrill.schedule", "0 30 2 * * 0",
     'spec.verify.restoreDrill.schedule: Invalid value: "0 30 2 * * 0": schedule must be a standard 5-field cron'),
    ("spec.broker.rabbitmqClusterReference.managementScheme", "ftp",
     'spec.broker.rabbitmqClusterReference.managementScheme: Unsupported value: "ftp": supported values: "http", "https"'),
    ("spec.concurrencyPolicy", "Sometimes", 'spec.concurrencyPolicy: Unsupported value: "Sometimes"'),
    ("spec.compressionLevel", 23,
     "spec.compressionLevel: Invalid value: 23: spec.compressionLevel in body should be less than or equal to 22"),
    ("spec.startingDeadlineSeconds", -1, "should be greater than or equal to 0"),
    ("spec.retention.maxAge", "1 month", "spec.retention.maxAge in body should match"),
    ("spec.storage", DEL, "spec.storage: Required value"),
    ("spec.broker.amqpUrl", "amqp://h:5672/%2f",
     "set exactly one of broker.rabbitmqClusterReference or broker.amqpUrl"),
    ("spec.timeZone", "Europe Berlin", "spec.timeZone in body should match"),
    ("spec.suspend", "yes", "spec.suspend: Invalid value: \"string\": spec.suspend in body must be of type boolean"),
]




@pytest.mark.parametrize("field, value, message", BAD_BACKUPS, ids=[f"{f}={v!r}"[:60] for f, v, _ in BAD_BACKUPS])
def test_server_refuses_bad_backup(kube: KubeApi, field: str, value, message: str):
    obj = _backup("bad")
    if field.startswith("spec.verify."):
        obj["spec"]["verify"] = {"restoreDrill": {"schedule": "0 3 * * 0"}}
    err = _refused(kube, set_path(obj, field, value))
    assert message in err, err


def test_the_valid_base_of_the_bad_backups_is_accepted(kube: KubeApi):
    ns = _namespace(kube)
    obj = _backup("good")
    obj["spec"]["verify"] = {"restoreDrill": {"schedule": "0 3 * * 0"}}
    assert "created" in _apply(kube, ns, obj).stdout


@pytest.mark.parametrize("schedule", ["0 2 * * *", "@daily", " */5 * * * * ", "0\t2\t*\t*\t1-5", "@hourly"])
def test_server_accepts_five_field_cron_and_macros(kube: KubeApi, schedule: str):
    ns = _namespace(kube)
    _apply(kube, ns, _backup("ok", schedule=schedule))
    got = json.loads(kube.kubectl("get", "rabbitmqbackup", "ok", "-n", ns, "-o", "json").stdout)
    assert got["spec"]["schedule"] == schedule


def test_server_refuses_missing_spec_and_unknown_fields(kube: KubeApi):
    err = _refused(kube, {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQBackup", "metadata": {"name": "nospec"}})
    assert "spec: Required value" in err, err
    ns = _namespace(kube)
    obj = _backup("typo", schedul="0 2 * * *")
    r = kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj), check=False)
    assert r.returncode != 0 and 'unknown field "spec.schedul"' in r.stderr, r.stderr


def test_server_refuses_bad_restores(kube: KubeApi):
    ns = _namespace(kube)
    restore = yaml.safe_load((ROOT / "docs" / "examples" / "rabbitmqrestore-pitr.yaml").read_text())
    restore["metadata"] = {"name": "r"}
    both = {**restore, "spec": {**restore["spec"], "storage": {"pvc": {"claimName": "x"}}}}
    r = kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(both), check=False)
    assert r.returncode != 0 and "set exactly one of spec.backupRef, spec.storage or spec.archiveRef" in r.stderr, r.stderr
    kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(restore))
    # immutable once created (a CEL transition rule: the server compares with the stored object)
    changed = {**restore, "spec": {**restore["spec"], "dryRun": not restore["spec"].get("dryRun", False)}}
    r = kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(changed), check=False)
    assert r.returncode != 0 and "a RabbitMQRestore is immutable: create a new one" in r.stderr, r.stderr


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_get_columns_render_as_text_without_invalid(kube: KubeApi):
    """`kubectl get` and `-o wide` after the operator wrote a status with a future next run."""
    ns = _namespace(kube)
    _apply(kube, ns, _backup("nightly", schedule="0 2 * * *"))
    now = datetime.now(timezone.utc)
    nxt, last = now + timedelta(hours=5), now - timedelta(hours=3)
    status = {"status": {"phase": "Scheduled", "nextScheduleTime": _iso(nxt), "lastSuccessfulTime": _iso(last),
                         "lastBackupId": "20260101T020000Z-abc", "lastRun": {"messages": 42, "size": "1.2 MiB"}}}
    kube.kubectl("patch", "rabbitmqbackup", "nightly", "-n", ns, "--subresource=status", "--type=merge",
                 "-p", json.dumps(status))
    plain = kube.kubectl("get", "rabbitmqbackups", "-n", ns).stdout
    wide = kube.kubectl("get", "rabbitmqbackups", "-n", ns, "-o", "wide").stdout
    for out in (plain, wide):
        assert "<invalid>" not in out, out
        header, row = out.splitlines()[:2]
        assert header.split()[:3] == ["NAME", "PHASE", "SCHEDULE"], out
        assert "NEXT RUN" in header, out
        assert row.startswith("nightly") and "Scheduled" in row and "0 2 * * *" in row, out
        assert _iso(nxt) in row, out  # the future time, as a time
        assert "20260101T020000Z-abc" in row and " 42 " in row and "1.2 MiB" in row, out
    assert "LAST SUCCESS" in wide and "LAST SUCCESS" not in plain
    # the past time is an age: "3h" (or "179m"/"3h1m" around a boundary)
    row = wide.splitlines()[1]
    assert re.search(r"\s(3h\d*m?|17\dm|18\dm)\s", row), wide


def test_status_subresource_keeps_status_apart(kube: KubeApi):
    ns = _namespace(kube)
    _apply(kube, ns, _backup("st"))
    kube.kubectl("patch", "rabbitmqbackup", "st", "-n", ns, "--type=merge", "-p", '{"status": {"phase": "Failed"}}')
    got = json.loads(kube.kubectl("get", "rabbitmqbackup", "st", "-n", ns, "-o", "json").stdout)
    assert "status" not in got or got["status"].get("phase") != "Failed", got
    kube.kubectl("patch", "rabbitmqbackup", "st", "-n", ns, "--subresource=status", "--type=merge",
                 "-p", '{"status": {"phase": "Failed"}}')
    got = json.loads(kube.kubectl("get", "rabbitmqbackup", "st", "-n", ns, "-o", "json").stdout)
    assert got["status"]["phase"] == "Failed"


def test_kubectl_explain_backup_spec(kube: KubeApi):
    out = kube.kubectl("explain", "rabbitmqbackup.spec").stdout
    assert "KIND:       RabbitMQBackup" in out or "KIND:" in out and "RabbitMQBackup" in out, out
    assert "What to back up, where, and when." in out, out
    for f in ("schedule", "broker", "storage"):
        assert re.search(rf"^\s+{f}\s", out, re.MULTILINE), (f, out)
    sched = kube.kubectl("explain", "rabbitmqbackup.spec.schedule").stdout
    assert "5-field cron" in sched, sched


def test_kopf_sees_namespaces_and_the_crds_in_discovery(kube: KubeApi):
    """What kopf waits for: namespaces in /api/v1 and the CRD groups in /apis (unaggregated); and
    coordination.k8s.io, where leader election keeps its Lease."""
    assert any(r["name"] == "namespaces" for r in kube.get("/api/v1")["resources"])
    groups = {g["name"] for g in kube.get("/apis")["groups"]}
    assert {"rbak.io", "coordination.k8s.io", "apiextensions.k8s.io", "batch", "apps",
            "rbac.authorization.k8s.io"} <= groups
    res = {r["name"] for r in kube.get("/apis/rbak.io/v1alpha1")["resources"]}
    assert {"rabbitmqbackups", "rabbitmqbackups/status", "rabbitmqrestores", "rabbitmqrestores/status"} <= res
