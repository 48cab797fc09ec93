"""The backup's fast read path (fast_consume) against real brokers: the same records as pika's own
path, uninstalled after every read, a consumer the broker cancels, heartbeats during a long read."""

from __future__ import annotations

import dataclasses
import random
import struct
import time

import pika
import pika.heartbeat
import pika.spec
import pytest

from rbak.backup import BackupEngine
from rbak.broker import fast_consume
from rbak.backup.queue_reader import read_queue
from rbak.broker.stream_reader import read_stream
from rbak.errors import BackupError, RbakError
from rbak.format.record import LongString

from support.backups import backup_config, load, records

EXCHANGE = "échange-✓"
KEYS = ("clé.ü.✓", "ключ")
HEADERS = {"str": "héllo", "int": 7, "big": 2**40, "neg": -5, "bool": True, "bytes": b"\x00\xff", "none": None,
           "nested": {"a": [1, "two", {"deep": False}], "empty": {}}, "list": []}


def _sized(t: bytes, payload: bytes) -> bytes:
    return t + struct.pack(">I", len(payload)) + payload


def _entry(key: str, wire: bytes) -> bytes:
    return bytes([len(key)]) + key.encode() + wire


# one header of every AMQP 0-9-1 field type RabbitMQ reads (rbak.format.amqp091.FIELD_TYPES)
_TABLE = b"".join([
    _entry("S", _sized(b"S", "héllo ✓".encode())), _entry("x", _sized(b"x", b"\x00\x01\xff")),
    _entry("b", b"b" + struct.pack(">b", -128)), _entry("B", b"B\xff"), _entry("s", b"s" + struct.pack(">h", -300)),
    _entry("u", b"u" + struct.pack(">H", 65535)), _entry("I", b"I" + struct.pack(">i", -70000)),
    _entry("i", b"i" + struct.pack(">I", 4_000_000_000)), _entry("l", b"l" + struct.pack(">q", -(2**63))),
    _entry("L", b"L" + struct.pack(">q", 2**62)), _entry("f", b"f" + struct.pack(">f", 1.5)),
    _entry("d", b"d" + struct.pack(">d", -2.25)), _entry("D", b"D\x02" + struct.pack(">I", 12345)),
    _entry("t", b"t\x01"), _entry("T", b"T" + struct.pack(">Q", 1_600_000_000)), _entry("V", b"V"),
    _entry("F", b"F" + _sized(b"", _entry("k", _sized(b"A", b"V" + b"t\x00")))),
    _entry("A", _sized(b"A", b"I" + struct.pack(">i", 1) + _sized(b"S", b"two"))),
])
# property flags: headers, delivery_mode, message_id; then the values in wire order
TYPED_RAW = struct.pack(">H", (1 << 13) | (1 << 12) | (1 << 7)) + _sized(b"", _TABLE) + b"\x02" + b"\x05typed"


def _typed_properties() -> pika.BasicProperties:
    bp = pika.BasicProperties()
    bp.encode = lambda: [TYPED_RAW]  # type: ignore[method-assign]  # pika cannot encode f, s, b, u...
    return bp


def _mixed(seed: int) -> list[tuple[str, str, bytes, pika.BasicProperties | None]]:
    """(exchange, routing key or "" for the queue's name, body, properties): what a backup has to carry.
    No priorities: 4.x quorum queues deliver by priority, so the queue's order would not be this one."""
    rnd = random.Random(seed)
    full = pika.BasicProperties(content_type="application/json", content_encoding="gzip", headers=HEADERS,
                                delivery_mode=2, correlation_id="c-1", reply_to="r", expiration="600000",
                                message_id="full", timestamp=1_700_000_000, type="t", user_id="guest", app_id="app")
    return [
        ("", "", b"plain-0", None),
        (EXCHANGE, KEYS[0], b"", full),  # empty body: no body frame
        (EXCHANGE, KEYS[1], rnd.randbytes(300 * 1024), pika.BasicProperties(message_id="300k")),  # 3 body frames
        ("", "", b"typed", _typed_properties()),
        ("", "", rnd.randbytes(1024 * 1024), None),  # 9 body frames
        ("", "", b"", None),
        *[(EXCHANGE, KEYS[i % 2], b"small-%d" % i, pika.BasicProperties(message_id=f"s{i}", headers={"i": i}))
          for i in range(8)],
        (EXCHANGE, KEYS[0], b"\xce" * 131064, None),  # exactly one full body frame of FRAME_END bytes
    ]


def _publish_mixed(broker, vhost: str, queues: dict[str, dict]) -> list[bytes]:
    msgs = _mixed(7)
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.exchange_declare(EXCHANGE, "direct", durable=True)
        for q, args in queues.items():
            ch.queue_declare(q, durable=True, arguments=args)
            for k in KEYS:
                ch.queue_bind(q, EXCHANGE, k)
        ch.confirm_delivery()
        for ex, rk, body, props in msgs:  # through the exchange: to every queue at once, in this order
            for q in (queues if not ex else [None]):
                ch.basic_publish(ex, rk or q, body, props or pika.BasicProperties(delivery_mode=2), mandatory=True)
    return [body for _ex, _rk, body, _p in msgs]


def take_all(broker, vhost: str, queue: str, n: int) -> list[bytes]:
    """Destructively consume the queue's ``n`` messages (bodies in order), then check nothing is left
    (``drain``'s idle wait at the end, times the queues here, would be most of these tests' time)."""
    out: list[bytes] = []
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        for method, _props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=30):
            assert method is not None, f"{queue}: only {len(out)} of {n} messages"
            out.append(body)
            if len(out) == n:
                break
        ch.cancel()
    assert broker.message_count(vhost, queue) == 0
    return out


def _spy_fast(monkeypatch) -> list[str]:
    """The queues read on the fast path (so a test knows it did the read)."""
    used: list[str] = []
    orig = fast_consume.FastConsume.messages

    def spy(self, ch, queue, *a, **kw):
        used.append(queue)
        return orig(self, ch, queue, *a, **kw)

    monkeypatch.setattr(fast_consume.FastConsume, "messages", spy)
    return used


def _same(r):
    """A record without what differs by path: quorum windows are consumers on one channel on the fast
    path (delivery tags 1..n, issue 27) and a channel each on pika's (tags restart per window)."""
    return dataclasses.replace(r, backed_up_at=0, source_vhost="", delivery_tag=0)


def test_fast_path_records_equal_pikas(broker, vhost_factory, tmp_path, monkeypatch):
    """Two vhosts with the same queues and messages, one backed up on the fast path, one on pika's:
    identical records, and both sources hold exactly what they held, in order."""
    queues = {"classic": {}, "quorum": {"x-queue-type": "quorum"}}
    fast, slow = vhost_factory(broker), vhost_factory(broker)
    bodies = _publish_mixed(broker, fast, queues)
    _publish_mixed(broker, slow, queues)
    used = _spy_fast(monkeypatch)
    store = tmp_path / "store"
    assert BackupEngine(backup_config(broker, fast, store, "fast", tmp_path / "a.db")).run().completed
    assert sorted(set(used)) == ["classic", "quorum"]
    used.clear()
    monkeypatch.setattr(fast_consume, "ENABLED", False)
    assert BackupEngine(backup_config(broker, slow, store, "slow", tmp_path / "b.db")).run().completed
    assert used == []  # pika's consumer generator did that one

    mf, ms = load(store, "fast"), load(store, "slow")
    for q in queues:
        rf, rs = records(store, mf, fast, q), records(store, ms, slow, q)
        assert [r.body for r in rf] == bodies, q
        assert [_same(r) for r in rf] == [_same(r) for r in rs], q
        by = {r.properties.message_id: r for r in rf}
        assert (by["full"].exchange, by["full"].routing_key) == (EXCHANGE, KEYS[0])
        assert by["300k"].routing_key == KEYS[1] and rf[0].routing_key == q and rf[0].exchange == ""
        assert dict(by["full"].headers)["str"] == LongString("héllo")
        typed = dict(by["typed"].headers)
        assert set("SxbBsuIilLfdDtTVFA") <= set(typed), sorted(typed)
        assert not any(r.redelivered for r in rf)
    for q in queues:  # one channel per read on the fast path, quorum windows included
        assert [r.delivery_tag for r in records(store, mf, fast, q)] == list(range(1, len(bodies) + 1)), q
    for v in (fast, slow):  # nothing taken: the same messages in the same order
        for q in queues:
            assert take_all(broker, v, q, len(bodies)) == bodies, (v, q)


def _installed(conn) -> tuple[bool, bool]:
    impl = conn._impl
    return "_on_data_available" in impl.__dict__, "_MAX_RECV_BYTES" in impl._transport.__dict__


def _read(conn, vhost: str, queue: str, qtype: str, n: int, fail_at: int | None = None):
    """read_queue's bodies and, per message, whether the fast path was installed while it was taken."""
    got: list[bytes] = []
    states: set[tuple[bool, bool]] = set()

    def sink(method, props, body):
        if len(got) == fail_at:
            raise RuntimeError("sink failed")
        states.add(_installed(conn))
        got.append(body)

    read_queue(conn, vhost, queue, qtype, n, sink)
    return got, states


def test_uninstalled_after_every_read_even_a_failed_one(broker, vhost):
    bodies = [b"u-%d" % i for i in range(20)]
    queues = {"c": "classic", "q": "quorum"}
    for q, qtype in queues.items():
        broker.publish(vhost, q, bodies, declare={"x-queue-type": qtype} if qtype == "quorum" else {})
    broker.publish(vhost, "s", bodies, declare={"x-queue-type": "stream"})
    with broker.connect(vhost) as conn:
        for q, qtype in queues.items():
            got, states = _read(conn, vhost, q, qtype, len(bodies))
            assert got == bodies and states == {(True, True)}  # the read was on the fast path
            assert _installed(conn) == (False, False)
            with pytest.raises(RuntimeError, match="sink failed"):
                _read(conn, vhost, q, qtype, len(bodies), fail_at=5)
            assert _installed(conn) == (False, False) and conn.is_open
        with pytest.raises(RbakError, match="'missing'"):  # the broker closes the channel: 404
            _read(conn, vhost, "missing", "classic", 3)
        assert _installed(conn) == (False, False) and conn.is_open
        for q, qtype in queues.items():  # the same connection reads again: everything still there, in order
            assert _read(conn, vhost, q, qtype, len(bodies))[0] == bodies
        assert _installed(conn) == (False, False)
        # a stream read (by offset, acking as it goes), a whole one and one whose sink fails
        got, states = [], set()

        def on_record(method, props, body, offset):
            states.add(_installed(conn))
            got.append(body)

        read_stream(conn, vhost, "s", "first", on_record, end_offset=len(bodies) - 1)
        assert got == bodies and states == {(True, True)}
        assert _installed(conn) == (False, False)

        def failing(method, props, body, offset):
            raise RuntimeError("sink failed")

        with pytest.raises(RuntimeError, match="sink failed"):
            read_stream(conn, vhost, "s", "first", failing, end_offset=len(bodies) - 1)
        assert _installed(conn) == (False, False) and conn.is_open
    for q in queues:
        assert take_all(broker, vhost, q, len(bodies)) == bodies


def test_queue_deleted_during_its_read(broker, vhost, tmp_path, monkeypatch):
    """The broker cancels the consumer of a deleted queue: that queue's read fails naming it, the others
    are backed up whole and keep every message."""
    others = {"a-classic": {}, "z-quorum": {"x-queue-type": "quorum"}}
    victims = {"m-victim-c": {}, "n-victim-q": {"x-queue-type": "quorum"}}
    bodies = [b"keep-%d" % i for i in range(30)]
    for q, args in others.items():
        broker.publish(vhost, q, bodies, declare=args)
    for q, args in victims.items():
        broker.publish(vhost, q, [q.encode() + b"-%d" % i for i in range(30)], declare=args)
    used = _spy_fast(monkeypatch)
    orig = fast_consume.to_delivery
    deleted: list[str] = []

    def delete_on_first(item):
        for q in victims:
            if item[5] == q.encode() + b"-0" and q not in deleted:
                broker.delete_queue(vhost, q)  # returns once the queue is gone
                deleted.append(q)
                # the broker's Basic.Cancel is on its way to the reading connection (which holds every
                # delivery already): a loaded broker gets 1.5 s to send it (0.3 s before)
                time.sleep(1.5)
        return orig(item)

    monkeypatch.setattr(fast_consume, "to_delivery", delete_on_first)
    store = tmp_path / "store"
    cfg = backup_config(broker, vhost, store, "del", tmp_path / "st.db", max_concurrent_queues=1)
    with pytest.raises(BackupError) as ei:
        BackupEngine(cfg).run()
    assert sorted(deleted) == sorted(victims) and set(victims) <= set(used)
    msg = str(ei.value)
    assert "2 of 4 queue(s) failed" in msg, msg
    for q in victims:
        line = next(x for x in msg.splitlines() if f"{vhost}/{q} " in x)
        assert f"queue {q!r} in vhost {vhost!r}" in line and "returned to the queue" in line, line
    classic = next(x for x in msg.splitlines() if "m-victim-c" in x)
    assert "cancelled the backup's consumer" in classic and "the queue was deleted" in classic, classic
    m = load(store, "del")
    assert m.state == "partial" and sorted(q.name for q in m.queue_status) == sorted(victims)
    for q in others:
        assert [r.body for r in records(store, m, vhost, q)] == bodies
        assert take_all(broker, vhost, q, len(bodies)) == bodies


def test_heartbeats_during_a_long_fast_read(broker, vhost, monkeypatch):
    """A read on the fast path that lasts several heartbeat intervals keeps its connection: pika's
    heartbeat checker sees bytes arrive although pika decodes none of the deliveries."""
    # pika checks every heartbeat + 5 s; checking every heartbeat, as the spec suggests, makes a
    # 5.6-second read span several check windows in which only deliveries arrive
    monkeypatch.setattr(pika.heartbeat.HeartbeatChecker, "_check_interval",
                        property(lambda self: self._timeout, lambda self, value: None), raising=False)
    n, size = 140, 16 * 1024  # about 8 deliveries per 128 KiB socket read; 140 x 40 ms: 5.6 s
    rnd = random.Random(3)
    bodies = [b"%04d" % i + rnd.randbytes(size) for i in range(n)]
    broker.publish(vhost, "hb", bodies, declare={})
    params = broker.connection_parameters(vhost)
    params.heartbeat = 2
    got: list[bytes] = []
    with pika.BlockingConnection(params) as conn:
        checker = conn._impl._heartbeat_checker
        assert checker is not None and checker._check_interval == 2

        def sink(method, props, body):
            assert _installed(conn) == (True, True)
            got.append(body)

        t0 = time.monotonic()
        read_queue(conn, vhost, "hb", "classic", n, sink, throttle=lambda _n: time.sleep(0.04))
        took = time.monotonic() - t0
        assert took > 2 * 2 + 1, took  # two check windows at least (without the fast path's byte count
        # pika closed this connection after 4.6 s: AMQPHeartbeatTimeout, "No activity ... in the last 2 seconds")
        assert got == bodies and conn.is_open
        assert checker._idle_byte_intervals == 0
        conn.process_data_events(0)
    assert take_all(broker, vhost, "hb", n) == bodies


def test_back_to_back_backups_each_take_the_whole_queue(broker, vhost, tmp_path):
    """Run after run, each backup takes every message, and right after it another connection finds
    them all back: a big queue (a fresh channel, returned by close) and a small one (the shared
    reading channel, returned by basic.nack, which has no reply: the read ends only after a passive
    declare on that channel, which the queue answers once it has requeued them)."""
    from support.backups import fast_publish

    sizes = {"again": 30_000, "small": 200}
    for q, n in sizes.items():
        fast_publish(broker, vhost, q, (b"%06d" % i for i in range(n)), declare={"durable": True})
    params = pika.URLParameters(broker.amqp_url(vhost))
    for run in range(3):
        s = BackupEngine(backup_config(broker, vhost, tmp_path / f"s{run}", f"again-{run}",
                                       tmp_path / f"st{run}.db")).run()
        assert s.completed and s.total_messages == sum(sizes.values()), (run, s.total_messages)
        conn = pika.BlockingConnection(params)  # at once: no wait for the broker to settle
        try:
            ch = conn.channel()
            assert {q: ch.queue_declare(q, passive=True).method.message_count for q in sizes} == sizes, run
        finally:
            conn.close()
