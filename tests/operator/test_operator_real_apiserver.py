"""The real operator process (kopf) against a real Kubernetes API server (``kube_api``), with the
local kubelet (``PodRunner``) running each Job's pod against the real RabbitMQ 3.10 and moto S3.

Unlike kmock's emulator the server validates what the operator writes (schemas, CEL rules,
spark-operator's CRD schema for SparkApplications), sets creationTimestamp, uid and
resourceVersion itself, keeps status apart behind /status and filters label selectors. The
operator's fake clock starts at the server's time, and a scheduled scenario sets it back there
first (``Cluster.clock_at_server_time``): the server stamps creationTimestamp with its own clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
import os
import signal
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from rbak_operator.kube.api_calls import used_api_calls
from support.kplugin import console_script, plugin_env
from support.op_e2e import API, bucket_root, create_backup, s3, trigger, wait_run
from support.opcluster import wait_for

from rbak.repo.catalog import list_backups, load_manifest

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(400)]

# The scenarios of test_operator_e2e.py (``e2e_*`` there) run here, on the real server.
from test_operator_e2e import (  # noqa: E402,F401 (collected by pytest)
    e2e_credentials_as_the_rabbitmq_operators_publish_them as test_credentials_as_the_rabbitmq_operators_publish_them,
    e2e_deletion_policy_delete_removes_backups_and_never_hangs as test_deletion_policy_delete_removes_backups_and_never_hangs,
    e2e_deletion_retain_has_no_finalizer_and_keeps_backups as test_deletion_retain_has_no_finalizer_and_keeps_backups,
    e2e_encrypted_backup_validates_and_restores_with_keys_from_a_secret as test_encrypted_backup_validates_and_restores_with_keys_from_a_secret,
    e2e_failing_backup_reports_the_cause as test_failing_backup_reports_the_cause,
    e2e_job_validation_fails_on_a_damaged_segment as test_job_validation_fails_on_a_damaged_segment,
    e2e_on_demand_trigger_runs_once_per_value as test_on_demand_trigger_runs_once_per_value,
    e2e_operator_killed_across_a_slot_runs_it_exactly_once as test_operator_killed_across_a_slot_runs_it_exactly_once,
    e2e_per_resource_gauges_outlive_the_job as test_per_resource_gauges_outlive_the_job,
    e2e_restore_from_latest_backup_puts_messages_back as test_restore_from_latest_backup_puts_messages_back,
    e2e_restore_with_the_spark_engine as test_restore_with_the_spark_engine,
    e2e_retention_deletes_the_oldest_backup as test_retention_deletes_the_oldest_backup,
    e2e_running_status_is_reconciled_from_the_job_after_a_crash as test_running_status_is_reconciled_from_the_job_after_a_crash,
    e2e_scheduled_backup_status_shows_manifest_counts as test_scheduled_backup_status_shows_manifest_counts,
    e2e_spark_validation_passes_then_names_a_damaged_segment as test_spark_validation_passes_then_names_a_damaged_segment,
    e2e_suspend_skips_slots_and_resume_does_not_fire_them as test_suspend_skips_slots_and_resume_does_not_fire_them,
    e2e_two_backups_of_one_source_never_both_read_at_once as test_two_backups_of_one_source_never_both_read_at_once,
    e2e_two_operators_one_slot_one_run as test_two_operators_one_slot_one_run,
)


def test_on_demand_backup_end_to_end(cluster, env):
    env.broker.publish_n(env.vhost, "q1", 3, declare={})
    name = f"{env.tag}-manual"
    created = create_backup(cluster, env, name)
    assert created["metadata"]["uid"].count("-") == 4  # a server-made uid, not the emulator's
    trigger(cluster, name, "first")
    run = wait_run(cluster, name, phase="Succeeded", timeout=120)
    assert run["trigger"] == "manual" and run["messages"] == 3
    st = cluster.status(name)
    assert st["lastManualTrigger"] == "first" and st["phase"] == "Succeeded", st
    [backup] = [b for b in list_backups(s3(env)) if b.complete]
    assert st["lastBackupId"] == backup.backup_id
    jobs = [j for j in cluster.http.items("batch/v1", "jobs") if j["metadata"]["name"].startswith(name + "-")]
    assert len(jobs) == 1
    owner = jobs[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("RabbitMQBackup", name, created["metadata"]["uid"])
    reasons = wait_for(lambda: {e["reason"] for e in cluster.events(name)} >= {"BackupStarted", "BackupSucceeded"}
                       and {e["reason"] for e in cluster.events(name)}, 30, what="events", diag=cluster.logs)
    assert "BackupFailed" not in reasons
    # what a user sees
    out = cluster.emu.kube.kubectl("-n", cluster.http.ns, "get", "rabbitmqbackups", name, "-o", "wide").stdout
    assert "<invalid>" not in out and "Succeeded" in out and backup.backup_id in out, out


def test_failed_run_reports_the_broker_refusal(cluster, env):
    name = f"{env.tag}-bad"
    create_backup(cluster, env, name, broker=dict(env.url_broker, credentialsSecretRef={"name": f"{env.tag}-bad"}))
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Failed", timeout=120)
    assert run["phase"] == "Failed"
    assert cluster.status(name)["phase"] == "Failed"
    assert "BackupFailed" in {e["reason"] for e in wait_for(lambda: cluster.events(name), 30, what="events")}


def test_invalid_backup_never_reaches_the_operator(cluster, env):
    """The server refuses it: the operator sees nothing and creates nothing."""
    body = {"apiVersion": API, "kind": "RabbitMQBackup", "metadata": {"name": f"{env.tag}-six"},
            "spec": {"broker": env.url_broker, "storage": env.storage, "schedule": "0 0 2 * * *"}}
    with pytest.raises(AssertionError, match="6-field values with a leading seconds field are not supported"):
        cluster.http.create(API, "rabbitmqbackups", body)
    assert cluster.backup(f"{env.tag}-six") == {}


def test_api_calls_are_within_the_declared_rbac(cluster, env):
    """From the server's audit log: every call the operator process made (kopf's and ours) is in
    api_calls.USED_API_CALLS, the list the Helm chart's RBAC is checked against.
    The test makes its own run first: it must not depend on which tests ran before it."""
    cluster.needs_audit_log()
    name = f"{env.tag}-rbac"
    create_backup(cluster, env, name)
    trigger(cluster, name, "1")
    wait_run(cluster, name, phase="Succeeded")
    made = cluster.emu.api_calls()
    unexpected = made - used_api_calls()
    assert not unexpected, f"operator used calls missing from api_calls.USED_API_CALLS: {sorted(unexpected)}"
    for call in [("batch", "jobs", "create"), ("rbak.io", "rabbitmqbackups/status", "patch"),
                 ("", "configmaps", "create"), ("rbak.io", "rabbitmqbackups", "watch"), ("", "events", "create"),
                 ("", "secrets", "get")]:
        assert call in made, (call, json.dumps(sorted(made)))


def _pod_pid(marker: str) -> int:
    """The local pod process whose environment holds ``marker`` (the PodRunner runs it as a child)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "environ").read_bytes().split(b"\0"):
                    return int(d.name)
            except OSError:
                continue
    raise AssertionError(f"no process with {marker}")


def test_deletion_while_a_progress_read_is_in_flight_is_not_held_for_a_minute(cluster, env, tmp_path):
    """kopf cannot cancel a timer's sync tick: when the object is deleted mid-tick, kopf keeps the
    finalizer and re-checks the timer only on the object's next event or after
    ``settings.background.cancellation_polling`` (60 s by default). After a deletion nothing else
    writes the object (a tick whose progress did not change writes nothing), so the object stayed
    a minute: the case behind the flaky deletionPolicy-delete test under load. Here the tick is
    held deterministically: the Job's pod is stopped (its progress no longer changes) and the
    tick's storage read is held by a proxy while the object is deleted."""
    from urllib.parse import urlsplit

    from rbak.format.layout import progress_prefix
    from rbak.repo.progress import latest_progress
    from rbak_operator.decide.progress import fmt_epoch
    from support.holdproxy import HoldProxy
    from test_operator_progress_e2e import GATE_DIR

    env.broker.publish_n(env.vhost, "q1", 2, declare={})
    env.broker.publish_n(env.vhost, "q2", 2, declare={})
    moto = urlsplit(env.storage["s3"]["endpoint"])
    proxy = HoldProxy(moto.hostname, moto.port)
    gate = tmp_path / "gate"
    cluster.runner.extra_env = {"PYTHONPATH": str(GATE_DIR), "RBAK_TEST_PROGRESS_GATE": str(gate)}
    pid, run = None, ""
    try:
        name = f"{env.tag}-delheld"
        create_backup(cluster, env, name, deletionPolicy="delete",
                      storage={"s3": dict(env.storage["s3"], endpoint=proxy.url)})
        wait_for(lambda: "rbak.io/finalizer" in (cluster.backup(name)["metadata"].get("finalizers") or []), 30,
                 what="finalizer", diag=cluster.logs)
        trigger(cluster, name, "1")
        reached = Path(f"{gate}.backup.reached")
        wait_for(reached.exists, 60, what="the run held after its first queue", diag=cluster.logs)
        run = reached.read_text()  # the id its progress records go under: its backup id
        pid = _pod_pid(f"RBAK_TEST_PROGRESS_GATE={gate}")
        os.kill(pid, signal.SIGSTOP)  # its progress reporter stops too: the newest record stays the newest
        st = s3(env)
        newest = lambda: latest_progress(st, None, "backup", run)  # noqa: E731
        wait_for(lambda: (rec := newest()) is not None
                 and (cluster.status(name).get("progress") or {}).get("updateTime") == fmt_epoch(rec.updated_at),
                 30, what="the newest progress record in the status", diag=cluster.logs)
        prefix = f"prefix={env.bucket.prefix}%2F{progress_prefix(None, 'backup', run).replace('/', '%2F')}"
        proxy.hold_next(prefix.encode(), 5)
        wait_for(proxy.holding.is_set, 30, what="a progress read in flight", diag=cluster.logs)
        cluster.http.delete(API, "rabbitmqbackups", name)
        start = time.monotonic()
        wait_for(lambda: cluster.http.get(API, "rabbitmqbackups", name) is None, 90, what="object gone",
                 diag=cluster.logs)
        took = time.monotonic() - start
        assert proxy.held == 1
        # the bug held it 60 s (kopf's poll); now: the 5 s read plus a 1 s poll, with a margin for load
        assert took < 40, f"the deleted object stayed {took:.0f} s: held until kopf's next poll of its timer"
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        gate.touch()
        cluster.runner.extra_env = {}
        if run:  # the pod writes through the proxy until it ends
            wait_for(lambda: run.rsplit("-", 1)[0] in cluster.runner.outputs, 60, what="the held run ended")
        proxy.close()


def _rbak(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The ``rbak`` CLI as a user runs it (this worktree's code: the test's PYTHONPATH)."""
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, **env})


def test_signed_drill_shows_its_signer_and_the_stored_report_verifies(cluster, env, e2e_kube, tmp_path):
    """spec.verify.restoreDrill.signingKeySecretRef: the drill Job signs its report with the Secret's
    Ed25519 key; the real server keeps the field and status.restoreDrill.signer (the CRD declares both);
    ``kubectl rbak drill`` prints it; the stored report verifies with ``rbak drill verify --public-key``,
    and a copy with one changed count is refused naming that field. The stored report then altered in
    the bucket: the operator's next check of the evidence fails the drill naming the field (so does
    ``kubectl rbak status``), and the status no longer shows a signer."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from datetime import timedelta

    from rbak_operator.decide.times import parse_time
    from rbak_operator.decide.wake import EVIDENCE_RECHECK
    from rbak_operator.reconcile.drill import manual_run_name as drill_run

    from rbak.drill.backup import find_drill_report
    from rbak.repo.evidence import fingerprint

    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    public = tmp_path / "drill-signing.pub.pem"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    signer = fingerprint(key.public_key())
    cluster.http.secret(f"{env.tag}-sign", {"drill.pem": pem})
    env.broker.publish(env.vhost, "orders", [f"order-{i}".encode() for i in range(7)], declare={})
    name = f"{env.tag}-signed"
    # a daily drill slot whose misses are skipped: only the on-demand drill runs here
    create_backup(cluster, env, name, verify={"restoreDrill": {
        "schedule": "0 4 * * *", "startingDeadlineSeconds": 60,
        "signingKeySecretRef": {"name": f"{env.tag}-sign", "key": "drill.pem"}}})
    spec = cluster.backup(name)["spec"]["verify"]["restoreDrill"]
    assert spec["signingKeySecretRef"] == {"name": f"{env.tag}-sign", "key": "drill.pem"}  # not pruned
    trigger(cluster, name, "1")
    bid = wait_run(cluster, name, phase="Succeeded", timeout=120)["backupId"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    console_script(bin_dir)
    r = subprocess.run(["kubectl-rbak", "drill", name], env=plugin_env(e2e_kube, bin_dir), capture_output=True,
                       text=True, timeout=300, check=False)  # as a user runs it: annotates, follows
    assert r.returncode == 0, (r.stdout, r.stderr, cluster.logs())
    d = cluster.status(name)["restoreDrill"]
    job = d["lastJob"]
    value = cluster.backup(name)["metadata"]["annotations"]["rbak.io/drill-now"]
    assert job == drill_run(name, value) and not d.get("active")
    assert (d["result"], d["reason"], d["backupId"], d["messages"]) == ("Passed", "DrillPassed", bid, 7), d
    assert d["signer"] == signer, d
    assert r.stdout.splitlines()[-1] == (f"job/{job}: Passed: {d['message']} (backup {bid}, 7 messages, "
                                         f"scratch vhost {d['scratchVhost']}, signed by {signer})")
    job_env = cluster.http.get("batch/v1", "jobs", job)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "RBAK_DRILL_SIGNING_KEY", "valueFrom": {"secretKeyRef": {
        "name": f"{env.tag}-sign", "key": "drill.pem"}}} in job_env  # the PEM itself is in no object
    assert pem not in json.dumps(cluster.http.get("v1", "configmaps", job))

    key_name, report = find_drill_report(s3(env), bid, "", job)  # s3(env): the bucket under its prefix
    assert report["signature"]["key_fingerprint"] == signer
    url = env.bucket.url_with_prefix(f"{env.bucket.prefix}/{key_name}")
    ok = _rbak("drill", "verify", url, "--public-key", str(public))
    assert ok.returncode == 0, ok
    lines = ok.stdout.splitlines()
    assert lines[0] == f"signature: valid Ed25519 signature by key {signer}"
    assert lines[1] == f"drill {report['drill_id']} of backup {bid}: Passed"
    assert lines[-1].startswith(f"proves: backup {bid} ") and lines[-1].endswith(f"holder of key {signer}")

    [q] = report["queues"]
    assert (q["queue"], q["actual_count"]) == ("orders", 7)
    q["actual_count"] = 6
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(report))
    bad = _rbak("drill", "verify", str(tampered), "--public-key", str(public))
    assert (bad.returncode, bad.stdout) == (1, ""), bad
    assert bad.stderr.strip() == (f"rbak: Drill evidence: {tampered}: field queues[0].actual_count was changed "
                                  "after signing: signed 7, the report shows 6")

    # The stored report itself altered in the bucket: at its next check of the evidence the operator
    # refuses it, names the object and the field, and the status no longer shows a signer.
    checked = d["evidenceCheckTime"]
    s3(env).put(key_name, json.dumps(report).encode())
    assert cluster.status(name)["restoreDrill"]["signer"] == signer  # not due yet: the fake clock has not moved
    cluster.set_clock(parse_time(checked) + EVIDENCE_RECHECK + timedelta(seconds=2))
    d = wait_for(lambda: (d := cluster.status(name)["restoreDrill"]).get("reason") == "DrillEvidenceInvalid" and d,
                 60, what="the drill evidence re-checked", diag=cluster.logs)
    assert (d["result"], d.get("signer"), d["lastJob"], d["backupId"]) == ("Failed", None, job, bid), d
    assert d["message"] == (f"the stored report of drill {job} no longer verifies: {env.bucket.prefix}/{key_name}: "
                            "field queues[0].actual_count was changed after signing: signed 7, the report shows 6"), d
    assert "evidenceCheckTime" not in d
    warned = wait_for(lambda: [e for e in cluster.events(name) if e["reason"] == "RestoreDrillEvidenceInvalid"], 30,
                      what="the evidence event", diag=cluster.logs)
    assert warned[0]["type"] == "Warning" and warned[0]["message"] == d["message"]
    st = subprocess.run(["kubectl-rbak", "status", name], env=plugin_env(e2e_kube, bin_dir), capture_output=True,
                        text=True, timeout=120, check=False)
    assert st.returncode == 0 and f"drill failed: {d['message']}" in st.stdout, st


def restore_backup_ref(cluster, rname: str, name: str, bid: str) -> dict:
    """Create a RabbitMQRestore of backup ``bid`` of RabbitMQBackup ``name``; its status once it ended."""
    cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore",
                                                  "metadata": {"name": rname},
                                                  "spec": {"backupRef": {"name": name, "backupId": bid}}})
    return wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {})
                   .get("phase") in ("Succeeded", "Failed") and s, 120, what="restore", diag=cluster.logs)


def test_envelope_encrypted_backup_restores_through_the_operator(cluster, env, moto_s3):
    """spec.encryption.envelope with a keyring Secret and a KMS key (moto's KMS): the backup Job
    writes one data key per backup, wrapped by both (a wrap object each, the key never stored
    plainly), in-pod deep validation unwraps it, and a RabbitMQRestore of the backup (keys inherited
    through backupRef) puts back every body in order."""
    import base64

    import boto3
    import orjson

    from rbak.sealing.crypto import MAGIC

    orders = [f"card-{i}".encode() for i in range(12)]
    audit = [f"audit-{i}".encode() for i in range(5)]
    env.broker.publish(env.vhost, "orders", orders, declare={})
    env.broker.publish(env.vhost, "audit", audit, declare={"x-queue-type": "quorum"})
    kek = os.urandom(32)
    cluster.http.secret(f"{env.tag}-keys", {"keyring": f"kek-1: {base64.b64encode(kek).decode()}\n"})
    arn = boto3.session.Session().client("kms", region_name="us-east-1", endpoint_url=moto_s3).create_key(
        Description="rbak operator e2e KEK")["KeyMetadata"]["Arn"]
    name = f"{env.tag}-env"
    create_backup(cluster, env, name, validate={"enabled": True, "deep": True},
                  encryption={"envelope": True, "keyId": "kek-1", "keysSecretRef": {"name": f"{env.tag}-keys"},
                              "kms": {"keyId": arn, "endpointUrl": moto_s3}})
    assert cluster.backup(name)["spec"]["encryption"]["envelope"] is True  # not pruned by the server
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Succeeded", timeout=120)
    assert (run["messages"], run.get("validation")) == (17, "Passed"), run
    bid = run["backupId"]
    st = bucket_root(env)
    m = load_manifest(st, bid, env.bucket.prefix)
    assert m.encryption is not None and m.encryption.key_id.startswith("dek-") and m.encryption.envelope, m.encryption
    keys_dir = f"{env.bucket.prefix}/{bid}/keys/"
    wraps = sorted(k[len(keys_dir):] for k in env.bucket.keys() if k.startswith(keys_dir))
    assert wraps == ["keyring-kek-1.wrap.json", f"kms-{quote(arn, safe='')}.wrap.json"], wraps
    kinds = {(w["kek_source"], w["kek_id"]) for w in (orjson.loads(st.get(keys_dir + x)) for x in wraps)}
    assert kinds == {("keyring", "kek-1"), ("kms", arn)}
    for q in m.queues:
        for seg in q.segments:
            data = st.get(seg.key)
            assert data.startswith(MAGIC) and b"card-" not in data and b"audit-" not in data

    env.broker.drain_queue(env.vhost, "orders")
    env.broker.drain_queue(env.vhost, "audit")
    rname = f"{env.tag}-envr"
    rst = restore_backup_ref(cluster, rname, name, bid)
    assert rst["phase"] == "Succeeded", rst
    assert env.broker.read_bodies(env.vhost, "orders") == orders
    assert env.broker.read_bodies(env.vhost, "audit") == audit


def test_kms_only_envelope_backup_drills_and_restores_at_its_kms_endpoint(cluster, env, moto_s3):
    """spec.encryption.kms alone wraps the data key (no keyring Secret), at an endpoint that is not
    AWS's (moto's KMS): every pod the operator runs for it must reach that endpoint, or it cannot
    read the backup. The pods get nothing from this process's environment (the local kubelet gives a
    pod only its spec's env), so what reaches them is what the operator rendered: the backup Job's
    in-pod deep validation decrypts the contents, an on-demand drill passes, and a RabbitMQRestore
    through backupRef (no encryption of its own) puts every body back, in order."""
    import boto3
    import yaml

    from rbak.repo.catalog import latest_validation
    from rbak_operator.reconcile.drill import manual_run_name as drill_run

    orders = [f"kms-order-{i}".encode() for i in range(9)]
    env.broker.publish(env.vhost, "orders", orders, declare={})
    arn = boto3.session.Session().client("kms", region_name="us-east-1", endpoint_url=moto_s3).create_key(
        Description="rbak operator e2e KMS-only KEK")["KeyMetadata"]["Arn"]
    name = f"{env.tag}-kms"
    create_backup(cluster, env, name, validate={"enabled": True, "deep": True},
                  encryption={"envelope": True, "kms": {"keyId": arn, "region": "us-east-1", "endpointUrl": moto_s3}},
                  verify={"restoreDrill": {"schedule": "0 4 * * *", "startingDeadlineSeconds": 60}})
    trigger(cluster, name, "1")
    run = wait_run(cluster, name, phase="Succeeded", timeout=120)
    bid = run["backupId"]
    assert (run["messages"], run.get("validation")) == (9, "Passed"), run
    endpoint = {"name": "AWS_ENDPOINT_URL_KMS", "value": moto_s3}

    def rendered(job: str) -> tuple[dict, dict]:
        """(container name -> env, the run's rbak config) as the server stored them."""
        pod = cluster.http.get("batch/v1", "jobs", job)["spec"]["template"]["spec"]
        envs = {c["name"]: c["env"] for c in pod.get("initContainers", []) + pod["containers"]}
        return envs, yaml.safe_load(cluster.http.get("v1", "configmaps", job)["data"]["config.yaml"])

    envs, cfg = rendered(run["jobName"])
    assert set(envs) == {"rbak", "validate"} and all(endpoint in e for e in envs.values()), envs
    assert (cfg["encryption"]["kms_key_id"], cfg["encryption"]["kms_endpoint_url"]) == (arn, moto_s3)
    m = load_manifest(bucket_root(env), bid, env.bucket.prefix)
    assert m.encryption is not None and m.encryption.envelope
    [wrap] = [k for k in env.bucket.keys() if k.startswith(f"{env.bucket.prefix}/{bid}/keys/")]
    assert wrap.endswith(f"kms-{quote(arn, safe='')}.wrap.json")
    _, vreport = latest_validation(s3(env), bid, "")
    assert vreport["ok"] and vreport["deep"] and not any("not decrypted" in n for n in vreport["notes"]), vreport

    cluster.http.patch(API, "rabbitmqbackups", name, {"metadata": {"annotations": {"rbak.io/drill-now": "k1"}}})
    job = drill_run(name, "k1")
    d = wait_for(lambda: (d := cluster.status(name).get("restoreDrill") or {}).get("lastJob") == job
                 and not d.get("active") and d, 180, what="the drill", diag=cluster.logs)
    assert (d["result"], d["backupId"], d["messages"]) == ("Passed", bid, 9), d
    envs, cfg = rendered(job)
    assert endpoint in envs["rbak"] and cfg["encryption"] == {"kms_region": "us-east-1", "kms_endpoint_url": moto_s3}

    env.broker.drain_queue(env.vhost, "orders")
    rname = f"{env.tag}-kmsr"
    rst = restore_backup_ref(cluster, rname, name, bid)
    assert rst["phase"] == "Succeeded", rst
    envs, cfg = rendered(rst["jobName"])
    assert endpoint in envs["rbak"] and cfg["encryption"] == {"kms_region": "us-east-1", "kms_endpoint_url": moto_s3}
    assert env.broker.read_bodies(env.vhost, "orders") == orders


def test_two_replicas_elect_one_leader_on_a_lease_and_hand_over(cluster, env):
    """Two operators with leader election (the chart's replicas: 2): one holds the Lease and reconciles,
    the other answers its liveness probe and waits; killed, the holder's Lease is taken over only once it
    expired; a clean stop releases it. (The suite's own standalone operator runs beside them, as a second
    operator may: correctness never depends on the election.)"""
    import requests
    from support.mosquitto import free_port

    lease = f"{env.tag}-lease"
    common = {"RBAK_OPERATOR_STANDALONE": "0", "RBAK_LEASE_NAME": lease, "RBAK_LEASE_NAMESPACE": cluster.http.ns,
              "RBAK_LEASE_SECONDS": "4"}

    def spec() -> dict:
        return (cluster.http.get("coordination.k8s.io/v1", "leases", lease) or {}).get("spec") or {}

    name = f"{env.tag}-ha"
    create_backup(cluster, env, name)
    started = f"{cluster.http.ns}/{name}: reconcile loop started"
    a = cluster.start_operator({**common, "POD_NAME": "replica-a"})
    port, metrics_port = free_port(), free_port()
    b = None
    try:
        wait_for(lambda: spec().get("holderIdentity") == "replica-a", 60, what="replica-a holds the Lease",
                 diag=a.log)
        b = cluster.start_operator({**common, "POD_NAME": "replica-b",
                                    "RBAK_OPERATOR_LIVENESS": f"http://127.0.0.1:{port}/healthz",
                                    "RBAK_METRICS_PORT": str(metrics_port), "RBAK_METRICS_BIND": "127.0.0.1"})
        wait_for(lambda: "waiting for Lease" in b.log(), 60, what="replica-b standing by", diag=b.log)
        wait_for(lambda: started in a.log(), 60, what="the leader reconciling", diag=a.log)
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json() == {"standby": True}
        # a standby is a scrape target that answers (else it reads as a pod down), with nothing run
        scraped = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        assert "rbak_operator_runs_total" in scraped and "rbak_operator_runs_started_total{" not in scraped
        time.sleep(6)  # longer than the lease: the holder renews it, the standby keeps waiting
        assert spec()["holderIdentity"] == "replica-a" and started not in b.log()

        a.kill()  # SIGKILL: no release, the Lease has to expire
        t0 = time.monotonic()
        wait_for(lambda: spec().get("holderIdentity") == "replica-b", 60, what="replica-b takes over", diag=b.log)
        assert time.monotonic() - t0 > 2.5  # never before the 4 s lease (less a renewal period) ran out
        assert spec()["leaseTransitions"] == 1
        wait_for(lambda: started in b.log(), 60, what="the new leader reconciling", diag=b.log)

        b.stop()  # SIGTERM: kopf stops, the Lease is released for the next replica at once
        assert b.proc.returncode == 0, b.log()[-3000:]
        assert spec().get("holderIdentity") in (None, ""), spec()
    finally:
        a.kill()
        if b is not None:
            b.stop()
        cluster.http.delete(API, "rabbitmqbackups", name)


def test_sigterm_exits_at_once_while_a_pass_is_blocked_on_an_unanswering_storage(cluster, env):
    """A RabbitMQRestore whose S3 endpoint accepts connections and never answers (a stalled proxy, a
    firewall that drops): its pass blocks in a storage read. SIGTERM still ends the replica within
    seconds, exit 0, with the Lease released, instead of waiting on that read until the kubelet's
    SIGKILL (the next leader redoes the pass)."""
    import socket
    import threading

    held: list[socket.socket] = []
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])  # read nothing, answer nothing
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    lease = f"{env.tag}-stall-lease"
    op = cluster.start_operator({"RBAK_OPERATOR_STANDALONE": "0", "RBAK_LEASE_NAME": lease, "POD_NAME": "stalled",
                                 "RBAK_LEASE_NAMESPACE": cluster.http.ns, "RBAK_LEASE_SECONDS": "6"})
    rname = f"{env.tag}-stall"
    try:
        wait_for(lambda: "holding Lease" in op.log(), 60, what="the operator leading", diag=op.log)
        stalled = {"s3": {**env.storage["s3"], "endpoint": f"http://127.0.0.1:{port}"}}
        cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore",
                                                      "metadata": {"name": rname},
                                                      "spec": {"storage": stalled, "target": env.url_broker}})
        wait_for(lambda: f"{cluster.http.ns}/{rname}: reconcile loop started" in op.log() and held, 60,
                 what="a pass reading the stalled storage", diag=op.log)
        time.sleep(1)
        t0 = time.monotonic()
        op.stop()
        took = time.monotonic() - t0
        assert op.proc.returncode == 0, op.log()[-3000:]
        assert took < 14, (took, op.log()[-3000:])  # the tasks get 5 s; the read alone would take 20 s+
        assert "blocked call(s) abandoned" in op.log()
        spec = (cluster.http.get("coordination.k8s.io/v1", "leases", lease) or {}).get("spec") or {}
        assert spec.get("holderIdentity") in (None, ""), spec
    finally:
        op.kill()
        server.close()
        for s in held:
            s.close()
        cluster.http.delete(API, "rabbitmqrestores", rname)
