"""The chart's Argo CD health checks, run by a real Lua 5.1 interpreter (the dialect of Argo CD's
gopher-lua, via lupa) against status bodies the operator's reconcilers write in the in-memory Kube
of test_handlers_fake, and the ``argocd-cm`` snippet of the docs against the shipped scripts."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from rbak_operator.reconcile import drill
from rbak_operator import handlers
from rbak_operator.decide.status import RunState
from support.require import require
from test_handlers_fake import (
    LOG,
    NS,
    FakeKube,
    backup_obj,
    clock,  # noqa: F401 (fixture)
    pvc,  # noqa: F401 (fixture)
    restore_obj,
    t,
    OWNER,
    backup_id_of,
    write_backup,
)
from test_logic_status import POD_FAILED

from rbak.format.manifest import BackupManifest, QueueStatus

lupa = require("lupa.lua51", "lupa")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "charts" / "rbak" / "files" / "argocd"
REFUSED = "rbak: AMQP error: ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN"
KEYS = {"resource.customizations.health.rbak.io_RabbitMQBackup": "rabbitmqbackup-health.lua",
        "resource.customizations.health.rbak.io_RabbitMQRestore": "rabbitmqrestore-health.lua",
        "resource.customizations.health.rbak.io_RabbitMQArchive": "rabbitmqarchive-health.lua"}


def health(script: str, obj: dict) -> tuple[str, str]:
    """(status, message) as Argo CD gets them: ``obj`` a global table, the chunk's return value."""
    lua = lupa.LuaRuntime()
    assert lua.eval("_VERSION") == "Lua 5.1"
    lua.globals().obj = lua.table_from(copy.deepcopy(obj), recursive=True)
    hs = lua.execute((SCRIPTS / script).read_text())
    assert set(dict(hs.items())) == {"status", "message"}
    return hs["status"], hs["message"]


def backup_health(obj):
    return health("rabbitmqbackup-health.lua", obj)


def restore_health(obj):
    return health("rabbitmqrestore-health.lua", obj)


class PodsKube(FakeKube):
    """A failed Job's pod carries the CLI's error line as its termination message."""

    def job_pods(self, ns, job):
        return [POD_FAILED]


def run_now(k, value="x"):
    k.objs[("backup", "b")]["metadata"]["annotations"] = {"rbak.io/backup-now": value}
    handlers.reconcile_backup(k, NS, "b", LOG)
    return max(name for kind, name in k.objs if kind == "job")


def test_backup_healthy_progressing_healthy(clock, pvc):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(schedule="*/5 * * * *", validate={"enabled": False})
    assert backup_health(k.objs[("backup", "b")]) == ("Progressing", "Waiting for the rbak operator")
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert backup_health(k.objs[("backup", "b")]) == ("Healthy", "No backup yet; next run at 2030-01-01T00:05:00Z")
    clock["now"] = t("2030-01-01T00:05:03Z")
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert backup_health(k.objs[("backup", "b")]) == ("Progressing", "running: b-20300101-0005")
    bid = backup_id_of(k, "b-20300101-0005")
    write_backup(pvc, bid, 42, 4096, origin=OWNER)
    k.finish_job("b-20300101-0005")
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert k.objs[("backup", "b")]["status"]["phase"] == "Succeeded"
    assert backup_health(k.objs[("backup", "b")]) == (
        "Healthy", f"Last backup {bid} succeeded: 42 messages, 4.0 KiB")


def test_backup_progress_summary_is_shown(clock, pvc):
    from rbak_operator.decide.progress import progress_patch

    from rbak.repo.progress import ProgressRecord

    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"enabled": False})
    run = run_now(k)
    body = k.objs[("backup", "b")]
    rec = ProgressRecord(run_id=run, kind="backup", state="running", queues_done=1, queues_total=3, records=500, bytes=5000,
                         rate=250.0, current_queue="/orders", started_at=1.0, updated_at=2.0, records_total=1000)
    body["status"].update(progress_patch(body["status"], run, rec))
    assert backup_health(body) == ("Progressing", f"running: {run} (1/3 queues, 500 msgs (50%))")


def test_failed_backup_is_degraded_with_the_conditions_message(clock, pvc):
    k = PodsKube()
    k.objs[("backup", "b")] = backup_obj(validate={"enabled": False})
    run = run_now(k)
    k.finish_job(run, ok=False)
    handlers.reconcile_backup(k, NS, "b", LOG)
    st = k.objs[("backup", "b")]["status"]
    assert st["phase"] == "Failed"
    assert backup_health(k.objs[("backup", "b")]) == (
        "Degraded", f"AuthenticationFailed: backup {backup_id_of(k, run)} failed (AuthenticationFailed): {REFUSED}")


def test_partial_backup_is_degraded_naming_the_queue(clock, pvc):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"enabled": False})
    run = run_now(k)
    run = backup_id_of(k, job := run)
    write_backup(pvc, run, 7, 700, origin=OWNER)
    m = BackupManifest.from_json(pvc.get(f"{run}/manifest.json"))
    m.queue_status = [QueueStatus("/", "limited", "refused", "its delivery limit is 2")]
    pvc.put(f"{run}/manifest.json", m.to_json())
    k.finish_job(job, ok=False)
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert backup_health(k.objs[("backup", "b")]) == (
        "Degraded", f"BackupPartial: backup {run} is partial: //limited (refused): its delivery limit is 2")


def test_validation_failing_after_a_successful_run_is_degraded(clock, pvc):
    """The Ready condition stays True (the run succeeded); lastRun.validation says Failed."""
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"sparkThresholdBytes": 10**9})
    run = run_now(k)
    bid = backup_id_of(k, run)
    write_backup(pvc, bid, 5, 5000, origin=OWNER)
    k.finish_job(run)
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert backup_health(k.objs[("backup", "b")]) == (
        "Healthy", f"Last backup {bid} succeeded: 5 messages, 4.9 KiB (validation pending)")
    k.finish_job(f"{run}-validate", ok=False)
    handlers.reconcile_backup(k, NS, "b", LOG)
    status, message = backup_health(k.objs[("backup", "b")])
    assert status == "Degraded" and message.startswith(f"ValidationFailed: backup {bid} validation failed")


def test_invalid_schedule_is_degraded(clock):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(schedule="61 * * * *")
    handlers.reconcile_backup(k, NS, "b", LOG)
    status, message = backup_health(k.objs[("backup", "b")])
    assert status == "Degraded" and message.startswith("InvalidSchedule: ") and "61" in message


def test_suspended_backup(clock, pvc):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(schedule="*/5 * * * *", suspend=True)
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert k.objs[("backup", "b")]["status"]["phase"] == "Suspended"
    assert backup_health(k.objs[("backup", "b")]) == ("Suspended", "Scheduled backups are suspended (spec.suspend)")


def test_a_failed_restore_drill_is_degraded(clock, pvc):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"enabled": False})
    job = run_now(k)
    run = backup_id_of(k, job)
    write_backup(pvc, run, 5, 5000, origin=OWNER)
    k.finish_job(job)
    handlers.reconcile_backup(k, NS, "b", LOG)
    body = k.objs[("backup", "b")]
    report = {"passed": False, "reason": "1 of 2 queue(s) did not match the backup", "scratch_vhost": "rbak-drill-x",
              "queues": [{"vhost": "/", "queue": "q", "passed": False, "actual_count": 3}]}
    body["status"]["restoreDrill"] = drill.drill_result(
        RunState("Failed", "", "", t("2030-01-01T01:00:00Z"), t("2030-01-01T01:01:00Z")), report, run, "b-drill-1")
    assert backup_health(body) == (
        "Degraded", f"restore drill b-drill-1 of backup {run} failed: 1 of 2 queue(s) did not match the backup")
    report.update(passed=True, queues=[dict(report["queues"][0], passed=True)])
    body["status"]["restoreDrill"] = drill.drill_result(RunState("Succeeded"), report, run, "b-drill-2")
    assert backup_health(body)[0] == "Healthy"


def test_generation_not_yet_observed_and_deletion_are_progressing(clock, pvc):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"enabled": False})
    handlers.reconcile_backup(k, NS, "b", LOG)
    body = k.objs[("backup", "b")]
    assert backup_health(body) == ("Healthy", "No backup yet")
    body["metadata"]["generation"] = 3
    assert backup_health(body) == ("Progressing", "Waiting for the rbak operator to observe generation 3")
    body["metadata"]["deletionTimestamp"] = "2030-01-01T00:09:00Z"
    assert backup_health(body) == ("Progressing", "Pending deletion")


class ResultKube(FakeKube):
    """A finished restore's pod carries the run's result (rbak.commands.result_file) as its termination message."""

    result: dict = {}

    def job_pods(self, ns, job):
        if ("job", job) not in self.objs or not (self.objs[("job", job)].get("status") or {}).get("conditions"):
            return [{"metadata": {"creationTimestamp": "2030-01-01T00:00:31Z"}, "status": {"phase": "Running"}}]
        return [{"metadata": {"creationTimestamp": "2030-01-01T00:00:31Z"}, "status": {"phase": "Succeeded",
                 "containerStatuses": [{"name": "rbak", "state": {"terminated": {
                     "exitCode": 0, "message": json.dumps(self.result)}}}]}}]


@pytest.mark.parametrize("dry", [False, True])
def test_restore_progressing_healthy(clock, pvc, dry):
    k = ResultKube()
    k.result = {"backup_id": "b-20300101-0010", "dry_run": dry, "ok": True, "published": 0 if dry else 5,
                "confirmed": 0 if dry else 5, "selected": 5, "target_vhosts": ["/"], "target_queues": ["//q"],
                "failed_queues": []}
    k.objs[("backup", "b")] = backup_obj()
    write_backup(pvc, "b-20300101-0010", 7, 700)
    k.objs[("restore", "r")] = restore_obj()
    assert restore_health(k.objs[("restore", "r")]) == (
        "Progressing", "Waiting for the rbak operator to start the restore")
    handlers.reconcile_restore(k, NS, "r", LOG)
    assert restore_health(k.objs[("restore", "r")]) == ("Progressing", "restoring b-20300101-0010 with job")
    k.finish_job("r-restore")
    handlers.reconcile_restore(k, NS, "r", LOG)
    st = k.objs[("restore", "r")]["status"]
    # what the run did, not the backup's total (7): published and confirmed, where, dry run or not
    assert (st["backupMessages"], st["messages"], st["dryRun"], st["targetQueues"]) == (7, 0 if dry else 5, dry, ["//q"])
    assert restore_health(k.objs[("restore", "r")]) == (
        ("Healthy", "Dry run of backup b-20300101-0010: would publish 5 messages") if dry else
        ("Healthy", "Restored backup b-20300101-0010: 5 messages confirmed"))


def test_failed_restores_are_degraded(clock, pvc):
    k = PodsKube()
    k.objs[("backup", "b")] = backup_obj()
    k.objs[("restore", "r")] = restore_obj(backupRef={"name": "b", "backupId": "nope"})
    k.objs[("restore", "gone")] = dict(restore_obj(backupRef={"name": "missing"}),
                                       metadata={"name": "gone", "namespace": NS, "uid": "g"})
    handlers.reconcile_restore(k, NS, "gone", LOG)
    status, message = restore_health(k.objs[("restore", "gone")])
    assert status == "Degraded" and message == (
        "InvalidSpec: Restore spec error: spec.backupRef.name: RabbitMQBackup ns/missing not found")
    write_backup(pvc, "nope", 1, 10)
    handlers.reconcile_restore(k, NS, "r", LOG)
    k.finish_job("r-restore", ok=False)
    handlers.reconcile_restore(k, NS, "r", LOG)
    assert restore_health(k.objs[("restore", "r")]) == (
        "Degraded", f"AuthenticationFailed: {REFUSED}")


def _snippets(doc: Path) -> list[dict]:
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", doc.read_text(), flags=re.DOTALL) if "argocd-cm" in b]
    return [y for y in map(yaml.safe_load, blocks) if isinstance(y, dict) and (y.get("metadata") or {}).get("name")
            == "argocd-cm"]


@pytest.mark.parametrize("doc", ["charts/rbak/README.md", "docs/operator.md"])
def test_docs_snippet_is_the_shipped_scripts(doc):
    found = _snippets(ROOT / doc)
    assert len(found) == 1, f"{doc}: one argocd-cm ConfigMap snippet expected"
    data = found[0]["data"]
    assert set(data) == set(KEYS)
    for key, script in KEYS.items():
        assert data[key] == (SCRIPTS / script).read_text(), f"{doc}: {key} differs from files/argocd/{script}"


def _archive_status(tick_written_ago_ms: int, behind_ms: int, gaps: list | None = None, suspend: bool = False) -> dict:
    """The status the operator's decisions (decide/archive.py) write for a tick this old and this far behind."""
    from datetime import datetime, timezone

    from rbak.format.archive import Tick, TickStream
    from rbak.format.manifest import StreamInfo
    from rbak_operator.decide import archive as ad

    now_ms = 1_780_000_000_000
    written = now_ms - tick_written_ago_ms
    info = StreamInfo(first_offset=0, last_offset=9, gaps=gaps or [])
    tick = Tick("a", "a.20261206T000000.000Z", 1, written, written, written - behind_ms,
                [TickStream("v", "s", info, 1, written - behind_ms, True)])
    spec = {"rpoSeconds": 30, "suspend": suspend}
    v = ad.view(tick, now_ms, spec, {})
    phase, conds = ad.conditions(v, spec, None, datetime.fromtimestamp(now_ms / 1000, timezone.utc), 1)
    return {"metadata": {"name": "a"}, "spec": spec, "status": {**v.status, "phase": phase, "conditions": conds}}


def test_archive_health_follows_rpomet_gaps_and_suspend():
    from rbak.format.manifest import StreamGap

    assert health("rabbitmqarchive-health.lua", {"metadata": {"name": "a"}, "spec": {}}) == (
        "Progressing", "Waiting for the rbak operator to read the archive")
    status, message = health("rabbitmqarchive-health.lua", _archive_status(5_000, 300))
    assert status == "Healthy" and message.startswith("Recoverable until ") and message.endswith(", lag 1s")
    assert health("rabbitmqarchive-health.lua", _archive_status(5_000, 45_000)) == (
        "Degraded", "Recovery point objective missed: the archive is more than rpoSeconds=30 behind: recoverable "
        "until 2026-05-28T20:25:50Z")
    gap = _archive_status(5_000, 300, [StreamGap(10, 19)])
    assert health("rabbitmqarchive-health.lua", gap) == (
        "Degraded", "retention removed messages before the archive read them: v/s offsets 10..19 (10 messages)")
    assert health("rabbitmqarchive-health.lua", _archive_status(5_000, 300, suspend=True)) == (
        "Suspended", "Suspended: the archiver is scaled to 0")
