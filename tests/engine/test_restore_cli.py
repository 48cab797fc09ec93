"""`rbak restore` and `rbak definitions-import` as a user runs them (subprocess, real broker)."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from support.restores import build_backup, consume_all, declare, make_records, storage_for

from rbak.format.compression import Compression, decompress


def rbak(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300)
    if check and r.returncode:
        raise AssertionError(f"rbak {' '.join(args)} -> {r.returncode}\n{r.stderr}")
    return r


def test_restore_without_a_backup_id_uses_the_newest_complete_backup(broker, vhost, tmp_path):
    storage = storage_for(tmp_path)
    old = make_records(vhost, "q", [b"old-%d" % i for i in range(3)], every_type=False)
    new = make_records(vhost, "q", [b"new-%d" % i for i in range(4)], every_type=False)
    build_backup(storage, "b-2024-01", [(vhost, "q", "classic", old)])
    build_backup(storage, "b-2024-02", [(vhost, "q", "classic", new)])
    build_backup(storage, "b-2024-03", [(vhost, "q", "classic", old)], complete=False)  # never chosen
    declare(broker, vhost, "q")
    path = f"file://{tmp_path / 'store'}"
    common = ["restore", "--path", path, "--target-url", broker.server_url(),
              "--management-url", broker.management_url, "--json", "--publish-mode", "queue"]
    dry = rbak(*common, "--dry-run")
    out = json.loads(dry.stdout)
    assert out["backup_id"] == "b-2024-02" and out["dry_run"] and out["queues"][0]["selected"] == 4
    assert "restoring the newest complete backup 'b-2024-02'" in dry.stderr
    assert broker.message_count(vhost, "q") == 0
    run = rbak(*common)
    assert json.loads(run.stdout)["confirmed"] == 4
    assert [d.body for d in consume_all(broker, vhost, "q", 4)] == [b"new-%d" % i for i in range(4)]
    # an explicit incomplete backup is refused, naming it
    r = rbak(*common, "--backup-id", "b-2024-03", check=False)
    assert r.returncode != 0 and "'b-2024-03' is incomplete" in r.stderr

    # b-2024-02 gets damaged and a validation with --write-report proves it: the next restore that
    # picks the latest backup skips it (saying so) and takes b-2024-01.
    from rbak.repo.catalog import load_manifest

    seg = load_manifest(storage, "b-2024-02").queues[0].segments[0]
    data = bytearray(storage.get(seg.key))
    data[40] ^= 0xFF
    storage.put(seg.key, bytes(data))
    v = rbak("validate", "--path", path, "--backup-id", "b-2024-02", "--deep", "--write-report", check=False)
    assert v.returncode == 1 and "report: b-2024-02/validation/report-" in v.stderr, v.stderr
    report = json.loads(storage.get(v.stderr.split("report: ")[1].split()[0]))
    assert report["ok"] is False and any(seg.key in p for p in report["all_problems"])
    dry = rbak(*common, "--dry-run")
    assert json.loads(dry.stdout)["backup_id"] == "b-2024-01"
    assert "skipping backup 'b-2024-02': its last validation failed" in dry.stderr, dry.stderr
    # a later passing validation (say, after the segment was repaired) makes it eligible again
    storage.put(seg.key, bytes(data[:40]) + bytes([data[40] ^ 0xFF]) + bytes(data[41:]))
    assert rbak("validate", "--path", path, "--backup-id", "b-2024-02", "--deep", "--write-report").returncode == 0
    assert json.loads(rbak(*common, "--dry-run").stdout)["backup_id"] == "b-2024-02"


def test_definitions_import_command_writes_the_rollback_into_the_backup(broker, vhost, tmp_path):
    doc = {"vhosts": [{"name": vhost}], "queues": [{"name": "from-file", "vhost": vhost, "durable": True,
                                                     "auto_delete": False, "arguments": {}}],
           "exchanges": [], "bindings": [], "policies": [], "parameters": [], "permissions": [], "users": []}
    src = tmp_path / "defs.json"
    src.write_text(json.dumps(doc))
    cfg = {"mode": "restore", "backup_id": "imp",
           "target": {"amqp_url": broker.server_url(), "management_url": broker.management_url},
           "storage": {"backend": "filesystem", "path": str(tmp_path / "store")}}
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    dry = rbak("definitions-import", "--config", str(cfg_path), "--input", str(src), "--dry-run", "--json")
    assert json.loads(dry.stdout)["changes"]["queues"]["create"] == [f"{vhost}/from-file"]
    assert broker.queue_info(vhost, "from-file") is None
    res = json.loads(rbak("definitions-import", "--config", str(cfg_path), "--input", str(src), "--json").stdout)
    assert res["imported"] and broker.queue_info(vhost, "from-file") is not None
    snapshot = json.loads(decompress((tmp_path / "store" / res["rollback_key"]).read_bytes(), Compression.ZSTD))
    assert not any(q["name"] == "from-file" and q["vhost"] == vhost for q in snapshot["queues"])
    out = tmp_path / "export.json"
    rbak("definitions-export", "--config", str(cfg_path), "--output", str(out))
    assert any(q["name"] == "from-file" and q["vhost"] == vhost for q in json.loads(out.read_text())["queues"])


def test_flags_that_a_config_also_says_are_refused_and_backup_id_applies(broker, vhost, tmp_path):
    """A new user's trials: with --config, --path, --target-url and --keys-file were silently ignored
    (the config's storage restored instead), and --backup-id was refused for a config naming none."""
    storage = storage_for(tmp_path)
    build_backup(storage, "b1", [(vhost, "q", "classic", make_records(vhost, "q", [b"a", b"b"], every_type=False))])
    declare(broker, vhost, "q")
    cfg = tmp_path / "r.yaml"
    cfg.write_text(yaml.safe_dump({
        "mode": "restore",
        "target": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url},
        "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
        "restore": {"publish_mode": "queue"}}))
    p = rbak("restore", "--config", str(cfg), "--backup-id", "b1", "--path", str(tmp_path / "other"),
             "--keys-file", str(tmp_path / "k.yaml"), check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"--path, --keys-file: not used with --config {cfg}" in p.stderr
    assert broker.message_count(vhost, "q") == 0
    p = rbak("restore", "--config", str(cfg), "--backup-id", "b1", check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert [d.body for d in consume_all(broker, vhost, "q", 2)] == [b"a", b"b"]


def test_a_malformed_target_url_is_refused_without_its_password(tmp_path):
    """A new user's trial: RBAK_TARGET_URL='amqp//guest:S3cret@host/v' (the scheme's colon forgotten) went
    on as a vhost named 'mqp//guest:S3cret@...' and printed the password in the refusal."""
    env = {**__import__("os").environ, "RBAK_TARGET_URL": "amqp//guest:S3cret@localhost:5674/v"}
    r = subprocess.run([sys.executable, "-m", "rbak", "restore", "--path", str(tmp_path), "--backup-id", "b"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    assert "--target-url (or --target-url-file, $RBAK_TARGET_URL): must be a amqp:///amqps:// URL" in r.stderr
    assert "S3cret" not in r.stderr + r.stdout and "amqp//guest:***@localhost:5674/v" in r.stderr
