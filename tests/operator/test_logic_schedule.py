"""Cron next-run with time zones and DST, 6-field rejection, missed slots."""

from __future__ import annotations

from datetime import datetime, timezone
from itertools import islice

import pytest

from rbak.errors import ConfigError
from rbak_operator.decide.schedule import ScheduleError, decide, parse_schedule

UTC = timezone.utc


def t(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def slots(expr, tz, after, n):
    return [d.strftime("%Y-%m-%dT%H:%MZ") for d in islice(parse_schedule(expr, tz).slots_after(t(after)), n)]


def test_every_five_minutes_utc():
    assert slots("*/5 * * * *", None, "2026-01-01T10:02:00Z", 3) == [
        "2026-01-01T10:05Z", "2026-01-01T10:10Z", "2026-01-01T10:15Z"]


def test_slot_strictly_after():
    assert slots("0 * * * *", "UTC", "2026-01-01T10:00:00Z", 1) == ["2026-01-01T11:00Z"]


def test_time_zone_shifts_the_slot():
    # 02:30 in Berlin is 01:30 UTC in winter, 00:30 UTC in summer.
    assert slots("30 2 * * *", "Europe/Berlin", "2026-01-10T00:00:00Z", 1) == ["2026-01-10T01:30Z"]
    assert slots("30 2 * * *", "Europe/Berlin", "2026-07-10T00:00:00Z", 1) == ["2026-07-10T00:30Z"]
    assert slots("0 9 * * 1-5", "America/New_York", "2026-01-09T15:00:00Z", 1) == ["2026-01-12T14:00Z"]


def test_spring_forward_gap_runs_right_after_the_gap():
    # 2026-03-29: Berlin skips 02:00-03:00 local. A 02:30 job runs at 03:00 CEST (01:00 UTC), once.
    assert slots("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", 3) == [
        "2026-03-28T01:30Z", "2026-03-29T01:00Z", "2026-03-30T00:30Z"]


def test_fall_back_repeated_hour_runs_once():
    # 2026-10-25: Berlin repeats 02:00-03:00 local. A 02:30 job runs once (the first, CEST, 00:30 UTC).
    got = slots("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 3)
    assert got == ["2026-10-25T00:30Z", "2026-10-26T01:30Z", "2026-10-27T01:30Z"]


def test_macros():
    assert slots("@daily", None, "2026-01-01T10:00:00Z", 1) == ["2026-01-02T00:00Z"]
    assert slots("@hourly", None, "2026-01-01T10:00:00Z", 1) == ["2026-01-01T11:00Z"]


def test_six_fields_rejected_with_a_clear_reason():
    with pytest.raises(ScheduleError) as e:
        parse_schedule("0 */5 * * * *")
    msg = str(e.value)
    assert "spec.schedule" in msg and "6 fields" in msg and "5-field" in msg and "seconds" in msg
    assert isinstance(e.value, ConfigError)


@pytest.mark.parametrize("expr", ["* * * *", "61 * * * *", "* * 32 * *", "@fortnightly", "", "a b c d e"])
def test_bad_expressions(expr):
    with pytest.raises(ScheduleError, match="spec.schedule"):
        parse_schedule(expr)


def test_unknown_time_zone():
    with pytest.raises(ScheduleError, match="spec.timeZone.*Mars/Olympus"):
        parse_schedule("* * * * *", "Mars/Olympus")


S = parse_schedule("*/5 * * * *")


def test_decide_waits_before_the_first_slot():
    d = decide(S, None, t("2026-01-01T10:01:00Z"), t("2026-01-01T10:04:59Z"), None)
    assert d.action == "wait" and d.slot is None and d.next_time == t("2026-01-01T10:05:00Z")


def test_decide_runs_the_due_slot_once():
    d = decide(S, None, t("2026-01-01T10:01:00Z"), t("2026-01-01T10:05:02Z"), None)
    assert (d.action, d.slot, d.missed) == ("run", t("2026-01-01T10:05:00Z"), 0)
    # Once lastScheduleTime records it, the same moment decides nothing.
    d2 = decide(S, d.slot, t("2026-01-01T10:01:00Z"), t("2026-01-01T10:05:03Z"), None)
    assert d2.action == "wait" and d2.next_time == t("2026-01-01T10:10:00Z")


def test_decide_collapses_missed_slots_into_one_run():
    d = decide(S, t("2026-01-01T10:00:00Z"), None, t("2026-01-01T10:21:00Z"), None)
    assert (d.action, d.slot, d.missed) == ("run", t("2026-01-01T10:20:00Z"), 3)


def test_decide_past_starting_deadline_is_missed():
    d = decide(S, t("2026-01-01T10:00:00Z"), None, t("2026-01-01T10:07:00Z"), 60)
    assert (d.action, d.slot, d.missed) == ("missed", t("2026-01-01T10:05:00Z"), 1)
    d = decide(S, t("2026-01-01T10:00:00Z"), None, t("2026-01-01T10:05:30Z"), 60)
    assert d.action == "run"


def test_decide_never_runs_slots_before_creation():
    d = decide(S, None, t("2026-01-01T10:06:00Z"), t("2026-01-01T10:09:00Z"), None)
    assert d.action == "wait"


def test_decide_after_a_long_outage_is_bounded():
    every_minute = parse_schedule("* * * * *")
    d = decide(every_minute, t("2025-01-01T00:00:00Z"), None, t("2026-01-01T00:00:30Z"), None)
    assert d.action == "run" and d.slot == t("2026-01-01T00:00:00Z") and d.missed > 0


def test_decide_counts_from_creation_not_from_when_the_operator_first_saw_it():
    """Created at 12:03 while the operator was down, seen first at 12:17: CronJob semantics. The
    latest slot since creation (12:15) runs, the ones before it are counted as missed; with a
    startingDeadlineSeconds it has passed, it is recorded as missed. Anchoring on first sight
    instead would silently drop 12:05-12:15."""
    created, seen = t("2026-01-01T12:03:00Z"), t("2026-01-01T12:17:00Z")
    assert decide(S, None, created, t("2026-01-01T12:04:00Z"), None).next_time == t("2026-01-01T12:05:00Z")
    d = decide(S, None, created, seen, None)
    assert (d.action, d.slot, d.missed, d.next_time) == ("run", t("2026-01-01T12:15:00Z"), 2, t("2026-01-01T12:20:00Z"))
    d = decide(S, None, created, seen, 60)
    assert (d.action, d.slot) == ("missed", t("2026-01-01T12:15:00Z"))
