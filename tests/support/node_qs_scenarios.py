"""Data directories of private 4.0.5 / 4.3.6 (and 3.10.8) nodes holding streams and quorum queues.

Each scenario publishes, acks/returns some quorum messages, lets retention
remove a stream's oldest segments, then a live AMQP 0-9-1 consumer reads
every stream and quorum queue without acking (the reference: what the node
delivered, as ``rbak.backup.convert.to_record`` records it), and the node is
stopped cleanly or killed with SIGKILL. Built once per test run, shared
through rabbitmq_scenarios.get_scenario's file lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pika

import rbak.backup.convert as convert
from rbak.broker.deliveries import receive
from support.require import require_that
from support.private_node import PrivateNode, chroot_ready, rawable
from support.node_scenarios import ALL_HEADERS_PUB, VHOST2, get_scenario, pattern

#: Decimal headers make 4.x's 0-9-1 -> AMQP 1.0 conversion close the connection; leave them out.
STREAM_HEADERS_PUB = {k: v for k, v in ALL_HEADERS_PUB.items() if k != "D"}
NOT_STORED = frozenset({"x-stream-offset", "x-stream-chunk-timestamp", "x-delivery-count"})


@dataclass
class Ref:
    """One delivery the reference consumer saw."""

    exchange: str
    routing_key: str
    properties: object  # BackupProperties
    headers: tuple
    body: bytes
    offset: int | None = None


@dataclass
class QsScenario:
    name: str
    version: str
    data_dir: Path
    streams: dict = field(default_factory=dict)  # (vhost, name) -> [Ref]
    quorum: dict = field(default_factory=dict)  # (vhost, name) -> [Ref]
    killed: bool = False


def _props(i: int) -> pika.BasicProperties:
    if i % 25 == 0:
        return pika.BasicProperties(
            content_type="application/json", content_encoding="utf-8", headers=dict(STREAM_HEADERS_PUB, n=i),
            delivery_mode=2, priority=i % 10, correlation_id="corr-ü", reply_to="reply.q", message_id=f"m{i}",
            timestamp=1_700_000_000 + i, type="ty", user_id="guest", app_id="app", expiration="86400000",
        )
    return pika.BasicProperties(delivery_mode=2 if i % 3 else 1, message_id=f"m{i}", headers={"n": i},
                                priority=i % 10 if i % 4 == 0 else None)


def _body(tag: str, i: int) -> bytes:
    return pattern(f"{tag}{i}", 3000 + i % 500) if i % 11 == 0 else f"{tag}-{i}".encode()


def reference(node: PrivateNode, vhost: str, queue: str, stream: bool, expect: int | None = None) -> list[Ref]:
    """Every message of the queue as a 0-9-1 consumer gets it, nothing acked (closing returns them).

    ``expect``: how many the read waits for (up to 5 min) when some arrive only later (a restarted
    node's delayed retries, a consumer timeout): a condition, where a fixed sleep would race a slow
    machine. Past it, the read goes on as without it, so a wrong count shows as a different result."""
    out = []
    deadline = time.monotonic() + 300
    # rbak's connection keeps each delivery's raw property bytes (exact header types), as a backup does
    conn = node.wire(vhost)
    try:
        ch = conn.channel()
        ch.qos(10_000)
        args = {"x-stream-offset": "first"} if stream else {}
        probe = None if stream else conn.channel()
        for method, props, body in receive(conn, ch, ch.consume(queue, args), 3):
            # 3 s without a delivery ends the read only once the queue has nothing ready left (a
            # loaded machine may pause longer); a stream has no such count, so there it is the end.
            if method is None:
                if expect is not None and len(out) < expect and time.monotonic() < deadline:
                    continue
                if probe is None or not probe.declare_passive(queue)[0]:
                    break
                continue
            r = convert.to_record(method, props, body, vhost, queue, 0, NOT_STORED)
            off = (props.headers or {}).get("x-stream-offset")
            out.append(Ref(r.exchange, r.routing_key, r.properties, r.headers, r.body, off))
    finally:
        conn.close()  # every quorum delivery returns to its queue
    return out


def _publish(ch, queue: str, n: int, tag: str, exchange: str = "") -> None:
    for i in range(n):
        rk = f"rk-{queue}" if exchange else queue
        ch.basic_publish(exchange, rk, _body(tag, i), rawable(_props(i)))


def _streams(node: PrivateNode, sc: QsScenario) -> None:
    conn = node.connect("/")
    ch = conn.channel()
    ch.confirm_delivery()
    # Small segments and a byte limit: retention removes the oldest segments.
    ch.queue_declare("orders-stream", durable=True, arguments={
        "x-queue-type": "stream", "x-stream-max-segment-size-bytes": 40_000, "x-max-length-bytes": 120_000})
    ch.queue_bind("orders-stream", "amq.direct", "rk-orders-stream")
    _publish(ch, "orders-stream", 250, "s")
    _publish(ch, "orders-stream", 100, "x", exchange="amq.direct")
    conn.close()
    conn = node.connect(VHOST2)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("strm_ü/2", durable=True, arguments={"x-queue-type": "stream"})
    _publish(ch, "strm_ü/2", 40, "v")
    ch.queue_declare("empty-stream", durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    for key in (("/", "orders-stream"), (VHOST2, "strm_ü/2"), (VHOST2, "empty-stream")):
        sc.streams[key] = reference(node, key[0], key[1], True)


def _quorum(node: PrivateNode, sc: QsScenario) -> None:
    conn = node.connect("/")
    ch = conn.channel()
    ch.confirm_delivery()
    qargs = {"x-queue-type": "quorum"}
    ch.queue_declare("qq-orders", durable=True, arguments=qargs)
    _publish(ch, "qq-orders", 300, "q")
    # A consumer acks 30, returns 10 (nack requeue) and leaves 10 unacked when its channel closes.
    c2 = node.connect("/")
    cch = c2.channel()
    cch.basic_qos(prefetch_count=50)
    tags = []
    for method, _p, _b in cch.consume("qq-orders", inactivity_timeout=60):
        assert method is not None, "quorum consumer got too few messages"
        tags.append(method.delivery_tag)
        if len(tags) == 50:
            break
    cch.basic_ack(tags[29], multiple=True)
    for t in tags[30:40]:
        cch.basic_nack(t, requeue=True)
    c2.close()
    _publish(ch, "qq-orders", 60, "r")
    # Churn: enough log to roll the WAL into segments and let Ra take snapshots.
    ch.queue_declare("qq-churn", durable=True, arguments=qargs)
    blob = b"c" * 1000
    for i in range(3000):
        ch.basic_publish("", "qq-churn", blob + str(i).encode(), pika.BasicProperties(delivery_mode=2))
    ch.basic_qos(prefetch_count=500)
    got = 0
    for method, _p, _b in ch.consume("qq-churn", inactivity_timeout=60):
        assert method is not None
        got += 1
        if got % 100 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if got == 2900:
            break
    ch.cancel()
    conn.close()
    conn = node.connect(VHOST2)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("qq-ü", durable=True, arguments=qargs)
    _publish(ch, "qq-ü", 20, "u")
    conn.close()
    for key in (("/", "qq-orders"), ("/", "qq-churn"), (VHOST2, "qq-ü")):
        sc.quorum[key] = reference(node, key[0], key[1], False)


def build(name: str, version: str, base: Path, kill: bool = False) -> QsScenario:
    node = PrivateNode(version, base, conf=["raft.wal_max_size_bytes = 262144"]).start()
    sc = QsScenario(name, version, node.data_dir, killed=kill)
    try:
        node.add_vhost(VHOST2)
        _streams(node, sc)
        _quorum(node, sc)
        time.sleep(1)
        if kill:
            node.kill()
        else:
            node.stop()
    except BaseException:
        node.cleanup()
        raise
    return sc


DELIVERY_HEADERS = {"x-delivery-count", "x-acquired-count"}


def versioned_scenario(name: str, root: Path):
    """A quorum/stream scenario; a 4.x one needs its chroot."""
    version = name.rsplit("-", 1)[1]
    if version.startswith("4"):
        require_that(chroot_ready(version))
    return get_scenario(name, root)


def assert_same_records(recs, refs, key):
    """Imported records equal a live consumer's reference (delivery-count headers aside)."""
    assert [r.body for r in recs] == [f.body for f in refs], key
    for i, (r, f) in enumerate(zip(recs, refs)):
        assert (r.exchange, r.routing_key) == (f.exchange, f.routing_key), (key, i)
        assert r.properties == f.properties, (key, i, r.properties, f.properties)
        assert dict(r.headers) == {k: v for k, v in f.headers if k not in DELIVERY_HEADERS}, (key, i)
        assert (r.source_vhost, r.source_queue) == key and not r.redelivered
