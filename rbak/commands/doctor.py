"""``rbak doctor``: read a storage's settings and rights and report what can lose or expose backups.

S3: lifecycle rules that can expire a backup prune keeps (the newest one and every chain base are kept
whatever their age, so any expiry of backups), versioning, Object Lock mode and default period, default encryption, public access block,
put/get/list/delete rights (a probe object under ``<prefix>/.rbak-doctor/``, removed after) and clock
skew against the storage. A directory: existence, writability and free space. Each finding comes with
its fix; the exit code is 1 when any finding is an error.
"""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from ..errors import ConfigError, StorageSettingsError
from ..repo.retention import RetentionPolicy, parse_duration
from . import output

RETENTION_KEYS = {"keepLast": "keep_last", "keepDaily": "keep_daily", "keepWeekly": "keep_weekly",
                  "keepMonthly": "keep_monthly", "maxAge": "max_age"}


def register(sub: argparse._SubParsersAction, _imp: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check a storage's settings and rights for what can lose or expose backups",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--path", required=True, help="storage URL (file:///dir, s3://bucket/prefix?...)")
    p.add_argument("--prefix", default="", help="storage prefix the backups live under")
    p.add_argument("--keep-last", type=int, metavar="N", help="retention: newest N backups")
    p.add_argument("--keep-daily", type=int, metavar="D", help="retention: newest backup of each of D days")
    p.add_argument("--keep-weekly", type=int, metavar="W", help="retention: newest backup of each of W weeks")
    p.add_argument("--keep-monthly", type=int, metavar="M", help="retention: newest backup of each of M months")
    p.add_argument("--max-age", metavar="DUR", help="retention: delete backups older than this (30d, 12h, 2w)")
    p.add_argument("--retention-file", metavar="FILE",
                   help="retention from a YAML file: a RabbitMQBackup (spec.retention), or a mapping with "
                        "keepLast/keepDaily/keepWeekly/keepMonthly/maxAge (or keep_last, ..., max_age)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=cmd_doctor)


def retention_from_file(path: str) -> dict[str, Any]:
    """The retention fields of a YAML file, snake_case."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"--retention-file {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--retention-file {path}: not YAML ({e})") from None
    if isinstance(doc, dict) and isinstance(doc.get("spec"), dict):
        doc, where = doc["spec"].get("retention"), "spec.retention"
    elif isinstance(doc, dict) and "retention" in doc:
        doc, where = doc["retention"], "retention"
    else:
        where = "(top level)"
    if not isinstance(doc, dict):
        raise ConfigError(f"--retention-file {path}: {where} is not a mapping of keepLast/keepDaily/.../maxAge")
    out: dict[str, Any] = {}
    for k, v in doc.items():
        name = RETENTION_KEYS[k] if k in RETENTION_KEYS else k
        if name not in RETENTION_KEYS.values():
            raise ConfigError(f"--retention-file {path}: {where}.{k}: unknown; known: {', '.join(RETENTION_KEYS)}")
        out[name] = v
    return out


def policy_from_args(args: argparse.Namespace):
    given = {n: getattr(args, n) for n in ("keep_last", "keep_daily", "keep_weekly", "keep_monthly", "max_age")
             if getattr(args, n) is not None}
    if args.retention_file:
        given = {**retention_from_file(args.retention_file), **given}  # flags win over the file
    if not given:
        return None
    if given.get("max_age") is not None:
        given["max_age"] = parse_duration(str(given["max_age"]), "max-age")
    return RetentionPolicy(**given)


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..doctor import run_doctor  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    findings = run_doctor(args.path, policy_from_args(args), args.prefix)
    errors = [f for f in findings if f.severity == "error"]
    if args.format == "json":
        output.emit(args, {"path": args.path, "errors": len(errors),
                           "warnings": sum(f.severity == "warning" for f in findings),
                           "findings": [f.to_json_obj() for f in findings]})
    else:
        for f in findings:
            for line in f.lines():
                print(line)
        warnings = sum(f.severity == "warning" for f in findings)
        print(f"{len(errors)} error(s), {warnings} warning(s)")
    if errors:
        raise StorageSettingsError(f"{args.path}: {len(errors)} error(s), first: {errors[0].check}: {errors[0].message}")
    return 0
