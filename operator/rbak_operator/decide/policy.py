"""Decisions with no I/O: concurrency, retention, Job history, restore engine, times.

Retention is ``rbak.repo.retention.plan_retention`` (the same function as
``rbak prune``): it only ever deletes COMPLETE backups that this
RabbitMQBackup made (their id starts with the object's run-name prefix),
never the newest complete one, never an incomplete (possibly still running)
one, and never a backup that a kept backup's incremental streams continue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from rbak.errors import ConfigError
from rbak.format.manifest import BackupManifest
from rbak.repo.retention import RetentionPlan, RetentionPolicy, StoredBackup, plan_retention
from rbak.repo.retention import parse_duration as _parse_duration
from rbak_operator.decide.naming import owns
from rbak_operator.decide.rbakconfig import backup_vhosts
from rbak_operator.decide.times import parse_time

__all__ = ["StoredBackup", "retention_plan", "retention_victims", "parse_duration"]


def parse_duration(text: str, field: str = "spec.retention.maxAge") -> timedelta:
    return _parse_duration(text, field)


def concurrency(policy: str | None, active: list[str]) -> str:
    """What to do with a due run: 'run', 'skip' (Forbid) or 'replace' (stop the active ones first)."""
    if not active:
        return "run"
    policy = policy or "Forbid"
    if policy == "Allow":
        return "run"
    if policy == "Replace":
        return "replace"
    if policy == "Forbid":
        return "skip"
    raise ConfigError(f"spec.concurrencyPolicy: {policy!r} is not one of Forbid, Allow, Replace")


def owned(backup_id: str, manifest: BackupManifest | None, meta: Mapping[str, Any]) -> bool:
    """Whether a stored backup was made by the RabbitMQBackup of ``meta``: by the owner its manifest
    records (namespace, name and, when both know it, uid), never by the shape of its id. A manifest
    without a recorded origin (an older operator's) falls back to the id's shape; a backup without a
    manifest is nobody's (retention and deletion leave it)."""
    if manifest is None:
        return False
    origin = manifest.origin
    if origin is None:
        return owns(meta["name"], backup_id)
    o = origin.owner
    if o is None or (o.namespace, o.name) != (meta.get("namespace"), meta["name"]):
        return False
    return not (o.uid and meta.get("uid")) or o.uid == meta.get("uid")


def retention_policy(retention: dict[str, Any] | None) -> RetentionPolicy:
    """``spec.retention`` as the core's policy (field names in errors are the spec's)."""
    r = retention or {}
    keep = r.get("keepLast")
    if keep is not None and keep < 1:
        raise ConfigError("spec.retention.keepLast: must be at least 1")
    try:
        return RetentionPolicy(keep, r.get("keepDaily"), r.get("keepWeekly"), r.get("keepMonthly"),
                               parse_duration(r["maxAge"]) if r.get("maxAge") else None)
    except ConfigError as e:
        raise ConfigError(f"spec.retention: {e}") from None


def retention_plan(backups: Iterable[StoredBackup], retention: dict[str, Any] | None, now: datetime) -> RetentionPlan:
    """Keep/delete with reasons for every stored backup (``owned`` marks this object's)."""
    return plan_retention(backups, retention_policy(retention), now)


def retention_victims(backups: Iterable[StoredBackup], keep_last: int | None, max_age: timedelta | None,
                      now: datetime, **gfs: int | None) -> list[str]:
    """Ids of complete backups the policy deletes, oldest first (``gfs``: keep_daily/keep_weekly/keep_monthly)."""
    if keep_last is not None and keep_last < 1:
        raise ConfigError("spec.retention.keepLast: must be at least 1")
    return plan_retention(backups, RetentionPolicy(keep_last, gfs.get("keep_daily"), gfs.get("keep_weekly"),
                                                   gfs.get("keep_monthly"), max_age), now).delete


def history_victims(finished: list[tuple[str, str, str]], keep_succeeded: int, keep_failed: int) -> list[str]:
    """Finished Jobs to delete: ``finished`` is (name, phase, completion-or-creation time)."""
    out: list[str] = []
    for phase, keep in (("Succeeded", keep_succeeded), ("Failed", keep_failed)):
        jobs = sorted((j for j in finished if j[1] == phase), key=lambda j: (j[2], j[0]), reverse=True)
        out.extend(j[0] for j in jobs[max(keep, 0):])
    return out


def restore_engine(engine: str | None, backup_bytes: int | None, threshold: int | None) -> str:
    """'job' or 'spark'; auto picks spark when the backup's stored size is above the threshold."""
    engine = engine or "auto"
    if engine in ("job", "spark"):
        return engine
    if engine != "auto":
        raise ConfigError(f"spec.engine: {engine!r} is not one of job, spark, auto")
    if threshold is None:
        threshold = 10 * 1024**3
    return "spark" if (backup_bytes or 0) > threshold else "job"


def validation_engine(validate: dict[str, Any] | None, backup_bytes: int) -> str:
    """'none', 'job' (in the run's pod) or 'spark' for a finished backup."""
    v = validate or {}
    if not v.get("enabled", True):
        return "none"
    thr = v.get("sparkThresholdBytes")
    if thr is not None and backup_bytes > int(thr):
        return "spark"
    return "job"


def epoch_ms(value: Any, field: str) -> int:
    """PITR bound: epoch ms (int or digits) or RFC 3339 -> epoch ms."""
    if isinstance(value, bool):
        raise ConfigError(f"{field}: {value!r} is not a time")
    if isinstance(value, int):
        return value
    s = str(value).strip()
    if s.isdigit():
        return int(s)
    try:
        return int(parse_time(s).timestamp() * 1000)
    except ValueError:
        raise ConfigError(f"{field}: {value!r} is neither epoch milliseconds nor an RFC 3339 time") from None


def source_of(spec: Mapping[str, Any], namespace: str) -> tuple[str, frozenset[str]]:
    """A RabbitMQBackup's source: (the broker it reads, its vhosts; empty: every vhost).

    The broker is the RabbitmqCluster reference (namespace/name) or the AMQP URL's host and port; the
    vhosts are ``queues.vhosts``, else the URL's vhost (``rbakconfig.backup_vhosts``)."""
    broker = spec.get("broker") or {}
    ref = broker.get("rabbitmqClusterReference") or {}
    if ref.get("name"):
        who = f"cluster:{ref.get('namespace') or namespace}/{ref['name']}"
    else:
        u = urlsplit(broker.get("amqpUrl") or "")
        port = u.port or (5671 if u.scheme == "amqps" else 5672)
        who = f"amqp:{(u.hostname or '').lower()}:{port}"
    return who, frozenset(backup_vhosts(spec))


def same_source(a: tuple[str, frozenset[str]], b: tuple[str, frozenset[str]]) -> bool:
    """Whether two backups read a vhost in common (every vhost overlaps every selection)."""
    return a[0] == b[0] and (not a[1] or not b[1] or bool(a[1] & b[1]))


def busy_source(mine: tuple[str, frozenset[str]],
                others: Iterable[tuple[str, tuple[str, frozenset[str]], list[str]]]) -> list[str]:
    """The active runs of OTHER RabbitMQBackups on this backup's source, as ``backup/run`` (a scheduled
    run waits for them: two backups of one vhost would each read short; rbak's lease refuses the second).

    ``others``: (RabbitMQBackup name, its ``source_of``, its active run names)."""
    return sorted(f"{name}/{run}" for name, src, runs in others if same_source(mine, src) for run in runs)
