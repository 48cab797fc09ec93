"""``rbak drill --archive``: the archive's state of a few seconds ago restored into a scratch vhost and compared
record by record with the live stream, on the three brokers; a live stream that no longer matches the archive
fails the drill naming the stream and offset; the evidence verifies, and a tampered copy does not."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pika
import pytest
from support.backups import fast_publish
from support.brokers import wait_until
from support.archives import Archiver, archive_config, declare_stream, fs_storage, generations

from rbak.drill.archive import first_mismatch, restore_point

LOOKBACK = 8.0


def rbak(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300)


def signing_key(tmp_path) -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    priv, pub = tmp_path / "sign.pem", tmp_path / "pub.pem"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(priv), str(pub)


def publish(broker, vhost: str, stream: str, prefix: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url(vhost)))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", stream, b"%s-%d" % (prefix.encode(), i),
                         pika.BasicProperties(delivery_mode=2, message_id=f"{prefix}-{i}", content_type="text/plain"))
    conn.close()


def archived_until(path: str, after_ms: int) -> bool:
    gens = generations(path)
    return bool(gens) and (gens[-1]["archive"]["recoverable_until"] or 0) > after_ms


def test_an_archive_drill_matches_the_live_streams_and_its_evidence_verifies(broker, vhost_factory, tmp_path):
    vhost = vhost_factory(broker)
    declare_stream(broker, vhost, "orders")
    declare_stream(broker, vhost, "audit")
    publish(broker, vhost, "orders", "o", 300)
    publish(broker, vhost, "audit", "a", 40)
    priv, pub = signing_key(tmp_path)
    store = fs_storage(tmp_path)
    path = str(tmp_path / "store")
    cfg = archive_config(tmp_path, broker, vhost, store, sections={"drill": {"signing_key_file": priv}})
    arc = Archiver(cfg, tmp_path / "archiver.log").running()
    try:
        wait_until(lambda: sum(g["total_messages"] for g in generations(path)) >= 340, timeout=120,
                   what="the records archived")
        read_by = int(time.time() * 1000)  # every record is stamped (read by the archiver) before this
        wait_until(lambda: archived_until(path, read_by + int(LOOKBACK * 1000) + 500), timeout=120,
                   what="the archive's recoverable-until past the look-back")
        # stamped after the restore point (the drill starts less than LOOKBACK after): live, not compared
        publish(broker, vhost, "orders", "late", 25)
        r = rbak("drill", "--config", str(cfg), "--archive", "arc", "--lookback", str(LOOKBACK), "--json")
    finally:
        arc.stop()
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    rep = json.loads(r.stdout)
    a = rep["archive"]
    assert rep["passed"] is True and rep["result"] == "Passed", rep
    streams = {s["stream"]: s for s in a["streams"]}
    assert set(streams) == {"orders", "audit"}
    assert (streams["orders"]["first_offset"], streams["orders"]["last_offset"]) == (0, 299)
    assert (streams["audit"]["first_offset"], streams["audit"]["last_offset"]) == (0, 39)
    for s, n in (("orders", 300), ("audit", 40)):
        st = streams[s]
        assert (st["restored_count"], st["read_back_count"], st["live_count"]) == (n, n, n), st
        assert st["restored_hash"] == st["live_hash"] and st["passed"]
    assert a["name"] == "arc" and a["generation"] in [g["backup_id"] for g in generations(path)]
    # the achieved recovery point: how far behind the drill's "now" the recoverable-until was
    assert a["recovery_point_secs"] == pytest.approx((a["drilled_at"] - a["recoverable_until"]) / 1000, abs=0.001)
    assert 0 <= a["recovery_point_secs"] < 10
    assert a["restore_point"] == restore_point(a["drilled_at"], a["recoverable_until"], LOOKBACK)
    assert a["restore_secs"] is not None and 0 < a["restore_secs"] < rep["duration_secs"]
    print(f"\n{broker.name}: archive drill of 340 records: recovery point achieved {a['recovery_point_secs']} s, "
          f"RTO {a['restore_secs']} s, drill {rep['duration_secs']} s")
    assert rep["scratch_vhost"].startswith("rbak-drill-arc.") and rep["scratch_vhost_removed"] is True
    assert not broker.vhost_exists(rep["scratch_vhost"])
    assert rep["report_key"].startswith(f"{a['generation']}/drills/")

    stored = tmp_path / "store" / rep["report_key"]
    v = rbak("drill", "verify", str(stored), "--public-key", pub)
    assert v.returncode == 0, v.stderr
    assert f"archive arc, generation {a['generation']}: recovery point achieved {a['recovery_point_secs']} s" in v.stdout
    assert "matched the live streams record by record" in v.stdout

    tampered = json.loads(stored.read_text())
    tampered["archive"]["recovery_point_secs"] = 0.001
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    t = rbak("drill", "verify", str(tmp_path / "tampered.json"), "--public-key", pub)
    assert t.returncode != 0
    assert "field archive.recovery_point_secs was changed after signing" in t.stderr, t.stderr


def test_an_archive_drill_fails_naming_the_stream_and_offset_that_differ(rmq43, vhost_factory, tmp_path):
    """The stream is deleted and declared again with other records at the same offsets (the archiver stopped,
    so the archive still holds the old ones): the drill fails at offset 0 of that stream."""
    broker = rmq43
    vhost = vhost_factory(broker)
    declare_stream(broker, vhost, "orders")
    publish(broker, vhost, "orders", "o", 20)
    store = fs_storage(tmp_path)
    path = str(tmp_path / "store")
    cfg = archive_config(tmp_path, broker, vhost, store)
    arc = Archiver(cfg, tmp_path / "archiver.log").running()
    at = int(time.time() * 1000)
    wait_until(lambda: archived_until(path, at + 500), timeout=120, what="the records archived")
    arc.stop()
    broker.delete_queue(vhost, "orders")
    declare_stream(broker, vhost, "orders")
    fast_publish(broker, vhost, "orders", [b"other-%d" % i for i in range(20)])
    r = rbak("drill", "--config", str(cfg), "--archive", "arc", "--lookback", "0", "--json")
    assert r.returncode == 1, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    (st,) = rep["archive"]["streams"]
    assert st["passed"] is False and st["mismatch_offset"] == 0
    assert rep["reason"] == (f"archive 'arc': stream 'orders' in vhost {vhost!r}: record at offset 0 restored "
                             "with another hash than the live stream's")
    assert "FAILED: archive 'arc': stream 'orders'" in r.stderr
    assert rep["scratch_vhost_removed"] is True and not broker.vhost_exists(rep["scratch_vhost"])


def test_refusals_name_the_option(rmq43, vhost_factory, tmp_path):
    vhost = vhost_factory(rmq43)
    declare_stream(rmq43, vhost, "orders")
    cfg = archive_config(tmp_path, rmq43, vhost, fs_storage(tmp_path))
    r = rbak("drill", "--config", str(cfg), "--archive", "arc", "--backup-id", "x.1")
    assert r.returncode == 2 and "--backup-id: not with --archive" in r.stderr
    r = rbak("drill", "--config", str(cfg), "--lookback", "5")
    assert r.returncode == 2 and "--lookback: only with --archive NAME" in r.stderr
    with_lookback = archive_config(tmp_path, rmq43, vhost, fs_storage(tmp_path), name="arc2",
                                   sections={"drill": {"lookback_secs": 60}})
    r = rbak("drill", "--config", str(with_lookback))
    assert r.returncode == 2 and "drill.lookback_secs: 60 is used only by a drill of an archive" in r.stderr
    r = rbak("drill", "--config", str(cfg), "--archive", "nothing")
    assert r.returncode != 0 and "no generation of archive 'nothing'" in r.stderr


@pytest.mark.parametrize("restored,live,want", [
    ([(0, b"a"), (1, b"b")], [(0, b"a"), (1, b"b")], None),
    ([(0, b"a"), (1, b"c")], [(0, b"a"), (1, b"b"), (2, b"c")], (1, "record at offset 1 missing from the restore")),
    ([(0, b"a"), (1, b"x"), (2, b"b")], [(0, b"a"), (1, b"b")], (1, "an extra record restored before offset 1")),
    ([(0, b"b"), (1, b"a")], [(0, b"a"), (1, b"b")],
     (0, "records reordered: the restore holds the record of offset 1 where offset 0 belongs")),
    ([(0, b"a"), (1, b"z")], [(0, b"a"), (1, b"b")],
     (1, "record at offset 1 restored with another hash than the live stream's")),
    ([(0, b"a")], [(0, b"a"), (1, b"b")], (1, "record at offset 1 missing from the restore (1 record(s) missing "
                                              "from there)")),
    ([(5, b"a")], [], (5, "the live stream holds none of offsets 5..5 (trimmed by its retention, or deleted): "
                          "nothing to compare the restore with")),
])
def test_first_mismatch_names_the_offset(restored, live, want):
    assert first_mismatch(restored, live) == want
