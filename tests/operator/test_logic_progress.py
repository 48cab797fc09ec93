"""The pure parts of live progress (which run, status block, patch, CRD schema and columns) and the
deletion of a resource's gauges."""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest
from prometheus_client import REGISTRY

from rbak.repo.progress import ProgressRecord
from rbak_operator.decide import bodies
from rbak_operator.crds import schema as crds
from rbak_operator.metrics import resources as rm
from rbak_operator.crds.parts import printer_columns, progress_schema
from rbak_operator.decide.progress import cleared, progress_patch, status_progress, watched_run


def rec(**kw) -> ProgressRecord:
    base = dict(kind="backup", run_id="nightly-20261124-0200", state="running", started_at=1_800_000_000.0,
                updated_at=1_800_000_042.0, queues_total=5, queues_done=2, records=1200, bytes=5 * 1024 * 1024,
                rate=345.6, current_queue="prod/orders")
    return ProgressRecord(**{**base, **kw})


def test_watched_run():
    assert watched_run("backup", {"active": ["b-20260101-0100", "b-20260101-0200"]}) == "b-20260101-0200"
    assert watched_run("backup", {"active": []}) is None and watched_run("backup", None) is None
    assert watched_run("restore", {"phase": "Running", "engine": "job", "jobName": "r-restore"}) == "r-restore"
    assert watched_run("restore", {"phase": "Running", "engine": "spark", "sparkApplicationName": "x"}) is None
    assert watched_run("restore", {"phase": "Succeeded", "engine": "job", "jobName": "r-restore"}) is None


def test_status_block_from_a_record():
    p = status_progress(rec())
    assert p["runName"] == "nightly-20261124-0200" and p["state"] == "Running"
    assert (p["queues"], p["queuesDone"], p["queuesTotal"], p["messages"]) == ("2/5", 2, 5, 1200)
    assert (p["size"], p["rate"], p["messagesPerSecond"], p["currentQueue"]) == ("5.0 MiB", "346 msg/s", 345.6, "prod/orders")
    assert p["summary"] == "2/5 queues, 1200 msgs" and "percent" not in p and "messagesTotal" not in p
    assert p["startTime"] == "2027-01-15T08:00:00Z" and p["updateTime"] == "2027-01-15T08:00:42Z"
    r = status_progress(rec(kind="restore", records_total=4800, queues_total=None, current_queue=None))
    assert (r["percent"], r["messagesTotal"], r["queues"], r["currentQueue"]) == (25, 4800, "2/?", "")
    assert r["summary"] == "2/? queues, 1200 msgs (25%)"
    assert status_progress(rec(state="failed"))["state"] == "Failed"


def test_patch_only_when_something_changed_and_only_for_the_running_run():
    r = rec()
    patch = progress_patch({}, r.run_id, r)
    assert patch == {"progress": status_progress(r)}
    assert progress_patch(patch, r.run_id, r) is None  # same record again: no write
    assert progress_patch({}, "another-run", r) is None  # an older run's leftovers are never shown
    assert progress_patch({}, None, r) is None and progress_patch({}, r.run_id, None) is None
    assert cleared({"progress": {"runName": "x"}}, running=False) == {"progress": None}
    assert cleared({"progress": {"runName": "x"}}, running=True) == {}
    assert cleared({}, running=False) == {}


@pytest.mark.parametrize("kind", ["RabbitMQBackup", "RabbitMQRestore"])
def test_crds_carry_the_progress_columns_and_accept_the_status(kind):
    crd = next(c for c in crds.all_crds().values() if c["spec"]["names"]["kind"] == kind)
    kubernetes_validate.validate(crd, "1.33", strict=True)
    ver = crd["spec"]["versions"][0]
    cols = [(c["name"], c["type"], c["jsonPath"], c.get("priority", 0)) for c in ver["additionalPrinterColumns"]]
    assert set(printer_columns(kind)) <= set(cols)
    assert cols[-1][0] == "Age"  # kubectl's habit: Age last
    status_schema = ver["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status_schema["properties"]["progress"] == progress_schema()
    for _, _, path, _ in printer_columns(kind):  # every column names a field of the schema
        node = ver["schema"]["openAPIV3Schema"]
        for part in path.strip(".").split("."):
            node = node["properties"][part]
    jsonschema.Draft7Validator(status_schema).validate({"progress": status_progress(rec())})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(status_schema).validate({"progress": {**status_progress(rec()), "state": "Sleeping"}})


def test_run_jobs_report_progress_under_their_own_name():
    job = bodies.job_body(bodies.JobRun(name="nightly-manual-1", namespace="prod", owner={"apiVersion": "rbak.io/v1alpha1",
                          "kind": "RabbitMQBackup", "metadata": {"name": "nightly", "uid": "u"}}, spec={},
                          storage={"s3": {"bucket": "b"}}, secret_env=[], args=bodies.backup_args(), labels={},
                          validate_args=["validate"], progress_id="nightly-manual-1"))
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["initContainers"][0]["env"]}
    assert env["RBAK_PROGRESS_ID"] == "nightly-manual-1" and float(env["RBAK_PROGRESS_INTERVAL"]) > 0
    assert "RBAK_PROGRESS_ID" not in {e["name"] for e in pod["containers"][0]["env"]}  # the validation is not the run


def test_forget_drops_every_series_of_the_deleted_object_only():
    val = REGISTRY.get_sample_value
    mk = lambda n, reason: {"metadata": {"namespace": "ns1", "name": n}, "spec": {"schedule": "0 3 * * *"},  # noqa: E731
                            "status": {"lastSuccessfulTime": "2026-11-23T01:31:00Z",
                                       "lastRun": {"phase": "Failed", "reason": reason, "messages": 4}}}
    rm.observe("rabbitmqbackups", mk("gone", "BackupFailed"))
    rm.observe("rabbitmqbackups", mk("stays", "BackupFailed"))
    # a series this process exported under another reason before a restart of the bookkeeping
    rm._GAUGES["rbak_backup_last_run_failed"].labels(rbak_namespace="ns1", backup="gone", reason="Old").set(1)
    removed = rm.forget("rabbitmqbackups", "ns1", "gone")
    assert {m for m, _ in removed} >= {"rbak_backup_last_messages", "rbak_backup_last_run_failed",
                                       "rbak_backup_schedule_period_seconds"}
    for reason in ("BackupFailed", "Old"):
        assert val("rbak_backup_last_run_failed", {"rbak_namespace": "ns1", "backup": "gone", "reason": reason}) is None
    assert val("rbak_backup_last_messages", {"rbak_namespace": "ns1", "backup": "gone"}) is None
    assert val("rbak_backup_last_messages", {"rbak_namespace": "ns1", "backup": "stays"}) == 4
    assert rm.forget("rabbitmqbackups", "ns1", "gone") == []  # twice: nothing left, no error
    rm.forget("rabbitmqbackups", "ns1", "stays")
