"""``kubectl rbak``'s pure parts: the flags it turns into a RabbitMQRestore's spec, the status line
of states the end-to-end tests do not reach (running, suspended, a failed drill) and the drill
report. The commands themselves run against the real API server in test_kubectl_plugin.py."""

from __future__ import annotations

import pytest
from rbak_kubectl.context import PluginError, request_unpicked, table
from rbak_kubectl.runs import archive_row, report_drill, status_row, waits_for_active
from rbak_kubectl.stored import parse_pitr, vhost_mapping


@pytest.mark.parametrize("text, window", [
    ("2026-01-01T00:00:00Z..2026-01-02T00:00:00+02:00",
     {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00+02:00"}),
    ("..1767225600000", {"end": 1767225600000}),
    ("1767225600000..", {"start": 1767225600000}),
])
def test_pitr_window(text, window):
    assert parse_pitr(text) == window


@pytest.mark.parametrize("text, error", [
    ("2026-01-01T00:00:00Z", "--pitr: '2026-01-01T00:00:00Z' must be START..END, START.. or ..END"),
    ("..", "--pitr: '..' must be START..END"),
    ("2026-01-01T00:00:00..", "--pitr start: RFC 3339 time '2026-01-01T00:00:00' needs a time zone"),
    ("..soon", "--pitr end: must be epoch milliseconds or an RFC 3339 time, got 'soon'"),
])
def test_pitr_refused(text, error):
    with pytest.raises(PluginError) as e:
        parse_pitr(text)
    assert str(e.value).startswith(error)


def test_to_vhost_maps_the_only_vhost_or_named_ones():
    assert vhost_mapping(["copy"], ["shop"], "b1") == {"shop": "copy"}
    assert vhost_mapping(["a=x", "b=y"], ["a", "b"], "b1") == {"a": "x", "b": "y"}
    assert vhost_mapping(["a=x"], None, "b1") == {"a": "x"}  # storage not readable: taken as given
    for values, vhosts, error in [
        (["copy"], ["a", "b"], "--to-vhost copy: backup b1 holds vhosts a, b; give SOURCE=TARGET for each"),
        (["copy"], None, "--to-vhost copy: give SOURCE=TARGET (the storage is not readable from here)"),
        (["c=x"], ["a"], "--to-vhost c=x: backup b1 has no vhost 'c' (it holds a)"),
        (["a="], ["a"], "--to-vhost 'a=': SOURCE and TARGET must not be empty"),
    ]:
        with pytest.raises(PluginError) as e:
            vhost_mapping(values, vhosts, "b1")
        assert str(e.value) == error


def body(name="nightly", spec=None, status=None):
    return {"metadata": {"name": name}, "spec": spec or {}, "status": status or {}}


def test_status_row_of_a_running_suspended_and_failing_object():
    running = status_row(body(spec={"schedule": "0 3 * * *"}, status={
        "phase": "Running", "nextScheduleTime": "2030-01-01T03:00:00Z",
        "progress": {"summary": "3/10 queues, 12000 msgs (40%)"},
        "restoreDrill": {"active": "nightly-drill-x", "result": "Passed", "lastRunTime": "2029-12-31T04:00:10Z"}}))
    assert (running["phase"], running["nextRun"], running["drill"], running["notes"]) == (
        "Running (3/10 queues, 12000 msgs (40%))", "2030-01-01T03:00:00Z", "Running", [])
    failing = status_row(body(spec={"schedule": "0 3 * * *", "suspend": True}, status={
        "phase": "Suspended",
        "lastRun": {"backupId": "b1", "jobName": "b1", "phase": "Succeeded", "validation": "Failed",
                    "message": "validation failed: segment q/0 CRC mismatch"},
        "conditions": [{"type": "Ready", "status": "False", "reason": "ValidationFailed",
                        "message": "backup b1 validation failed: segment q/0 CRC mismatch"}],
        "restoreDrill": {"result": "Failed", "lastRunTime": "2029-12-31T04:00:10Z",
                         "message": "orders: 3 restored, 4 in the backup"}}))
    assert failing["result"] == "Succeeded, validation Failed" and failing["nextRun"] == "suspended"
    assert failing["drill"] == "Failed (2029-12-31T04:00:10Z)"
    assert failing["notes"] == ["last run b1: validation failed: segment q/0 CRC mismatch",
                                "drill failed: orders: 3 restored, 4 in the backup"]
    invalid = status_row(body(spec={"schedule": "61 * * * *"}, status={"phase": "Failed", "conditions": [
        {"type": "Ready", "status": "False", "reason": "InvalidSchedule", "message": "spec.schedule: bad"}]}))
    assert invalid["notes"] == ["InvalidSchedule: spec.schedule: bad"] and invalid["nextRun"] == "-"


def test_failed_drill_exits_1_and_names_the_queues(capsys):
    code = report_drill("nightly-drill-x", {"result": "Failed", "message": "1 queue(s) did not match",
                                            "backupId": "b1", "messages": 7, "failedQueues": ["shop/orders"],
                                            "signer": "ed25519:ab12"})
    assert code == 1
    assert capsys.readouterr().out == ("job/nightly-drill-x: Failed: 1 queue(s) did not match "
                                       "(backup b1, 7 messages, signed by ed25519:ab12)\n"
                                       "failed queues: shop/orders\n")


def test_an_archive_drill_reports_the_recovery_point_and_rto_and_its_failed_streams(capsys):
    passed = {"result": "Passed", "reason": "DrillPassed", "backupId": "orders.20261206T081219.576Z",
              "message": "1 stream(s) restored up to 2026-12-06T08:12:19.500Z into a scratch vhost and matched the "
                         "live streams (100 records)", "messages": 100, "recoveryPointSeconds": 1.8,
              "restoreSeconds": 0.4, "scratchVhost": "rbak-drill-x", "signer": "SHA256:ab", "failedStreams": []}
    assert report_drill("orders-archive-drill-manual-x", passed, archive=True) == 0
    assert capsys.readouterr().out == (
        "job/orders-archive-drill-manual-x: Passed: 1 stream(s) restored up to 2026-12-06T08:12:19.500Z into a "
        "scratch vhost and matched the live streams (100 records) (generation orders.20261206T081219.576Z, recovery "
        "point achieved 1.8s, RTO 0.4s, scratch vhost rbak-drill-x, signed by SHA256:ab)\n")
    failed = {**passed, "result": "Failed", "reason": "DrillFailed", "failedStreams": ["o/a"],
              "message": "archive 'orders': stream 'a' in vhost 'o': record at offset 3 missing from the restore"}
    assert report_drill("r", failed, archive=True) == 1
    assert capsys.readouterr().out.splitlines()[1:] == ["failed streams: o/a"]
    # a Job that stored no report: the earlier drill's figures still in the status are not this one's
    no_report = {**passed, "result": "Failed", "reason": "DrillJobFailed", "backupId": "orders",
                 "message": "the drill Job ended without storing a report", "signer": None}
    assert report_drill("r", no_report, archive=True) == 1
    assert capsys.readouterr().out == "job/r: Failed: the drill Job ended without storing a report\n"


def test_table_is_kubectls_layout():
    assert table(["NAME", "PHASE"], [["a-long-name", None], ["b", "Running"]]) == [
        "NAME          PHASE", "a-long-name   -", "b             Running"]


def test_a_trigger_waits_only_under_forbid():
    assert waits_for_active(None, ["nightly-20300101-0300"])  # Forbid is the default
    assert waits_for_active("Forbid", ["a"]) and not waits_for_active("Forbid", [])
    assert not waits_for_active("Allow", ["a"]) and not waits_for_active("Replace", ["a"])


def test_a_request_no_operator_acted_on_is_named_and_any_status_change_counts_as_an_operator():
    """``backup``/``drill`` give up after --pickup-timeout only when the status is as the request left it;
    an operator that set the trigger's field, or wrote anything else (a run the request queues behind
    reporting progress), is alive: the command follows on."""
    before = {"lastManualTrigger": "v0", "phase": "Succeeded"}

    def body(status, value="v1"):
        return {"metadata": {"name": "nightly", "annotations": {"rbak.io/backup-now": value}}, "status": status}

    def acted(st):
        return st.get("lastManualTrigger") == "v1"

    def check(b):
        return request_unpicked("prod", b, "rbak.io/backup-now", "v1", before, acted, "status.lastManualTrigger")

    assert check(body(dict(before))) == (
        "RabbitMQBackup prod/nightly still has rbak.io/backup-now=v1 and its status is unchanged since it was set "
        "(status.lastManualTrigger is 'v0'); the request stays: an operator that starts runs it")
    assert check(body({**before, "lastManualTrigger": "v1"})) is None
    assert check(body({**before, "progress": {"runName": "nightly-0300", "summary": "1/2 queues"}})) is None
    assert check(body(dict(before), value="v2")) == (
        "RabbitMQBackup prod/nightly: rbak.io/backup-now is now 'v2', another request replaced 'v1', "
        "and its status is unchanged")
    drill = request_unpicked("prod", body({}), "rbak.io/backup-now", "v1", {}, acted,
                             "status.restoreDrill.lastManualTrigger")
    assert drill is not None and "(status.restoreDrill.lastManualTrigger is unset)" in drill


def test_archive_row_shows_the_columns_and_why_the_objective_is_missed():
    body = {"metadata": {"name": "orders"}, "spec": {"rpoSeconds": 10},
            "status": {"phase": "Lagging", "lagSeconds": 42, "recoverableUntil": "2026-12-06T08:12:19Z",
                       "streamCount": 2, "gapMessages": 50, "conditions": [
                           {"type": "Ready", "status": "True", "reason": "Archiving", "message": "ok"},
                           {"type": "RPOMet", "status": "False", "reason": "ObjectiveMissed", "message": "behind"},
                           {"type": "Degraded", "status": "True", "reason": "GapRecorded", "message": "v/s 1..50"}]}}
    r = archive_row(body)
    assert [r[k] for k in ("name", "phase", "rpo", "lag", "recoverableUntil", "streams", "gaps", "rpoMet")] == [
        "orders", "Lagging", "10s", "42s", "2026-12-06T08:12:19Z", 2, 50, "False"]
    assert r["notes"] == ["RPOMet ObjectiveMissed: behind", "Degraded GapRecorded: v/s 1..50"]
    fresh = archive_row({"metadata": {"name": "new"}, "spec": {}})
    assert (fresh["phase"], fresh["rpo"], fresh["lag"], fresh["notes"]) == ("Pending", "30s", None, [])


@pytest.mark.parametrize("argv,error", [
    (["restore", "--archive", "orders", "--backup-id", "x"], "restore --archive orders: the archive's newest generation"),
    (["restore", "orders"], "restore: give NAME --backup-id BACKUP_ID (a RabbitMQBackup's), or --archive NAME"),
    (["describe", "orders"], "describe: give NAME BACKUP_ID (a RabbitMQBackup's), or --archive NAME [GENERATION]"),
    (["drill"], "drill: give NAME (a RabbitMQBackup's drill) or --archive NAME (a RabbitMQArchive's), one of them"),
    (["drill", "nightly", "--archive", "orders"], "drill: give NAME (a RabbitMQBackup's drill) or --archive NAME (a "
                                                  "RabbitMQArchive's), not both"),
])
def test_archive_flags_refused_before_any_call(argv, error, capsys):
    """Wrong combinations are one line naming the flags, before the plugin reads anything from the cluster."""
    from rbak_kubectl import plugin

    args = plugin.build_parser().parse_args(argv)

    class NoKube:
        def __getattr__(self, name):
            raise AssertionError(f"no API call expected, got {name}")

    with pytest.raises(PluginError) as e:
        plugin.COMMANDS[args.command](plugin.Ctx(NoKube(), "ns", args))  # type: ignore[arg-type]
    assert str(e.value).startswith(error)


def test_describe_archive_shows_the_last_drill_beside_the_objective(capsys):
    from rbak_kubectl.stored import describe_archive_status

    body = {"metadata": {"name": "orders"}, "spec": {"rpoSeconds": 30},
            "status": {"phase": "Archiving", "restoreDrill": {
                "result": "Failed", "reason": "DrillFailed", "lastRunTime": "2026-12-06T06:00:12Z",
                "message": "archive 'orders': stream 'a' in vhost 'o': record at offset 3 missing from the restore",
                "recoveryPointSeconds": 1.8, "restoreSeconds": 0.4, "restorePoint": "2026-12-06T05:55:10.000Z",
                "evidenceKey": "p/orders.1/drills/t-x.json", "signer": "SHA256:ab"}}}
    describe_archive_status(body)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:5] == [
        "Drill:       Failed at 2026-12-06T06:00:12Z: recovery point achieved 1.8s (objective 30s), RTO 0.4s, "
        "restored up to 2026-12-06T05:55:10.000Z, signed by SHA256:ab",
        "  DrillFailed: archive 'orders': stream 'a' in vhost 'o': record at offset 3 missing from the restore",
        "  evidence p/orders.1/drills/t-x.json"]
