"""The handlers' decisions against an in-memory Kube (no server): call order,
validation and restore engines, concurrency, deletion with a missing Secret.
Storage is a real directory (a PVC as the operator sees it via RBAK_OPERATOR_PVC_ROOT)."""

from __future__ import annotations

import copy
import logging
from datetime import datetime

import pytest

from rbak.repo.catalog import list_backups
from rbak.format.manifest import BackupManifest, BackupOrigin, BackupOwner, QueueBackup, SegmentMetadata
from rbak.storage.url import open_storage
from rbak_operator.runtime import clock as op_clock
from rbak_operator import handlers
from rbak_operator.decide.status import GONE

NS = "ns"
LOG = logging.getLogger("test")


def t(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


class FakeKube:
    def __init__(self):
        self.objs: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple] = []

    def _get(self, kind, name):
        o = self.objs.get((kind, name))
        return copy.deepcopy(o) if o else None

    def get_backup(self, ns, name):
        return self._get("backup", name)

    def get_restore(self, ns, name):
        return self._get("restore", name)

    def patch_status(self, plural, ns, name, status):
        kind = "backup" if plural == "rabbitmqbackups" else "restore"
        self.calls.append(("patch_status", name, tuple(sorted(status))))
        st = self.objs[(kind, name)].setdefault("status", {})
        for k, v in status.items():
            if v is None:
                st.pop(k, None)
            else:
                st[k] = v

    def list_jobs(self, ns, labels):
        return [copy.deepcopy(o) for (k, _), o in self.objs.items() if k == "job"
                and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in labels.items())]

    def get_job(self, ns, name):
        return self._get("job", name)

    def create_job(self, body):
        self.calls.append(("create_job", body["metadata"]["name"]))
        if ("job", body["metadata"]["name"]) in self.objs:
            return False
        self.objs[("job", body["metadata"]["name"])] = copy.deepcopy(body)
        return True

    def delete_job(self, ns, name):
        self.calls.append(("delete_job", name))
        self.objs.pop(("job", name), None)

    def job_pods(self, ns, job):
        return []

    def create_configmap(self, body):
        self.objs[("cm", body["metadata"]["name"])] = body
        return True

    def delete_configmap(self, ns, name):
        self.objs.pop(("cm", name), None)

    def secret_values(self, ns, name):
        o = self.objs.get(("secret", name))
        return dict(o) if o is not None else None

    def get_rabbitmq_cluster(self, ns, name):
        self.calls.append(("get_rabbitmq_cluster", name))
        return self._get("rabbitmqcluster", name)

    def create_spark_app(self, body):
        self.calls.append(("create_spark_app", body["metadata"]["name"]))
        self.objs[("spark", body["metadata"]["name"])] = copy.deepcopy(body)
        return True

    def get_spark_app(self, ns, name):
        return self._get("spark", name)

    # test helpers
    def finish_job(self, name, ok=True):
        cond = {"type": "Complete" if ok else "Failed", "status": "True", "lastTransitionTime": "2030-01-01T00:06:00Z"}
        self.objs[("job", name)]["status"] = {"startTime": "2030-01-01T00:05:01Z", "completionTime": "2030-01-01T00:06:00Z",
                                              "conditions": [cond]}


@pytest.fixture
def pvc(tmp_path, monkeypatch):
    monkeypatch.setenv("RBAK_OPERATOR_PVC_ROOT", str(tmp_path))
    (tmp_path / "data" / "backups").mkdir(parents=True)
    return open_storage("file://" + str(tmp_path / "data" / "backups"))


@pytest.fixture
def clock(monkeypatch):
    box = {"now": t("2030-01-01T00:00:30Z")}
    monkeypatch.setattr(op_clock, "now", lambda: box["now"])
    return box


OWNER = BackupOrigin("rabbit@h", None, BackupOwner(NS, "b", "u"))


def backup_id_of(k, run):
    """The backup id the operator gave run ``run`` (its Job's annotation)."""
    return k.objs[("job", run)]["metadata"]["annotations"]["rbak.io/backup-id"]


def write_backup(storage, backup_id, messages, nbytes, created_ms=1, origin=None):
    """A backup as a run writes it (``origin``: OWNER for the runs of object b) or as an older version did."""
    m = BackupManifest(backup_id=backup_id, created_at=created_ms, completed_at=created_ms + 1, origin=origin)
    q = QueueBackup(vhost="/", name="q")
    q.add_segment(SegmentMetadata(key="k", sequence=1, record_count=messages, size_bytes=nbytes, uncompressed_bytes=nbytes,
                                  first_timestamp=1, last_timestamp=2, checksum="x"))
    m.queues.append(q)
    m.recompute_totals()
    storage.put(f"{backup_id}/manifest.json", m.to_json())


def backup_obj(**spec):
    base = {"broker": {"amqpUrl": "amqp://h:5672/%2f", "managementUrl": "http://h:15672", "credentialsSecretRef": {"name": "c"}},
            "storage": {"pvc": {"claimName": "data", "path": "backups"}}}
    return {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQBackup",
            "metadata": {"name": "b", "namespace": NS, "uid": "u", "creationTimestamp": "2030-01-01T00:00:00Z", "generation": 2},
            "spec": {**base, **spec}}


def test_slot_is_persisted_before_the_job_is_created(clock):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(schedule="*/5 * * * *")
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert not [c for c in k.calls if c[0] == "create_job"]
    clock["now"] = t("2030-01-01T00:05:03Z")
    handlers.reconcile_backup(k, NS, "b", LOG)
    names = [c[0] for c in k.calls]
    i_patch = next(i for i, c in enumerate(k.calls) if c[0] == "patch_status" and "lastScheduleTime" in c[2])
    assert i_patch < names.index("create_job") and k.calls[names.index("create_job")][1] == "b-20300101-0005"
    st = k.objs[("backup", "b")]["status"]
    assert st["lastScheduleTime"] == "2030-01-01T00:05:00Z" and st["phase"] == "Running" and st["observedGeneration"] == 2
    # Crash between the status patch and the Job: the next pass re-creates the same Job, once.
    del k.objs[("job", "b-20300101-0005")]
    handlers.reconcile_backup(k, NS, "b", LOG)
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert [c[1] for c in k.calls if c[0] == "create_job"] == ["b-20300101-0005", "b-20300101-0005"]
    assert ("job", "b-20300101-0005") in k.objs


def _sample(name, **labels):
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_finished_run_counts_from_manifest_and_forbid(clock, pvc):
    ok_before = _sample("rbak_operator_runs_total", kind="backup", outcome="succeeded")
    missed_before = _sample("rbak_operator_missed_schedules_total", reason="forbid")
    dur_before = _sample("rbak_operator_run_duration_seconds_count", kind="backup")
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(schedule="*/5 * * * *", validate={"enabled": False})
    clock["now"] = t("2030-01-01T00:05:03Z")
    handlers.reconcile_backup(k, NS, "b", LOG)
    clock["now"] = t("2030-01-01T00:10:03Z")  # next slot while the first still runs: Forbid skips it
    handlers.reconcile_backup(k, NS, "b", LOG)
    st = k.objs[("backup", "b")]["status"]
    assert st["missedSchedules"] == 1 and st["lastScheduleTime"] == "2030-01-01T00:10:00Z"
    assert [c[1] for c in k.calls if c[0] == "create_job"] == ["b-20300101-0005"]
    bid = backup_id_of(k, "b-20300101-0005")
    assert bid.startswith("b-20300101-0005-")  # the Job's name and the object's tag (issue 44)
    write_backup(pvc, bid, 42, 4096, origin=OWNER)
    k.finish_job("b-20300101-0005")
    handlers.reconcile_backup(k, NS, "b", LOG)
    st = k.objs[("backup", "b")]["status"]
    assert st["phase"] == "Succeeded" and st["lastBackupId"] == bid
    assert (st["lastRun"]["messages"], st["lastRun"]["bytes"], st["lastRun"]["size"]) == (42, 4096, "4.0 KiB")
    assert "validation" not in st["lastRun"]
    # Operator metrics: runs by outcome, durations, missed slots.
    assert _sample("rbak_operator_runs_total", kind="backup", outcome="succeeded") == ok_before + 1
    assert _sample("rbak_operator_missed_schedules_total", reason="forbid") == missed_before + 1
    assert _sample("rbak_operator_run_duration_seconds_count", kind="backup") == dur_before + 1


def test_replace_stops_the_active_run(clock):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(schedule="*/5 * * * *", concurrencyPolicy="Replace")
    clock["now"] = t("2030-01-01T00:05:03Z")
    handlers.reconcile_backup(k, NS, "b", LOG)
    clock["now"] = t("2030-01-01T00:10:03Z")
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert ("delete_job", "b-20300101-0005") in k.calls and ("job", "b-20300101-0010") in k.objs


def test_spark_validation_above_threshold(clock, pvc):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"enabled": True, "sparkThresholdBytes": 1000})
    k.objs[("backup", "b")]["metadata"]["annotations"] = {"rbak.io/backup-now": "x"}
    handlers.reconcile_backup(k, NS, "b", LOG)
    run = next(c[1] for c in k.calls if c[0] == "create_job")
    job = k.objs[("job", run)]
    assert "initContainers" not in job["spec"]["template"]["spec"]  # validation is decided after the run
    write_backup(pvc, backup_id_of(k, run), 5, 5000, origin=OWNER)
    k.finish_job(run)
    handlers.reconcile_backup(k, NS, "b", LOG)
    app = k.objs[("spark", f"{run}-validate")]
    assert app["spec"]["mainApplicationFile"].endswith("/validate.py")
    assert app["spec"]["arguments"][:1] == ["--path"] and app["spec"]["arguments"][-2:] == ["--backup-id", backup_id_of(k, run)]
    assert k.objs[("backup", "b")]["status"]["lastRun"]["validation"] == "Pending"
    app["status"] = {"applicationState": {"state": "COMPLETED"}}
    handlers.reconcile_backup(k, NS, "b", LOG)
    st = k.objs[("backup", "b")]["status"]
    assert st["lastRun"]["validation"] == "Passed" and st["history"][0]["validation"] == "Passed"


@pytest.mark.parametrize("outcome", ["COMPLETED", "FAILED"])
def test_retention_waits_for_the_validation(clock, pvc, outcome):
    """keepLast: 1 with validation after the run: the older good backup goes only once
    the new one has passed validation, never for a new one that fails it."""
    from rbak_operator.decide.naming import manual_run_name

    old = manual_run_name("b", "old")
    write_backup(pvc, old, 1, 100)
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"sparkThresholdBytes": 0}, retention={"keepLast": 1})
    k.objs[("backup", "b")]["metadata"]["annotations"] = {"rbak.io/backup-now": "new"}
    handlers.reconcile_backup(k, NS, "b", LOG)
    run = next(c[1] for c in k.calls if c[0] == "create_job")
    write_backup(pvc, backup_id_of(k, run), 5, 5000, created_ms=10, origin=OWNER)
    k.finish_job(run)
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert k.objs[("backup", "b")]["status"]["lastRun"]["validation"] == "Pending"
    assert {e.backup_id for e in list_backups(pvc)} == {old, backup_id_of(k, run)}  # not before the validation
    k.objs[("spark", f"{run}-validate")]["status"] = {"applicationState": {"state": outcome}}
    handlers.reconcile_backup(k, NS, "b", LOG)
    handlers.reconcile_backup(k, NS, "b", LOG)
    left = {e.backup_id for e in list_backups(pvc)}
    assert left == ({backup_id_of(k, run)} if outcome == "COMPLETED" else {old, backup_id_of(k, run)})


def test_small_backup_is_validated_by_a_job(clock, pvc):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"sparkThresholdBytes": 10**9, "deep": True})
    k.objs[("backup", "b")]["metadata"]["annotations"] = {"rbak.io/backup-now": "x"}
    handlers.reconcile_backup(k, NS, "b", LOG)
    run = next(c[1] for c in k.calls if c[0] == "create_job")
    write_backup(pvc, backup_id_of(k, run), 5, 5000, origin=OWNER)
    k.finish_job(run)
    handlers.reconcile_backup(k, NS, "b", LOG)
    vjob = k.objs[("job", f"{run}-validate")]
    c = vjob["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][0] == "validate" and "--deep" in c["args"]
    # flags only: no ConfigMap of the run (which the Job history limit may already have deleted)
    assert not any("configMap" in v for v in vjob["spec"]["template"]["spec"]["volumes"])
    assert "--write-report" in c["args"] and "--config" not in c["args"]
    k.finish_job(f"{run}-validate", ok=False)
    handlers.reconcile_backup(k, NS, "b", LOG)
    lr = k.objs[("backup", "b")]["status"]["lastRun"]
    assert lr["validation"] == "Failed" and lr["message"].startswith("validation failed")
    # A validation Job is never mistaken for a backup run.
    assert [h["jobName"] for h in k.objs[("backup", "b")]["status"]["history"]] == [run]


def restore_obj(**spec):
    return {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQRestore",
            "metadata": {"name": "r", "namespace": NS, "uid": "ru"}, "spec": {"backupRef": {"name": "b"}, **spec}}


@pytest.mark.parametrize("threshold, engine", [(100, "spark"), (10**9, "job")])
def test_restore_auto_engine_from_manifest_size(clock, pvc, threshold, engine):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj()
    write_backup(pvc, "b-20300101-0005", 3, 300, created_ms=1)
    write_backup(pvc, "b-20300101-0010", 7, 700, created_ms=2)
    k.objs[("restore", "r")] = restore_obj(sparkThresholdBytes=threshold, pitr={"end": "2030-01-01T00:00:00Z"})
    handlers.reconcile_restore(k, NS, "r", LOG)
    st = k.objs[("restore", "r")]["status"]
    assert st["backupId"] == "b-20300101-0010" and st["engine"] == engine and st["phase"] == "Running"
    if engine == "spark":
        app = k.objs[("spark", "r-restore")]
        assert app["spec"]["mainApplicationFile"].endswith("/restore.py")
        args = app["spec"]["arguments"]
        assert args[args.index("--backup-id") + 1] == "b-20300101-0010" and "--config" in args
        app["status"] = {"applicationState": {"state": "FAILED", "errorMessage": "driver OOM"}}
    else:
        job = k.objs[("job", "r-restore")]
        assert job["spec"]["template"]["spec"]["containers"][0]["args"][0] == "restore"
        k.finish_job("r-restore")
    handlers.reconcile_restore(k, NS, "r", LOG)
    st = k.objs[("restore", "r")]["status"]
    if engine == "spark":
        assert st["phase"] == "Failed" and st["message"] == "driver OOM"
    else:
        # the backup's total is not what was restored: without the run's result no restored count is claimed
        assert st["phase"] == "Succeeded" and st["backupMessages"] == 7 and "messages" not in st
    assert handlers.reconcile_restore(k, NS, "r", LOG) == GONE  # finished: its loop ends


def test_restore_of_a_missing_backup_fails_with_the_reason(clock, pvc):
    k = FakeKube()
    k.objs[("restore", "r")] = restore_obj()
    handlers.reconcile_restore(k, NS, "r", LOG)
    st = k.objs[("restore", "r")]["status"]
    assert st["phase"] == "Failed" and "RabbitMQBackup ns/b not found" in st["message"]
    k.objs[("backup", "b")] = backup_obj()
    k.objs[("restore", "r2")] = dict(restore_obj(), metadata={"name": "r2", "namespace": NS, "uid": "x"})
    handlers.reconcile_restore(k, NS, "r2", LOG)
    assert "no complete backup" in k.objs[("restore", "r2")]["status"]["message"]


def test_restore_whose_mapping_or_selection_names_nothing_is_refused_in_its_status(clock, pvc):
    from rbak_operator.decide.restore_checks import check_restore_spec

    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj()
    write_backup(pvc, "b-20300101-0005", 3, 300)
    for name, spec, expect in (
            ("r1", {"vhostMapping": {"nope": "x"}}, "spec.vhostMapping: key 'nope' names no vhost of backup"),
            ("r2", {"queueMapping": {"qq": "x"}}, "spec.queueMapping: key 'qq' names no queue of backup"),
            ("r3", {"queues": {"include": ["nope*"]}}, "spec.queues.include: 'nope*' matches no queue of backup"),
            ("r4", {"target": {"amqpUrl": "amqp://h:5672/staging", "managementUrl": "http://h:15672",
                               "credentialsSecretRef": {"name": "c"}}, "vhostMapping": {"/": "qa"}},
             "names vhost 'staging' but spec.vhostMapping maps '/' to 'qa'")):
        k.objs[("restore", name)] = dict(restore_obj(**spec), metadata={"name": name, "namespace": NS, "uid": name})
        handlers.reconcile_restore(k, NS, name, LOG)
        st = k.objs[("restore", name)]["status"]
        assert st["phase"] == "Failed" and expect in st["message"], st
        assert ("job", f"{name}-restore") not in k.objs  # no run started
    # the backed-up broker as the target: its URL's vhost (where the backup connected) is dropped
    m = BackupManifest(backup_id="x", created_at=1, completed_at=2, queues=[QueueBackup(vhost="a", name="q"),
                                                                              QueueBackup(vhost="b", name="q")])
    assert check_restore_spec({}, {"amqpUrl": "amqp://h:5672"}, m) is None
    assert "restores 2 vhosts" in check_restore_spec({}, {"amqpUrl": "amqp://h:5672/a"}, m)


def test_deletion_with_a_missing_secret_lets_go(monkeypatch, caplog):
    """Deletion is not blocked (no exception) and the user is told why the backups were kept."""
    k = FakeKube()
    body = backup_obj(deletionPolicy="delete", storage={"s3": {"bucket": "bkt", "credentialsSecretRef": {"name": "gone"}}})
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(handlers, "Kube", lambda: k)  # the handler builds its own client
    monkeypatch.setattr(handlers, "_event", lambda _body, etype, reason, message: events.append((etype, reason, message)))
    with caplog.at_level(logging.WARNING):
        handlers.backup_delete(body=body, name="b", namespace=NS, spec=body["spec"], logger=logging.getLogger("t"))
    assert [(t, r) for t, r, _ in events] == [("Warning", "BackupsKept")]
    assert "gone" in events[0][2]
    assert "backups kept" in caplog.text and "gone" in caplog.text


def test_deletion_policy_delete_removes_only_own_backups(pvc):
    k = FakeKube()
    body = backup_obj(deletionPolicy="delete")
    write_backup(pvc, "b-20300101-0005", 1, 1)
    write_backup(pvc, "b-manual-0123abcd", 1, 1)
    write_backup(pvc, "other-20300101-0005", 1, 1)
    handlers.Kube = lambda: k
    try:
        handlers.backup_delete(body=body, name="b", namespace=NS, spec=body["spec"], logger=LOG)
    finally:
        from rbak_operator.kube.client import Kube

        handlers.Kube = Kube
    assert [e.backup_id for e in list_backups(pvc)] == ["other-20300101-0005"]


def _env_of(job):
    env = job["spec"]["template"]["spec"]["containers"][0].get("env") or []
    for c in job["spec"]["template"]["spec"].get("initContainers") or []:
        env += c.get("env") or []
    return {e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in env if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]}


def test_cluster_reference_uses_the_secret_the_cluster_status_names(clock, pvc):
    k = FakeKube()
    k.objs[("rabbitmqcluster", "prod-rabbit")] = {"status": {"defaultUser": {"secretReference": {
        "name": "prod-rabbit-admin-creds", "namespace": NS,
        "keys": {"username": "user", "password": "pass", "host": "host", "port": "port"}}}}}
    k.objs[("backup", "b")] = backup_obj(broker={"rabbitmqClusterReference": {"name": "prod-rabbit"}})
    k.objs[("backup", "b")]["metadata"]["annotations"] = {"rbak.io/backup-now": "x"}
    handlers.reconcile_backup(k, NS, "b", LOG)
    run = next(c[1] for c in k.calls if c[0] == "create_job")
    env = _env_of(k.objs[("job", run)])
    assert env["RBAK_BROKER_USERNAME"] == ("prod-rabbit-admin-creds", "user")
    assert env["RBAK_BROKER_PASSWORD"] == ("prod-rabbit-admin-creds", "pass")
    assert env["RBAK_BROKER_HOST"] == ("prod-rabbit-admin-creds", "host")


def test_restore_with_a_connection_secret_missing_a_key_fails_naming_it(clock, pvc):
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj()
    write_backup(pvc, "b-20300101-0005", 3, 300)
    k.objs[("secret", "topo")] = {"uri": "https://rabbit.ns.svc:15671", "username": "u"}
    target = {"rabbitmqClusterReference": {"connectionSecret": {"name": "topo"}}}
    k.objs[("restore", "r")] = restore_obj(target=target)
    handlers.reconcile_restore(k, NS, "r", LOG)
    st = k.objs[("restore", "r")]["status"]
    assert st["phase"] == "Failed" and "Secret ns/topo lacks key(s) password" in st["message"]
    k.objs[("secret", "topo")]["password"] = "p"
    k.objs[("restore", "r2")] = dict(restore_obj(target=target), metadata={"name": "r2", "namespace": NS, "uid": "x"})
    handlers.reconcile_restore(k, NS, "r2", LOG)
    assert k.objs[("restore", "r2")]["status"]["phase"] == "Running"
    cm = k.objs[("cm", "r2-restore")]
    text = str(cm)
    assert "https://rabbit.ns.svc:15671" in text and "amqp://rabbit.ns.svc:5672" in text and "5672/%2f" not in text and "'p'" not in text
    env = _env_of(k.objs[("job", "r2-restore")])
    assert env["RBAK_BROKER_USERNAME"] == ("topo", "username") and env["RBAK_BROKER_PASSWORD"] == ("topo", "password")
def _stream_backup(storage, backup_id, created_ms, previous=None, origin=None):
    """A backup holding a stream, incremental on ``previous`` when given."""
    from rbak.format.manifest import StreamInfo

    m = BackupManifest(backup_id=backup_id, created_at=created_ms, completed_at=created_ms + 1, origin=origin)
    m.queues.append(QueueBackup(vhost="/", name="s", queue_type="stream",
                                stream=StreamInfo(0, 9, previous, 4 if previous else None)))
    storage.put(f"{backup_id}/manifest.json", m.to_json())


def test_retention_keeps_the_chain_of_a_kept_backup(clock, pvc):
    """keepLast: 1 (and GFS fields): the base the newest incremental backup continues is not deleted."""
    from rbak_operator.decide.naming import manual_run_name

    base, older = manual_run_name("b", "base"), manual_run_name("b", "older")
    _stream_backup(pvc, older, 1)  # a full backup nobody continues: may go
    _stream_backup(pvc, base, 2)
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"enabled": False},
                                         retention={"keepLast": 1, "keepDaily": 0, "keepWeekly": 0, "keepMonthly": 0})
    k.objs[("backup", "b")]["metadata"]["annotations"] = {"rbak.io/backup-now": "new"}
    handlers.reconcile_backup(k, NS, "b", LOG)
    run = next(c[1] for c in k.calls if c[0] == "create_job")
    _stream_backup(pvc, backup_id_of(k, run), 10, previous=base, origin=OWNER)
    k.finish_job(run)
    handlers.reconcile_backup(k, NS, "b", LOG)
    assert {e.backup_id for e in list_backups(pvc)} == {base, backup_id_of(k, run)}
    assert k.objs[("backup", "b")]["status"]["retention"]["lastDeleted"] == [older]


def test_partial_backup_shows_in_status(clock, pvc):
    """A run that exits non-zero after writing a partial manifest: the status says partial, naming the queue."""
    from rbak.format.manifest import QueueStatus

    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"enabled": False})
    k.objs[("backup", "b")]["metadata"]["annotations"] = {"rbak.io/backup-now": "p"}
    handlers.reconcile_backup(k, NS, "b", LOG)
    run = next(c[1] for c in k.calls if c[0] == "create_job")
    write_backup(pvc, backup_id_of(k, run), 7, 700, origin=OWNER)
    m = BackupManifest.from_json(pvc.get(f"{backup_id_of(k, run)}/manifest.json"))
    m.queue_status = [QueueStatus("/", "limited", "refused", "its delivery limit is 2")]
    pvc.put(f"{backup_id_of(k, run)}/manifest.json", m.to_json())
    k.finish_job(run, ok=False)
    handlers.reconcile_backup(k, NS, "b", LOG)
    st = k.objs[("backup", "b")]["status"]
    last = st["lastRun"]
    assert last["phase"] == "Failed" and last["reason"] == "PartiallyFailed" and last["backupState"] == "partial"
    assert last["partialQueues"] == ["//limited (refused): its delivery limit is 2"] and last["messages"] == 7
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "BackupPartial" and "limited" in ready["message"]


def test_short_read_backup_shows_as_partial(clock, pvc):
    """Issue 27: a queue read short of its depth (status partial, expected/read) makes the run partial:
    Ready condition, lastRun and the last-run-failed metric say so, with both numbers."""
    from rbak.format.manifest import QueueStatus
    from rbak_operator.metrics import resources as rm

    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(validate={"enabled": False})
    k.objs[("backup", "b")]["metadata"]["annotations"] = {"rbak.io/backup-now": "s"}
    handlers.reconcile_backup(k, NS, "b", LOG)
    run = next(c[1] for c in k.calls if c[0] == "create_job")
    write_backup(pvc, backup_id_of(k, run), 180, 700, origin=OWNER)
    m = BackupManifest.from_json(pvc.get(f"{backup_id_of(k, run)}/manifest.json"))
    m.queue_status = [QueueStatus("/", "q", "partial", "read 180 of the 190 messages ...", 190, 180)]
    pvc.put(f"{backup_id_of(k, run)}/manifest.json", m.to_json())
    k.finish_job(run, ok=False)  # rbak backup exits 3: completed, but partial
    handlers.reconcile_backup(k, NS, "b", LOG)
    st = k.objs[("backup", "b")]["status"]
    last = st["lastRun"]
    assert (last["phase"], last["reason"], last["backupState"]) == ("Failed", "PartiallyFailed", "partial")
    assert last["partialQueues"] == ["//q (partial): read 180 of the 190 messages ..."]
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "BackupPartial" and "read 180 of the 190" in ready["message"]
    got = {(name, labels.get("reason")): v for name, labels, v in rm.samples("backup", k.objs[("backup", "b")])}
    assert got[("rbak_backup_last_run_failed", "PartiallyFailed")] == 1


def test_a_slot_waits_while_another_backup_reads_the_same_source(clock):
    """Two RabbitMQBackups of one broker and vhost: the second's slot is skipped while the first runs
    (rbak's lease would refuse it anyway); another vhost, or another broker, runs. A backup of every
    vhost overlaps any vhost."""
    k = FakeKube()
    k.objs[("backup", "b")] = backup_obj(queues={"vhosts": ["orders"]})
    k.objs[("backup", "b")]["metadata"]["annotations"] = {"rbak.io/backup-now": "x"}
    handlers.reconcile_backup(k, NS, "b", LOG)
    (first,) = [c[1] for c in k.calls if c[0] == "create_job"]
    every = {"amqpUrl": "amqp://h:5672", "managementUrl": "http://h:15672", "credentialsSecretRef": {"name": "c"}}
    for name, spec in (("same", {"broker": every}), ("other-vhost", {"queues": {"vhosts": ["billing"]}}),
                       ("other-host", {"broker": {"amqpUrl": "amqp://elsewhere:5672/%2f", "managementUrl": "http://e:15672",
                                                  "credentialsSecretRef": {"name": "c"}}})):
        o = backup_obj(schedule="*/5 * * * *", **spec)
        o["metadata"].update(name=name, uid=f"u-{name}")
        k.objs[("backup", name)] = o
    clock["now"] = t("2030-01-01T00:05:03Z")
    for name in ("same", "other-vhost", "other-host"):
        handlers.reconcile_backup(k, NS, name, LOG)
    created = [c[1] for c in k.calls if c[0] == "create_job"]
    assert created == [first, "other-vhost-20300101-0005", "other-host-20300101-0005"]
    st = k.objs[("backup", "same")]["status"]
    assert st["missedSchedules"] == 1 and st["lastScheduleTime"] == "2030-01-01T00:05:00Z"
    k.finish_job(first)
    clock["now"] = t("2030-01-01T00:10:03Z")
    handlers.reconcile_backup(k, NS, "same", LOG)  # every vhost: other-vhost's run (billing) overlaps it
    assert ("create_job", "same-20300101-0010") not in k.calls
    k.finish_job("other-vhost-20300101-0005")
    clock["now"] = t("2030-01-01T00:15:03Z")
    handlers.reconcile_backup(k, NS, "same", LOG)
    assert ("create_job", "same-20300101-0015") in k.calls
