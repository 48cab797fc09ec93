"""Private 4.0.5 / 4.3.6 nodes whose quorum queue Ra compacted into a snapshot.

Small WAL and segments (``raft.*`` on 4.0, the quorum system's
``quorum_queue.*`` on 4.3) and a few thousand settled messages make Ra take
a snapshot and drop the log before it. Then, on top of the snapshot, a
consumer acks, returns and leaves unacked messages with priorities and
properties; a live consumer reads the queue without acking (the reference)
and the node is stopped cleanly or killed with SIGKILL.

On 4.3 a first consumer holds messages checked out across the snapshot (the
state refers to them; their bodies stay in the compacted segments). 4.0 only
promotes a checkpoint to a snapshot once every message before it is settled,
so there that consumer settles what it holds first.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pika

from rbak.offline.rabbitmq import ra_log
from rbak.offline.rabbitmq.damage import ImportContext
from support.brokers import wait_until
from support.node_qs_scenarios import QsScenario, _body, _publish, reference
from support.node_scenarios import BUILDERS, VERSIONS
from support.private_node import PrivateNode

QUEUE = "qq-snap"
CONF = {
    "3.1": ["raft.wal_max_size_bytes = 262144", "raft.segment_max_entries = 256"],
    "4.0": ["raft.wal_max_size_bytes = 262144", "raft.segment_max_entries = 256"],
    "4.3": ["raft.wal_max_size_bytes = 262144", "quorum_queue.wal_max_size_bytes = 262144",
            "quorum_queue.segment_max_entries = 256"],
}


#: 4.0's Ra takes a checkpoint (which it later promotes to a snapshot) only every 8192 indexes
#: (rabbit_quorum_queue's ?MIN_CHECKPOINT_INTERVAL); rabbit_fifo asks after 4096. Lowered so a few
#: thousand messages do; 4.3 snapshots on reclaimable bytes scaled by how full the WAL is.
ADVANCED = {"3.1": "[{rabbit, [{quorum_snapshot_interval, 1024}]}].\n", "4.0": "[{rabbit, [{quorum_min_checkpoint_interval, 1024}]}].\n", "4.3": None}


def _take(ch, n: int) -> list[int]:
    tags = []
    for method, _p, _b in ch.consume(QUEUE, inactivity_timeout=60):
        assert method is not None, "consumer got too few messages"
        tags.append(method.delivery_tag)
        if len(tags) == n:
            break
    return tags


def _churn(node: PrivateNode, n: int) -> None:
    """Publish and settle ``n`` messages in batches, a consumer attached throughout (so a snapshot
    taken meanwhile holds it with messages checked out, settled by msg id after the snapshot).
    Settled data is what lets Ra snapshot and compact."""
    conn = node.connect("/")
    pub = conn.channel()
    pub.confirm_delivery()
    c = node.connect("/")
    ch = c.channel()
    ch.basic_qos(prefetch_count=300)
    deliveries = ch.consume(QUEUE, inactivity_timeout=60)
    blob = b"c" * 1000
    got = 0
    for start in range(0, n, 500):
        end = min(n, start + 500)
        for i in range(start, end):
            pub.basic_publish("", QUEUE, blob + str(i).encode(), pika.BasicProperties(delivery_mode=2))
        while got < end:
            method, _p, _b = next(deliveries)
            assert method is not None, "churn consumer got too few messages"
            got += 1
            if got % 100 == 0 or got == n:
                ch.basic_ack(method.delivery_tag, multiple=True)
    ch.cancel()
    c.close()
    conn.close()


def compacted(data_dir: Path, queue: str = QUEUE) -> bool:
    """The queue's (qq-snap's) Ra server holds a snapshot past index 1000 and most of the log before it is gone
    (what test_import_quorum_snapshot.assert_compacted requires), read from the running node's files."""
    try:
        sdir = next(d for sysdir in (data_dir / "quorum").iterdir() for d in sysdir.iterdir()
                    if (d / "config").is_file() and queue.encode() in (d / "config").read_bytes())
        snap = ra_log.latest_snapshot(str(sdir), ImportContext())
        if snap is None or snap.index <= 1000:
            return False
        logs = ra_log.read_server_logs(str(sdir.parent), ImportContext())
        return len([i for i in logs[sdir.name].entries if i <= snap.index]) < snap.index // 2
    except Exception:  # noqa: BLE001 - files still being written: not yet
        return False


def build(name: str, version: str, base: Path, kill: bool) -> QsScenario:
    node = PrivateNode(version, base, conf=CONF[version[:3]], advanced=ADVANCED[version[:3]]).start()
    sc = QsScenario(name, version, node.data_dir, killed=kill)
    hold = version.startswith("4.3")
    try:
        conn = node.connect("/")
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        _publish(ch, QUEUE, 40, "k")
        # Consumer A takes every early message, cancels, acks 10; on 4.3 it keeps the rest across the snapshot.
        a = node.connect("/")
        ach = a.channel()
        ach.basic_qos(prefetch_count=40)
        tags = _take(ach, 40)
        ach.cancel()  # a cancelled consumer keeps what it holds and takes nothing new
        ach.basic_ack(tags[39 if not hold else 9], multiple=True)
        for n in (2600, 2600, 300):
            _churn(node, n)
            # rabbit_fifo's checkpoint / snapshot checks run on its tick; 4.0 takes a checkpoint, then
            # promotes it to a snapshot once the smallest live index has moved past it (the last round).
            time.sleep(6)
        # A loaded node ticks late: go on once the snapshot is there and the log before it compacted
        # (never longer than 3 min: should it come only later, the test's own check says so).
        with contextlib.suppress(AssertionError):
            wait_until(lambda: compacted(node.data_dir), timeout=180, what=f"{name}: a compacted Ra snapshot")
        # On top of the snapshot: a consumer acks 5, returns 5 and leaves 10 unacked; more publishes.
        _publish(ch, QUEUE, 60, "r")
        c = node.connect("/")
        cch = c.channel()
        cch.basic_qos(prefetch_count=20)
        tags = _take(cch, 20)
        cch.basic_ack(tags[4], multiple=True)
        for t in tags[5:10]:
            cch.basic_nack(t, requeue=True)
        c.close()
        a.close()  # A's held messages (4.3) go back to the queue
        _publish(ch, QUEUE, 20, "t")
        conn.close()
        sc.quorum[("/", QUEUE)] = reference(node, "/", QUEUE, False)
        time.sleep(1)
        if kill:
            node.kill()
        else:
            node.stop()
    except BaseException:
        node.cleanup()
        raise
    return sc


for _name, _version, _kill in (("qsnap-3.10", "3.10", False),
                               ("qsnap-4.0", "4.0", False), ("qsnap-kill-4.0", "4.0", True),
                               ("qsnap-4.3", "4.3", False), ("qsnap-kill-4.3", "4.3", True)):
    BUILDERS[_name] = lambda base, n=_name, v=_version, k=_kill: build(n, v, base, k)
    VERSIONS[_name] = _version
_ = _body


def build_ttl(name: str, version: str, base: Path) -> QsScenario:
    """Quorum queues where messages expired while the node ran (provable from the log: rabbit_fifo
    drops an expired message when a later command's checkout reaches it) and others that had not.

    No outcome hangs on how fast the machine is: what must expire has a 1-1.5 s TTL and the build
    waits until the broker itself reports it gone; what must survive has a 1 h TTL (or none)."""
    node = PrivateNode(version, base).start()
    sc = QsScenario(name, version, node.data_dir)
    try:
        # The queue's own x-message-ttl is 1 h; a policy lowers it to 1 s (the lower of the two
        # applies) while the doomed messages are published, and is cleared before the survivors.
        node.ctl("set_policy", "short-ttl", "^qq-ttl$", '{"message-ttl": 1000}', "--apply-to", "queues")
        conn = node.connect("/")
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("qq-ttl", durable=True, arguments={"x-queue-type": "quorum", "x-message-ttl": 3_600_000})
        ch.queue_declare("qq-exp", durable=True, arguments={"x-queue-type": "quorum"})
        for i in range(10):
            ch.basic_publish("", "qq-ttl", f"gone-{i}".encode(), pika.BasicProperties(delivery_mode=2))
        # Per-message TTL: only a message at the head is expired; a live one in front shields the rest.
        for i, exp in enumerate(["1500", None, "1500", "1500", "3600000", "1500"]):
            ch.basic_publish("", "qq-exp", f"e-{i}".encode(),
                             pika.BasicProperties(delivery_mode=2, expiration=exp, message_id=f"e{i}"))
        # rabbit_fifo's expiry timer drops the expired head messages: every gone-*, and e-0 (e-1 shields the rest).
        def counts() -> tuple[int, ...]:
            return tuple(ch.queue_declare(q, passive=True).method.message_count for q in ("qq-ttl", "qq-exp"))

        wait_until(lambda: counts() == (0, 5), timeout=300, what="the broker to expire gone-* and e-0")
        node.ctl("clear_policy", "short-ttl")
        for i in range(5):
            ch.basic_publish("", "qq-ttl", f"kept-{i}".encode(), pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", "qq-exp", b"e-late", pika.BasicProperties(delivery_mode=2, message_id="late"))
        conn.close()
        for q in ("qq-ttl", "qq-exp"):
            sc.quorum[("/", q)] = reference(node, "/", q, False)
        time.sleep(1)
        node.stop()
    except BaseException:
        node.cleanup()
        raise
    return sc


for _version in ("3.10", "4.0", "4.3"):
    BUILDERS[f"qttl-{_version}"] = lambda base, n=f"qttl-{_version}", v=_version: build_ttl(n, v, base)
    VERSIONS[f"qttl-{_version}"] = _version
