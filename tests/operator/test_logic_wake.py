"""When a RabbitMQBackup's next pass is due (wake.py) and what wakes it early (wakeups.py)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from rbak_operator.decide import wake
from rbak_operator.runtime import wakeups

NOW = datetime(2026, 11, 28, 10, 0, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


def test_next_wake_is_the_earliest_duty_or_the_resync():
    slot, drill = NOW + timedelta(minutes=7), NOW + timedelta(minutes=3)
    assert wake.next_wake([slot, None], NOW, HOUR) == slot
    assert wake.next_wake([slot, drill], NOW, HOUR) == drill
    assert wake.next_wake([NOW + 2 * HOUR], NOW, HOUR) == NOW + HOUR
    assert wake.next_wake([], NOW, HOUR) == NOW + HOUR


def test_a_due_time_in_the_past_never_spins():
    assert wake.next_wake([NOW - HOUR], NOW, HOUR) == NOW + wake.MIN_DELAY


def test_backup_times_include_the_next_drill():
    status = {"nextScheduleTime": None, "restoreDrill": {"nextRunTime": "2026-11-28T10:05:00Z"}}
    slot = NOW + timedelta(minutes=9)
    assert wake.backup_times(status, slot) == [slot, NOW + timedelta(minutes=5), None]
    assert wake.backup_times({}, None) == [None, None, None]


def test_backup_times_include_the_next_check_of_a_signed_drill_report():
    from rbak_operator.decide.wake import EVIDENCE_RECHECK

    d = {"signer": "SHA256:ab", "lastJob": "n-drill-1", "backupId": "b1", "evidenceCheckTime": "2026-11-28T10:00:00Z"}
    assert wake.backup_times({"restoreDrill": d}, None)[2] == NOW + EVIDENCE_RECHECK
    assert wake.backup_times({"restoreDrill": dict(d, signer=None)}, None)[2] is None  # nothing signed to vouch for


def test_backoff_doubles_up_to_a_cap():
    assert [wake.backoff(n).total_seconds() for n in (1, 2, 3, 4)] == [2, 4, 8, 16]
    assert wake.backoff(30).total_seconds() == 300


def test_status_only_events_do_not_wake_but_spec_and_annotations_do():
    key = ("backup", "ns", "b-wake")
    body = {"metadata": {"generation": 1, "annotations": {}}, "spec": {"suspend": True}, "status": {"phase": "Scheduled"}}
    assert wakeups.object_changed(key, body)  # first sight
    assert not wakeups.object_changed(key, dict(body, status={"phase": "Running"}))  # our own status patch
    body = dict(body, spec={"suspend": False})  # spec changed (generation or not: kmock does not bump it)
    assert wakeups.object_changed(key, body)
    body = dict(body, metadata={"annotations": {"rbak.io/backup-now": "1"}})
    assert wakeups.object_changed(key, body)
    assert not wakeups.object_changed(key, body)
    body = dict(body, metadata={"annotations": {"rbak.io/backup-now": "1"}, "deletionTimestamp": "2026-11-28T10:00:00Z"})
    assert wakeups.object_changed(key, body)
    wakeups.forget(key)


def test_jobs_and_spark_apps_map_to_their_owners():
    body = {"metadata": {"namespace": "team-a", "ownerReferences": [
        {"kind": "RabbitMQBackup", "name": "orders"}, {"kind": "Deployment", "name": "x"},
        {"kind": "RabbitMQRestore", "name": "r1"}]}}
    assert wakeups.owners(body) == [("backup", "team-a", "orders"), ("restore", "team-a", "r1")]
    assert wakeups.owners({"metadata": {"namespace": "team-a"}}) == []


def test_source_index_answers_only_for_namespaces_it_has_seen():
    assert wakeups.sources_in("never-seen") is None
    wakeups.remember_source("ns-idx", "a", ("amqp:r:5672", frozenset()))
    assert wakeups.sources_in("ns-idx") == {"a": ("amqp:r:5672", frozenset())}
    wakeups.forget(("backup", "ns-idx", "a"))
    assert wakeups.sources_in("ns-idx") is None


def test_a_poke_ends_the_sleep_long_before_its_due_time():
    async def run() -> float:
        key = ("backup", "ns", "b-poke")
        wakeups.flag(key)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, wakeups.poke, key)
        t0 = loop.time()
        await wakeups.sleep_until(key, datetime.now(timezone.utc) + HOUR, asyncio.Event())
        wakeups.forget(key)
        return loop.time() - t0

    assert asyncio.run(asyncio.wait_for(run(), 20)) < 20  # an hour's sleep, ended by the poke


def test_stopping_ends_the_sleep():
    async def run() -> None:
        key = ("restore", "ns", "r-stop")
        stopped = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, stopped.set)
        await wakeups.sleep_until(key, datetime.now(timezone.utc) + HOUR, stopped)
        wakeups.forget(key)

    asyncio.run(asyncio.wait_for(run(), 20))


def test_a_fake_clock_jump_past_the_due_time_wakes_the_sleeper(tmp_path, monkeypatch):
    clock_file = tmp_path / "now"
    clock_file.write_text("2026-11-28T10:00:00Z")
    monkeypatch.setenv("RBAK_OPERATOR_CLOCK_FILE", str(clock_file))

    async def run() -> None:
        key = ("backup", "ns", "b-clock")
        asyncio.get_running_loop().call_later(0.05, clock_file.write_text, "2026-11-28T10:05:00Z")
        await wakeups.sleep_until(key, NOW + timedelta(minutes=5), asyncio.Event())
        wakeups.forget(key)

    asyncio.run(asyncio.wait_for(run(), 20))
