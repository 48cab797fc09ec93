"""Every read (basic.get for auto-delete queues, a consumer, a stream) keeps every header's AMQP type,
on every broker, with pika's ``BasicProperties.decode`` left as pika ships it (no process-wide patch):
the reads keep each content header's bytes (``broker.deliveries.KeptProperties``)."""

from __future__ import annotations

import pika
import pika.spec
import pytest

from rbak.backup.convert import BROKER_HEADERS, to_record
from rbak.backup.queue_reader import ReadOptions, read_queue
from rbak.broker.stream_reader import read_stream
from rbak.format.amqp091 import encode_basic_properties
from rbak.format.record import BackupProperties, Double, Float, Long, Short

PROPS = BackupProperties(delivery_mode=2, message_id="typed")
# pika's decoder would give 1, -2, -7 and 2**50 as plain ints (a NaN, which it fails on, the brokers
# refuse: 541 INTERNAL_ERROR on publish; tests/engine/test_backup_convert.py covers it)
HEADERS = (("f", Float(1.5)), ("d", Double(-2.25)), ("s", Short(-7)), ("l", Long(2**50)))


def _publish(broker, vhost: str, queue: str, n: int, declare: dict) -> None:
    with broker.connect(vhost) as conn:
        conn.channel().queue_declare(queue, **declare)
    raw = encode_basic_properties(PROPS, HEADERS)
    broker.publish_raw(vhost, [("", queue, raw, b"m-%d" % i) for i in range(n)])


def _same(records) -> None:
    for r in records:
        assert r.properties == PROPS
        assert sorted(r.headers, key=lambda kv: kv[0]) == sorted(HEADERS)  # 4.x sorts them by name


@pytest.mark.parametrize("how", ["basic.get", "consumer"])
def test_reads_keep_header_types(broker, vhost, how):
    assert pika.spec.BasicProperties.decode.__module__ == "pika.spec"  # pika's own, not replaced
    declare = {"durable": True, "auto_delete": how == "basic.get"}
    _publish(broker, vhost, "q", 3, declare)
    got = []
    with broker.wire(vhost) as conn:
        read_queue(conn, vhost, "q", "classic", 3, lambda m, p, b: got.append(to_record(m, p, b, vhost, "q", 0)),
                   ReadOptions(use_get=how == "basic.get"))
        assert conn.is_open
    assert [r.body for r in got] == [b"m-0", b"m-1", b"m-2"]
    _same(got)
    assert broker.message_count(vhost, "q") == 3  # all given back


def test_stream_read_keeps_header_types(broker, vhost):
    _publish(broker, vhost, "s", 2, {"durable": True, "arguments": {"x-queue-type": "stream"}})
    got = []
    with broker.wire(vhost) as conn:
        read_stream(conn, vhost, "s", "first",
                    lambda m, p, b, off: got.append(to_record(m, p, b, vhost, "s", 0, BROKER_HEADERS, off)),
                    idle_secs=2.0)
    assert [r.body for r in got] == [b"m-0", b"m-1"]
    _same(got)
