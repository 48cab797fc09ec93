"""The configuration reference (docs/configuration.md) and JSON schema, generated from the model."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from typing import Any, Literal, Union

from .model import Config
from .validation import _hints, _join

# --------------------------------------------------------------------------
# Reference export (README and JSON schema), generated from the dataclasses.
# --------------------------------------------------------------------------


_UNION_ORDER = ("string", "integer", "number", "boolean")


def _field_type_str(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        # sorted: typing caches Union[int, str] and Union[str, int] as one object, so the
        # order of ``args`` depends on which was built first in this process
        names = sorted((_field_type_str(a) for a in args if a is not type(None)),
                       key=lambda n: (_UNION_ORDER.index(n) if n in _UNION_ORDER else len(_UNION_ORDER), n))
        return " or ".join(names)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {_field_type_str(args[0])}"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "section"
    return {int: "integer", str: "string", float: "number", bool: "boolean"}.get(tp, str(tp))


def _default_str(f: dataclasses.Field) -> str:
    if f.metadata.get("required"):
        return "**required**"
    if f.default_factory is not dataclasses.MISSING:
        v = f.default_factory()
        if dataclasses.is_dataclass(v):
            return ""
        return f"`{v!r}`".replace("'", '"') if v else ("`[]`" if isinstance(v, list) else "`{}`")
    if f.default is None:
        return "unset"
    if isinstance(f.default, bool):
        return f"`{str(f.default).lower()}`"
    return f"`{f.default}`"


def iter_fields(cls: type = Config, path: str = ""):
    """(key path, field, type) for every field, depth first."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        p = _join(path, f.name)
        yield p, f, tp
        inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] or ([tp] if dataclasses.is_dataclass(tp) else [])
        for sub in inner:
            yield from iter_fields(typing.cast(type, sub), p)  # a config section: a dataclass, not an instance


def config_reference_markdown() -> str:
    """The configuration reference as Markdown (one table per section)."""
    lines = ["## Configuration reference", "",
             "Generated from `rbak/config/` (`python -m rbak.config`). Strings accept `${VAR}` and "
             "`${VAR:-default}`; secrets are masked in every log and error.", ""]

    def section(cls: type, path: str) -> None:
        title = f"`{path}`" if path else "Top level"
        lines.extend([f"### {title}", "", (cls.__doc__ or "").strip().replace("\n    ", " "), "",
                      "| Key | Type | Default | Description |", "|---|---|---|---|"])
        subs: list[Any] = []
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            p = _join(path, f.name)
            lines.append(f"| `{p}` | {_field_type_str(tp)} | {_default_str(f)} | {f.metadata.get('doc', '')} |")
            inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] or ([tp] if dataclasses.is_dataclass(tp) else [])
            subs.extend((s, p) for s in inner)
        lines.append("")
        for s, p in subs:
            section(s, p)

    section(Config, "")
    return "\n".join(lines)


def json_schema(cls: type = Config) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of the config file, for editors and CI."""

    def schema_of(tp: Any, meta: typing.Mapping[str, Any]) -> dict[str, Any]:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (Union, types.UnionType):
            opts = [schema_of(a, meta) for a in args if a is not type(None)]
            s: dict[str, Any] = opts[0] if len(opts) == 1 else {"anyOf": opts}
            return {"anyOf": [s, {"type": "null"}]} if type(None) in args else s
        if origin is Literal:
            return {"enum": list(args)}
        if origin is list:
            return {"type": "array", "items": schema_of(args[0], {})}
        if origin is dict:
            return {"type": "object", "additionalProperties": schema_of(args[1], {})}
        if dataclasses.is_dataclass(tp):
            return obj(typing.cast(type, tp))  # a type hint: the section's dataclass, not an instance
        s = {"type": {int: "integer", str: "string", float: "number", bool: "boolean"}[tp]}
        if meta.get("min") is not None:
            s["minimum"] = meta["min"]
        if meta.get("max") is not None:
            s["maximum"] = meta["max"]
        return s

    def obj(c: type) -> dict[str, Any]:
        hints = _hints(c)
        props, req = {}, []
        for f in dataclasses.fields(c):
            s = schema_of(hints[f.name], f.metadata)
            s["description"] = f.metadata.get("doc", "")
            props[f.name] = s
            if f.metadata.get("required"):
                req.append(f.name)
        out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
        if req:
            out["required"] = req
        if c.__doc__:
            out["description"] = " ".join(c.__doc__.split())
        return out

    s = obj(cls)
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    s["title"] = "rbak configuration"
    return s


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--json-schema":
        print(json.dumps(json_schema(), indent=2))
    else:
        print(config_reference_markdown())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
