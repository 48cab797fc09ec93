"""Backups against both real brokers: every queue type, typed headers, source unchanged, streams incremental."""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys

import orjson
import pika
import pytest

from rbak.backup import BackupEngine
from rbak.errors import ConfigError
from rbak.format.compression import decompress, Compression
from rbak.format.record import Bool, Bytes, Double, Long, LongString, Table, Array, Timestamp, Void, Float, Short
from rbak.storage import open_storage

from support.backups import backup_config, drain, fast_publish, load, records

HEADERS = {
    "str": "héllo", "int": 7, "big": 2**40, "neg": -5, "bool": True, "bytes": b"\x00\xff",
    "nested": {"a": [1, "two", {"deep": False}], "empty": {}}, "none": None, "list": [],
}


def _publish_typed(broker, vhost: str, queue: str) -> None:
    """A message whose headers carry f, d, s, T fields pika cannot encode: published from raw bytes."""
    from rbak.format.amqp091 import encode_basic_properties
    from rbak.format.record import BackupProperties

    props = BackupProperties(content_type="application/x", delivery_mode=2, priority=3, correlation_id="c",
                             reply_to="r", expiration="600000", message_id="typed-1", timestamp=1_700_000_000,
                             type_field="t", user_id="guest", app_id="app", cluster_id="cl")
    headers = (("f", Float(1.5)), ("d", Double(-2.25)), ("s", Short(-7)), ("t", Timestamp(1_600_000_000)),
               ("l", Long(2**50)), ("v", Void()), ("tbl", Table((("x", Array((Bool(True), Bytes(b"\x01")))),))))
    broker.publish_raw(vhost, [("", queue, encode_basic_properties(props, headers), b"typed")])
    return props, headers


def test_backup_every_type_source_unchanged(broker, vhost, tmp_path):
    b = broker
    n = 2000
    bodies = [f"m-{i}".encode() for i in range(n)]
    fast_publish(b, vhost, "classic", bodies, declare={})
    fast_publish(b, vhost, "quorum", bodies, declare={"x-queue-type": "quorum"})
    b.publish(vhost, "stream", [b"s-%d" % i for i in range(300)], declare={"x-queue-type": "stream"})
    b.declare_queue(vhost, "empty")
    special = [b"", bytes(range(256)) * 4, b"\x00" * (16 * 1024 * 1024)]
    b.publish(vhost, "special", special, declare={},
              properties=pika.BasicProperties(delivery_mode=2, headers=HEADERS, message_id="sp"))
    typed_props, typed_headers = _publish_typed(b, vhost, "special")

    store, state = tmp_path / "store", tmp_path / "state.db"
    cfg = backup_config(b, vhost, store, "b1", state, include_definitions=True, segment_max_bytes=64 * 1024)
    summary = BackupEngine(cfg).run()
    assert summary.completed
    m = load(store, "b1")
    assert m.completed_at is not None and m.rabbitmq_version == b.version
    by = {q.name: q for q in m.queues}
    assert {k: v.message_count for k, v in by.items()} == {
        "classic": n, "quorum": n, "stream": 300, "empty": 0, "special": 4}
    assert by["quorum"].queue_type == "quorum" and by["stream"].queue_type == "stream"
    assert len(by["classic"].segments) > 1  # rotated by segment_max_bytes
    assert m.total_messages == 2 * n + 304

    # records: order, bodies, typed headers and properties
    assert [r.body for r in records(store, m, vhost, "classic")] == bodies
    assert [r.body for r in records(store, m, vhost, "quorum")] == bodies
    srecs = records(store, m, vhost, "stream")
    assert [r.body for r in srecs] == [b"s-%d" % i for i in range(300)]
    assert all(not any(k.startswith("x-stream") for k, _ in r.headers) for r in srecs)
    sp = records(store, m, vhost, "special")
    assert [r.body for r in sp[:3]] == special
    h = dict(sp[0].headers)
    assert h["str"] == LongString("héllo") and h["int"] == Long(7) and h["big"] == Long(2**40)
    assert h["bool"] == Bool(True) and h["bytes"] == Bytes(b"\x00\xff") and h["none"] == Void()
    assert h["nested"] == Table((("a", Array((Long(1), LongString("two"), Table((("deep", Bool(False)),))))),
                                 ("empty", Table(()))))
    assert sp[0].properties.message_id == "sp" and sp[0].source_vhost == vhost and sp[0].source_queue == "special"
    assert sp[3].body == b"typed" and sp[3].properties == typed_props
    # 4.0 keeps header tables sorted by key (its internal message container); 3.10 keeps publish order
    assert sorted(sp[3].headers, key=lambda kv: kv[0]) == sorted(typed_headers, key=lambda kv: kv[0])

    # definitions: pretty JSON with counts
    s = open_storage(str(store))
    d = m.definitions
    assert d is not None and d.key == "b1/definitions/definitions.json.zst"
    raw = decompress(s.get(d.key), Compression.ZSTD)
    doc = orjson.loads(raw)
    assert raw.startswith(b"{\n  ") and d.size_bytes == len(raw)
    assert d.queue_count == len(doc["queues"]) and any(q["vhost"] == vhost for q in doc["queues"])
    assert s.exists("b1/state/offsets.db")

    # the source holds exactly what it held, in the same order; only the redelivered flag changed
    got = drain(b, vhost, "classic")
    assert [x[0] for x in got] == bodies and all(x[2] for x in got)
    assert [x[0] for x in drain(b, vhost, "quorum")] == bodies
    sp_after = drain(b, vhost, "special")
    assert [x[0] for x in sp_after] == special + [b"typed"]
    assert b.read_stream(vhost, "stream")[-1].body == b"s-299"


def test_stream_incremental_and_existing_id(broker, vhost, tmp_path):
    b = broker
    b.publish(vhost, "st", [b"a-%d" % i for i in range(50)], declare={"x-queue-type": "stream"})
    store, state = tmp_path / "store", tmp_path / "state.db"
    BackupEngine(backup_config(b, vhost, store, "s1", state)).run()
    b.publish(vhost, "st", [b"b-%d" % i for i in range(20)])
    BackupEngine(backup_config(b, vhost, store, "s2", state)).run()
    BackupEngine(backup_config(b, vhost, store, "s3", state)).run()  # nothing new
    assert [r.body for r in records(store, load(store, "s1"), vhost, "st")] == [b"a-%d" % i for i in range(50)]
    assert [r.body for r in records(store, load(store, "s2"), vhost, "st")] == [b"b-%d" % i for i in range(20)]
    assert load(store, "s3").find_queue(vhost, "st").message_count == 0
    # the spec: a stream record's delivery_tag is its stream offset (not the channel's delivery tag)
    offsets = [m.headers["x-stream-offset"] for m in b.read_stream(vhost, "st", "first")]
    stored = [r.delivery_tag for k in ("s1", "s2") for r in records(store, load(store, k), vhost, "st")]
    assert stored == offsets and len(offsets) == 70

    # a fresh machine (new local state) continues from the storage copy of the newest backup's state
    BackupEngine(backup_config(b, vhost, store, "s4", tmp_path / "other.db")).run()
    assert load(store, "s4").find_queue(vhost, "st").message_count == 0
    # full read when incremental is off
    full = BackupEngine(backup_config(b, vhost, store, "s5", state, stream_incremental=False)).run()
    assert full.total_messages == 70

    with pytest.raises(ConfigError, match="'s1' already exists and is complete"):
        BackupEngine(backup_config(b, vhost, store, "s1", state)).run()


def test_cli_backup_json_and_credentials_never_printed(rmq310, vhost_factory, tmp_path):
    b = rmq310
    vhost = vhost_factory(b)
    b.publish(vhost, "q1", [b"x"] * 5, declare={})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
mode: backup
source:
  amqp_url: amqp://guest:${{RBAK_TEST_PW}}@127.0.0.1:{b.amqp_port}/%2f
  management_url: {b.management_url}
  management_password: ${{RBAK_TEST_PW}}
  queues: {{vhosts: ["{vhost}"]}}
storage: {{backend: filesystem, path: "{tmp_path / 'store'}"}}
offset_storage: {{path: "{tmp_path / 'state.db'}"}}
""")
    env = {"RBAK_TEST_PW": "guest", "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    r = subprocess.run([sys.executable, "-m", "rbak", "-v", "backup", "--config", str(cfg), "--json",
                        "--backup-id", "cli-1"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["completed"] and out["total_messages"] == 5 and out["queues"][0]["name"] == "q1"
    assert "guest:guest" not in r.stderr + r.stdout
    manifest = (tmp_path / "store" / "cli-1" / "manifest.json").read_text()
    assert "guest" not in manifest
    # same id again: refused, exit 2, nothing overwritten
    r2 = subprocess.run([sys.executable, "-m", "rbak", "backup", "--config", str(cfg), "--backup-id", "cli-1"],
                        capture_output=True, text=True, env=env, timeout=120)
    assert r2.returncode == 2 and "already exists and is complete" in r2.stderr
    assert (tmp_path / "store" / "cli-1" / "manifest.json").read_text() == manifest
    # a wrong password: a clear error, the password not echoed
    env["RBAK_TEST_PW"] = "s3cret-wrong"
    r3 = subprocess.run([sys.executable, "-m", "rbak", "backup", "--config", str(cfg), "--backup-id", "cli-2"],
                        capture_output=True, text=True, env=env, timeout=120)
    assert r3.returncode != 0 and "401" in r3.stderr and "s3cret-wrong" not in r3.stderr


def test_metrics_served(rmq310, vhost_factory, tmp_path):
    import requests

    from rbak import metrics as bm
    from rbak.config import MetricsConfig

    b = rmq310
    vhost = vhost_factory(b)
    b.publish(vhost, "mq", [b"abc"] * 7, declare={})
    BackupEngine(backup_config(b, vhost, tmp_path / "s", "m1", tmp_path / "st.db")).run()
    srv = bm.serve(MetricsConfig(enabled=True, port=0, bind="127.0.0.1", path="/metrics"))
    try:
        port = srv.server_port
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        line = [ln for ln in text.splitlines() if ln.startswith("rabbitmq_backup_messages_read_total")
                and f'vhost="{vhost}"' in ln]
        assert line and 'queue="mq"' in line[0] and 'queue_type="classic"' in line[0] and line[0].endswith(" 7.0")
        assert "rabbitmq_backup_segments_written_total" in text and "guest" not in text
        assert requests.get(f"http://127.0.0.1:{port}/other", timeout=5).status_code == 404
    finally:
        srv.shutdown()


def test_backup_to_s3_with_prefix(rmq310, vhost_factory, s3_bucket, tmp_path):
    """S3 storage (moto over HTTP): segments, definitions, manifest and the checkpoint under the prefix."""
    from rbak.config import Config

    b = rmq310
    vhost = vhost_factory(b)
    b.publish(vhost, "s3q", [b"a", b"b", b"c"], declare={})
    cfg = Config.from_dict({
        "mode": "backup", "backup_id": "on-s3",
        "source": {"amqp_url": b.amqp_url(vhost), "management_url": b.management_url, "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "s3", "bucket": s3_bucket.bucket, "endpoint": s3_bucket.endpoint, "path_style": True,
                    "region": "us-east-1", "prefix": "team/a"},
        "offset_storage": {"path": str(tmp_path / "st.db")},
    }, env={})
    s = BackupEngine(cfg).run()
    assert s.completed and s.total_messages == 3
    keys = set(s3_bucket.keys())
    assert {"team/a/on-s3/manifest.json", "team/a/on-s3/state/offsets.db",
            "team/a/on-s3/definitions/definitions.json.zst"} <= keys
    seg = [k for k in keys if k.startswith(f"team/a/on-s3/queues/{vhost}/s3q/segment-")]
    assert seg == [f"team/a/on-s3/queues/{vhost}/s3q/segment-0001.zst"]
    from rbak.repo.catalog import load_manifest

    m = load_manifest(cfg.storage.open(), "on-s3", "team/a")
    assert m.is_complete and m.find_queue(vhost, "s3q").message_count == 3


def test_cli_embedded_default(rmq310, vhost_factory, tmp_path):
    """`rbak backup` without a config: the local broker (guest, :5672/:15672) into ./rbak-backups."""
    import os

    b = rmq310
    vhost = vhost_factory(b)  # --vhost keeps the test inside its own vhost on the shared broker
    b.publish(vhost, "dq", [b"d1", b"d2"], declare={})
    r = subprocess.run([sys.executable, "-m", "rbak", "backup", "--vhost", vhost], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert r.returncode == 0, r.stderr
    assert "2 messages from 1 queue(s)" in r.stdout and f"{vhost}/dq (classic): 2 messages [done]" in r.stdout
    (bid,) = [p.name for p in (tmp_path / "rbak-backups").iterdir()]
    assert bid.startswith("backup-")
    m = load(tmp_path / "rbak-backups", bid)
    assert m.is_complete and [r.body for r in records(tmp_path / "rbak-backups", m, vhost, "dq")] == [b"d1", b"d2"]
    assert (tmp_path / ".rbak-state" / "offsets.db").is_file()


def test_min_messages_counts_exactly_and_lists_what_it_skips(broker, vhost, tmp_path):
    """source.queues.min_messages goes by the count just before the read, not the management API's
    sampled figure: a queue filled right before the backup (its listing may still say 0) is taken
    whole, a smaller one is skipped and named in the manifest. A restore's min_messages goes by the
    backup's count."""
    from rbak.config import Config
    from rbak.restore.engine import run_restore
    from rbak.restore.options import options_from_config

    broker.publish(vhost, "small", [b"s-%d" % i for i in range(3)], declare={})
    broker.publish(vhost, "big", [b"b-%d" % i for i in range(10)], declare={})
    broker.declare_queue(vhost, "late")
    broker.declare_queue(vhost, "sq", arguments={"x-queue-type": "quorum"})
    broker.publish(vhost, "sq", [b"q-%d" % i for i in range(4)])
    listed = {q["name"]: q.get("messages") for q in broker.list_queues(vhost)}
    broker.publish(vhost, "late", [b"l-%d" % i for i in range(7)])  # after the listing's last sample
    cfg = backup_config(broker, vhost, tmp_path / "store", "mm", tmp_path / "st.db")
    cfg.source.queues.min_messages = 5
    BackupEngine(cfg).run()
    m = load(tmp_path / "store", "mm")
    assert sorted(q.name for q in m.queues) == ["big", "late"], listed
    assert [r.body for r in records(tmp_path / "store", m, vhost, "late")] == [b"l-%d" % i for i in range(7)]
    skipped = {s.name: s for s in m.queue_status}
    assert set(skipped) == {"small", "sq"} and all(s.status == "skipped" for s in skipped.values())
    assert "held 3 message(s), fewer than source.queues.min_messages (5)" in skipped["small"].reason
    assert [b for b, _p, _r in drain(broker, vhost, "small")] == [b"s-%d" % i for i in range(3)]  # kept whole

    for q in ("big", "late"):
        broker.delete_queue(vhost, q)
        broker.declare_queue(vhost, q)
    rcfg = Config.from_dict({"mode": "restore", "backup_id": "mm",
                             "target": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url},
                             "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
                             "restore": {"queues": {"min_messages": 8}}}, env={})
    run_restore(rcfg.storage.open(), options_from_config(rcfg))
    assert [b for b, _p, _r in drain(broker, vhost, "big")] == [b"b-%d" % i for i in range(10)]
    assert drain(broker, vhost, "late") == []  # 7 backed-up messages: fewer than 8
