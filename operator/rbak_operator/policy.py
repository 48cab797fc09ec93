"""Decisions with no I/O: concurrency, retention, Job history, restore engine, times.

Retention only ever chooses COMPLETE backups that this RabbitMQBackup made
(their id starts with the object's run-name prefix) and never the newest
complete one, so a misconfigured ``maxAge`` cannot empty the bucket; an
incomplete (possibly still running) backup is never chosen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable

from rbak.errors import ConfigError

from .clock import parse_time

_DUR = re.compile(r"^([0-9]+)(s|m|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, field: str = "spec.retention.maxAge") -> timedelta:
    m = _DUR.match(str(text).strip())
    if not m:
        raise ConfigError(f"{field}: {text!r} is not a duration like 30d, 12h, 90m, 2w")
    return timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])


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


@dataclass(frozen=True, slots=True)
class StoredBackup:
    backup_id: str
    created_at_ms: int
    complete: bool


def owned(backup_id: str, backup_name: str) -> bool:
    """Whether a backup id was made by the RabbitMQBackup ``backup_name``."""
    from .naming import owns

    return owns(backup_name, backup_id)


def retention_victims(backups: Iterable[StoredBackup], keep_last: int | None, max_age: timedelta | None,
                      now: datetime) -> list[str]:
    """Ids of complete backups the policy deletes, oldest first."""
    done = sorted((b for b in backups if b.complete), key=lambda b: (b.created_at_ms, b.backup_id))
    if not done or (keep_last is None and max_age is None):
        return []
    victims: set[str] = set()
    if keep_last is not None:
        if keep_last < 1:
            raise ConfigError("spec.retention.keepLast: must be at least 1")
        victims.update(b.backup_id for b in done[:-keep_last])
    if max_age is not None:
        cutoff_ms = int((now - max_age).timestamp() * 1000)
        victims.update(b.backup_id for b in done if b.created_at_ms < cutoff_ms)
    victims.discard(done[-1].backup_id)  # never the newest complete backup
    return [b.backup_id for b in done if b.backup_id in victims]


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
