"""Offline check of a SparkApplication against kubeflow spark-operator's own CRD schema.

``data/sparkapplication-v1beta2.schema.json`` is the CRD's openAPIV3Schema
(descriptions dropped; source commit inside). An object is checked as the API
server would with ``fieldValidation=Strict`` (kubectl's default): the OpenAPI
part with jsonschema, fields the schema does not declare are errors (a
structural schema would silently prune them), and CEL rules with cel-python.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

from support.crds import cel_failures

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "operator" / "data" / "sparkapplication-v1beta2.schema.json"


@functools.cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())["openAPIV3Schema"]


def unknown_fields(node: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Fields of ``value`` that ``node`` does not declare (where it declares its properties)."""
    out: list[str] = []
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return out
    if isinstance(value, dict):
        props = node.get("properties")
        extra = node.get("additionalProperties")
        for key, sub in value.items():
            child = (props or {}).get(key)
            if child is None and isinstance(extra, dict):
                child = extra
            if child is None:
                if props is not None or extra is False:
                    out.append(f"{path}.{key}: unknown field")
                continue
            out += unknown_fields(child, sub, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            out += unknown_fields(node["items"], item, f"{path}[{i}]")
    return out


def problems(app: dict[str, Any]) -> list[str]:
    """Everything the API server (with spark-operator's CRD installed) would refuse in ``app``."""
    s = schema()
    errs = [f"{'.'.join(map(str, e.absolute_path)) or '.'}: {e.message}"
            for e in jsonschema.Draft7Validator(s).iter_errors(app)]
    # metadata is the API server's own (ObjectMeta); the CRD schema only says "object".
    body = {k: v for k, v in app.items() if k != "metadata"}
    return errs + unknown_fields(s, body) + cel_failures(s, app)
