"""Building the typed model from plain data: ``${VAR}`` interpolation, type-driven coercion with
key paths in every error, and the cross-field checks."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
import types
import typing
from typing import Any, Literal, Union
from urllib.parse import urlsplit

from ..errors import ConfigError
from .fields import mask_url


# --------------------------------------------------------------------------
# Time bounds.
# --------------------------------------------------------------------------


def parse_time_bound(value: Any, where: str) -> int | None:
    """Epoch milliseconds from an int (ms) or an RFC 3339 string."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{where}: must be epoch milliseconds or an RFC 3339 time, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        s = value.strip()
        if re.fullmatch(r"-?\d+", s):
            return int(s)
        try:
            t = _dt.datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ConfigError(f"{where}: must be epoch milliseconds or an RFC 3339 time, got {value!r}") from None
        if t.tzinfo is None:
            raise ConfigError(f"{where}: RFC 3339 time {value!r} needs a time zone (e.g. 'Z')")
        return int(t.timestamp() * 1000)
    raise ConfigError(f"{where}: must be epoch milliseconds or an RFC 3339 time, got {value!r}")


# --------------------------------------------------------------------------
# Interpolation and the generic, type-driven validator.
# --------------------------------------------------------------------------

_ENV_RE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def interpolate(s: str, env: typing.Mapping[str, str], path: str, errors: list[str]) -> str:
    """Expand ``${VAR}`` / ``${VAR:-default}``; an unset variable without a default is an error."""
    if "$" not in s:
        return s

    def rep(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name, default = m.group(1), m.group(2)
        val = env.get(name)
        if val is None or (val == "" and default is not None):
            if default is not None:
                return default
            errors.append(f"{path}: environment variable {name} is not set (use ${{{name}:-default}} for a default)")
            return ""
        return val

    return _ENV_RE.sub(rep, s)


def _describe(v: Any) -> str:
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (dict, list)):
        return f"a {'mapping' if isinstance(v, dict) else 'list'}"
    return repr(v)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, data: Any, path: str, errors: list[str], env: typing.Mapping[str, str]) -> Any:
    where = path or "(top level)"
    if not isinstance(data, dict):
        errors.append(f"{where}: must be a mapping, got {_describe(data)}")
        return None
    hints = _hints(cls)
    flds = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key in data:
        if not isinstance(key, str) or key not in flds:
            known = ", ".join(flds)
            errors.append(f"{_join(path, str(key))}: unknown key (known keys here: {known})")
    for name, f in flds.items():
        p = _join(path, name)
        if name not in data or data[name] is None:
            if f.metadata.get("required"):
                errors.append(f"{p}: required")
            continue
        ok, val = _coerce(hints[name], data[name], p, errors, env, f.metadata)
        if ok:
            kwargs[name] = val
    try:
        return cls(**kwargs)
    except TypeError:  # pragma: no cover - a required field missing; already reported
        return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _coerce(tp: Any, v: Any, path: str, errors: list[str], env: typing.Mapping[str, str],
            meta: typing.Mapping[str, Any] | None = None) -> tuple[bool, Any]:
    """(ok, value) of ``v`` as type ``tp``; problems are appended to ``errors`` with their key path."""
    meta = meta or {}
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(typing.get_args(tp), v, path, errors, env, meta)
    if origin is Literal:
        return _coerce_literal(typing.get_args(tp), v, path, errors, env)
    if origin is list:
        return _coerce_list(typing.get_args(tp), v, path, errors, env)
    if origin is dict:
        return _coerce_dict(typing.get_args(tp), v, path, errors, env)
    if dataclasses.is_dataclass(tp):
        # Keep a partly invalid section (its bad fields at their defaults) so the
        # cross-field checks still run on the rest; the errors are already listed.
        obj = _build(typing.cast(type, tp), v, path, errors, env)  # a type hint: the class, not an instance
        return obj is not None, obj
    if tp is bool:
        return _coerce_bool(v, path, errors, env)
    if tp is int or tp is float:
        return _coerce_number(tp, v, path, errors, env, meta)
    if tp is str:
        if isinstance(v, bool) or isinstance(v, (dict, list)) or v is None:
            errors.append(f"{path}: must be a string, got {_describe(v)}")
            return False, None
        if isinstance(v, (int, float)):
            v = str(v)
        return True, interpolate(v, env, path, errors)
    if tp is Any:
        return True, v
    raise TypeError(f"config: unsupported field type {tp!r} at {path}")  # pragma: no cover


def _coerce_union(args: tuple, v: Any, path: str, errors: list[str], env: typing.Mapping[str, str],
                  meta: typing.Mapping[str, Any]) -> tuple[bool, Any]:
    non_none = [a for a in args if a is not type(None)]
    if v is None:
        return True, None
    if len(non_none) == 1:
        return _coerce(non_none[0], v, path, errors, env, meta)
    # int | str (time bounds): accept either, interpolate strings
    if isinstance(v, str):
        v = interpolate(v, env, path, errors)
        if "time_window" in path:
            try:
                parse_time_bound(v, path)
            except ConfigError as e:
                errors.append(str(e.args[0]))
                return False, None
        return True, v
    if isinstance(v, int) and not isinstance(v, bool) and int in non_none:
        return True, v
    errors.append(f"{path}: must be {' or '.join(_type_name(a) for a in non_none)}, got {_describe(v)}")
    return False, None


def _coerce_literal(args: tuple, v: Any, path: str, errors: list[str],
                    env: typing.Mapping[str, str]) -> tuple[bool, Any]:
    if isinstance(v, str):
        v = interpolate(v, env, path, errors)
    if v not in args:
        errors.append(f"{path}: must be one of {', '.join(map(str, args))}; got {_describe(v)}")
        return False, None
    return True, v


def _coerce_list(args: tuple, v: Any, path: str, errors: list[str],
                 env: typing.Mapping[str, str]) -> tuple[bool, Any]:
    if not isinstance(v, list):
        if isinstance(v, str) and args and args[0] is str:
            v = [v]  # a single name where a list is expected
        else:
            errors.append(f"{path}: must be a list, got {_describe(v)}")
            return False, None
    out, ok = [], True
    for i, item in enumerate(v):
        good, x = _coerce(args[0] if args else Any, item, f"{path}[{i}]", errors, env)
        ok &= good
        out.append(x)
    return ok, out


def _coerce_dict(args: tuple, v: Any, path: str, errors: list[str],
                 env: typing.Mapping[str, str]) -> tuple[bool, Any]:
    if not isinstance(v, dict):
        errors.append(f"{path}: must be a mapping, got {_describe(v)}")
        return False, None
    out, ok = {}, True
    for k, item in v.items():
        if not isinstance(k, str):
            errors.append(f"{path}: keys must be strings, got {_describe(k)}")
            ok = False
            continue
        good, x = _coerce(args[1] if args else Any, item, f"{path}.{k}", errors, env)
        ok &= good
        out[k] = x
    return ok, out


def _coerce_bool(v: Any, path: str, errors: list[str], env: typing.Mapping[str, str]) -> tuple[bool, Any]:
    if isinstance(v, str):
        s = interpolate(v, env, path, errors).strip().lower()
        if s in ("true", "yes", "on", "1"):
            return True, True
        if s in ("false", "no", "off", "0"):
            return True, False
    if not isinstance(v, bool):
        errors.append(f"{path}: must be true or false, got {_describe(v)}")
        return False, None
    return True, v


def _coerce_number(tp: type, v: Any, path: str, errors: list[str], env: typing.Mapping[str, str],
                   meta: typing.Mapping[str, Any]) -> tuple[bool, Any]:
    if isinstance(v, str):
        s = interpolate(v, env, path, errors).strip()
        try:
            v = int(s) if tp is int else float(s)
        except ValueError:
            pass
    good = (isinstance(v, int) and not isinstance(v, bool)) or (tp is float and isinstance(v, float))
    lo, hi = meta.get("min"), meta.get("max")
    if good and ((lo is not None and v < lo) or (hi is not None and v > hi)):
        good = False
    if not good:
        kind = "an integer" if tp is int else "a number"
        rng = ""
        if lo is not None and hi is not None:
            rng = f" {_num(lo)}-{_num(hi)}" if tp is int else f" from {_num(lo)} to {_num(hi)}"
        elif lo is not None:
            rng = f" >= {_num(lo)}"
        errors.append(f"{path}: must be {kind}{rng}, got {_describe(v)}")
        return False, None
    return True, (float(v) if tp is float else v)


def _num(x: float) -> str:
    """A bound as a user writes it: ``1000000``, not ``:g``'s ``1e+06``."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _type_name(tp: Any) -> str:
    return {int: "an integer", str: "a string", float: "a number", bool: "true or false"}.get(tp, str(tp))


def _check_url(url: str, schemes: tuple[str, ...], path: str, errors: list[str]) -> None:
    try:
        p = urlsplit(url)
        p.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        errors.append(f"{path}: not a valid URL ({e}): {mask_url(url)!r}")
        return
    if p.scheme not in schemes or not p.hostname:
        errors.append(f"{path}: must be a {'/'.join(s + '://' for s in schemes)} URL with a host, got {mask_url(url)!r}")


def check_url(url: str, schemes: tuple[str, ...], path: str) -> None:
    """A URL given outside a config file (a flag, an environment variable) checked as the file's are:
    ``ConfigError`` naming ``path``, with any password masked."""
    errors: list[str] = []
    _check_url(url, schemes, path, errors)
    if errors:
        raise ConfigError(errors[0])
