"""Restore behaviour against real brokers: PITR, remapping, dry run, refusals, definitions."""

from __future__ import annotations

import json
import os

import pytest
from support.restores import build_backup, consume_all, declare, make_records, options_for, storage_for

from rbak.errors import ManagementApiError, RestoreError
from rbak.format.compression import Compression, compress, decompress
from rbak.format.manifest import DefinitionsBackup
from rbak.format.layout import BackupLayout
from rbak.restore import run_restore
from rbak.config import ConnectionConfig, DefinitionsSelection, TlsConfig

T0 = 1_700_000_000_000


def _bodies(n, tag="m"):
    return [f"{tag}-{i}".encode() for i in range(n)]


def test_pitr_restores_only_the_window_and_never_reads_segments_outside_it(broker, vhost, tmp_path):
    storage = storage_for(tmp_path)
    # 60 records, 1 s apart, ~10 per segment
    records = make_records(vhost, "q", _bodies(60), start_ts=T0, step_ms=1000, every_type=False)
    manifest = build_backup(storage, "pitr", [(vhost, "q", "classic", records)], max_bytes=700)
    segs = manifest.queues[0].segments
    assert len(segs) >= 4
    start, end = T0 + 15_500, T0 + 33_000  # records 16..33
    outside = [s for s in segs if s.last_timestamp < start or s.first_timestamp > end]
    assert outside
    for s in outside:  # damage them: a restore that opened them would fail its CRC check
        storage.put(s.key, b"RBAK" + b"\xff" * 100)
    declare(broker, vhost, "q")
    summary = run_restore(storage, options_for(broker, "pitr", window_start_ms=start, window_end_ms=end))
    assert summary.ok, summary.to_json_obj()
    (q,) = summary.queues
    assert q.skipped_segments == len(outside)
    got = consume_all(broker, vhost, "q", 18)
    assert [d.body for d in got] == [b"m-%d" % i for i in range(16, 34)]


def test_vhost_and_queue_remapping_in_both_publish_modes(broker, vhost, tmp_path):
    storage = storage_for(tmp_path)
    direct = make_records("prod", "orders", _bodies(20, "d"), every_type=False)
    routed = make_records("prod", "events", _bodies(20, "r"), exchange="ev.x", routing_key="ev.created", every_type=False)
    build_backup(storage, "remap", [("prod", "orders", "classic", direct), ("prod", "events", "quorum", routed)])
    declare(broker, vhost, "orders-staging")
    declare(broker, vhost, "events-staging", "quorum")
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.exchange_declare("ev.x", "topic", durable=True)
        ch.queue_bind("events-staging", "ev.x", "ev.*")
    opts = options_for(broker, "remap", publish_mode="exchange", vhost_mapping=(("prod", vhost),),
                       queue_mapping=(("prod/orders", "orders-staging"), ("events", "events-staging")))
    summary = run_restore(storage, opts)
    assert summary.ok, summary.to_json_obj()
    assert {(q.target_vhost, q.target_queue) for q in summary.queues} == {(vhost, "orders-staging"), (vhost, "events-staging")}
    got = consume_all(broker, vhost, "orders-staging", 20)
    assert [d.body for d in got] == _bodies(20, "d")
    assert {d.routing_key for d in got} == {"orders-staging"}  # default-exchange records go to the remapped queue
    got = consume_all(broker, vhost, "events-staging", 20)
    assert [d.body for d in got] == _bodies(20, "r")
    assert {(d.exchange, d.routing_key) for d in got} == {("ev.x", "ev.created")}


def test_dry_run_reports_per_queue_without_touching_a_broker(tmp_path):
    storage = storage_for(tmp_path)
    a = make_records("/", "a", _bodies(30), start_ts=T0, step_ms=1000, every_type=False)
    b = make_records("/", "b", _bodies(5), start_ts=T0, step_ms=1000, every_type=False)
    build_backup(storage, "dry", [("/", "a", "classic", a), ("/", "b", "classic", b)], max_bytes=500)
    nowhere = ConnectionConfig(amqp_url="amqp://guest:guest@127.0.0.1:1/%2f", management_url="http://127.0.0.1:1")
    from rbak.restore.options import RestoreOptions

    opts = RestoreOptions(backup_id="dry", target=nowhere, dry_run=True, window_start_ms=T0 + 10_000)
    summary = run_restore(storage, opts)
    by = {q.source_queue: q for q in summary.queues}
    assert (by["a"].status, by["a"].selected, by["a"].published) == ("dry-run", 20, 0)
    assert (by["b"].selected, by["b"].skipped_records) == (0, 5)
    assert by["a"].skipped_segments >= 1


def test_a_dry_run_fails_a_missing_target_queue_as_the_real_run_does(rmq43, vhost_factory, tmp_path):
    """A dry run that reaches the target said "would publish" for a queue the real run fails: it does not exist."""
    vhost = vhost_factory(rmq43)
    storage = storage_for(tmp_path)
    build_backup(storage, "gone", [(vhost, "gone", "classic", make_records(vhost, "gone", _bodies(3), every_type=False))])
    want = (f"Restore error: queue 'gone' in vhost {vhost!r} does not exist (restore the definitions first, or create "
            f"it); it is the target of queue 'gone' in vhost {vhost!r}")
    for dry in (True, False):
        summary = run_restore(storage, options_for(rmq43, "gone", dry_run=dry))
        (q,) = summary.queues
        assert (q.status, q.error, summary.ok) == ("failed", want, False), (dry, q)
    declare(rmq43, vhost, "gone")
    (q,) = run_restore(storage, options_for(rmq43, "gone", dry_run=True)).queues
    assert (q.status, q.error, q.selected) == ("dry-run", None, 3)
    assert rmq43.message_count(vhost, "gone") == 0


def test_refuses_a_non_empty_queue_unless_allowed(broker, vhost, tmp_path):
    storage = storage_for(tmp_path)
    build_backup(storage, "ne", [(vhost, "busy", "classic", make_records(vhost, "busy", _bodies(10), every_type=False))])
    declare(broker, vhost, "busy")
    broker.publish(vhost, "busy", [b"already-there"])
    summary = run_restore(storage, options_for(broker, "ne"))
    (q,) = summary.queues
    assert q.status == "failed" and not summary.ok
    assert "'busy'" in q.error and vhost in q.error and "non-empty" in q.error
    assert broker.message_count(vhost, "busy") == 1
    summary = run_restore(storage, options_for(broker, "ne", allow_non_empty=True))
    assert summary.ok
    got = consume_all(broker, vhost, "busy", 11)
    assert [d.body for d in got] == [b"already-there"] + _bodies(10)


def test_unroutable_message_fails_naming_the_queue(broker, vhost, tmp_path):
    storage = storage_for(tmp_path)
    recs = make_records(vhost, "lonely", _bodies(5), exchange="nowhere.x", routing_key="rk", every_type=False)
    build_backup(storage, "unr", [(vhost, "lonely", "classic", recs)])
    declare(broker, vhost, "lonely")
    with broker.connect(vhost) as conn:
        conn.channel().exchange_declare("nowhere.x", "direct", durable=True)  # no binding
    summary = run_restore(storage, options_for(broker, "unr", publish_mode="exchange"))
    (q,) = summary.queues
    assert q.status == "failed" and q.confirmed == 0
    assert "unroutable" in q.error and "'lonely'" in q.error and "'nowhere.x'" in q.error
    # queue mode into a queue that does not exist
    summary = run_restore(storage, options_for(broker, "unr", queue_mapping=(("lonely", "missing"),)))
    (q,) = summary.queues
    assert q.status == "failed" and "'missing'" in q.error and "does not exist" in q.error


def _definitions_doc(vhost_name, queue="defined-q"):
    return {
        "rabbit_version": "3.10.8",
        "vhosts": [{"name": vhost_name}],
        "queues": [{"name": queue, "vhost": vhost_name, "durable": True, "auto_delete": False,
                    "arguments": {"x-queue-type": "quorum"}}],
        "exchanges": [{"name": "defined.x", "vhost": vhost_name, "type": "fanout", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "bindings": [{"source": "defined.x", "vhost": vhost_name, "destination": queue, "destination_type": "queue",
                      "routing_key": "", "arguments": {}}],
        "policies": [], "parameters": [], "permissions": [], "users": [],
    }


def _store_definitions(storage, manifest, backup_id, doc):
    layout = BackupLayout(backup_id)
    key = layout.definitions(Compression.ZSTD)
    data = json.dumps(doc).encode()
    storage.put(key, compress(data, Compression.ZSTD))
    manifest.definitions = DefinitionsBackup(key=key, vhost_count=1, queue_count=1, exchange_count=1, size_bytes=len(data))
    storage.put(layout.manifest, manifest.to_json())


def test_definitions_import_writes_rollback_first_and_remaps(broker, vhost, tmp_path):
    storage = storage_for(tmp_path)
    recs = make_records("src", "defined-q", _bodies(10), exchange="defined.x", routing_key="", every_type=False)
    manifest = build_backup(storage, "defs", [("src", "defined-q", "quorum", recs)])
    _store_definitions(storage, manifest, "defs", _definitions_doc("src"))
    opts = options_for(broker, "defs", restore_definitions=True, publish_mode="exchange", vhost_mapping=(("src", vhost),))
    dry = run_restore(storage, options_for(broker, "defs", definitions_dry_run=True, restore_messages=False,
                                           vhost_mapping=(("src", vhost),)))
    assert dry.definitions.dry_run and dry.definitions.rollback_key is None
    assert dry.definitions.changes["queues"]["create"] == [f"{vhost}/defined-q"]
    assert broker.queue_info(vhost, "defined-q") is None  # the dry run changed nothing
    summary = run_restore(storage, opts)
    assert summary.ok, summary.to_json_obj()
    d = summary.definitions
    assert d.imported and d.rollback_key.startswith("defs/definitions/rollback-before-import-")
    assert d.rollback_key.endswith(".zst")
    snapshot = json.loads(decompress(storage.get(d.rollback_key), Compression.ZSTD))
    # taken before the import: the target did not have the queue yet, but had the test's vhost
    assert not any(q["vhost"] == vhost and q["name"] == "defined-q" for q in snapshot["queues"])
    assert any(v["name"] == vhost for v in snapshot["vhosts"])
    info = broker.queue_info(vhost, "defined-q")
    assert info["type"] == "quorum"
    got = consume_all(broker, vhost, "defined-q", 10)
    assert [x.body for x in got] == _bodies(10)


def test_failed_definitions_import_stops_the_message_restore(broker, vhost, tmp_path):
    storage = storage_for(tmp_path)
    recs = make_records(vhost, "plain", _bodies(5), every_type=False)
    manifest = build_backup(storage, "bad", [(vhost, "plain", "classic", recs)])
    doc = _definitions_doc(vhost)
    doc["queues"][0]["arguments"] = {"x-queue-type": "no-such-type"}
    _store_definitions(storage, manifest, "bad", doc)
    declare(broker, vhost, "plain")
    with pytest.raises(ManagementApiError) as e:
        run_restore(storage, options_for(broker, "bad", restore_definitions=True))
    assert "no message was restored" in str(e.value) and "rollback-before-import-" in str(e.value)
    assert broker.message_count(vhost, "plain") == 0
    assert [k for k in storage.list("bad/definitions/") if "rollback-before-import-" in k]


def test_foreign_user_id_fails_the_queue_with_the_broker_reason_and_metrics_count(broker, vhost, tmp_path):
    from dataclasses import replace

    from prometheus_client import REGISTRY

    storage = storage_for(tmp_path)
    ok = make_records(vhost, "ok", _bodies(7), every_type=False)
    bad = [replace(r, properties=replace(r.properties, user_id="someone-else"))
           for r in make_records(vhost, "bad", _bodies(3), every_type=False)]
    build_backup(storage, "uid", [(vhost, "ok", "classic", ok), (vhost, "bad", "classic", bad)])
    declare(broker, vhost, "ok")
    declare(broker, vhost, "bad")
    summary = run_restore(storage, options_for(broker, "uid"))
    by = {q.source_queue: q for q in summary.queues}
    assert by["ok"].status == "restored" and by["ok"].confirmed == 7  # other queues continue
    assert by["bad"].status == "failed" and "'bad'" in by["bad"].error
    # the broker's reason: 0-9-1 closes the channel with 406, 1.0 (4.x) detaches with unauthorized-access
    assert "406" in by["bad"].error if by["bad"].protocol == "amqp091" else "unauthorized-access" in by["bad"].error
    assert "someone-else" in by["bad"].error
    assert broker.message_count(vhost, "bad") == 0
    sample = REGISTRY.get_sample_value
    assert sample("rabbitmq_backup_messages_confirmed_total", {"vhost": vhost, "queue": "ok"}) == 7
    assert sample("rabbitmq_backup_messages_published_total", {"vhost": vhost, "queue": "ok"}) == 7


def test_tls_restore_and_a_wrong_ca_fails_clearly(rmq310, tls, tmp_path):
    from rbak.restore.options import RestoreOptions

    broker = rmq310
    vhost = f"test-tls-{os.urandom(4).hex()}"
    broker.create_vhost(vhost)
    try:
        storage = storage_for(tmp_path)
        build_backup(storage, "tls", [(vhost, "q", "classic", make_records(vhost, "q", _bodies(5), every_type=False))])
        declare(broker, vhost, "q")

        def opts(ca):
            t = ConnectionConfig(amqp_url=broker.amqps_url(vhost), management_url=broker.management_tls_url,
                                 tls=TlsConfig(enabled=True, ca_cert=str(ca), client_cert=str(tls.client_cert),
                                               client_key=str(tls.client_key)))
            return RestoreOptions(backup_id="tls", target=t, publish_mode="queue")

        bad = run_restore(storage, opts(tls.wrong_ca_cert))
        (q,) = bad.queues
        assert q.status == "failed" and "TLS" in q.error and "guest:" not in q.error
        assert broker.message_count(vhost, "q") == 0
        good = run_restore(storage, opts(tls.ca_cert))
        assert good.ok, good.to_json_obj()
        assert [d.body for d in consume_all(broker, vhost, "q", 5)] == _bodies(5)
    finally:
        broker.delete_vhost(vhost)


def test_a_missing_target_vhost_fails_naming_it(broker, vhost, tmp_path):
    storage = storage_for(tmp_path)
    build_backup(storage, "nv", [(vhost, "q", "classic", make_records(vhost, "q", _bodies(2), every_type=False))])
    missing = f"{vhost}-does-not-exist"
    with pytest.raises(RestoreError) as e:
        run_restore(storage, options_for(broker, "nv", vhost_mapping=((vhost, missing),)))
    msg = str(e.value)
    assert "\n" not in msg and "guest:guest" not in msg
    assert f"target vhost {missing!r} does not exist on {broker.management_url}" in msg, msg
    assert "nothing was published" in msg and f"map vhost {vhost!r} elsewhere" in msg


def test_restore_from_s3_writes_the_rollback_snapshot_there(broker, vhost, s3_bucket):
    from rbak.storage import open_storage

    storage = open_storage(s3_bucket)
    recs = make_records("src", "defined-q", _bodies(25), exchange="defined.x", routing_key="", every_type=False)
    manifest = build_backup(storage, "s3b", [("src", "defined-q", "quorum", recs)], max_bytes=300)
    assert len(manifest.queues[0].segments) > 2
    _store_definitions(storage, manifest, "s3b", _definitions_doc("src"))
    opts = options_for(broker, "s3b", restore_definitions=True, publish_mode="exchange",
                       vhost_mapping=(("src", vhost),), definitions_selection=DefinitionsSelection(vhosts=["src"]))
    summary = run_restore(storage, opts)
    assert summary.ok, summary.to_json_obj()
    assert f"{s3_bucket.prefix}/{summary.definitions.rollback_key}" in s3_bucket.keys()
    assert [d.body for d in consume_all(broker, vhost, "defined-q", 25)] == _bodies(25)
