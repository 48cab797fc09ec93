"""Shared helpers for the shipping tests: render the chart, validate manifests.

Everything here is offline: helm-python-sdk renders with Helm's own Go library,
kubernetes-validate checks against bundled Kubernetes JSON schemas.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from support.require import require_tool
import yaml
from support.crds import cel_failures

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rbak"
KUBE_VERSION = "1.33.0"  # a current Kubernetes release; the chart's kubeVersion allows >= 1.28
# Every built-in manifest is checked against the oldest version the chart allows,
# the current one, and the newest schemas kubernetes-validate bundles.
KUBE_VERSIONS = ("1.28.0", KUBE_VERSION, "latest")


def render_chart(values: dict[str, Any] | None = None, *, name: str = "rbak",
                 namespace: str = "rbak-system") -> dict[str, list[dict[str, Any]]]:
    """Render the chart like `helm template`: {template path: [manifest, ...]} (empty docs dropped)."""
    import copy

    return copy.deepcopy(_render_cached(json.dumps(values or {}, sort_keys=True), name, namespace))


@functools.lru_cache(maxsize=64)
def _render_cached(values_json: str, name: str, namespace: str) -> dict[str, list[dict[str, Any]]]:
    import helm_python

    helm_python.disable_logging()  # the Go library logs every followed symlink (files/crds)
    values = json.loads(values_json)

    chart = helm_python.Chart.load(str(CHART))
    try:
        chart.validate_schema(values or {})
        files = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
    finally:
        chart.close()
    out: dict[str, list[dict[str, Any]]] = {}
    for path, text in files.items():
        if path.endswith("NOTES.txt"):
            out[path] = [{"NOTES": text}]
            continue
        docs = [d for d in yaml.safe_load_all(text) if d]
        if docs:
            out[path] = docs
    return out


def manifests(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [d for path, docs in rendered.items() if not path.endswith("NOTES.txt") for d in docs]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None,
         namespace: str | None = None) -> list[dict[str, Any]]:
    return [
        o for o in objs
        if o["kind"] == kind
        and (name is None or o["metadata"]["name"] == name)
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]


def k8s_validate(obj: dict[str, Any]) -> None:
    """Strict offline validation of a built-in Kubernetes object; a clear one-line failure."""
    import kubernetes_validate

    for version in KUBE_VERSIONS:
        version = kubernetes_validate.latest_version() if version == "latest" else version
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = "/".join(str(p) for p in e.path)
            pytest.fail(f"Kubernetes {version}: {obj['kind']}/{obj['metadata'].get('name')}: {where}: {e.message}",
                        pytrace=False)


@functools.lru_cache(maxsize=1)
def _load_crds_cached() -> str:
    crds = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        crds[crd["spec"]["names"]["kind"]] = crd
    return json.dumps(crds)


def load_crds() -> dict[str, dict[str, Any]]:
    """The repo's crds/*.yaml by kind (a fresh copy each call)."""
    return json.loads(_load_crds_cached())


def canonical_json(obj: Any) -> str:
    """Type-strict comparison key (1 and 1.0 differ, key order does not)."""
    return json.dumps(obj, sort_keys=True)


def tool(name: str) -> str:
    """Path of a linter binary; under CI a missing one is a failure, locally a skip."""
    return require_tool(name)


def crd_schema(kind: str) -> dict[str, Any]:
    return load_crds()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _unknown_fields(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    """What `kubectl apply` (field validation Strict, the default since 1.27) rejects as unknown."""
    errors: list[str] = []
    if isinstance(value, dict) and not schema.get("x-kubernetes-preserve-unknown-fields"):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                continue
            if props is not None and key in props:
                errors += _unknown_fields(props[key], sub, f"{path}.{key}")
            elif isinstance(extra, dict):
                errors += _unknown_fields(extra, sub, f"{path}.{key}")
            elif props is not None or extra is False:
                errors.append(f"{path}.{key}: unknown field")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += _unknown_fields(schema["items"], item, f"{path}[{i}]")
    return errors


def crd_problems(obj: dict[str, Any]) -> list[str]:
    """Everything the API server (with kubectl's strict field validation) would refuse in a custom resource."""
    import jsonschema

    crd = load_crds()[obj["kind"]]
    version = crd["spec"]["versions"][0]
    problems = []
    want = f"{crd['spec']['group']}/{version['name']}"
    if obj.get("apiVersion") != want:
        problems.append(f"apiVersion {obj.get('apiVersion')!r} is not {want!r}")
    schema = version["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft7Validator(schema)
    problems += [f".{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    problems += _unknown_fields(schema, obj, "")
    problems += cel_failures(schema, obj)
    return problems


def flatten(rules: list[dict]) -> set[tuple[str, str, str]]:
    out = set()
    for rule in rules:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                for v in rule["verbs"]:
                    assert "*" not in (g, r, v), f"wildcard in {rule}"
                    out.add((g, r, v))
    return out


def granted(objs: list[dict], sa: str = "rbak-operator") -> tuple[set, dict[str, set]]:
    """(cluster-wide grants, {namespace: grants}) to the operator's service account."""
    def bound(binding):
        return any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in binding["subjects"])

    cluster = set()
    for b in find(objs, "ClusterRoleBinding"):
        if bound(b):
            cluster |= flatten(find(objs, "ClusterRole", b["roleRef"]["name"])[0]["rules"])
    per_ns: dict[str, set] = {}
    for b in find(objs, "RoleBinding"):
        if bound(b):
            ns = b["metadata"]["namespace"]
            role = find(objs, b["roleRef"]["kind"], b["roleRef"]["name"],
                        None if b["roleRef"]["kind"] == "ClusterRole" else ns)[0]
            per_ns.setdefault(ns, set()).update(flatten(role["rules"]))
    return cluster, per_ns


def prometheus_rules() -> list[dict[str, Any]]:
    """The chart's PrometheusRule alerts (charts/rbak/files/prometheus-rules.yaml)."""
    return yaml.safe_load((ROOT / "charts/rbak/files/prometheus-rules.yaml").read_text())
