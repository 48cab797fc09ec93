"""Evaluating a CRD's x-kubernetes-validations (CEL) rules as the API server does on create.

Shared by the operator's CRD tests and the ship tests (examples, chart values).
"""

from __future__ import annotations

from typing import Any


def cel_failures(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Every failing rule under ``schema`` for ``value`` (rules using oldSelf are update-only: skipped)."""
    import celpy

    errors: list[str] = []
    rules = [r for r in schema.get("x-kubernetes-validations") or [] if "oldSelf" not in r["rule"]]
    if rules:
        env = celpy.Environment()
        for rule in rules:
            program = env.program(env.compile(rule["rule"]))
            if not bool(program.evaluate({"self": celpy.json_to_cel(value)})):
                errors.append(f"{path or '.'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for key, sub in value.items():
            child = (schema.get("properties") or {}).get(key)
            if child is None and isinstance(schema.get("additionalProperties"), dict):
                child = schema["additionalProperties"]
            if child:
                errors += cel_failures(child, sub, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += cel_failures(schema["items"], item, f"{path}[{i}]")
    return errors
