"""Typed reads of manifest fields: what every part of manifest.json (and its rbak extensions) checks."""

from __future__ import annotations

from typing import Any

from ..errors import ManifestError


def type_ok(v: Any, typ: type) -> bool:
    if typ is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, typ)


def required(d: dict[str, Any], name: str, typ: type, where: str) -> Any:
    if not isinstance(d, dict):
        raise ManifestError(f"{where}: must be a JSON object")
    if name not in d or d[name] is None:
        raise ManifestError(f"{where}: missing required field '{name}'")
    v = d[name]
    if not type_ok(v, typ):
        raise ManifestError(f"{where}: field '{name}' must be {typ.__name__}, got {type(v).__name__}")
    return v


def optional(d: dict[str, Any], name: str, typ: type, where: str) -> Any:
    v = d.get(name)
    if v is None:
        return None
    if not type_ok(v, typ):
        raise ManifestError(f"{where}: field '{name}' must be {typ.__name__} or null, got {type(v).__name__}")
    return v
