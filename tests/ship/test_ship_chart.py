"""charts/rbak renders, lints and validates offline for realistic value sets."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from support.dockerfile import parse
from support.ship import (CHART, ROOT, KUBE_VERSION, canonical_json, find, k8s_validate, load_crds,
                          manifests, render_chart)

VALUE_SETS = {
    "defaults": {},
    "ha-namespaced": {
        "operator": {"replicas": 2},
        "watchNamespaces": ["messaging", "payments"],
        "serviceAccount": {"backupJob": {"annotations": {
            "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/rbak-backups"}}},
    },
    "monitoring-spark-digest": {
        "image": {"repository": "registry.example.com/platform/rbak",
                  "digest": "sha256:" + "ab" * 32},
        "spark": {"enabled": True},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
        "operator": {"resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                     "nodeSelector": {"kubernetes.io/os": "linux"},
                     "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}]},
    },
    "crds-elsewhere-no-metrics-pvc": {"crds": {"install": False}, "metrics": {"enabled": False},
                                      "fullnameOverride": "backup-operator",
                                      "operator": {"backupClaims": ["rabbit-backups"]}},
}

# The prometheus-operator ServiceMonitor is not a built-in kind: check the fields we set.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object", "properties": {"matchLabels": {"type": "object"}}},
                "namespaceSelector": {"type": "object", "properties": {"matchNames": {"type": "array"}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                   "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                                   "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}}}},
            },
        },
    },
}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request):
    return request.param, render_chart(VALUE_SETS[request.param])


def test_helm_lint_strict_is_clean():
    import helm_python

    for name, values in VALUE_SETS.items():
        report = helm_python.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}")
        assert report["errors"] == [] and report["messages"] == [], (name, report)


def validate_any(obj: dict) -> None:
    """Built-in kinds against Kubernetes' schemas, custom ones against their CRD's schema."""
    import jsonschema

    custom = load_crds()
    if obj["kind"] == "ServiceMonitor":
        jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
    elif obj["kind"] in custom:
        crd = custom[obj["kind"]]
        assert obj["apiVersion"] == f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}"
        assert ("namespace" in obj["metadata"]) == (crd["spec"]["scope"] == "Namespaced"), obj["metadata"]
        jsonschema.validate(obj, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    else:
        k8s_validate(obj)


def test_every_manifest_is_valid_for_kubernetes(rendered):
    _, out = rendered
    objs = manifests(out)
    assert objs
    for obj in objs:
        validate_any(obj)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "rbak"
        if obj["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"].get("namespace"), f"{obj['kind']}/{obj['metadata']['name']} has no namespace"


def test_values_schema_rejects_typos_and_bad_values():
    import helm_python

    bad = [
        ({"operator": {"replica": 2}}, "replica"),
        ({"operator": {"replicas": 0}}, "replicas"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"image": {"digest": "latest"}}, "digest"),
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "interval"),
        ({"operator": {"logLevel": "verbose"}}, "logLevel"),
        ({"operator": {"evidenceRecheckSeconds": 5}}, "evidenceRecheckSeconds"),
    ]
    chart = helm_python.Chart.load(str(CHART))
    try:
        for values, key in bad:
            with pytest.raises(helm_python.HelmValuesError, match=key):
                chart.validate_schema(values)
    finally:
        chart.close()


def test_chart_crds_are_the_repo_crds(tmp_path):
    """One source of truth: charts/rbak/files/crds links to crds/ (generated by the operator),
    and the packaged chart carries byte-identical copies."""
    import tarfile

    import helm_python

    link = CHART / "files" / "crds"
    assert link.is_symlink() and link.resolve() == (ROOT / "crds").resolve()
    assert not os.path.isabs(os.readlink(link)), "a relative link survives clones and Argo CD checkouts"
    repo = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    assert set(repo) == {"rabbitmqbackups.yaml", "rabbitmqrestores.yaml", "rabbitmqarchives.yaml"}
    chart = helm_python.Chart.load(str(CHART))
    try:
        archive = chart.save(str(tmp_path))
    finally:
        chart.close()
    with tarfile.open(archive) as tar:
        packaged = {m.name.rsplit("/", 1)[1]: tar.extractfile(m).read()
                    for m in tar.getmembers() if m.name.startswith("rbak/files/crds/") and m.isfile()}
    assert packaged == repo


def test_rendered_crds_equal_the_repo_crds_plus_keep_policy():
    objs = manifests(render_chart({}))
    crds = {o["spec"]["names"]["kind"]: o for o in find(objs, "CustomResourceDefinition")}
    repo = load_crds()
    assert set(crds) == set(repo) == {"RabbitMQBackup", "RabbitMQRestore", "RabbitMQArchive"}
    for kind, crd in crds.items():
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert canonical_json(crd["spec"]) == canonical_json(repo[kind]["spec"]), f"{kind} spec changed in rendering"
        assert crd["metadata"]["name"] == repo[kind]["metadata"]["name"]
        for key, value in repo[kind]["metadata"].get("labels", {}).items():
            assert crd["metadata"]["labels"][key] == value
        assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}, (
            "status subresource keeps status out of GitOps diffs")

    none = manifests(render_chart({"crds": {"install": False}}))
    assert find(none, "CustomResourceDefinition") == []
    nokeep = find(manifests(render_chart({"crds": {"keep": False}})), "CustomResourceDefinition")
    assert all("helm.sh/resource-policy" not in (c["metadata"].get("annotations") or {}) for c in nokeep)


def test_pod_security_matches_the_image_user():
    df = parse(ROOT / "Dockerfile")
    uid, _, gid = df.effective("runtime", "USER").value.partition(":")
    dep = find(manifests(render_chart({})), "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["securityContext"]["runAsGroup"] == int(gid)
    c = pod["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def operator_env(objs) -> dict[str, str]:
    """name: value, or "fieldRef:<path>" for a downward API field."""
    c = find(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == ["operator"]
    return {e["name"]: e["value"] if "value" in e else f"fieldRef:{e['valueFrom']['fieldRef']['fieldPath']}"
            for e in c["env"]}


LEASE_ENV = ("RBAK_LEASE_NAME", "RBAK_LEASE_NAMESPACE", "POD_NAME", "POD_NAMESPACE")


def test_single_replica_is_standalone_and_recreated():
    objs = manifests(render_chart({}))
    dep = find(objs, "Deployment")[0]
    env = operator_env(objs)
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    assert env["RBAK_OPERATOR_STANDALONE"] == "1"
    assert not set(LEASE_ENV) & set(env), "a single replica elects no leader"
    assert env["RBAK_OPERATOR_NAMESPACES"] == ""  # all namespaces
    assert find(objs, "Role") == [] and find(objs, "RoleBinding") == []


def lease_role(objs: list[dict], namespace: str) -> dict:
    """The Role bound to the operator that grants leases, in ``namespace`` (exactly one)."""
    roles = [r for r in find(objs, "Role") if r["metadata"]["namespace"] == namespace
             and any("leases" in rule["resources"] for rule in r["rules"])]
    assert len(roles) == 1, roles
    binding = [b for b in find(objs, "RoleBinding") if b["metadata"]["namespace"] == namespace
               and b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                    "name": roles[0]["metadata"]["name"]}]
    assert len(binding) == 1 and binding[0]["subjects"] == [
        {"kind": "ServiceAccount", "name": "rbak-operator", "namespace": "rbak-system"}], binding
    return roles[0]


@pytest.mark.parametrize("watch", [[], ["messaging", "payments"]], ids=["all-namespaces", "namespaced"])
def test_two_replicas_elect_a_leader_on_a_lease_and_spread(watch):
    objs = manifests(render_chart({**VALUE_SETS["ha-namespaced"], "watchNamespaces": watch}))
    dep = find(objs, "Deployment")[0]
    spec = dep["spec"]["template"]["spec"]
    env = operator_env(objs)
    assert dep["spec"]["replicas"] == 2
    assert "RBAK_OPERATOR_STANDALONE" not in env
    # the Lease lives in the release namespace whatever is watched; each pod is named by the downward API
    assert {k: env[k] for k in LEASE_ENV} == {
        "RBAK_LEASE_NAME": "rbak", "RBAK_LEASE_NAMESPACE": "rbak-system",
        "POD_NAME": "fieldRef:metadata.name", "POD_NAMESPACE": "fieldRef:metadata.namespace"}
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate",
                                       "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert "podAntiAffinity" in spec["affinity"]
    assert env["RBAK_OPERATOR_NAMESPACES"] == ",".join(watch)
    role = lease_role(objs, "rbak-system")
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "update"]}]
    assert not [r for r in find(objs, "ClusterRole") for rule in r["rules"] if "leases" in rule["resources"]]


def test_leader_election_values_name_the_lease_and_force_it_on():
    objs = manifests(render_chart({"operator": {"leaderElection": {"enabled": True, "leaseName": "backups-leader"}}},
                                  namespace="ops"))
    env = operator_env(objs)
    assert find(objs, "Deployment")[0]["spec"]["replicas"] == 1
    assert env["RBAK_LEASE_NAME"] == "backups-leader" and env["RBAK_LEASE_NAMESPACE"] == "ops"
    assert "RBAK_OPERATOR_STANDALONE" not in env
    role = [r for r in find(objs, "Role") if r["metadata"]["namespace"] == "ops"]
    assert [rule["resources"] for r in role for rule in r["rules"]] == [["leases"]]
    named = manifests(render_chart({"operator": {"replicas": 2}, "fullnameOverride": "backup-operator"}))
    assert operator_env(named)["RBAK_LEASE_NAME"] == "backup-operator"


def test_no_kopf_peering_anywhere():
    """Leader election needs no CRD: the chart has no crds/ folder, and nothing renders a kopf.dev object."""
    import helm_python

    chart = helm_python.Chart.load(str(CHART))
    try:
        assert chart.crds == []
    finally:
        chart.close()
    assert not (CHART / "crds").exists()
    for values in [*VALUE_SETS.values(), {"operator": {"replicas": 2}}]:
        for obj in manifests(render_chart(values)):
            assert not obj["apiVersion"].startswith("kopf.dev/"), obj["kind"]
            for rule in obj.get("rules") or []:
                assert "kopf.dev" not in rule["apiGroups"], (obj["kind"], rule)


def test_every_operator_env_var_the_chart_sets_is_read_by_the_operator():
    import re

    source = "\n".join(p.read_text() for p in (ROOT / "operator" / "rbak_operator").rglob("*.py"))
    read = set(re.findall(r"\b(?:environ|env)\.get\(\s*[\"']([A-Z0-9_]+)[\"']", source))
    assert {"RBAK_OPERATOR_NAMESPACES", "RBAK_LEASE_NAME", "POD_NAME"} <= read  # the pattern sees reads
    for values in VALUE_SETS.values():
        for name in operator_env(manifests(render_chart(values))):
            assert name in read, f"the chart sets {name} but operator/rbak_operator never reads it"


def test_evidence_recheck_interval_reaches_the_operator_env():
    env = operator_env(manifests(render_chart({"operator": {"evidenceRecheckSeconds": 900}})))
    assert env["RBAK_OPERATOR_EVIDENCE_RECHECK_SECONDS"] == "900"
    assert operator_env(manifests(render_chart({})))["RBAK_OPERATOR_EVIDENCE_RECHECK_SECONDS"] == "3600"


def test_watched_namespaces_get_roles_and_job_accounts_there_only():
    objs = manifests(render_chart(VALUE_SETS["ha-namespaced"]))
    # a Role per watched namespace, and (two replicas) the Lease's Role in the release namespace
    roles = [r for r in find(objs, "Role") if r is not lease_role(objs, "rbak-system")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["messaging", "payments"]
    for rb in find(objs, "RoleBinding"):
        assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "rbak-operator", "namespace": "rbak-system"}]
    cluster = find(objs, "ClusterRole")[0]
    cluster_resources = {r for rule in cluster["rules"] for r in rule["resources"]}
    assert "rabbitmqbackups" not in cluster_resources and "jobs" not in cluster_resources, (
        "namespaced permissions must not be granted cluster-wide when watchNamespaces is set")
    jobs = [sa for sa in find(objs, "ServiceAccount") if sa["metadata"]["name"] == "rbak-job"]
    assert sorted(sa["metadata"]["namespace"] for sa in jobs) == ["messaging", "payments"]
    for sa in jobs:
        assert sa["automountServiceAccountToken"] is False
        assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith("role/rbak-backups")
    bound = {s["name"] for b in find(objs, "RoleBinding") + find(objs, "ClusterRoleBinding") for s in b["subjects"]}
    assert "rbak-job" not in bound, "backup Jobs need no Kubernetes API access"


def test_all_namespaces_uses_one_cluster_role():
    objs = manifests(render_chart({}))
    assert find(objs, "Role") == [] and find(objs, "RoleBinding") == []
    cluster = find(objs, "ClusterRole")[0]
    assert any("rabbitmqbackups" in rule["resources"] for rule in cluster["rules"])


def test_metrics_service_and_service_monitor():
    objs = manifests(render_chart(VALUE_SETS["monitoring-spark-digest"]))
    svc = find(objs, "Service")[0]
    dep = find(objs, "Deployment")[0]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics" and ports["metrics"] == svc["spec"]["ports"][0]["port"]
    sm = find(objs, "ServiceMonitor")[0]
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()

    assert operator_env(objs)["RBAK_METRICS_PORT"] == str(svc["spec"]["ports"][0]["port"])
    off = manifests(render_chart(VALUE_SETS["crds-elsewhere-no-metrics-pvc"]))
    assert find(off, "Service") == [] and find(off, "ServiceMonitor") == []
    assert operator_env(off)["RBAK_METRICS_PORT"] == "0"  # 0 disables the operator's metrics server
    assert "metrics" not in {p["name"] for p in find(off, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["ports"]}


def test_image_digest_and_spark_image():
    objs = manifests(render_chart(VALUE_SETS["monitoring-spark-digest"]))
    c = find(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    digest = "registry.example.com/platform/rbak@sha256:" + "ab" * 32
    assert c["image"] == digest
    env = operator_env(objs)
    assert env["RBAK_IMAGE"] == digest
    default = find(manifests(render_chart({})), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert default["image"] == "ghcr.io/rbak/rbak:0.1.0"


def test_notes_render_the_essentials():
    out = render_chart(VALUE_SETS["ha-namespaced"])
    notes = next(d for p, docs in out.items() if p.endswith("NOTES.txt") for d in docs)["NOTES"]
    assert "messaging, payments" in notes and "kubectl get rabbitmqbackups" in notes
    assert "leader election on Lease rbak-system/rbak (one active, others standby)" in notes
    single = render_chart({})
    assert "Lease" not in next(d for p, docs in single.items() if p.endswith("NOTES.txt") for d in docs)["NOTES"]


def test_values_reference_in_the_chart_readme_is_generated_and_current():
    import importlib.util

    spec = importlib.util.spec_from_file_location("values_doc", CHART / "hack" / "values_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    readme = (CHART / "README.md").read_text()
    assert mod.render(readme) == readme, "charts/rbak/README.md is stale: run python charts/rbak/hack/values_doc.py"
    documented = {row[0] for row in mod.rows(json.loads((CHART / "values.schema.json").read_text()),
                                              yaml.safe_load((CHART / "values.yaml").read_text()))}
    assert {"image.repository", "watchNamespaces", "operator.replicas", "metrics.serviceMonitor.enabled"} <= documented


def test_values_yaml_has_no_key_the_schema_does_not_describe():
    def walk(values, schema, path=""):
        for key, value in values.items():
            props = schema.get("properties") or {}
            assert key in props or schema.get("additionalProperties") not in (False, None), f"{path}{key}"
            if isinstance(value, dict) and props.get(key, {}).get("additionalProperties") is False:
                walk(value, props[key], f"{path}{key}.")

    walk(yaml.safe_load((CHART / "values.yaml").read_text()), json.loads((CHART / "values.schema.json").read_text()))


def test_backup_claims_are_mounted_where_the_operator_looks_for_them():
    objs = manifests(render_chart(VALUE_SETS["crds-elsewhere-no-metrics-pvc"]))
    pod = find(objs, "Deployment")[0]["spec"]["template"]["spec"]
    env = operator_env(objs)
    root = env["RBAK_OPERATOR_PVC_ROOT"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    # storage_access.open_backup_storage reads <RBAK_OPERATOR_PVC_ROOT>/<claimName>/<path>
    assert {mounts[n] for n in claims} == {f"{root}/rabbit-backups"}
    assert "RBAK_OPERATOR_PVC_ROOT" not in operator_env(manifests(render_chart({})))
