"""A 3.10 message over 4.x's max_message_size, restored into 4.0.5 and 4.3.6 (issue 45).

3.x takes bodies up to 128 MiB; 4.x's default ``max_message_size`` is 16 MiB and its broker closes the
channel (406) on a bigger one, so a migration restore used to publish until that message and fail half
way. The backup records each segment's largest body (``max_body_bytes``); the restore reads the target's
limit (its AMQP 1.0 attach) and refuses before ANY publish, naming the size, the limit and the setting;
an older backup without the field is scanned; ``allow_oversize_skip`` restores the rest and lists each
skipped record. Run as users run it: ``rbak restore --config ... --json``, the exit code, stdout's JSON,
and the targets' exact contents.
"""

from __future__ import annotations

import json
import subprocess
import sys

import orjson
import pytest
import yaml

from rbak.backup import BackupEngine
from support.backups import backup_config, fast_publish, load

LIMIT = 16 * 1024 * 1024  # 4.x's default max_message_size (the CI brokers keep it)
BIG = b"B" * (LIMIT + 1)
SMALL = [b"s-0", b"s-1", b"s-2"]


@pytest.fixture
def old_backup(tmp_path, rmq310, vhost_factory):
    """One backup of a 3.10 vhost: queue ``big`` (a-0, 16 MiB + 1 byte, a-2) and queue ``small``."""
    vh = vhost_factory(rmq310)
    fast_publish(rmq310, vh, "big", [b"a-0", BIG, b"a-2"], declare={})
    fast_publish(rmq310, vh, "small", SMALL, declare={})
    BackupEngine(backup_config(rmq310, vh, tmp_path / "store", "b310", tmp_path / "state.db")).run()
    return tmp_path / "store", vh


def restore(broker, store, src_vhost: str, vhost: str, tmp_path, **opts) -> tuple[subprocess.CompletedProcess, dict]:
    cfg = {"mode": "restore", "backup_id": "b310",
           "target": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url},
           "storage": {"backend": "filesystem", "path": str(store)},
           "restore": {"publish_mode": "queue", "vhost_mapping": {src_vhost: vhost}, **opts}}
    path = tmp_path / "restore.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "rbak", "restore", "--config", str(path), "--json", "--no-progress"],
                       capture_output=True, text=True, timeout=600)
    return r, json.loads(r.stdout)


def assert_refused(r, out, broker, vhost: str, src_vhost: str) -> None:
    assert r.returncode == 1, r.stderr
    msg = out["error"]["message"]
    assert (out["ok"], out["error"]["class"]) == (False, "RestoreError"), out
    assert msg.startswith(f"Restore error: queue 'big' in vhost '{src_vhost}' -> queue 'big' in vhost '{vhost}': "
                          f"record 1 of "), msg
    assert (f"has a {LIMIT + 1}-byte body, over the target's max_message_size {LIMIT} (RabbitMQ "
            f"{broker.version}, as its AMQP 1.0 attach announces it)") in msg, msg
    assert "Nothing was published" in msg and "restore.allow_oversize_skip: true" in msg
    assert "rbak: " + msg in r.stderr.splitlines()
    # refused before ANY publish: not even the queue that fits got a message
    assert broker.message_count(vhost, "big") == 0 and broker.message_count(vhost, "small") == 0


@pytest.mark.parametrize("broker", ["rmq40", "rmq43"], indirect=True)
def test_a_message_over_the_targets_max_message_size_is_refused_before_any_publish_then_skipped(
        broker, vhost, old_backup, tmp_path):
    store, src = old_backup
    m = load(store, "b310")
    big = m.find_queue(src, "big")
    assert big.max_body_bytes == LIMIT + 1 and m.find_queue(src, "small").max_body_bytes == 3
    raw = orjson.loads((store / "b310" / "manifest.json").read_bytes())
    (qbig,) = [q for q in raw["queues"] if q["name"] == "big"]
    assert qbig["max_body_bytes"] == LIMIT + 1 and qbig["segments"][0]["max_body_bytes"] == LIMIT + 1
    d = json.loads(subprocess.run([sys.executable, "-m", "rbak", "describe", "--path", str(store), "--backup-id",
                                   "b310", "--format", "json"], capture_output=True, text=True, check=True).stdout)
    assert {q["name"]: q["max_body_bytes"] for q in d["queues"]} == {"big": LIMIT + 1, "small": 3}
    for q in ("big", "small"):
        broker.declare_queue(vhost, q)

    r, out = restore(broker, store, src, vhost, tmp_path)
    assert_refused(r, out, broker, vhost, src)

    # a backup written before max_body_bytes existed (or by the Rust tool): the segments are scanned
    older = tmp_path / "older"
    import shutil

    shutil.copytree(store, older)
    for q in raw["queues"]:
        q.pop("max_body_bytes", None)
        for s in q["segments"]:
            s.pop("max_body_bytes")
    (older / "b310" / "manifest.json").write_bytes(orjson.dumps(raw, option=orjson.OPT_INDENT_2))
    assert load(older, "b310").find_queue(src, "big").max_body_bytes is None
    r, out = restore(broker, older, src, vhost, tmp_path)
    assert_refused(r, out, broker, vhost, src)

    # allow_oversize_skip: everything else restored, the skipped record listed, exit 0
    r, out = restore(broker, older, src, vhost, tmp_path, allow_oversize_skip=True)
    assert r.returncode == 0, r.stderr
    by = {q["source_queue"]: q for q in out["queues"]}
    seg = big.segments[0].key
    assert by["big"]["oversize_skipped"] == [{"segment": seg, "index": 1, "bytes": LIMIT + 1}]
    assert (by["big"]["status"], by["big"]["confirmed"]) == ("restored", 2)
    assert (by["small"]["confirmed"], by["small"]["oversize_skipped"]) == (3, [])
    assert broker.read_bodies(vhost, "big") == [b"a-0", b"a-2"]
    assert broker.read_bodies(vhost, "small") == SMALL


@pytest.mark.parametrize("broker", ["rmq43"], indirect=True)
def test_a_drill_into_a_4x_target_refuses_the_queue_naming_size_and_limit(broker, old_backup, tmp_path):
    """Drills publish through each queue's own run: the same check refuses the queue, the drill fails
    naming it, and the scratch vhost goes."""
    store, src = old_backup
    cfg = {"mode": "drill", "backup_id": "b310", "storage": {"backend": "filesystem", "path": str(store)},
           "drill": {"target": {"amqp_url": broker.amqp_url("/"), "management_url": broker.management_url}}}
    path = tmp_path / "drill.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "rbak", "drill", "--config", str(path), "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert rep["passed"] is False and rep["ok"] is False and rep["error"]["class"] == "DrillError", rep
    by = {q["queue"]: q for q in rep["queues"]}
    assert by["small"]["passed"] and not by["big"]["passed"], by
    assert f"has a {LIMIT + 1}-byte body, over the target's max_message_size {LIMIT}" in json.dumps(by["big"])
    assert not broker.vhost_exists(rep["scratch_vhost"])
