"""When an object next needs a reconcile, from its status alone (pure).

Event-driven reconciliation (runtime/loop.py) runs a pass when something changes (the object's
spec or annotations, one of its Jobs or SparkApplications) and otherwise sleeps until the
time this module names: the next scheduled slot, the next restore drill, the next check of a
signed drill report, or the safety resync, whichever comes first. A failed pass retries with a capped exponential backoff.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

from rbak_operator.decide.times import parse_time

MIN_DELAY = timedelta(seconds=1)  # a due time already past (clock skew, a slot the pass held back) never spins
# How often the stored signed report of the last drill is verified again (one GET and LIST per backup)
EVIDENCE_RECHECK = timedelta(seconds=float(os.environ.get("RBAK_OPERATOR_EVIDENCE_RECHECK_SECONDS", "3600")))


def next_wake(times: Iterable[datetime | None], now: datetime, resync: timedelta) -> datetime:
    """The earliest of an object's timed duties (None: none) and ``now + resync``, never in the past."""
    due = min([now + resync, *(t for t in times if t is not None)])
    return max(due, now + MIN_DELAY)


def backup_times(status: dict[str, Any], next_slot: datetime | None) -> list[datetime | None]:
    """A RabbitMQBackup's timed duties: its next slot (also while suspended: a slot passing then is
    recorded as skipped, so resuming never runs it), its next restore drill, and the next check of
    the last drill's signed report."""
    drill = status.get("restoreDrill") or {}
    return [next_slot, parse_time(drill["nextRunTime"]) if drill.get("nextRunTime") else None,
            evidence_recheck_time(drill)]


def evidence_recheck_time(d: dict[str, Any]) -> datetime | None:
    """When the stored report of the last drill is next verified again: only while the status names
    its signer (None otherwise); a status without ``evidenceCheckTime`` is due at once."""
    if not (d.get("signer") and d.get("lastJob") and d.get("backupId")):
        return None
    checked = d.get("evidenceCheckTime") or d.get("lastRunTime")
    return parse_time(checked) + EVIDENCE_RECHECK if checked else datetime.min.replace(tzinfo=timezone.utc)


def backoff(failures: int, base: float = 2.0, cap: float = 300.0) -> timedelta:
    """Retry delay after ``failures`` failed passes in a row: 2 s, 4 s, ... up to 5 min."""
    return timedelta(seconds=min(cap, base * 2 ** max(0, failures - 1)))
