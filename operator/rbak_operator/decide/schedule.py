"""Cron schedules: 5-field only, IANA time zones, DST, missed slots.

Semantics follow Kubernetes CronJob, with the slot persisted first:
the latest slot after ``status.lastScheduleTime`` (or the object's creation)
and not after now is *due*; if it is older than ``startingDeadlineSeconds``
it is recorded as missed instead of run. Several missed slots collapse into
one run. Times are computed in the schedule's zone with cronsim's Debian-cron
DST rules: a fixed-time job in a spring-forward gap runs right after the gap,
and in the repeated autumn hour it runs once (the first occurrence).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from rbak.errors import ConfigError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Past this many slots between the last run and now we stop counting exactly
# (an every-minute schedule after a month offline) and look at a recent window.
MAX_SLOTS_COUNTED = 2000


class ScheduleError(ConfigError):
    """A schedule or time zone the operator cannot use; names the field."""


@dataclass(frozen=True, slots=True)
class Schedule:
    expr: str
    tz: ZoneInfo | timezone

    def slots_after(self, after: datetime):
        """Slots strictly after ``after``, as aware UTC datetimes, ascending."""
        local = after.astimezone(self.tz)
        it = CronSim(self.expr, local)
        for dt in it:
            yield dt.astimezone(timezone.utc)

    def next_after(self, after: datetime) -> datetime:
        return next(self.slots_after(after))


def parse_schedule(expr: str | None, tz_name: str | None = None, field: str = "spec.schedule") -> Schedule:
    if not isinstance(expr, str) or not expr.strip():
        raise ScheduleError(f"{field}: empty schedule")
    text = " ".join(expr.split())
    if text.startswith("@"):
        if text.lower() not in MACROS:
            raise ScheduleError(f"{field}: unknown macro {text!r}; known: {', '.join(sorted(MACROS))}")
        text = MACROS[text.lower()]
    n = len(text.split(" "))
    if n == 6:
        raise ScheduleError(
            f"{field}: {expr!r} has 6 fields; use a standard 5-field cron expression "
            "'minute hour day-of-month month day-of-week' (a leading seconds field is not supported)"
        )
    if n != 5:
        raise ScheduleError(f"{field}: {expr!r} has {n} fields; a cron expression has exactly 5")
    tz = parse_timezone(tz_name)
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=timezone.utc))
    except CronSimError as e:
        raise ScheduleError(f"{field}: {expr!r} is not a valid cron expression: {e}") from None
    return Schedule(text, tz)


def parse_timezone(name: str | None, field: str = "spec.timeZone") -> ZoneInfo | timezone:
    if not name or name in ("UTC", "Etc/UTC"):
        return timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"{field}: unknown time zone {name!r} (use an IANA name such as Europe/Berlin)") from None


@dataclass(frozen=True, slots=True)
class SlotDecision:
    """What the scheduler should do now."""

    action: str  # "wait" | "run" | "missed"
    slot: datetime | None  # the slot to run or record
    missed: int  # slots skipped (past the deadline, or collapsed)
    next_time: datetime  # the next slot after now


def decide(schedule: Schedule, last_schedule: datetime | None, created: datetime | None, now: datetime,
           starting_deadline_seconds: int | None) -> SlotDecision:
    """The due slot, if any: pure function of the persisted state and now."""
    baseline = last_schedule or created or now
    if now - baseline > timedelta(days=2):
        # Count the skipped slots roughly; look closely only at the recent window.
        baseline = now - timedelta(days=2)
    latest: datetime | None = None
    count = 0
    for slot in schedule.slots_after(baseline):
        if slot > now:
            next_time = slot
            break
        latest = slot
        count += 1
        if count > MAX_SLOTS_COUNTED:
            # Still catching up: the remaining ones are skipped too.
            return decide(schedule, now - timedelta(hours=1), None, now, starting_deadline_seconds)
    else:  # pragma: no cover - cron iterators are infinite
        raise AssertionError("unreachable")
    if latest is None:
        return SlotDecision("wait", None, 0, next_time)
    if starting_deadline_seconds is not None and (now - latest).total_seconds() > starting_deadline_seconds:
        return SlotDecision("missed", latest, count, next_time)
    return SlotDecision("run", latest, count - 1, next_time)
