"""``kubectl rbak`` as a user runs it: the ``kubectl-rbak`` console script (the entry point
pyproject.toml declares) on the PATH, ``KUBECONFIG`` pointing at the real API server (``kube_api``),
the real operator and the local kubelet running each Job against RabbitMQ 3.10 and moto S3.

One RabbitMQBackup is backed up, drilled and restored once (module fixture ``scene``); the tests
assert what each command printed and its exit code against what the server and the storage hold.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.brokers import BROKERS, unique_name
from support.kplugin import console_script, plugin_env
from support.kubelogs import LogFront
from support.op_e2e import API, START, Cluster
from support.opcluster import wait_for
from support.require import unavailable
from support.s3 import create_bucket

from rbak.repo.catalog import load_manifest
from rbak.commands.inspect import fmt_ts
from rbak.storage.url import open_storage
from rbak.base.units import human_bytes

# One worker builds the scene (with -n, --dist loadgroup keeps an xdist_group together).
pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.timeout(400),
              pytest.mark.xdist_group("module-kubectl-plugin")]

NEXT_BACKUP = "2030-01-01T03:00:00Z"  # the daily 03:00 slot after the operator's clock (support.op_e2e.START)


@dataclass
class Scene:
    cluster: Cluster
    kube: object
    env: dict
    bin_dir: Path
    vhost: str
    name: str  # backed up, drilled, restored
    idle: str  # never run
    bad: str  # its run fails: wrong broker password
    storage: object
    bucket: object
    prefix: str
    backup: subprocess.CompletedProcess
    failed: subprocess.CompletedProcess
    drill: subprocess.CompletedProcess

    def run(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl-rbak", *args], env=env or self.env, capture_output=True, text=True,
                              timeout=300, check=False)

    def run_all(self, *commands: list[str]) -> list[subprocess.CompletedProcess]:
        """Independent commands at once (each is a process that mostly waits on its imports and the server)."""
        procs = [subprocess.Popen(["kubectl-rbak", *c], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for c in commands]
        done = [(p, *p.communicate(timeout=300)) for p in procs]
        return [subprocess.CompletedProcess(p.args, p.returncode, o, e) for p, o, e in done]

    def status(self, name: str) -> dict:
        return self.cluster.status(name)


@pytest.fixture(scope="module")
def scene(tmp_path_factory, moto_s3, kube_api):
    broker = BROKERS["rmq310"]
    reason = broker.unreachable_reason()
    if reason:
        unavailable(reason)
    tmp = tmp_path_factory.mktemp("kplugin")
    cluster = Cluster(tmp, kube=kube_api, start=START)  # a fixed clock: NEXT_BACKUP is known
    vhost, tag = unique_name("test-kplugin"), unique_name("kp")
    http = cluster.http
    try:
        broker.create_vhost(vhost)
        bucket = create_bucket(moto_s3, unique_name("bucket"), prefix="backups")
        http.secret(f"{tag}-s3", {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
        http.secret(f"{tag}-rmq", {"username": broker.user, "password": broker.password})
        http.secret(f"{tag}-bad", {"username": broker.user, "password": "definitely-wrong"})
        storage = {"s3": {"bucket": bucket.bucket, "prefix": bucket.prefix, "endpoint": bucket.endpoint,
                          "pathStyle": True, "region": "us-east-1", "credentialsSecretRef": {"name": f"{tag}-s3"}}}
        source = {"amqpUrl": f"amqp://{broker.host}:{broker.amqp_port}/%2f", "managementUrl": broker.management_url,
                  "credentialsSecretRef": {"name": f"{tag}-rmq"}}
        base = {"broker": source, "storage": storage, "queues": {"vhosts": [vhost]}, "validate": {"enabled": False}}
        name, idle, bad = f"{tag}-nightly", f"{tag}-idle", f"{tag}-bad"
        # Schedules whose slots before the operator's clock are past startingDeadlineSeconds: never run here.
        http.create(API, "rabbitmqbackups", {"apiVersion": API, "kind": "RabbitMQBackup", "metadata": {"name": name},
                                             "spec": {**base, "validate": {"enabled": True},  # in the run's pod
                                                      "schedule": "0 3 * * *", "startingDeadlineSeconds": 60,
                                                      "verify": {"restoreDrill": {"schedule": "0 4 * * *",
                                                                                  "startingDeadlineSeconds": 60}}}})
        http.create(API, "rabbitmqbackups", {"apiVersion": API, "kind": "RabbitMQBackup", "metadata": {"name": idle},
                                             "spec": base})
        http.create(API, "rabbitmqbackups", {"apiVersion": API, "kind": "RabbitMQBackup", "metadata": {"name": bad},
                                             "spec": {**base, "broker": {**source, "credentialsSecretRef": {
                                                 "name": f"{tag}-bad"}}}})
        broker.publish_n(vhost, "q1", 3, declare={})
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        console_script(bin_dir)
        env = plugin_env(kube_api, bin_dir)
        wait_for(lambda: cluster.status(name).get("nextScheduleTime") and cluster.status(idle).get("phase"),
                 60, what="the operator's first passes", diag=cluster.logs)
        s = Scene(cluster, kube_api, env, bin_dir, vhost, name, idle, bad, open_storage(bucket.url_with_prefix("")),
                  bucket, bucket.prefix, None, None, None)
        failing = subprocess.Popen(["kubectl-rbak", "backup", bad], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)  # beside the good one: saves its time
        s.backup = s.run("backup", name)
        s.drill = s.run("drill", name)
        fout, ferr = failing.communicate(timeout=300)
        s.failed = subprocess.CompletedProcess(failing.args, failing.returncode, fout, ferr)
        yield s
    finally:
        # The server outlives this module: remove its objects so no later operator reconciles them.
        for api, plural in ((API, "rabbitmqrestores"), (API, "rabbitmqbackups"), ("batch/v1", "jobs")):
            for o in http.items(api, plural):
                if o["metadata"]["name"].startswith(tag):
                    http.delete(api, plural, o["metadata"]["name"])
        cluster.close()
        broker.delete_vhost(vhost)


def lines(text: str) -> list[str]:
    return text.rstrip("\n").split("\n") if text.strip() else []


def test_backup_runs_now_and_follows_the_operators_job(scene):
    r = scene.backup
    assert r.returncode == 0, (r.stdout, r.stderr, scene.cluster.logs())
    out = lines(r.stdout)
    value = re.fullmatch(rf"rabbitmqbackup/{scene.name}: backup requested \(rbak\.io/backup-now=(\S+)\)", out[0])
    assert value, out
    st = scene.status(scene.name)
    run = st["lastRun"]["jobName"]
    assert st["lastManualTrigger"] == value.group(1) and st["lastRun"]["trigger"] == "manual"
    assert out[1] == f"job/{run}"
    assert run in scene.cluster.runner.started  # the operator made the Job, the kubelet ran it
    bid = st["lastRun"]["backupId"]  # the Job's name and the object's tag
    assert bid.startswith(f"{run}-")
    m = load_manifest(scene.storage, bid, scene.prefix)
    assert m.total_messages == 3 and m.is_complete
    assert out[-1] == (f"job/{run}: Succeeded: backup {bid}: 3 messages, {human_bytes(m.total_bytes)}, 1 queues "
                       "(validation Passed)")
    for line in out[2:-1]:  # what it saw meanwhile (how much depends on timing): the run and its progress
        assert line == f"job/{run}: running" or line.startswith(f"job/{run}: ") and " queues, " in line, out
    assert r.stderr == ""


def test_backup_that_fails_exits_1_with_the_operators_cause(scene):
    r = scene.failed
    last = scene.status(scene.bad)["lastRun"]
    assert last["phase"] == "Failed" and "401 Unauthorized" in last["message"], last
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert lines(r.stdout)[1] == f"job/{last['jobName']}"
    assert lines(r.stdout)[-1] == f"job/{last['jobName']}: Failed: {last['message']}"


def test_drill_runs_now_and_reports_the_operators_result(scene):
    r = scene.drill
    assert r.returncode == 0, (r.stdout, r.stderr, scene.cluster.logs())
    d = scene.status(scene.name)["restoreDrill"]
    run = d["lastJob"]
    out = lines(r.stdout)
    assert re.fullmatch(rf"rabbitmqbackup/{scene.name}: restore drill requested \(rbak\.io/drill-now=\S+\)", out[0])
    assert out[1] == f"job/{run}" and d["result"] == "Passed" and d["messages"] == 3
    backup_id = scene.status(scene.name)["lastBackupId"]
    assert out[-1] == (f"job/{run}: Passed: 1 queue(s) restored into a scratch vhost and matched the backup "
                       f"(backup {backup_id}, 3 messages, scratch vhost {d['scratchVhost']})")
    assert all(line == f"job/{run}: running (backup {backup_id})" for line in out[2:-1]), out


def test_status_shows_every_object_in_one_table(scene):
    st = scene.status(scene.name)
    last = st["lastRun"]
    drill = st["restoreDrill"]
    bad = scene.status(scene.bad)["lastRun"]
    # one object, -n/--namespace before or after the command, JSON
    r, one, other, as_json = scene.run_all(["status"], ["-n", "default", "status", scene.name],
                                           ["status", "--namespace", "kube-system"], ["status", "-o", "json"])
    assert r.returncode == 0, r.stderr
    rows = [re.split(r"\s{3,}", line) for line in lines(r.stdout)]
    assert rows == [
        ["NAME", "PHASE", "LAST RUN", "RESULT", "MESSAGES", "SIZE", "FINISHED", "NEXT RUN", "DRILL"],
        [scene.bad, "Failed", bad["backupId"], "Failed", "-", "-", bad["completionTime"], "on demand", "-"],
        [scene.idle, "Pending", "-", "-", "-", "-", "-", "on demand", "-"],
        [scene.name, "Succeeded", last["backupId"], "Succeeded", "3", last["size"], last["completionTime"],
         NEXT_BACKUP, f"Passed ({drill['lastRunTime']})"],
        [f"{scene.bad}: last run {bad['jobName']}: {bad['message']}"],  # why it failed, under the table
    ]
    assert one.returncode == 0 and lines(one.stdout)[1:] == [lines(r.stdout)[3]]
    assert (other.returncode, other.stdout) == (0, "No RabbitMQBackups in namespace kube-system.\n")
    rows = json.loads(as_json.stdout)
    assert [x["name"] for x in rows] == [scene.bad, scene.idle, scene.name]
    assert {k: rows[2][k] for k in ("phase", "lastRun", "result", "messages", "nextRun", "notes")} == {
        "phase": "Succeeded", "lastRun": last["backupId"], "result": "Succeeded", "messages": 3,
        "nextRun": NEXT_BACKUP, "notes": []}


def test_kubectl_finds_the_plugin_on_the_path(scene):
    kubectl = str(Path(scene.kube.bin_dir) / "kubectl")
    plugins = subprocess.run([kubectl, "plugin", "list"], env=scene.env, capture_output=True, text=True, check=False)
    assert str(scene.bin_dir / "kubectl-rbak") in plugins.stdout, plugins
    r = subprocess.run([kubectl, "rbak", "status", scene.name], env=scene.env, capture_output=True, text=True,
                       check=False, timeout=120)
    assert r.returncode == 0 and r.stdout == scene.run("status", scene.name).stdout, r


def test_list_and_describe_read_the_objects_storage(scene):
    bid = scene.status(scene.name)["lastBackupId"]
    m = load_manifest(scene.storage, bid, scene.prefix)
    r, d, missing = scene.run_all(["list", scene.name], ["describe", scene.name, bid],
                                  ["describe", scene.name, "no-such-backup"])
    assert r.returncode == 0, r.stderr
    assert [re.split(r"\s{3,}", line) for line in lines(r.stdout)] == [
        ["BACKUP ID", "STATUS", "CREATED", "QUEUES", "MESSAGES", "SIZE", "OWN", "NOTES"],
        [bid, "complete", fmt_ts(m.created_at), "1", "3", human_bytes(m.total_bytes), "yes", "-"],
    ]
    assert d.returncode == 0, d.stderr
    q = m.queues[0]
    head = [
        f"Backup:      {bid} (complete)",
        f"Storage:     s3://{scene.bucket.bucket}/backups at {scene.bucket.endpoint}",
        f"Created:     {fmt_ts(m.created_at)}",
        f"Completed:   {fmt_ts(m.completed_at)}",
        f"Source:      {m.source_cluster} (RabbitMQ {m.rabbitmq_version})",
        f"Totals:      3 messages, {m.total_segments} segments, {human_bytes(m.total_bytes)}",
        *([f"Definitions: {m.definitions.vhost_count} vhosts, {m.definitions.queue_count} queues, "
           f"{m.definitions.exchange_count} exchanges, {m.definitions.user_count} users"] if m.definitions else []),
        "",
    ]
    text = lines(d.stdout)
    assert text[:len(head)] == head
    assert [re.split(r"\s{3,}", x) for x in text[len(head):]] == [
        ["VHOST", "QUEUE", "TYPE", "MESSAGES", "SEGMENTS", "SIZE", "FIRST", "LAST"],
        [scene.vhost, "q1", q.queue_type, "3", str(len(q.segments)), human_bytes(q.size_bytes),
         fmt_ts(q.first_message_timestamp), fmt_ts(q.last_message_timestamp)],
    ]
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.startswith(f"error: RabbitMQBackup default/{scene.name}: BACKUP_ID 'no-such-backup': ")
    assert "has no manifest" in missing.stderr and len(lines(missing.stderr)) == 1


def test_restore_creates_a_restore_and_follows_it(scene):
    broker = BROKERS["rmq310"]
    target = unique_name("test-kplugin-to")
    broker.create_vhost(target)
    broker.declare_queue(target, "q1")  # a restore publishes into existing queues (or --definitions)
    try:
        bid = scene.status(scene.name)["lastBackupId"]
        r = scene.run("restore", scene.name, "--backup-id", bid, "--to-vhost", target,
                      "--pitr", "2000-01-01T00:00:00Z..", "--name", f"{scene.name}-r1")
        assert r.returncode == 0, (r.stdout, r.stderr, scene.cluster.logs())
        rname = f"{scene.name}-r1"
        obj = scene.cluster.http.get(API, "rabbitmqrestores", rname)
        assert {k: obj["spec"].get(k) for k in ("backupRef", "pitr", "vhostMapping")} == {
            "backupRef": {"name": scene.name, "backupId": bid}, "pitr": {"start": "2000-01-01T00:00:00Z"},
            "vhostMapping": {scene.vhost: target}}
        st = obj["status"]
        out = lines(r.stdout)
        assert out[0] == f"rabbitmqrestore/{rname} created (backup {bid} of rabbitmqbackup/{scene.name})"
        assert out[-1] == (f"rabbitmqrestore/{rname}: Succeeded: backup {bid}: 3 messages restored (published 3, "
                           f"confirmed 3) to {target}/q1")
        assert all(x == f"job/{st['jobName']}: running" or x.startswith(f"job/{st['jobName']}: ") for x in out[1:-1])
        assert broker.read_bodies(target, "q1") == [b"msg-0", b"msg-1", b"msg-2"]
    finally:
        broker.delete_vhost(target)


def test_status_lists_the_restores_too(scene):
    """Restores under the backups: each with what it restores from, its phase and outcome; ``status NAME``
    keeps to NAME's restores; ``-o json`` appends them as rows of kind RabbitMQRestore."""
    broker = BROKERS["rmq310"]
    target = unique_name("test-kplugin-st")
    broker.create_vhost(target)
    broker.declare_queue(target, "q1")
    try:
        bid = scene.status(scene.name)["lastBackupId"]
        good, bad = f"{scene.name}-st1", f"{scene.bad}-st2"
        r = scene.run("restore", scene.name, "--backup-id", bid, "--to-vhost", target, "--name", good)
        assert r.returncode == 0, (r.stdout, r.stderr)
        scene.cluster.http.create(API, "rabbitmqrestores", {
            "apiVersion": API, "kind": "RabbitMQRestore", "metadata": {"name": bad},
            "spec": {"backupRef": {"name": scene.bad, "backupId": "no-such-backup"}}})
        wait_for(lambda: (scene.cluster.http.get(API, "rabbitmqrestores", bad).get("status") or {}).get("phase")
                 == "Failed", 120, what=f"restore {bad} to fail", diag=scene.cluster.logs)
        objs = {n: scene.cluster.http.get(API, "rabbitmqrestores", n) for n in
                sorted(o["metadata"]["name"] for o in scene.cluster.http.items(API, "rabbitmqrestores"))}
        all_, one, as_json = scene.run_all(["status"], ["status", scene.name], ["status", "-o", "json"])
        assert all_.returncode == 0, all_.stderr
        text = lines(all_.stdout)
        gap = text.index("")
        rows = [re.split(r"\s{3,}", line) for line in text[gap + 1:]]
        assert rows[0] == ["RESTORE", "FROM", "BACKUP ID", "PHASE", "RESTORED", "TARGET", "FINISHED"]
        by_name = {row[0]: row for row in rows[1:] if len(row) == 7}
        assert set(by_name) == set(objs)  # every restore of the namespace (the restore test's too, if it ran)
        st = objs[good]["status"]
        assert by_name[good] == [good, f"rabbitmqbackup/{scene.name}", bid, "Succeeded", "3", target,
                                 st["completionTime"]]
        assert by_name[bad][:4] == [bad, f"rabbitmqbackup/{scene.bad}", "no-such-backup", "Failed"]
        failed = objs[bad]["status"]
        assert [f"{bad}: {failed.get('reason') or 'Failed'}: {failed['message']}"] == [
            line for line in text[gap + 1:] if line.startswith(f"{bad}: ")]
        restores_of_name = [line.split()[0] for line in lines(one.stdout)[lines(one.stdout).index("") + 2:]]
        assert good in restores_of_name and bad not in restores_of_name
        j = json.loads(as_json.stdout)
        assert [x["kind"] for x in j] == ["RabbitMQBackup"] * 3 + ["RabbitMQRestore"] * len(objs)
        assert {k: v for k, v in next(x for x in j if x["name"] == good).items() if k != "finished"} == {
            "kind": "RabbitMQRestore", "name": good, "backup": f"rabbitmqbackup/{scene.name}", "backupId": bid,
            "phase": "Succeeded", "messages": 3, "published": 3, "confirmed": 3, "dryRun": False, "target": target,
            "targetQueues": [f"{target}/q1"], "size": st["size"], "notes": []}
    finally:
        broker.delete_vhost(target)


def test_logs_show_the_last_runs_pod(scene, tmp_path):
    run = scene.status(scene.name)["lastRun"]["jobName"]
    front = LogFront(scene.kube, scene.cluster.runner.outputs)
    try:
        r = scene.run("logs", scene.name, env={**scene.env, "KUBECONFIG": str(front.kubeconfig(tmp_path / "kc"))})
    finally:
        front.stop()
    assert r.returncode == 0, r.stderr
    # the backup (init container), then its validation: each under its header
    assert front.log_requests == [f"/api/v1/namespaces/default/pods/{run}-pod/log?container={c}"
                                  for c in ("rbak", "validate")]
    head, backup, check = re.split(rf"^==> pod/{run}-pod container (?:rbak|validate) <==\n", r.stdout, flags=re.M)
    assert head == ""
    bid = scene.status(scene.name)["lastRun"]["backupId"]
    assert f"rbak.backup.engine: backup {bid} of amqp://" in backup and "is valid" not in backup
    assert f"backup {bid} is valid" in check and "rbak.backup.engine" not in check


def test_suspend_and_resume_set_spec_suspend(scene):
    idle = scene.idle
    assert [scene.run(cmd, idle).stdout for cmd in ("suspend", "suspend")] == [
        f"rabbitmqbackup/{idle} suspended\n", f"rabbitmqbackup/{idle} already suspended\n"]
    assert scene.cluster.backup(idle)["spec"]["suspend"] is True
    r = scene.run("resume", idle, "--kubeconfig", str(scene.kube.kubeconfig), env={
        k: v for k, v in scene.env.items() if k != "KUBECONFIG"})
    assert (r.returncode, r.stdout) == (0, f"rabbitmqbackup/{idle} resumed\n")
    assert scene.cluster.backup(idle)["spec"]["suspend"] is False


BAD_INPUT = [  # (arguments, the start of the one error line); more in test_logic_kubectl_plugin.py
    (["backup", "nope"], 'RabbitMQBackup "nope" not found in namespace "default"'),
    (["-n", "kube-system", "list", "{name}"], 'RabbitMQBackup "{name}" not found in namespace "kube-system"'),
    (["status", "--kubeconfig", "/nonexistent/kc"], "--kubeconfig: /nonexistent/kc does not exist"),
    (["status", "--context", "nope"], "--context: no context 'nope' in the kubeconfig {kubeconfig} (it has: rbak-test)"),
    (["drill", "{idle}"], "RabbitMQBackup default/{idle}: spec.verify.restoreDrill is not enabled (it needs a "
                          "schedule): the operator runs no drill for it"),
    (["logs", "{idle}"], "RabbitMQBackup default/{idle} has no run yet (kubectl rbak backup {idle} starts one)"),
    (["restore", "{name}", "--backup-id", "nope"], "--backup-id nope: not in the storage of RabbitMQBackup "
                                                   "default/{name}: "),
    (["restore", "{name}", "--backup-id", "{bid}", "--pitr", "yesterday.."],
     "--pitr start: must be epoch milliseconds or an RFC 3339 time, got 'yesterday'"),
    (["restore", "{name}", "--backup-id", "{bid}", "--to-vhost", "elsewhere=x"],
     "--to-vhost elsewhere=x: backup {bid} has no vhost 'elsewhere' (it holds {vhost})"),
]


def test_bad_input_is_one_line_naming_it(scene):
    fill = {"name": scene.name, "idle": scene.idle, "bid": scene.status(scene.name)["lastBackupId"],
            "vhost": scene.vhost, "kubeconfig": scene.kube.kubeconfig}
    def restores():
        return sorted(o["metadata"]["name"] for o in scene.cluster.http.items(API, "rabbitmqrestores"))

    before = restores()
    results = scene.run_all(*[[a.format(**fill) for a in args] for args, _ in BAD_INPUT])
    for (args, error), r in zip(BAD_INPUT, results):
        assert r.returncode == 1 and r.stdout == "", (args, r)
        [line] = lines(r.stderr)
        assert line.startswith("error: " + error.format(**fill)), (args, line)
    assert restores() == before  # nothing created
