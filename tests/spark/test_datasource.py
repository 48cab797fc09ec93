"""The ``rbak`` Spark data source and spark/export.py, on real backups."""

from __future__ import annotations

import datetime as dt

import orjson
import pytest

from rbak.storage import open_storage
from rbak_spark.datasource import read_backup
from rbak_spark.export_job import run_export
from rbak_spark.synthetic import QueueSpec, make_record, write_backup

START = 1_700_000_000_000  # write_backup's default start; record i is START + i * 1000 ms
QUEUES = [QueueSpec("/", "orders", 150, 120), QueueSpec("prod", "a/b", 40, 50)]


@pytest.fixture(scope="module")
def backup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    url = f"file://{root}"
    m = write_backup(open_storage(url), "b1", QUEUES, segment_max_bytes=20000, prefix="p")
    assert m.total_segments >= 6
    return url, m


def utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def test_one_row_per_record_with_every_field(spark, backup):
    url, m = backup
    df = read_backup(spark, url, "b1", "p")
    assert df.rdd.getNumPartitions() == m.total_segments  # one partition per segment
    rows = sorted(df.collect(), key=lambda r: (r.vhost, r.queue, r.segment_sequence, r.record_index))
    assert len(rows) == m.total_messages == 190
    orders = [r for r in rows if r.queue == "orders"]
    assert [r.properties.message_id for r in orders] == [f"orders-{i}" for i in range(150)]
    r = orders[7]
    assert (r.vhost, r.queue_type, r.exchange, r.routing_key, r.delivery_tag, r.redelivered) == (
        "/", "classic", "", "orders", 8, False)
    assert r.backed_up_at_ms == START + 7000
    assert round(r.backed_up_at.timestamp() * 1000) == START + 7000  # naive local time, as Spark returns it
    assert orjson.loads(r.headers) == {"seq": 7, "origin": "synthetic"}
    assert bytes(r.body).startswith(b"orders:7:") and len(r.body) == 120
    assert r.properties.delivery_mode == 2 and r.properties.content_type == "text/plain"
    assert r.segment_key.startswith("p/b1/queues/_default/orders/segment-")
    assert {r.queue for r in rows if r.vhost == "prod"} == {"a/b"}


def test_time_filter_is_pushed_down_and_prunes_segments(spark, backup):
    url, m = backup
    df = read_backup(spark, url, "b1", "p")
    lo, hi = utc(START + 100_000), utc(START + 120_000)
    f = df.filter((df.backed_up_at >= lo) & (df.backed_up_at < hi))
    got = sorted(r.backed_up_at_ms for r in f.select("backed_up_at_ms").collect())
    want = sorted(START + i * 1000 for q in QUEUES for i in range(q.messages) if 100 <= i < 120)
    assert got == want
    assert 0 < f.rdd.getNumPartitions() < m.total_segments / 2  # most segments never opened

    g = df.filter("queue = 'a/b'")
    assert g.count() == 40
    assert g.rdd.getNumPartitions() == len(m.find_queue("prod", "a/b").segments)


def test_time_window_options(spark, backup):
    url, _ = backup
    df = read_backup(spark, url, "b1", "p", time_window_start=START + 5000,
                     time_window_end=utc(START + 9000).isoformat())
    assert sorted(r.backed_up_at_ms for r in df.collect()) == sorted([START + i * 1000 for i in range(5, 10)] * 2)


def test_missing_backup_id_is_a_clear_error(spark, backup):
    url, _ = backup
    from rbak_spark.datasource import register

    register(spark)
    with pytest.raises(Exception, match="backup_id"):
        spark.read.format("rbak").load(url).count()


def test_export_to_parquet_from_s3(spark, s3_bucket, tmp_path):
    m = write_backup(open_storage(s3_bucket), "b2", QUEUES, segment_max_bytes=30000)
    out = tmp_path / "parquet"
    n = run_export(spark, s3_bucket, "b2", str(out), partition_by=["vhost"])
    assert n == m.total_messages
    back = spark.read.parquet(str(out))
    assert back.filter("queue = 'orders'").count() == 150
    first = back.filter("queue = 'orders' and backed_up_at_ms = %d" % START).collect()
    assert len(first) == 1 and bytes(first[0].body) == make_record(QUEUES[0], 0, START).body
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"vhost=%2F", "vhost=prod"}
