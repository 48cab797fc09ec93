"""The Spark restore judges lossy targets on the driver and checks depths on the executors (issue 27)."""

from __future__ import annotations

import pytest
from rbak_spark.restore_job import run_restore_job
from rbak_spark.synthetic import QueueSpec, write_backup

from rbak.config import ConnectionConfig
from rbak.errors import RestoreError
from rbak.restore.options import RestoreOptions
from rbak.storage import open_storage


def options(broker, vhost, **kw) -> RestoreOptions:
    return RestoreOptions(target=ConnectionConfig(amqp_url=broker.server_url(), management_url=broker.management_url),
                          vhost_mapping=(("/", vhost),), **kw)


def test_spark_refuses_a_drop_head_target_then_reports_the_loss(spark, target, tmp_path):
    broker, vh = target
    url = f"file://{tmp_path}"
    write_backup(open_storage(url), "b1", [QueueSpec("/", "orders", 100)], segment_max_bytes=3000)
    broker.declare_queue(vh, "orders", arguments={"x-max-length": 10})
    with pytest.raises(RestoreError, match=rf"queue 'orders' in vhost '{vh}' may drop, expire or dead-letter restored "
                                           r"messages: max-length 10 \(queue argument x-max-length\) leaves room for "
                                           r"10 of the 100 message\(s\).*Nothing was published"):
        run_restore_job(spark, url, options(broker, vh, backup_id="b1"))
    assert broker.message_count(vh, "orders") == 0
    out = run_restore_job(spark, url, options(broker, vh, backup_id="b1", allow_lossy_target=True))
    assert out["ok"] is False
    (run,) = out["runs"]
    assert (run["status"], run["confirmed"], run["expected_depth"], run["found_depth"]) == ("failed", 100, 100, 10)
    assert f"queue 'orders' in vhost '{vh}' holds 10 message(s) after the restore, expected 100" in run["error"]
    assert [m.properties.message_id for m in broker.drain_queue(vh, "orders")] == [f"orders-{i}" for i in range(90, 100)]


def test_spark_split_runs_say_they_were_not_depth_checked(spark, target, tmp_path):
    broker, vh = target
    url = f"file://{tmp_path}"
    write_backup(open_storage(url), "b2", [QueueSpec("/", "big", 400)], segment_max_bytes=3000)
    broker.declare_queue(vh, "big", arguments={"x-max-length": 400})  # room for all: not lossy
    out = run_restore_job(spark, url, options(broker, vh, backup_id="b2"), ordering="relaxed", log=lambda _m: None)
    assert out["ok"], out
    assert [r["runs"] for r in out["runs"]] == [2, 2]
    assert {r["depth_check"] for r in out["runs"]} == {"not checked: a run of a split queue"}
    assert broker.message_count(vh, "big") == 400
