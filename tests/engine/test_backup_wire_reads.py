"""The backup's reads on rbak's own connection (``broker.wire``) against real brokers: every field of
every kind of message, a connection left usable after every read (a failed one too), a consumer the
broker cancels, heartbeats during a long read."""

from __future__ import annotations

import random
import struct
import time

import pika
import pika.spec
import pytest

from rbak.backup import BackupEngine
from rbak.broker import deliveries
from rbak.backup.queue_reader import ReadOptions, read_queue
from rbak.broker.stream_reader import read_stream
from rbak.errors import BackupError, RbakError
from rbak.format.record import Long, LongString

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


def _mixed(seed: int) -> list[tuple[str, str, bytes, pika.BasicProperties | bytes | None]]:
    """(exchange, routing key or "" for the queue's name, body, properties or their raw bytes): what a
    backup has to carry (pika cannot encode the f, s, b, u... header types: TYPED_RAW).
    No priorities: 4.x quorum queues deliver by priority, so the queue's order would not be this one."""
    rnd = random.Random(seed)
    full = pika.BasicProperties(content_type="application/json", content_encoding="gzip", headers=HEADERS,
                                delivery_mode=2, correlation_id="c-1", reply_to="r", expiration="600000",
                                message_id="full", timestamp=1_700_000_000, type="t", user_id="guest", app_id="app")
    return [
        ("", "", b"plain-0", None),
        (EXCHANGE, KEYS[0], b"", full),  # empty body: no body frame
        (EXCHANGE, KEYS[1], rnd.randbytes(300 * 1024), pika.BasicProperties(message_id="300k")),  # 3 body frames
        ("", "", b"typed", TYPED_RAW),
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
    out = []
    for ex, rk, body, props in msgs:  # through the exchange: to every queue at once, in this order
        p = props or pika.BasicProperties(delivery_mode=2)
        raw = p if isinstance(p, bytes) else b"".join(p.encode())
        out += [(ex, rk or q, raw, body) for q in (queues if not ex else [""])]
    broker.publish_raw(vhost, out)
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


def test_records_carry_every_field(broker, vhost, tmp_path):
    """Every kind of message a backup carries (empty and multi-frame bodies, a body of FRAME_END bytes,
    every header type, non-ASCII exchange and keys) is recorded exactly, in order, from a classic and
    a quorum queue; both sources hold exactly what they held, in order."""
    queues = {"classic": {}, "quorum": {"x-queue-type": "quorum"}}
    bodies = _publish_mixed(broker, vhost, queues)
    store = tmp_path / "store"
    assert BackupEngine(backup_config(broker, vhost, store, "all", tmp_path / "a.db")).run().completed
    m = load(store, "all")
    for q in queues:
        rf = records(store, m, vhost, q)
        assert [r.body for r in rf] == bodies, q
        by = {r.properties.message_id: r for r in rf}
        assert (by["full"].exchange, by["full"].routing_key) == (EXCHANGE, KEYS[0])
        assert by["full"].properties.content_type == "application/json"
        assert (by["full"].properties.correlation_id, by["full"].properties.expiration) == ("c-1", "600000")
        assert by["300k"].routing_key == KEYS[1] and rf[0].routing_key == q and rf[0].exchange == ""
        assert dict(by["full"].headers)["str"] == LongString("héllo")
        assert dict(by["s3"].headers)["i"] == Long(3)
        typed = dict(by["typed"].headers)
        assert set("SxbBsuIilLfdDtTVFA") <= set(typed), sorted(typed)
        assert not any(r.redelivered for r in rf)
        # one channel per read, quorum windows included (consumers of one channel: issue 27)
        assert [r.delivery_tag for r in rf] == list(range(1, len(bodies) + 1)), q
    for q in queues:  # nothing taken: the same messages in the same order
        assert take_all(broker, vhost, q, len(bodies)) == bodies, q


def _read(conn, vhost: str, queue: str, qtype: str, n: int, fail_at: int | None = None):
    """read_queue's bodies."""
    got: list[bytes] = []

    def sink(method, props, body):
        if len(got) == fail_at:
            raise RuntimeError("sink failed")
        got.append(body)

    read_queue(conn, vhost, queue, qtype, n, sink)
    return got


def test_every_read_leaves_the_connection_usable(broker, vhost):
    """Reads whole, reads whose sink fails, a read of a missing queue, stream reads: the same connection
    goes on, holds no channel a read opened (only the kept control and reading channels), and every
    message is still in its queue, in order."""
    bodies = [b"u-%d" % i for i in range(20)]
    queues = {"c": "classic", "q": "quorum"}
    for q, qtype in queues.items():
        broker.publish(vhost, q, bodies, declare={"x-queue-type": qtype} if qtype == "quorum" else {})
    broker.publish(vhost, "s", bodies, declare={"x-queue-type": "stream"})
    with broker.wire(vhost) as conn:
        for q, qtype in queues.items():
            assert _read(conn, vhost, q, qtype, len(bodies)) == bodies
            with pytest.raises(RuntimeError, match="sink failed"):
                _read(conn, vhost, q, qtype, len(bodies), fail_at=5)
            assert conn.is_open
        with pytest.raises(RbakError, match="'missing'"):  # the broker closes the channel: 404
            _read(conn, vhost, "missing", "classic", 3)
        assert conn.is_open
        for q, qtype in queues.items():  # the same connection reads again: everything still there, in order
            assert _read(conn, vhost, q, qtype, len(bodies)) == bodies
        # a stream read (by offset, acking as it goes), a whole one and one whose sink fails
        got = []
        read_stream(conn, vhost, "s", "first", lambda m, p, body, off: got.append(body), end_offset=len(bodies) - 1)
        assert got == bodies

        def failing(method, props, body, offset):
            raise RuntimeError("sink failed")

        with pytest.raises(RuntimeError, match="sink failed"):
            read_stream(conn, vhost, "s", "first", failing, end_offset=len(bodies) - 1)
        assert conn.is_open and len(conn.channels) <= 2, sorted(conn.channels)
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
    orig = deliveries.to_delivery
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

    monkeypatch.setattr(deliveries, "to_delivery", delete_on_first)
    store = tmp_path / "store"
    cfg = backup_config(broker, vhost, store, "del", tmp_path / "st.db", max_concurrent_queues=1)
    with pytest.raises(BackupError) as ei:
        BackupEngine(cfg).run()
    assert sorted(deleted) == sorted(victims)
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


def test_heartbeats_during_a_long_read(broker, vhost):
    """A read that lasts several heartbeat intervals keeps its connection: the connection sends its
    heartbeats while it waits for deliveries, and counts the deliveries as the broker's."""
    n, size = 140, 16 * 1024  # about 8 deliveries per 128 KiB socket read; 140 x 40 ms: 5.6 s
    rnd = random.Random(3)
    bodies = [b"%04d" % i + rnd.randbytes(size) for i in range(n)]
    broker.publish(vhost, "hb", bodies, declare={})
    got: list[bytes] = []
    with broker.wire(vhost, heartbeat=2) as conn:
        assert conn.heartbeat == 2
        t0 = time.monotonic()
        read_queue(conn, vhost, "hb", "classic", n, lambda m, p, body: got.append(body),
                   ReadOptions(throttle=lambda _n: time.sleep(0.04)))
        took = time.monotonic() - t0
        assert took > 2 * 2 + 1, took  # longer than the broker waits for a silent peer (two intervals)
        assert got == bodies and conn.is_open
        conn.sleep(0)
        assert conn.is_open
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
