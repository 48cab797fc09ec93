"""Building the typed model from plain data: ``${VAR}`` interpolation, type-driven coercion with
key paths in every error, and the cross-field checks."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union
from urllib.parse import urlsplit

from ..errors import ConfigError
from . import Config, ConnectionConfig, mask_url


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
            rng = f" {lo:g}-{hi:g}" if tp is int else f" from {lo:g} to {hi:g}"
        elif lo is not None:
            rng = f" >= {lo:g}"
        errors.append(f"{path}: must be {kind}{rng}, got {_describe(v)}")
        return False, None
    return True, (float(v) if tp is float else v)


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


def _check_connection(c: ConnectionConfig, path: str, errors: list[str]) -> None:
    _check_url(c.amqp_url, ("amqp", "amqps"), f"{path}.amqp_url", errors)
    _check_url(c.management_url, ("http", "https"), f"{path}.management_url", errors)
    for name in ("ca_cert", "client_cert", "client_key"):
        v = getattr(c.tls, name)
        if v and not os.path.isfile(v):
            errors.append(f"{path}.tls.{name}: file not found: {v!r}")
    if bool(c.tls.client_cert) != bool(c.tls.client_key):
        errors.append(f"{path}.tls: client_cert and client_key go together (one is missing)")


def _check_config(cfg: Config, errors: list[str]) -> None:
    from ..format.layout import check_backup_id, normalize_prefix  # here: `import rbak.config` stays light (no numpy/zstd)

    if cfg.backup_id is not None:
        try:
            check_backup_id(cfg.backup_id)
        except ConfigError as e:
            errors.append(e.args[0])
    if cfg.mode == "restore" and not cfg.backup_id:
        errors.append("backup_id: required when mode is restore")
    if cfg.mode in ("backup", "archive") and cfg.source is None:
        errors.append(f"source: required when mode is {cfg.mode}")
    if cfg.mode == "archive" and not _archive_name_ok(cfg.archive.name):
        errors.append(f"archive.name: {cfg.archive.name!r} is not a valid name (letters, digits, '.', '_', '-')")
    if cfg.mode == "restore" and cfg.target is None:
        errors.append("target: required when mode is restore")
    if cfg.mode == "drill" and cfg.source is None and cfg.target is None and cfg.drill.target is None:
        errors.append("drill.target: required when mode is drill and there is no source or target")
    if cfg.drill.target is not None:
        _check_connection(cfg.drill.target, "drill.target", errors)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", cfg.drill.scratch_vhost_prefix or ""):
        errors.append(f"drill.scratch_vhost_prefix: {cfg.drill.scratch_vhost_prefix!r} must be 1-64 letters, digits, "
                      "'.', '_' or '-', starting with a letter or digit")
    if cfg.drill.signing_key_file is not None and cfg.drill.signing_key_env is not None:
        errors.append("drill.signing_key_env: give either it or drill.signing_key_file, not both")
    if cfg.drill.signing_key_file is not None and not Path(cfg.drill.signing_key_file).is_file():
        errors.append(f"drill.signing_key_file: {cfg.drill.signing_key_file!r} is not a readable file")
    if cfg.source is not None:
        _check_connection(cfg.source, "source", errors)
    if cfg.target is not None:
        _check_connection(cfg.target, "target", errors)
    st = cfg.storage
    if st.backend == "filesystem" and not st.path:
        errors.append("storage.path: required when storage.backend is filesystem")
    if st.backend == "s3" and not st.bucket:
        errors.append("storage.bucket: required when storage.backend is s3")
    if st.backend in ("azure", "gcs"):
        errors.append(f"storage.backend: {st.backend} is not supported yet; use s3 or filesystem")
    if st.sse_kms_key_id and st.sse != "aws:kms":
        errors.append("storage.sse_kms_key_id: only used with sse: aws:kms")
    if st.object_lock_mode and st.backend != "s3":
        errors.append("storage.object_lock_mode: only for the s3 backend")
    if st.object_lock_mode and not st.object_lock_retain_days:
        errors.append("storage.object_lock_retain_days: required (> 0) with object_lock_mode")
    enc = cfg.encryption
    if enc.enabled and not enc.key_id and not (enc.envelope and enc.kms_key_id):
        errors.append("encryption.key_id: required when encryption.enabled is true"
                      + (" (or encryption.kms_key_id with envelope: true)" if enc.envelope else ""))
    named = [f"encryption.{n}" for n in ("key_id", "keys_file", "keys_env", "kms_key_id") if getattr(enc, n)]
    named += ["encryption.envelope"] if enc.envelope else []
    if cfg.mode == "backup" and not enc.enabled and named:  # never a silent plaintext backup
        errors.append(f"encryption.enabled: is false but {', '.join(named)} is set: this backup would be stored in "
                      f"plaintext; set encryption.enabled: true to encrypt it, or remove the encryption section")
    if enc.kms_key_id and not enc.envelope:
        errors.append("encryption.kms_key_id: a KMS key only wraps data keys: set encryption.envelope: true")
    for name in ("kms_region", "kms_endpoint_url"):
        if getattr(enc, name) is not None and not getattr(enc, name).strip():
            errors.append(f"encryption.{name}: must not be empty")
    if enc.kms_endpoint_url and not enc.kms_endpoint_url.startswith(("http://", "https://")):
        errors.append(f"encryption.kms_endpoint_url: {enc.kms_endpoint_url!r} is not an http(s) URL")
    if bool(st.access_key_id) != bool(st.secret_access_key):
        errors.append("storage: access_key_id and secret_access_key go together (one is missing)")
    try:
        normalize_prefix(st.prefix)
    except ConfigError as e:
        errors.append(e.args[0])
    try:
        start, end = cfg.restore.window_ms()
        if start is not None and end is not None and start > end:
            errors.append(f"restore.time_window_start: {start} is after time_window_end {end}")
    except ConfigError as e:
        errors.append(e.args[0])
    if not cfg.metrics.path.startswith("/"):
        errors.append(f"metrics.path: must start with '/', got {cfg.metrics.path!r}")
    from . import QueueSelection

    for sel_path, conn in (("target.queues", cfg.target), ("drill.target.queues", cfg.drill.target)):
        if conn is not None and conn.queues != QueueSelection():
            errors.append(f"{sel_path}: not used, so it would select nothing: a restore selects queues with "
                          f"restore.queues, and a drill covers every queue of the backup; move it or remove it")
    if cfg.backup.definitions_only:
        if not cfg.backup.include_definitions:
            errors.append("backup.definitions_only: needs backup.include_definitions: true (it would back up nothing)")
        if cfg.source is not None and cfg.source.queues != QueueSelection():
            errors.append("source.queues: not used with backup.definitions_only: true (no queue is backed up); "
                          "remove one of them")
    for sel_path, sel in (("source.queues", cfg.source.queues if cfg.source else None),
                          ("target.queues", cfg.target.queues if cfg.target else None)):
        if sel is not None and not sel.types:
            errors.append(f"{sel_path}.types: must list at least one of classic, quorum, stream")


def _archive_name_ok(name: str) -> bool:
    from ..format.layout import BACKUP_ID_RE

    return bool(BACKUP_ID_RE.match(name)) and ".." not in name and len(name) <= 160
