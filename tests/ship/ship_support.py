"""Shared helpers for the shipping tests: render the chart, validate manifests.

Everything here is offline: helm-python-sdk renders with Helm's own Go library,
kubernetes-validate checks against bundled Kubernetes JSON schemas.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rbak"
KUBE_VERSION = "1.33.0"  # a current Kubernetes release; the chart's kubeVersion allows >= 1.28


def render_chart(values: dict[str, Any] | None = None, *, name: str = "rbak",
                 namespace: str = "rbak-system") -> dict[str, list[dict[str, Any]]]:
    """Render the chart like `helm template`: {template path: [manifest, ...]} (empty docs dropped)."""
    import helm_python

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

    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = "/".join(str(p) for p in e.path)
        pytest.fail(f"{obj['kind']}/{obj['metadata'].get('name')}: {where}: {e.message}", pytrace=False)


def load_crds() -> dict[str, dict[str, Any]]:
    """The repo's crds/*.yaml by kind."""
    crds = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        crds[crd["spec"]["names"]["kind"]] = crd
    return crds


def canonical_json(obj: Any) -> str:
    """Type-strict comparison key (1 and 1.0 differ, key order does not)."""
    return json.dumps(obj, sort_keys=True)


def tool(name: str) -> str | None:
    """Path of a linter binary; under CI a missing one is a failure, locally a skip."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{name} is not installed but CI=true: .ci/setup must install it")
        pytest.skip(f"{name} not installed")
    return path
