"""``rbak drill``: restore the newest complete backup into a scratch vhost, compare, always remove the vhost.

Real backups made with ``rbak backup`` from a test vhost on each broker; the
drill runs as a user would run it (``python -m rbak drill --config``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import orjson
import pika
import pytest
import yaml
from support.backups import fast_publish
from support.brokers import wait_until

from rbak.format.layout import BackupLayout
from rbak.storage import open_storage

QUEUES = {"orders": "classic", "payments": "quorum", "events": "stream"}


def rbak(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300, **kw)
    if check:
        assert p.returncode == 0, p.stderr + p.stdout
    return p


def _config(broker, vhost: str, store, backup_id: str | None = None, **drill) -> dict:
    cfg = {
        "mode": "backup",
        "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                   "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "filesystem", "path": str(store)},
        "backup": {"include_definitions": False},
        "offset_storage": {"path": str(store) + "-state/offsets.db", "sync_interval_secs": 0},
    }
    if backup_id:
        cfg["backup_id"] = backup_id
    if drill:
        cfg["drill"] = drill
    return cfg


def _write(tmp_path, cfg: dict, name: str = "rbak.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _fill(broker, vhost: str, n: int = 40) -> dict[str, int]:
    counts = {}
    for q, qtype in QUEUES.items():
        props = pika.BasicProperties(delivery_mode=2, content_type="text/plain", message_id=f"{q}-id",
                                     correlation_id="c-1")
        broker.publish(vhost, q, [f"{q}-{i}".encode() * (1 + i % 3) for i in range(n)], properties=props,
                       declare={"x-queue-type": qtype})
        counts[q] = n
    return counts


def _counts(broker, vhost: str) -> dict[str, int]:
    return {q["name"]: broker.message_count(vhost, q["name"]) if q.get("type") != "stream" else -1
            for q in broker.list_queues(vhost)}


def _drill_vhosts(broker, backup_id: str) -> set[str]:
    """Scratch vhosts of drills of ``backup_id`` (other tests drill other ids on the same broker meanwhile)."""
    return {v["name"] for v in broker.api("GET", "/api/vhosts") if v["name"].startswith(f"rbak-drill-{backup_id}-")}


def _backup(broker, vhost, tmp_path, backup_id: str) -> str:
    store = tmp_path / "store"
    cfg = _write(tmp_path, _config(broker, vhost, store, backup_id), f"backup-{backup_id}.yaml")
    rbak("backup", "--config", cfg)
    return str(store)


def test_drill_passes_on_a_good_backup_and_leaves_no_scratch_vhost(broker, vhost, tmp_path):
    _fill(broker, vhost)
    before = _counts(broker, vhost)
    store = _backup(broker, vhost, tmp_path, "b1")
    _backup(broker, vhost, tmp_path, "b2")  # the newest complete one is drilled
    cfg = _write(tmp_path, _config(broker, vhost, store))
    existing = _drill_vhosts(broker, "b2")
    p = rbak("drill", "--config", cfg, "--json")
    rep = json.loads(p.stdout)
    assert rep["passed"] is True and rep["result"] == "Passed" and rep["backup_id"] == "b2", rep
    by = {q["queue"]: q for q in rep["queues"]}
    assert set(by) == set(QUEUES)
    for name, q in by.items():
        assert q["expected_count"] == q["actual_count"] == 40 and q["hash_match"], q
        assert q["queue_type"] == QUEUES[name]
    assert rep["scratch_vhost"].startswith("rbak-drill-b2-") and rep["scratch_vhost"] != vhost
    assert rep["scratch_vhost_removed"] and not broker.vhost_exists(rep["scratch_vhost"])
    assert _drill_vhosts(broker, "b2") <= existing
    assert _counts(broker, vhost) == before  # the source vhost is untouched
    assert len(broker.read_stream(vhost, "events")) == 40
    # the report is stored next to the backup, a new object per drill
    st = open_storage(store)
    rbak("drill", "--config", cfg, "--backup-id", "b1")
    keys = sorted(st.list(BackupLayout("b2").drills_dir))
    assert keys == [rep["report_key"]]
    stored = orjson.loads(st.get(keys[0]))
    assert stored["passed"] and stored["drill_id"] == rep["drill_id"]
    assert len(list(st.list(BackupLayout("b1").drills_dir))) == 1


def _manifest_path(store: str, backup_id: str):
    from pathlib import Path

    return Path(store) / backup_id / "manifest.json"


def test_drill_finds_a_damaged_segment_and_names_the_queue(broker, vhost, tmp_path):
    _fill(broker, vhost, 20)
    store = _backup(broker, vhost, tmp_path, "dmg")
    man = json.loads(_manifest_path(store, "dmg").read_text())
    q = next(q for q in man["queues"] if q["name"] == "payments")
    seg = _manifest_path(store, "dmg").parent.parent / q["segments"][0]["key"]
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0xFF
    seg.write_bytes(bytes(data))
    cfg = _write(tmp_path, _config(broker, vhost, store))
    existing = _drill_vhosts(broker, "dmg")
    p = rbak("drill", "--config", cfg, "--backup-id", "dmg", "--json", check=False)
    assert p.returncode == 1, p.stderr
    rep = json.loads(p.stdout)
    assert rep["passed"] is False and "'payments'" in rep["reason"] and "dmg" in rep["reason"]
    by = {q["queue"]: q for q in rep["queues"]}
    assert by["orders"]["passed"] and by["events"]["passed"] and not by["payments"]["passed"]
    assert "payments" in p.stderr.strip().splitlines()[-1]
    assert not broker.vhost_exists(rep["scratch_vhost"]) and _drill_vhosts(broker, "dmg") <= existing


def test_drill_finds_a_manifest_count_that_lies(broker, vhost, tmp_path):
    _fill(broker, vhost, 15)
    store = _backup(broker, vhost, tmp_path, "lie")
    path = _manifest_path(store, "lie")
    man = json.loads(path.read_text())
    q = next(q for q in man["queues"] if q["name"] == "orders")
    q["message_count"] += 1
    man["total_messages"] += 1
    path.write_text(json.dumps(man))
    p = rbak("drill", "--config", _write(tmp_path, _config(broker, vhost, store)), "--json", check=False)
    assert p.returncode == 1
    rep = json.loads(p.stdout)
    bad = [q for q in rep["queues"] if not q["passed"]]
    assert [q["queue"] for q in bad] == ["orders"] and bad[0]["expected_count"] == 16, rep
    assert "'orders'" in rep["reason"] and not broker.vhost_exists(rep["scratch_vhost"])


def test_drill_failing_half_way_still_removes_the_scratch_vhost(broker, vhost, tmp_path):
    """The management API answers (the vhost is created) but AMQP is unreachable: the drill fails, the vhost goes."""
    _fill(broker, vhost, 5)
    before = _counts(broker, vhost)
    store = _backup(broker, vhost, tmp_path, "half")
    cfg = _config(broker, vhost, store)
    cfg["drill"] = {"target": {"amqp_url": "amqp://guest:guest@127.0.0.1:1/%2f",
                               "management_url": broker.management_url, "connection_timeout_secs": 2}}
    existing = _drill_vhosts(broker, "half")
    p = rbak("drill", "--config", _write(tmp_path, cfg), "--json", check=False)
    assert p.returncode == 1
    rep = json.loads(p.stdout)
    assert rep["scratch_vhost"] and rep["scratch_vhost_removed"] and "half" in rep["reason"]
    assert not broker.vhost_exists(rep["scratch_vhost"]) and _drill_vhosts(broker, "half") <= existing
    assert _counts(broker, vhost) == before


def test_sigterm_during_a_drill_removes_the_scratch_vhost(rmq310, vhost_factory, tmp_path):
    vhost = vhost_factory(rmq310)
    fast_publish(rmq310, vhost, "big", (b"x" * 2000 for _ in range(20000)), declare={"x-queue-type": "classic"})
    store = _backup(rmq310, vhost, tmp_path, "term")
    existing = _drill_vhosts(rmq310, "term")
    cfg = _write(tmp_path, _config(rmq310, vhost, store, read_timeout_secs=60))
    proc = subprocess.Popen([sys.executable, "-m", "rbak", "drill", "--config", cfg, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        made = wait_until(lambda: _drill_vhosts(rmq310, "term") - existing, timeout=60, interval=0.05, what="scratch vhost")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, (out, err)
    rep = json.loads(out)
    assert "SIGTERM" in rep["reason"] and rep["scratch_vhost_removed"] and {rep["scratch_vhost"]} == made, rep
    assert not any(rmq310.vhost_exists(v) for v in made)
    assert rmq310.message_count(vhost, "big") == 20000


@pytest.mark.parametrize("field,value,needle", [
    ("scratch_vhost_prefix", "bad prefix!", "drill.scratch_vhost_prefix"),
    ("read_timeout_secs", 0, "drill.read_timeout_secs"),
    ("bogus", 1, "drill.bogus"),
])
def test_bad_drill_fields_are_named(tmp_path, field, value, needle):
    cfg = {"mode": "drill", "storage": {"backend": "filesystem", "path": str(tmp_path / "s")},
           "drill": {"target": {"amqp_url": "amqp://guest:guest@localhost:5672/%2f",
                                "management_url": "http://localhost:15672"}, field: value}}
    p = rbak("drill", "--config", _write(tmp_path, cfg), check=False)
    assert p.returncode == 2 and needle in p.stderr, p.stderr


def test_drill_mode_needs_a_broker(tmp_path):
    cfg = {"mode": "drill", "storage": {"backend": "filesystem", "path": str(tmp_path / "s")}}
    p = rbak("drill", "--config", _write(tmp_path, cfg), check=False)
    assert p.returncode == 2 and "drill.target" in p.stderr, p.stderr


def test_drill_of_an_encrypted_backup_in_an_object_lock_bucket_writes_each_report_once(rmq310, vhost_factory,
                                                                                       moto_s3, tmp_path):
    """Write-once storage: each drill's report is a new locked object; nothing is rewritten. The drill
    opens the encrypted segments with the configured keyring; without it, it fails naming the key id."""
    import base64
    import uuid

    from support.s3 import S3Bucket, s3_client

    vhost = vhost_factory(rmq310)
    fast_publish(rmq310, vhost, "orders", [b"secret-%d" % i for i in range(50)], declare={})
    bucket = S3Bucket(moto_s3, f"lock-{uuid.uuid4().hex[:12]}")
    s3_client(moto_s3).create_bucket(Bucket=bucket.bucket, ObjectLockEnabledForBucket=True)
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"k1: {base64.b64encode(os.urandom(32)).decode()}\n")
    cfg = _config(rmq310, vhost, tmp_path / "unused", "enc-lock")
    cfg["storage"] = {"backend": "s3", "bucket": bucket.bucket, "prefix": "locked", "endpoint": bucket.endpoint,
                      "path_style": True, "region": "us-east-1", "object_lock_mode": "GOVERNANCE",
                      "object_lock_retain_days": 1}
    cfg["encryption"] = {"enabled": True, "key_id": "k1", "keys_file": str(keys)}
    env = {k: v for k, v in os.environ.items() if k != "RBAK_ENCRYPTION_KEYS"}
    rbak("backup", "--config", _write(tmp_path, cfg, "backup.yaml"), env=env)
    del cfg["backup_id"]
    path = _write(tmp_path, cfg)
    reps = [json.loads(rbak("drill", "--config", path, "--json", env=env).stdout) for _ in range(2)]
    assert all(r["passed"] and r["queues"][0]["actual_count"] == 50 and r["queues"][0]["hash_match"] for r in reps)
    c = bucket.client()
    vs = c.list_object_versions(Bucket=bucket.bucket, Prefix="locked/")
    keys_written = [v["Key"] for v in vs.get("Versions", [])]
    assert len(keys_written) == len(set(keys_written)) and not vs.get("DeleteMarkers")  # nothing rewritten
    drills = sorted(k for k in keys_written if "/drills/" in k)
    assert drills == sorted(r["report_key"] for r in reps) and len(drills) == 2
    for k in drills:
        assert c.head_object(Bucket=bucket.bucket, Key=k)["ObjectLockMode"] == "GOVERNANCE"
    nokey = dict(cfg, encryption={})
    p = rbak("drill", "--config", _write(tmp_path, nokey, "nokey.yaml"), "--json", env=env, check=False)
    rep = json.loads(p.stdout)
    assert p.returncode == 1 and "k1" in rep["reason"] and "'orders'" in rep["reason"], rep
    assert not rmq310.vhost_exists(rep["scratch_vhost"])


def test_drill_of_a_missing_backup_names_it_and_writes_nothing(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    cfg = {"mode": "drill", "storage": {"backend": "filesystem", "path": str(store)},
           "drill": {"target": {"amqp_url": "amqp://guest:guest@127.0.0.1:1/%2f",
                                "management_url": "http://127.0.0.1:1"}}}
    path = _write(tmp_path, cfg)
    p = rbak("drill", "--config", path, "--backup-id", "nope", "--json", check=False)
    assert p.returncode == 1 and "'nope'" in p.stderr.strip().splitlines()[-1], p.stderr
    assert json.loads(p.stdout)["scratch_vhost"] is None and list(store.iterdir()) == []
    p = rbak("drill", "--config", path, check=False)  # no backup at all: no newest complete one
    assert p.returncode != 0 and "no complete backup" in p.stderr, p.stderr
