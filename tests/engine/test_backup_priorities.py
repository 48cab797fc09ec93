"""Issue 17 item 3: quorum-queue priorities (4.0: two levels, 4.3: strict levels 0-31).

Measured on all three brokers before writing ``rbak/backup/priorities.py``: the messages
a backup returns go back ahead of the priority levels, in the order they were delivered.
With nothing published during the read, a consumer afterwards receives exactly what it
would have received without the backup (checked here against a control queue fed the
same messages). A priority queue in live use (messages at several levels and consumers
attached) is refused before anything is taken on 4.x; 3.10 quorum queues are FIFO.
"""

from __future__ import annotations

import urllib.parse

import pika
import pytest

from rbak.backup import BackupEngine
from rbak.backup.priorities import priority_levels, refuse_live_priorities

from support.backups import backup_config, drain, load, records
from support.brokers import wait_until
from rbak.errors import BackupError

N = 60


def _publish(broker, vhost: str, queue: str) -> list[bytes]:
    bodies = [b"p-%02d" % i for i in range(N)]
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        for i, body in enumerate(bodies):
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, priority=(i * 7) % 10))
    return bodies


def _config(broker, vhost, store, backup_id, state, queue: str):
    cfg = backup_config(broker, vhost, store, backup_id, state)
    cfg.source.queues.include = [queue]
    return cfg


def _levels(broker, vhost: str, queue: str) -> dict | None:
    d = broker.api("GET", f"/api/queues/{urllib.parse.quote(vhost, safe='')}/{queue}")
    return priority_levels(d)


def test_idle_priority_queue_keeps_its_order(broker, vhost, tmp_path):
    """Order after two backups == order of a control queue never backed up, checked by a consumer."""
    _publish(broker, vhost, "prio")
    _publish(broker, vhost, "control")
    store, state = tmp_path / "store", tmp_path / "st.db"
    for bid in ("b1", "b2"):
        s = BackupEngine(_config(broker, vhost, store, bid, state, "prio")).run()
        assert s.total_messages == N
    m = load(store, "b2")
    assert m.state == "complete" and not m.queue_status
    expected = [x[0] for x in drain(broker, vhost, "control")]
    if broker.name != "rmq310":  # 4.x delivers by priority: the control order is not the publish order
        assert expected != sorted(expected)
    stored = [r.body for r in records(store, m, vhost, "prio")]
    assert stored == expected  # the backup holds the queue's delivery order
    assert [x[0] for x in drain(broker, vhost, "prio")] == expected


def test_live_priority_queue_is_refused_before_reading(broker, vhost, tmp_path):
    """Messages at several priority levels and a consumer attached: refused on 4.x, nothing taken."""
    _publish(broker, vhost, "live")
    _publish(broker, vhost, "control")
    if broker.name != "rmq310":
        wait_until(lambda: len(_levels(broker, vhost, "live") or {}) > 1, timeout=60, what="per-priority stats")
    holder = broker.connect(vhost)
    try:
        ch = holder.channel()
        ch.basic_qos(prefetch_count=1)
        held = []
        ch.basic_consume("live", lambda c, m, p, b: held.append(b), auto_ack=False)
        wait_until(lambda: holder.process_data_events(0.1) or held, what="the consumer's first message")
        store, state = tmp_path / "store", tmp_path / "st.db"
        cfg = _config(broker, vhost, store, "live1", state, "live")
        if broker.name == "rmq310":  # quorum queues ignore priorities on 3.x: nothing to reorder
            assert BackupEngine(cfg).run().total_messages == N - 1
            outcome = None
        else:
            with pytest.raises(BackupError) as e:
                BackupEngine(cfg).run()
            outcome = str(e.value)
    finally:
        holder.close()  # its one message goes back to the head
    if outcome is not None:
        assert f"{vhost}/live" in outcome and "priorit" in outcome
        m = load(store, "live1")
        assert m.state == "partial" and m.find_queue(vhost, "live") is None
        [st] = m.queue_status
        assert (st.name, st.status) == ("live", "refused")
        assert "'live'" in st.reason and "refused before reading" in st.reason and "priorit" in st.reason
    got = drain(broker, vhost, "live")
    control = [x[0] for x in drain(broker, vhost, "control")]
    if outcome is None:  # read on 3.10: the consumer's message, returned after the backup's, is last (docs/backup.md)
        control = control[1:] + control[:1]
    assert [x[0] for x in got] == control
    if outcome is not None:  # nothing taken by the backup: only the consumer's message was delivered before
        assert sum(1 for x in got if x[2]) == 1


def test_a_publish_during_the_read_is_what_reorders(broker, vhost):
    """The measurement behind the refusal: rbak's own read (nack on 4.3, channel close before),
    with two priority-9 messages published while it holds the queue. 4.x serves the returned
    messages first, so the new ones come after held lower-priority ones (a control queue fed the
    same messages without a backup delivers them first); 3.10 quorum queues are FIFO: no change."""
    from rbak.backup.queue_reader import CLOSE, NACK, ReadOptions, read_queue

    _publish(broker, vhost, "held")
    _publish(broker, vhost, "control")
    new = [b"new-high-0", b"new-high-1"]

    def publish_new(queue: str) -> None:
        with broker.connect(vhost) as c:
            ch = c.channel()
            ch.confirm_delivery()
            for body in new:
                ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, priority=9))

    taken = []

    def sink(method, props, body) -> None:
        taken.append(body)
        if len(taken) == N:  # everything held: a producer publishes now
            publish_new("held")

    with broker.wire(vhost) as conn:
        read_queue(conn, vhost, "held", "quorum", N, sink, ReadOptions(return_mode=NACK if broker.name == "rmq43" else CLOSE))
    publish_new("control")
    after = [x[0] for x in drain(broker, vhost, "held")]
    without_backup = [x[0] for x in drain(broker, vhost, "control")]
    if broker.name == "rmq310":
        assert after == without_backup == taken + new
    else:
        assert after == taken + new  # the held messages first, whatever their priority
        assert without_backup.index(b"new-high-0") < N  # ...where without the backup the new ones go ahead


def test_refusal_decision():
    assert refuse_live_priorities("4.3.6", {"0": 3, "9": 1}, consumers=0) is None
    assert refuse_live_priorities("4.3.6", {"4": 30}, consumers=2) is None
    why = refuse_live_priorities("4.3.6", {"0": 3, "9": 1}, consumers=1)
    assert "strict priority levels" in why and "0: 3, 9: 1" in why
    assert "two priority levels" in refuse_live_priorities("4.0.5", {"high (> 4)": 1, "normal (<= 4)": 2}, 1)
    assert "has not reported" in refuse_live_priorities("4.3.6", None, 1)
    assert priority_levels({"messages_by_priority": {"4": 3, "0": 0}}) == {"4": 3}
    assert priority_levels({"messages_ready_high": 0, "messages_ready_normal": 5}) == {"normal (<= 4)": 5}
    assert priority_levels({"messages": 5}) is None
