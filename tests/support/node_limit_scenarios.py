"""Private 3.10.8 / 4.0.5 / 4.3.6 nodes whose quorum queues hit length limits and dead-letter at least once.

Queues (all quorum, vhost ``/``):

- ``qq-maxlen``: ``x-max-length`` 10 (drop-head). 25 published; a consumer
  takes 4 and nacks two of them back in reverse order, its channel closing
  returns the other two; 3 more published drop the head, returned messages
  first (so the survivors are not simply the newest 10).
- ``qq-maxbytes``: ``x-max-length-bytes`` 2000, bodies of 50-390 bytes with a
  300-byte header (4.3 counts metadata too, older versions the body only).
- ``qq-reject``: ``x-max-length`` 5, ``x-overflow`` reject-publish: publishes
  past the limit are nacked (``rejected`` counts them), two acked, more
  published.
- ``qq-policy``: no limit at first; 20 published, then a policy sets
  ``max-length`` 7 (an ``update_config`` in the log drops 13), 2 more.
- ``qq-dlx``: ``x-dead-letter-strategy`` at-least-once (with reject-publish),
  its dead-letter exchange never declared, so the 3 messages a consumer
  rejects stay in the queue's dead-letter state, undeliverable.
- ``qq-drop-dlx`` -> ``qq-dead``: drop-head at 3 with at-most-once
  dead-lettering into another quorum queue through the default exchange.

A live consumer reads each queue without acking before the clean stop (the
reference).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pika
import pika.exceptions

from support.brokers import wait_until
from support.node_qs_scenarios import QsScenario, reference
from support.node_scenarios import BUILDERS, VERSIONS
from support.private_node import PrivateNode

QUEUES = ("qq-maxlen", "qq-maxbytes", "qq-reject", "qq-policy", "qq-dlx", "qq-drop-dlx", "qq-dead")
QQ = {"x-queue-type": "quorum"}
DLX_REJECTED = 3  # messages the qq-dlx consumer rejects: pending at-least-once dead-lettering


def _pub(ch, queue: str, body: bytes, headers: dict | None = None) -> bool:
    """Publish with confirms; False when the broker nacked it (reject-publish)."""
    try:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, headers=headers),
                         mandatory=False)
        return True
    except pika.exceptions.NackError:
        return False


def _take(node: PrivateNode, queue: str, n: int):
    """A consumer (own connection) holding ``n`` messages unacked: (connection, channel, delivery tags)."""
    conn = node.connect("/")
    ch = conn.channel()
    ch.basic_qos(prefetch_count=n)
    tags = []
    for method, _p, _b in ch.consume(queue, inactivity_timeout=60):
        assert method is not None, f"{queue}: consumer got too few messages"
        tags.append(method.delivery_tag)
        if len(tags) == n:
            break
    return conn, ch, tags


def _maxlen(node: PrivateNode, ch) -> None:
    ch.queue_declare("qq-maxlen", durable=True, arguments=dict(QQ, **{"x-max-length": 10}))
    for i in range(25):
        _pub(ch, "qq-maxlen", f"len-{i}".encode())
    conn, cch, tags = _take(node, "qq-maxlen", 4)
    cch.basic_nack(tags[3], requeue=True)
    cch.basic_nack(tags[2], requeue=True)
    conn.close()
    time.sleep(0.5)
    for i in range(25, 28):
        _pub(ch, "qq-maxlen", f"len-{i}".encode())


def _maxbytes(ch) -> None:
    ch.queue_declare("qq-maxbytes", durable=True, arguments=dict(QQ, **{"x-max-length-bytes": 2000}))
    for i in range(30):
        _pub(ch, "qq-maxbytes", f"b{i}-".encode() + b"x" * (50 + (i * 37) % 340), {"pad": "h" * 300})


def _reject(ch) -> int:
    ch.queue_declare("qq-reject", durable=True, arguments=dict(QQ, **{"x-max-length": 5,
                                                                        "x-overflow": "reject-publish"}))
    rejected = sum(not _pub(ch, "qq-reject", f"rej-{i}".encode()) for i in range(9))
    for _ in range(2):
        method, _p, _b = ch.basic_get("qq-reject", auto_ack=False)
        assert method is not None
        ch.basic_ack(method.delivery_tag)
    time.sleep(0.5)
    rejected += sum(not _pub(ch, "qq-reject", f"rej-late-{i}".encode()) for i in range(4))
    return rejected


def _policy(node: PrivateNode, ch) -> None:
    ch.queue_declare("qq-policy", durable=True, arguments=QQ)
    for i in range(20):
        _pub(ch, "qq-policy", f"pol-{i}".encode())
    node.ctl("set_policy", "-p", "/", "--apply-to", "queues", "qlim", "^qq-policy$", '{"max-length": 7}')
    time.sleep(2)
    for i in range(20, 22):
        _pub(ch, "qq-policy", f"pol-{i}".encode())


def _dead_letters(node: PrivateNode, ch) -> None:
    ch.queue_declare("qq-dlx", durable=True, arguments=dict(QQ, **{
        "x-dead-letter-exchange": "dlx-never-declared", "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish"}))
    for i in range(10):
        _pub(ch, "qq-dlx", f"dl-{i}".encode())
    conn, cch, tags = _take(node, "qq-dlx", 5)
    for t in tags[:DLX_REJECTED]:
        cch.basic_reject(t, requeue=False)
    cch.basic_nack(tags[3], requeue=True)
    conn.close()
    ch.queue_declare("qq-dead", durable=True, arguments=QQ)
    ch.queue_declare("qq-drop-dlx", durable=True, arguments=dict(QQ, **{
        "x-max-length": 3, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "qq-dead"}))
    for i in range(8):
        _pub(ch, "qq-drop-dlx", f"dd-{i}".encode())


def build_limits(name: str, version: str, base: Path) -> QsScenario:
    node = PrivateNode(version, base).start()
    sc = QsScenario(name, version, node.data_dir)
    try:
        conn = node.connect("/")
        ch = conn.channel()
        ch.confirm_delivery()
        _maxlen(node, ch)
        _maxbytes(ch)
        sc.rejected = _reject(ch)
        _policy(node, ch)
        _dead_letters(node, ch)
        conn.close()
        time.sleep(2)  # the dead-letter worker has checked out what it cannot route
        for q in QUEUES:
            sc.quorum[("/", q)] = reference(node, "/", q, False)
        time.sleep(1)
        node.stop()
    except BaseException:
        node.cleanup()
        raise
    return sc


for _version in ("3.10", "4.0", "4.3"):
    BUILDERS[f"qlim-{_version}"] = lambda base, n=f"qlim-{_version}", v=_version: build_limits(n, v, base)
    VERSIONS[f"qlim-{_version}"] = _version


SNAP_LIMIT_QUEUE, SNAP_DLX_QUEUE = "qq-snap-limit", "qq-snap-dlx"
SNAP_DLX_PENDING = 5  # rejected into at-least-once dead-lettering: 3 before the floods, 2 after


def _flood(node: PrivateNode, queue: str, n: int, settle: bool) -> None:
    """Publish ``n`` 1 kB messages in batches (settled by a consumer when ``settle``): log for Ra to compact."""
    conn = node.connect("/")
    pub = conn.channel()
    pub.confirm_delivery()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=300)
    deliveries = ch.consume(queue, inactivity_timeout=60) if settle else None
    for start in range(0, n, 500):
        for i in range(start, min(n, start + 500)):
            _pub(pub, queue, b"f" * 1000 + str(i).encode())
        while deliveries is not None:
            method, _p, _b = next(deliveries)
            assert method is not None, f"{queue}: flood consumer got too few messages"
            ch.basic_ack(method.delivery_tag)
            if method.delivery_tag == min(n, start + 500):
                break
    conn.close()


def _reject_some(node: PrivateNode, queue: str, n: int) -> None:
    conn, cch, tags = _take(node, queue, n)
    for t in tags:
        cch.basic_reject(t, requeue=False)
    conn.close()


def build_limit_snapshot(name: str, version: str, base: Path) -> QsScenario:
    """A limit set by policy, then compacted into a Ra snapshot by a drop-head flood (the config file
    has no limit: only the snapshot's ``#cfg`` has it); on 4.3 also at-least-once dead letters
    pending across a snapshot."""
    from support.node_snap_scenarios import ADVANCED, CONF, compacted

    node = PrivateNode(version, base, conf=CONF[version[:3]], advanced=ADVANCED[version[:3]]).start()
    sc = QsScenario(name, version, node.data_dir)
    dlx = version.startswith("4.3")
    try:
        conn = node.connect("/")
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(SNAP_LIMIT_QUEUE, durable=True, arguments=QQ)
        node.ctl("set_policy", "-p", "/", "--apply-to", "queues", "qlim", f"^{SNAP_LIMIT_QUEUE}$",
                 '{"max-length": 100}')
        time.sleep(2)
        if dlx:
            ch.queue_declare(SNAP_DLX_QUEUE, durable=True, arguments=dict(QQ, **{
                "x-dead-letter-exchange": "dlx-never-declared", "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish"}))
            for i in range(3):  # rejected into the dead-letter state; the floods below settle around them
                _pub(ch, SNAP_DLX_QUEUE, f"sd-gone-{i}".encode())
            _reject_some(node, SNAP_DLX_QUEUE, 3)
        for _round in range(3):
            _flood(node, SNAP_LIMIT_QUEUE, 2600, settle=False)
            if dlx:
                _flood(node, SNAP_DLX_QUEUE, 2600, settle=True)
            time.sleep(6)  # rabbit_fifo's checkpoint / snapshot checks run on its tick
        # A loaded node ticks late: go on once the snapshot the test checks is there (at most 3 min;
        # should it come only later, the test's own check says so).
        with contextlib.suppress(AssertionError):
            wait_until(lambda: compacted(node.data_dir, SNAP_LIMIT_QUEUE), timeout=180, what=f"{name}: a Ra snapshot")
        for i in range(30):
            _pub(ch, SNAP_LIMIT_QUEUE, f"after-{i}".encode())
        conn2, _cch, _tags = _take(node, SNAP_LIMIT_QUEUE, 5)
        conn2.close()  # five returned to the head, then dropped by the next publishes
        for i in range(30, 33):
            _pub(ch, SNAP_LIMIT_QUEUE, f"after-{i}".encode())
        if dlx:
            for i in range(7):
                _pub(ch, SNAP_DLX_QUEUE, f"sd-{i}".encode())
            _reject_some(node, SNAP_DLX_QUEUE, 2)
        conn.close()
        time.sleep(2)
        for q in (SNAP_LIMIT_QUEUE, SNAP_DLX_QUEUE) if dlx else (SNAP_LIMIT_QUEUE,):
            sc.quorum[("/", q)] = reference(node, "/", q, False)
        time.sleep(1)
        node.stop()
    except BaseException:
        node.cleanup()
        raise
    return sc


for _version in ("3.10", "4.0", "4.3"):
    BUILDERS[f"qlimsnap-{_version}"] = lambda base, n=f"qlimsnap-{_version}", v=_version: \
        build_limit_snapshot(n, v, base)
    VERSIONS[f"qlimsnap-{_version}"] = _version
