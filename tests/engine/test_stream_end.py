"""A stream backup stops at the stream's end when it started (asked over the stream protocol), on
every broker: nothing that was in the stream is missed, what is published during the backup is left
for the next one, and the manifest says which offsets were taken. Empty streams, streams whose head
retention removed, and a stream port that cannot answer (the quiet-period end) are covered too."""

from __future__ import annotations

import logging
import threading

from rbak.backup import BackupEngine
from rbak.broker.stream_end import EMPTY, stream_end

from support.backups import backup_config, load, records

STREAM = {"x-queue-type": "stream"}
END_LOG = "the end is found by a quiet period"


def _offsets(broker, vhost: str, queue: str) -> list[int]:
    return [m.headers["x-stream-offset"] for m in broker.read_stream(vhost, queue, "first")]


def test_stream_end_probe_gives_the_last_offset(broker, vhost):
    broker.publish(vhost, "st", [b"a-%d" % i for i in range(700)], declare=STREAM)
    broker.declare_queue(vhost, "empty", arguments=STREAM)
    end = stream_end(broker.host, broker.stream_port, vhost, "st", "guest", "guest")
    assert end is not None and end.last_offset == _offsets(broker, vhost, "st")[-1] == 699
    assert end.chunk_first <= end.last_offset
    empty = stream_end(broker.host, broker.stream_port, vhost, "empty", "guest", "guest")
    # 3.11+ confirm an empty stream with StreamStats; 3.10 cannot, and the caller reads until quiet
    assert empty == (EMPTY if _has_stats(broker) else None)
    settled = stream_end(broker.host, broker.stream_port, vhost, "st", "guest", "guest", settled=True)
    assert settled == (end if _has_stats(broker) else None)


def _has_stats(broker) -> bool:
    return tuple(int(p) for p in broker.version.split(".")[:2]) >= (3, 11)


def test_restore_finds_a_stream_end_without_a_quiet_period(broker, vhost, caplog):
    """A restore asks where the target stream ends (its next offset; a resume's landed tail) over the
    stream protocol on 3.11+, with the same answers as reading the stream until it goes quiet."""
    from rbak.restore.stream_resume import landed_tail, stream_next_offset

    from support.restores import options_for

    target = options_for(broker, "x").target
    broker.declare_queue(vhost, "empty", arguments=STREAM)
    broker.publish(vhost, "st", [b"a-%d" % i for i in range(700)], declare=STREAM)
    with broker.wire(vhost) as conn:
        with caplog.at_level(logging.INFO, logger="rbak"):
            caplog.clear()
            probed = [stream_next_offset(conn, vhost, q, target=target) for q in ("empty", "st")]
            tail = landed_tail(conn, vhost, "st", 600, 50, 1000, b"a-649", target=target)
            quiet_log = "its end is found by a quiet period" in caplog.text
        assert probed == [stream_next_offset(conn, vhost, q) for q in ("empty", "st")] == [0, 700]
        assert tail.start == 650 and len(tail) == 50
        assert list(tail.digests) == list(landed_tail(conn, vhost, "st", 600, 50, 1000, b"a-649").digests)
    assert quiet_log == (not _has_stats(broker))


def test_records_published_during_the_backup_are_left_for_the_next(broker, vhost, tmp_path, caplog):
    first = [b"a-%d" % i for i in range(3000)]
    broker.publish(vhost, "st", first, declare=STREAM)
    store, state = tmp_path / "store", tmp_path / "state.db"
    stop = threading.Event()
    started = threading.Event()
    late: list[bytes] = []

    def publisher() -> None:
        started.wait(30)
        i = 0
        while not stop.is_set():
            batch = [b"late-%d" % j for j in range(i, i + 50)]
            broker.publish(vhost, "st", batch)
            late.extend(batch)
            i += 50

    def throttle(n: int) -> None:  # the backup is under way: publish while it reads
        if n == 1:
            started.set()
        if n % 500 == 0:
            stop.wait(0.05)

    t = threading.Thread(target=publisher, daemon=True)
    t.start()
    try:
        with caplog.at_level(logging.INFO, logger="rbak"):
            BackupEngine(backup_config(broker, vhost, store, "d1", state), throttle=throttle).run()
    finally:
        stop.set()
        t.join(60)
    assert END_LOG not in caplog.text  # the end came from the stream protocol
    m1 = load(store, "d1").find_queue(vhost, "st")
    got = records(store, load(store, "d1"), vhost, "st")
    bodies = [r.body for r in got]
    assert bodies[:3000] == first  # everything there at the start, in order
    assert [r.delivery_tag for r in got] == list(range(len(got)))  # contiguous offsets, no duplicates
    assert m1.stream.first_offset == 0 and m1.stream.last_offset == got[-1].delivery_tag == len(got) - 1
    # the rest of what was published lands in the next backup, which continues right after
    BackupEngine(backup_config(broker, vhost, store, "d2", state)).run()
    got2 = records(store, load(store, "d2"), vhost, "st")
    m2 = load(store, "d2").find_queue(vhost, "st")
    assert m2.stream.previous_backup == "d1" and m2.stream.previous_last_offset == m1.stream.last_offset
    assert [r.delivery_tag for r in got2] == list(range(len(got), len(got) + len(got2)))
    assert bodies + [r.body for r in got2] == first + late
    assert len(late) > 0 and len(got2) > 0 and len(got) - 3000 < len(late)


def test_empty_stream_then_incremental(broker, vhost, tmp_path):
    broker.declare_queue(vhost, "st", arguments=STREAM)
    store, state = tmp_path / "store", tmp_path / "state.db"
    s = BackupEngine(backup_config(broker, vhost, store, "e1", state)).run()
    assert s.total_messages == 0 and load(store, "e1").find_queue(vhost, "st").message_count == 0
    broker.publish(vhost, "st", [b"x-%d" % i for i in range(5)])
    BackupEngine(backup_config(broker, vhost, store, "e2", state)).run()
    assert [r.body for r in records(store, load(store, "e2"), vhost, "st")] == [b"x-%d" % i for i in range(5)]


def test_stream_with_its_head_removed_by_retention(broker, vhost, tmp_path, caplog):
    args = {**STREAM, "x-max-length-bytes": 30_000, "x-stream-max-segment-size-bytes": 5_000}
    body = b"y" * 900
    for i in range(0, 300, 10):  # segments roll over: retention drops the oldest
        broker.publish(vhost, "ret", [body + b"%04d" % j for j in range(i, i + 10)], declare=args if i == 0 else None)
    present = _offsets(broker, vhost, "ret")
    assert present[0] > 0  # the head is gone
    store, state = tmp_path / "store", tmp_path / "state.db"
    with caplog.at_level(logging.INFO, logger="rbak"):
        BackupEngine(backup_config(broker, vhost, store, "r1", state, stream_incremental=False)).run()
    assert END_LOG not in caplog.text
    got = records(store, load(store, "r1"), vhost, "ret")
    q = load(store, "r1").find_queue(vhost, "ret")
    tags = [r.delivery_tag for r in got]
    # retention runs on its own: it may remove another segment between our read and the backup's
    assert tags[0] >= present[0] and tags == present[present.index(tags[0]):]
    assert [r.body for r in got][-1] == body + b"0299"
    assert q.stream.first_offset == tags[0] and q.stream.last_offset == present[-1]


def test_a_stream_port_that_cannot_answer_falls_back_to_the_quiet_end(broker, vhost, tmp_path, caplog):
    bodies = [b"q-%d" % i for i in range(400)]
    broker.publish(vhost, "st", bodies, declare=STREAM)
    store, state = tmp_path / "store", tmp_path / "state.db"
    cfg = backup_config(broker, vhost, store, "f1", state)
    cfg.source.stream_port = broker.amqp_port  # an AMQP listener: not the stream protocol
    with caplog.at_level(logging.INFO, logger="rbak"):
        BackupEngine(cfg).run()
    assert END_LOG in caplog.text
    assert [r.body for r in records(store, load(store, "f1"), vhost, "st")] == bodies


def test_a_read_stopped_at_the_end_leaves_the_connection_usable(broker, vhost):
    """Deliveries past the end are in flight when the read stops: they are released by closing the
    channel, never rejected (a stream refuses basic.reject; 3.10 closes the whole connection)."""
    from rbak.broker.stream_reader import read_stream

    broker.publish(vhost, "st", [b"a-%d" % i for i in range(2000)], declare=STREAM)
    end = stream_end(broker.host, broker.stream_port, vhost, "st", "guest", "guest").last_offset
    broker.publish(vhost, "st", [b"b-%d" % i for i in range(2000)])  # published after the "backup" started
    with broker.wire(vhost) as conn:
        for _ in range(2):  # the second read runs on the same connection
            got: list[tuple[int, bytes]] = []
            res = read_stream(conn, vhost, "st", 0, lambda _m, _p, body, off: got.append((off, body)),
                              prefetch=1000, end_offset=end)
            assert [o for o, _ in got] == list(range(end + 1)) and res.last_offset == end == 1999
            assert [b for _, b in got] == [b"a-%d" % i for i in range(2000)]
        assert conn.is_open
        ch = conn.channel()
        ch.declare_passive("st")
        ch.close()
    # nothing past the end and nothing before the start: no read at all
    with broker.wire(vhost) as conn:
        assert read_stream(conn, vhost, "st", end + 1, lambda *_: None, end_offset=end).records == 0
