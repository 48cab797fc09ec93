"""When a read sees no message for a while and the queue has none ready: short only if someone else
holds the rest. 3.10.8 took over 2 s to send the first deliveries of a 50,000-message quorum read on
a loaded machine, with every message already handed to the read (none ready, no other consumer): the
read called itself short after 0 of 50,000 and the backup was partial (a CI run, test_backup_source_intact).
"""

from __future__ import annotations

from types import SimpleNamespace

from rbak.backup import queue_reader
from rbak.backup.queue_reader import QueueRead, ReadOptions
from rbak.broker.declare import QueueCounts


class FakeChannel:
    number = 1

    def __init__(self):
        self.deliveries: list = []

    def consume(self, queue, arguments=None):
        return "ctag-1"


def run_fill(monkeypatch, idles: int, counts: QueueCounts, messages: int, read_timeout: float = 30.0):
    """``idles`` quiet checks, the declare answering ``counts``, then ``messages`` deliveries."""
    def receive(conn, ch, tag, idle):
        for _ in range(idles):
            yield None, None, None
        for i in range(messages):
            yield SimpleNamespace(delivery_tag=i + 1, redelivered=False), SimpleNamespace(headers={}), b"m%d" % i

    declares = []
    monkeypatch.setattr(queue_reader, "receive", receive)
    monkeypatch.setattr(queue_reader, "passive_declare", lambda conn, vhost, queue: declares.append(1) or counts)
    got: list[bytes] = []
    read = QueueRead(None, "/", "q", False, 10, lambda m, p, b: got.append(b),
                     ReadOptions(read_timeout=read_timeout))
    read.fill(FakeChannel(), 10)
    return read.res, got, read.depth, len(declares)


def test_a_slow_broker_with_no_other_consumer_is_waited_for(monkeypatch):
    res, got, depth, declares = run_fill(monkeypatch, idles=3, counts=QueueCounts(0, 1), messages=10)
    assert got == [b"m%d" % i for i in range(10)] and res.records == 10 and depth == 10
    assert res.short == "" and declares == 3


def test_another_consumer_holding_the_rest_makes_the_read_short(monkeypatch):
    res, got, depth, _ = run_fill(monkeypatch, idles=1, counts=QueueCounts(0, 2), messages=10)
    assert got == [] and depth == 0
    assert "read 0 of the 10 messages" in res.short and "another consumer, or another backup" in res.short


def test_messages_that_left_the_queue_make_it_short_after_the_read_timeout(monkeypatch):
    res, got, depth, declares = run_fill(monkeypatch, idles=5, counts=QueueCounts(0, 1), messages=0, read_timeout=6)
    assert got == [] and declares == 3  # 2 s, 4 s: waited; 6 s: the read timeout
    assert "no message arrived for 6s, the queue has none ready and no other consumer" in res.short
    assert "expired, purged or dead-lettered" in res.short
