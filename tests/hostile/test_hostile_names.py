"""Names too long for a file-system component, and names full of control characters.

A 127 x 'é' queue name is 254 bytes (RabbitMQ allows 255) but 762
characters percent-encoded: stored under a bounded, injective key that the
manifest maps back, on file storage and S3, backed up and restored on every
broker. Log lines escape control characters.
"""

from __future__ import annotations

import json
import subprocess
import sys

from rbak.backup import BackupEngine
from rbak.format.layout import MAX_COMPONENT, BackupLayout, decode_name, encode_name, encode_vhost
from support.backups import backup_config, load

LONG = "é" * 127


def test_long_names_get_bounded_injective_components_and_ordinary_names_do_not_change():
    assert encode_name("orders") == "orders" and encode_name("a/b c%d") == "a%2Fb%20c%25d"
    assert encode_name("q" * 200) == "q" * 200  # the Rust tool's keys, unchanged
    names = [LONG, LONG[:-1] + "e", "é" * 126 + "è", "x" * 255, "x" * 254 + "y", "\x00" * 255]
    comps = [encode_name(n) for n in names]
    assert len(set(comps)) == len(names)
    for c in comps:
        assert len(c.encode()) <= MAX_COMPONENT and "/" not in c and c not in (".", "..")
    assert encode_vhost(LONG) == encode_name(LONG)
    assert len(BackupLayout("b").segment(LONG, LONG, 1, __import__("rbak").format.Compression.ZSTD)) < 512
    try:
        decode_name(comps[0])
    except ValueError as e:
        assert "manifest" in str(e)
    else:
        raise AssertionError("a hashed component must not decode to a wrong name")


def test_a_queue_named_127_e_acute_is_backed_up_and_restored(broker, vhost, tmp_path):
    broker.declare_queue(vhost, LONG)
    broker.publish(vhost, LONG, [b"m-%d" % i for i in range(25)])
    store = tmp_path / "store"
    summary = BackupEngine(backup_config(broker, vhost, store, "b1", tmp_path / "state")).run()
    assert summary.completed
    m = load(store, "b1")
    (q,) = [q for q in m.queues if q.name == LONG]
    assert q.message_count == 25
    assert all(len(part.encode()) <= 255 for s in q.segments for part in s.key.split("/"))
    v = subprocess.run([sys.executable, "-m", "rbak", "validate", "--path", f"file://{store}", "--backup-id", "b1",
                        "--deep"], capture_output=True, text=True, timeout=120)
    assert v.returncode == 0, v.stderr
    broker.delete_queue(vhost, LONG)
    broker.declare_queue(vhost, LONG)
    r = subprocess.run([sys.executable, "-m", "rbak", "restore", "--path", f"file://{store}", "--backup-id", "b1",
                        "--target-url", broker.server_url(), "--management-url", broker.management_url,
                        "--publish-mode", "queue", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["confirmed"] == 25 == broker.message_count(vhost, LONG)


def test_control_characters_in_names_are_escaped_in_log_lines(tmp_path):
    """The importer logs each queue it writes: a client id full of control bytes stays one escaped line."""
    from rbak.offline.mosquitto import ClientChunk, ClientMsgChunk, MsgStoreChunk, write_db

    cid = "evil\x1b[2J\nFAKE LOG LINE\x07"
    db = tmp_path / "mosquitto.db"
    write_db(db, [MsgStoreChunk(1, "t", b"x", 1, False), ClientChunk(cid, session_expiry_interval=0xFFFFFFFF),
                  ClientMsgChunk(1, cid, 1, 1, 11, 1)])
    r = subprocess.run([sys.executable, "-m", "rbak", "-v", "import", "mosquitto-db", str(db), "--to",
                        f"file://{tmp_path}/out", "--backup-id", "b1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "evil" in r.stderr and "\\x1b" in r.stderr  # logged, escaped
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert not any(line.startswith("FAKE LOG LINE") for line in r.stderr.splitlines())
