"""Status from Jobs, pods, SparkApplications and manifests; retention, history, concurrency, engine."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from rbak.errors import ConfigError
from rbak.format.manifest import BackupManifest, BackupOrigin, BackupOwner, QueueBackup, SegmentMetadata
from rbak_operator.decide import policy
from rbak.base.units import human_bytes as human_size
from rbak_operator.decide.status import (RunState, in_pod_validation, job_state, manifest_counts, push_history,
                                  run_summary, set_condition, spark_state)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def manifest() -> BackupManifest:
    m = BackupManifest(backup_id="nightly-20261122-1100", created_at=1, completed_at=2)
    for vhost, name, counts in (("/", "orders", (100, 50)), ("prod", "audit", (7,))):
        q = QueueBackup(vhost=vhost, name=name)
        for i, n in enumerate(counts, 1):
            q.add_segment(SegmentMetadata(key=f"k{i}", sequence=i, record_count=n, size_bytes=n * 1000,
                                          uncompressed_bytes=n * 3000, first_timestamp=1, last_timestamp=2, checksum="x"))
        m.queues.append(q)
    m.recompute_totals()
    return BackupManifest.from_json(m.to_json())  # as read from storage


def test_counts_come_from_the_manifest():
    assert manifest_counts(manifest()) == {"messages": 157, "bytes": 157000, "size": "153.3 KiB", "segments": 3, "queues": 2}


def test_human_size():
    assert [human_size(n) for n in (0, 1023, 1024, 5 * 1024**3)] == ["0 B", "1023 B", "1.0 KiB", "5.0 GiB"]


JOB_OK = {"status": {"startTime": "2026-11-22T11:00:01Z", "completionTime": "2026-11-22T11:02:31Z", "succeeded": 1,
                     "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-11-22T11:02:31Z"}]}}
JOB_FAILED = {"status": {"startTime": "2026-11-22T11:00:01Z", "failed": 1, "conditions": [
    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
     "message": "Job has reached the specified backoff limit", "lastTransitionTime": "2026-11-22T11:00:09Z"}]}}
POD_FAILED = {"metadata": {"creationTimestamp": "2026-11-22T11:00:00Z"}, "status": {"containerStatuses": [
    {"name": "rbak", "state": {"terminated": {"exitCode": 1, "message":
        "INFO starting\nrbak: AMQP error: ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN\n"}}}]}}


def test_job_state_running_succeeded_failed():
    assert job_state({"status": {"active": 1}}).phase == "Running"
    assert job_state({}).phase == "Running"
    ok = job_state(JOB_OK)
    assert ok.phase == "Succeeded" and ok.finished and ok.duration == 150
    bad = job_state(JOB_FAILED, [POD_FAILED])
    assert bad.phase == "Failed" and bad.reason == "BackoffLimitExceeded"
    assert bad.message.startswith("rbak: AMQP error: ACCESS_REFUSED")
    # Without pods the Job's own message is all there is.
    assert job_state(JOB_FAILED).message == "Job has reached the specified backoff limit"


def test_init_container_failure_is_found():
    pod = {"status": {"initContainerStatuses": [{"name": "rbak", "state": {"terminated": {"exitCode": 2, "message": "rbak: Configuration error: x"}}}],
                      "containerStatuses": [{"name": "validate", "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    assert job_state(JOB_FAILED, [pod]).message == "rbak: Configuration error: x"


def _pod(run_exit: int, validate: dict) -> dict:
    return {"status": {"initContainerStatuses": [{"name": "rbak", "state": {"terminated": {"exitCode": run_exit}}}],
                       "containerStatuses": [{"name": "validate", "state": validate}]}}


def test_in_pod_validation_outcome():
    failed = RunState("Failed")
    bad = {"terminated": {"exitCode": 1, "message": "  - backups/b/queues/v/q/segment-0001.zst: SHA-256 mismatch"}}
    assert in_pod_validation(RunState("Succeeded"), None) == "Passed"
    assert in_pod_validation(RunState("Running"), [_pod(0, {"running": {}})]) is None
    # The backup was written, then did not validate.
    assert in_pod_validation(failed, [_pod(0, bad)]) == "Failed"
    assert job_state(JOB_FAILED, [_pod(0, bad)]).message.endswith("segment-0001.zst: SHA-256 mismatch")
    # The backup itself failed: validation never ran.
    assert in_pod_validation(failed, [_pod(1, {"waiting": {"reason": "PodInitializing"}})]) is None
    assert in_pod_validation(failed, []) is None


@pytest.mark.parametrize("state, phase", [("", "Running"), ("SUBMITTED", "Running"), ("RUNNING", "Running"),
                                          ("COMPLETED", "Succeeded"), ("FAILED", "Failed"), ("SUBMISSION_FAILED", "Failed"),
                                          ("PENDING_RERUN", "Running")])
def test_spark_state(state, phase):
    assert spark_state({"status": {"applicationState": {"state": state, "errorMessage": "boom"}}}).phase == phase


def test_run_summary_from_job_and_manifest():
    s = run_summary(backup_id="b", job_name="b", trigger="schedule", state=job_state(JOB_OK),
                    slot=datetime(2026, 11, 22, 11, 0, tzinfo=timezone.utc), manifest=manifest(), validation="Passed")
    assert s == {"backupId": "b", "jobName": "b", "trigger": "schedule", "phase": "Succeeded", "reason": "Completed",
                 "scheduledTime": "2026-11-22T11:00:00Z", "startTime": "2026-11-22T11:00:01Z",
                 "completionTime": "2026-11-22T11:02:31Z", "durationSeconds": 150.0, "messages": 157, "bytes": 157000,
                 "size": "153.3 KiB", "segments": 3, "queues": 2, "validation": "Passed"}


def test_conditions_keep_transition_time_until_status_changes():
    c1 = set_condition(None, "Ready", "True", "A", "m", NOW, 3)
    c2 = set_condition(c1, "Ready", "True", "B", "m2", NOW + timedelta(hours=1), 4)
    assert c2[0]["lastTransitionTime"] == "2026-11-22T12:00:00Z" and c2[0]["reason"] == "B" and c2[0]["observedGeneration"] == 4
    c3 = set_condition(c2, "Ready", "False", "C", "m3", NOW + timedelta(hours=2), 4)
    assert c3[0]["lastTransitionTime"] == "2026-11-22T14:00:00Z"
    c4 = set_condition(c3, "Progressing", "True", "R", "", NOW, None)
    assert [c["type"] for c in c4] == ["Ready", "Progressing"] and "observedGeneration" not in c4[1]


def test_history_newest_first_bounded_and_unique():
    h: list = []
    for i in range(15):
        h = push_history(h, {"jobName": f"j{i}"}, limit=10)
    h = push_history(h, {"jobName": "j14", "phase": "Succeeded"}, limit=10)
    assert [e["jobName"] for e in h] == [f"j{i}" for i in range(14, 4, -1)] and h[0]["phase"] == "Succeeded"


# -- policy ------------------------------------------------------------------

def B(i, complete=True, age_days=0.0):  # noqa: N802 - a short constructor for the tables below
    return policy.StoredBackup(f"nightly-{i:02d}", int((NOW - timedelta(days=age_days)).timestamp() * 1000) + i, complete)


def test_retention_keep_last():
    backups = [B(i, age_days=10 - i) for i in range(6)]
    assert policy.retention_victims(backups, 2, None, NOW) == ["nightly-00", "nightly-01", "nightly-02", "nightly-03"]


def test_retention_max_age_and_never_the_newest():
    backups = [B(i, age_days=40 - i) for i in range(3)]  # all older than 30 days
    assert policy.retention_victims(backups, None, timedelta(days=30), NOW) == ["nightly-00", "nightly-01"]


def test_retention_skips_incomplete_and_combines_rules():
    backups = [B(0, age_days=9), B(1, complete=False, age_days=8), B(2, age_days=7), B(3, age_days=1), B(4, age_days=0)]
    assert policy.retention_victims(backups, 3, None, NOW) == ["nightly-00"]
    assert policy.retention_victims(backups, 3, timedelta(days=5), NOW) == ["nightly-00", "nightly-02"]
    assert policy.retention_victims(backups, None, None, NOW) == []


def _m(origin: BackupOrigin | None = None) -> BackupManifest:
    return BackupManifest(backup_id="x", created_at=1, completed_at=2, origin=origin)


def test_owned_backups_only():
    """Without a recorded origin (an older operator's backups): by the exact shape of the id."""
    meta = {"namespace": "prod", "name": "nightly", "uid": "u1"}
    assert policy.owned("nightly-20261122-1100", _m(), meta)
    assert policy.owned("nightly-manual-abcd1234", _m(), meta)
    assert not policy.owned("nightlyx-20261122-1100", _m(), meta)
    assert not policy.owned("backup-20261122T110000Z", _m(), meta)
    assert not policy.owned("nightly-20261122-1100", None, meta)  # no manifest: nobody's


def test_owned_by_the_recorded_owner_not_the_name():
    meta = {"namespace": "prod", "name": "twin", "uid": "u1"}
    mine = BackupOrigin("rabbit@a", None, BackupOwner("prod", "twin", "u1"))
    assert policy.owned("anything", _m(mine), meta)
    # the same name in another namespace, another uid (deleted and made again), a CLI backup: not ours
    assert not policy.owned("twin-manual-4cd0e21a", _m(BackupOrigin("rabbit@b", None, BackupOwner("dev", "twin", "u2"))), meta)
    assert not policy.owned("twin-manual-4cd0e21a", _m(BackupOrigin("rabbit@a", None, BackupOwner("prod", "twin", "u0"))), meta)
    assert not policy.owned("twin-manual-4cd0e21a", _m(BackupOrigin("rabbit@a", None, None)), meta)
    # an API server without uids (kmock's emulator): namespace and name
    assert policy.owned("x", _m(BackupOrigin("c", None, BackupOwner("prod", "twin"))), {"namespace": "prod", "name": "twin"})


def test_backup_ids_differ_across_namespaces_and_objects():
    from rbak_operator.decide import naming

    run = naming.manual_run_name("twin", "1")
    ids = {naming.run_backup_id(run, ns, uid) for ns, uid in (("a", "u1"), ("b", "u1"), ("a", "u2"), ("a", None))}
    assert len(ids) == 4 and all(i.startswith(run + "-") for i in ids)
    assert naming.run_backup_id(run, "a", "u1") == naming.run_backup_id(run, "a", "u1")


@pytest.mark.parametrize("text, secs", [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("2w", 1209600), ("10s", 10)])
def test_durations(text, secs):
    assert policy.parse_duration(text).total_seconds() == secs


def test_bad_duration():
    with pytest.raises(ConfigError, match="spec.retention.maxAge.*'1y'"):
        policy.parse_duration("1y")


def test_concurrency():
    assert policy.concurrency("Forbid", []) == "run"
    assert policy.concurrency(None, ["a"]) == "skip"
    assert policy.concurrency("Allow", ["a"]) == "run"
    assert policy.concurrency("Replace", ["a"]) == "replace"
    with pytest.raises(ConfigError, match="concurrencyPolicy"):
        policy.concurrency("Sometimes", ["a"])


def test_history_victims():
    finished = [("a", "Succeeded", "1"), ("b", "Succeeded", "2"), ("c", "Succeeded", "3"), ("d", "Failed", "1"), ("e", "Failed", "2")]
    assert sorted(policy.history_victims(finished, 2, 1)) == ["a", "d"]
    assert sorted(policy.history_victims(finished, 0, 0)) == ["a", "b", "c", "d", "e"]


def test_restore_engine():
    assert policy.restore_engine("job", 10**15, 1) == "job"
    assert policy.restore_engine("spark", 1, None) == "spark"
    assert policy.restore_engine("auto", 2000, 1000) == "spark"
    assert policy.restore_engine(None, 1000, 1000) == "job"
    assert policy.restore_engine("auto", None, 1000) == "job"
    with pytest.raises(ConfigError, match="spec.engine"):
        policy.restore_engine("flink", 1, 1)


def test_validation_engine():
    assert policy.validation_engine({"enabled": False}, 10**12) == "none"
    assert policy.validation_engine(None, 10**12) == "job"
    assert policy.validation_engine({"sparkThresholdBytes": 1000}, 1001) == "spark"


def test_pitr_bounds():
    assert policy.epoch_ms("1795341600000", "x") == 1795341600000
    assert policy.epoch_ms("2026-11-22T10:00:00Z", "x") == 1795341600000
    assert policy.epoch_ms("2026-11-22T11:00:00+01:00", "x") == 1795341600000
    with pytest.raises(ConfigError, match="spec.pitr.start"):
        policy.epoch_ms("yesterday", "spec.pitr.start")


@pytest.mark.parametrize("name", ["nightly", "n" * 120, "Odd.Name_x"])
def test_owned_matches_every_generated_name(name):
    from rbak_operator.decide import naming

    slot = datetime(2026, 11, 22, 11, 0, tzinfo=timezone.utc)
    meta = {"namespace": "ns", "name": name}
    assert policy.owned(naming.scheduled_run_name(name, slot), _m(), meta)
    assert policy.owned(naming.manual_run_name(name, "x"), _m(), meta)
    assert not policy.owned(naming.scheduled_run_name(name + "2", slot), _m(), meta)


def _waiting_pod(created, waiting=None, init=False, phase="Pending", conditions=None):
    cs = [{"name": "rbak", "state": {"waiting": waiting} if waiting else {"running": {}}}]
    return {"metadata": {"name": "r-pod", "creationTimestamp": created},
            "status": {"phase": phase, "initContainerStatuses" if init else "containerStatuses": cs,
                       "conditions": conditions or []}}


def test_start_failure_past_the_bound_only():
    from rbak_operator.decide.status import start_failure

    now = datetime(2030, 1, 1, 0, 10, tzinfo=timezone.utc)
    secret = {"reason": "CreateContainerConfigError", "message": 'secret "rmq" not found'}
    failed, due = start_failure([_waiting_pod("2030-01-01T00:09:00Z", secret, init=True)], now, 300)
    assert failed is None and due == datetime(2030, 1, 1, 0, 14, tzinfo=timezone.utc)
    failed, due = start_failure([_waiting_pod("2030-01-01T00:04:00Z", secret, init=True)], now, 300)
    assert failed == ("SecretMissing", 'pod r-pod container rbak: CreateContainerConfigError: secret "rmq" not found '
                      "(not started after 300s)") and due is None
    pull = {"reason": "ErrImagePull", "message": "pull access denied"}
    assert start_failure([_waiting_pod("2030-01-01T00:00:00Z", pull)], now, 300)[0][0] == "ImagePull"
    crash = {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}
    assert start_failure([_waiting_pod("2030-01-01T00:00:00Z", crash)], now, 300)[0][0] == "CrashLoop"
    unsched = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "lastTransitionTime": "2030-01-01T00:01:00Z", "message": "0/3 nodes are available"}]
    failed, _ = start_failure([_waiting_pod("2030-01-01T00:00:00Z", conditions=unsched)], now, 300)
    assert failed[0] == "Unschedulable" and "0/3 nodes are available" in failed[1]
    # running, or a container merely being created: never failed (looked at again one bound later)
    assert start_failure([_waiting_pod("2030-01-01T00:00:00Z", phase="Running")], now, 300) == (
        None, datetime(2030, 1, 1, 0, 15, tzinfo=timezone.utc))
    assert start_failure([_waiting_pod("2030-01-01T00:00:00Z", phase="Succeeded")], now, 300) == (None, None)
    creating = {"reason": "ContainerCreating"}
    assert start_failure([_waiting_pod("2030-01-01T00:00:00Z", creating)], now, 300)[0] is None


@pytest.mark.parametrize("message, reason", [
    ("rbak: AMQP error: ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN", "AuthenticationFailed"),
    ("rbak: Management API error: GET http://h:15672/api/overview -> HTTP 401", "AuthenticationFailed"),
    ("rbak: Storage error: s3://b: NoSuchBucket", "StorageUnreachable"),
    ("rbak: Restore error: 'v'/'q' already holds 3; refusing to publish into a non-empty queue", "TargetNotEmpty"),
    ("rbak: Backup lease: vhost 'v' is held by backup 'x'", "SourceBusy"),
    ("rbak: something else", "RunFailed"),
])
def test_failure_reasons_are_specific(message, reason):
    from rbak_operator.decide.status import failure_reason

    assert failure_reason(RunState("Failed", "BackoffLimitExceeded", message)) == reason
    assert failure_reason(RunState("Failed", "SecretMissing", "pod ...")) == "SecretMissing"


def test_errors_in_the_spec_words():
    from rbak_operator.decide.status import in_user_words

    bad = "rbak: Management API error: http://r:15672/api/overview: 401 (check source.management_username/password)"
    assert in_user_words(bad, "backup").endswith("(check the username and password in the Secret of "
                                                 "spec.broker.credentialsSecretRef (or of the RabbitmqCluster's default user))")
    full = "rbak: Restore error: 'v'/'q' already holds 3; refusing to publish into a non-empty queue (set restore.allow_non_empty: true to add to it)"
    assert in_user_words(full, "restore").endswith("(drain it, or restore elsewhere with spec.vhostMapping or spec.queueMapping)")
    assert "spec.queues.vhosts" in in_user_words("rbak: Configuration error: source.queues.vhosts: vhost 'x' does not exist", "backup")
