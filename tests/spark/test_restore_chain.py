"""The Spark restore follows incremental stream chains exactly as ``rbak restore`` does."""

from __future__ import annotations

import dataclasses

import pytest

from rbak.backup import BackupEngine
from rbak.errors import ManifestError
from rbak.config import ConnectionConfig
from rbak.restore.options import RestoreOptions
from rbak_spark.restore_job import run_restore_job, summary_lines
from support.backups import backup_config

STREAM = {"x-queue-type": "stream"}


@pytest.mark.broker
def test_spark_restores_the_whole_chain(spark, broker, vhost, tmp_path):
    first, more = [b"a-%d" % i for i in range(50)], [b"b-%d" % i for i in range(20)]
    broker.publish(vhost, "st", first, declare=STREAM)
    store, state = tmp_path / "store", tmp_path / "state.db"
    BackupEngine(backup_config(broker, vhost, store, "c1", state)).run()
    broker.publish(vhost, "st", more)
    BackupEngine(backup_config(broker, vhost, store, "c2", state)).run()
    broker.delete_queue(vhost, "st")
    broker.declare_queue(vhost, "st", arguments=STREAM)
    url = f"file://{store}"
    opts = RestoreOptions(backup_id="c2", target=ConnectionConfig(amqp_url=broker.server_url(),
                                                                  management_url=broker.management_url))
    dry = run_restore_job(spark, url, dataclasses.replace(opts, dry_run=True))
    assert dry["queues"][0]["chain"] == ["c1", "c2"] and dry["queues"][0]["selected"] == 70
    assert "chain c1 -> c2" in "\n".join(summary_lines(dry))
    out = run_restore_job(spark, url, opts)
    assert out["ok"] and out["confirmed"] == 70 and out["runs"][0]["chain"] == ["c1", "c2"]
    assert [m.body for m in broker.read_stream(vhost, "st")] == first + more

    # a missing link: fails on the driver before any task publishes
    broker.delete_queue(vhost, "st")
    broker.declare_queue(vhost, "st", arguments=STREAM)
    (store / "c1" / "manifest.json").unlink()
    with pytest.raises(ManifestError, match="'c1', which is missing"):
        run_restore_job(spark, url, opts, progress_id="other")
    assert broker.read_stream(vhost, "st") == []
