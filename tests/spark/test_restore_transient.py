"""Issue 17: the Spark restore skips the transient queues the 3.x -> 4.x adaptation skips
(``restore.transient_queues: skip``), through the same decision as the CLI restore
(``rbak.restore.engine.skipped_by_definitions``)."""

from __future__ import annotations

import dataclasses
import json
import uuid

import pika
import pika.exceptions

from rbak.format.compression import Compression, compress
from rbak.format.manifest import DefinitionsBackup
from rbak.format.layout import BackupLayout
from rbak.restore import definitions
from rbak.config import ConnectionConfig
from rbak.restore.options import RestoreOptions
from rbak.storage import open_storage
from rbak_spark.restore_job import run_restore_job
from rbak_spark.synthetic import QueueSpec, write_backup
from support.require import require_that
from support.private_node import chroot_ready, private_node


def write_with_definitions(url: str, backup_id: str, vhost: str) -> None:
    """A backup of a transient queue and a durable one, with the source's definitions."""
    storage = open_storage(url)
    m = write_backup(storage, backup_id, [QueueSpec(vhost, "tmp-q", 5), QueueSpec(vhost, "keep-q", 3)])
    doc = {"vhosts": [{"name": vhost}], "permissions": [], "users": [],
           "queues": [{"name": "tmp-q", "vhost": vhost, "durable": False, "auto_delete": False, "arguments": {}},
                      {"name": "keep-q", "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}}],
           "bindings": [{"source": "amq.fanout", "vhost": vhost, "destination": "tmp-q", "destination_type": "queue",
                         "routing_key": "", "arguments": {}}]}
    key = BackupLayout(backup_id).definitions(Compression.ZSTD)
    storage.put(key, compress(json.dumps(doc).encode(), Compression.ZSTD))
    m.definitions = DefinitionsBackup(key=key, vhost_count=1, queue_count=2, exchange_count=0, size_bytes=1)
    storage.put(BackupLayout(backup_id).manifest, m.to_json())


def spark_options(broker, **kw) -> RestoreOptions:
    return RestoreOptions(target=ConnectionConfig(amqp_url=broker.server_url(), management_url=broker.management_url),
                          restore_definitions=True, **kw)


def test_spark_restore_skips_transient_queues_like_the_cli(spark, rmq310, vhost_factory, tmp_path, monkeypatch):
    """The target denies transient non-exclusive queues (capability overridden here; the real denial is
    tested against a private 4.3.6 node in tests/engine/test_transient_denied.py)."""
    vh = vhost_factory(rmq310, "test-spark")
    url = f"file://{tmp_path}"
    write_with_definitions(url, "tr", vh)
    real = definitions.capabilities_of
    monkeypatch.setattr(definitions, "capabilities_of", lambda c: dataclasses.replace(real(c), transient_nonexcl_queues=False))

    out = run_restore_job(spark, url, spark_options(rmq310, backup_id="tr", transient_queues="skip"))
    assert out["ok"], out
    by = {r["source_queue"]: r for r in out["runs"]}
    assert by["tmp-q"]["status"] == "skipped" and "restore.transient_queues: skip" in by["tmp-q"]["error"]
    assert by["keep-q"]["status"] == "restored" and by["keep-q"]["confirmed"] == 3
    assert out["confirmed"] == 3 and out["definitions"]["skipped_queues"] == [[vh, "tmp-q"]]
    assert rmq310.queue_info(vh, "tmp-q") is None  # never declared, nothing published anywhere for it
    assert rmq310.message_count(vh, "keep-q") == 3

    # the default (durable): the same backup into a fresh target vhost restores both
    rmq310.delete_vhost(vh)
    out = run_restore_job(spark, url, spark_options(rmq310, backup_id="tr"), progress_id="durable")
    by = {r["source_queue"]: r for r in out["runs"]}
    assert out["ok"] and by["tmp-q"]["status"] == "restored" and by["tmp-q"]["confirmed"] == 5
    assert rmq310.queue_info(vh, "tmp-q")["durable"] is True


def test_spark_restore_into_a_43_node_that_denies_transient_queues(spark, tmp_path):
    """No override: a private 4.3.6 node with deprecated_features.permit.transient_nonexcl_queues = false."""
    require_that(chroot_ready("4.3"))
    url = f"file://{tmp_path}"
    vh = f"tr-{uuid.uuid4().hex[:6]}"
    write_with_definitions(url, "tr", vh)
    with private_node("4.3", conf=["deprecated_features.permit.transient_nonexcl_queues = false"],
                      plugins=("rabbitmq_management",)) as node:
        target = ConnectionConfig(amqp_url=f"amqp://guest:guest@127.0.0.1:{node.port}",  # names no vhost
                                  management_url=f"http://127.0.0.1:{node.management_port}")
        out = run_restore_job(spark, url, RestoreOptions(target=target, backup_id="tr", restore_definitions=True,
                                                         transient_queues="skip"))
        assert out["ok"], out
        by = {r["source_queue"]: r for r in out["runs"]}
        assert by["tmp-q"]["status"] == "skipped" and by["keep-q"]["confirmed"] == 3
        with node.connect(vh) as conn:
            assert conn.channel().queue_declare("keep-q", passive=True).method.message_count == 3
            try:
                conn.channel().queue_declare("tmp-q", passive=True)
                raise AssertionError("tmp-q was declared on the target")
            except pika.exceptions.ChannelClosedByBroker as e:
                assert e.reply_code == 404
