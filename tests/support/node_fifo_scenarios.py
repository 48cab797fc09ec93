"""Private nodes whose quorum queues are read back after a restart: what ``rabbit_fifo`` does when it
recovers (consumers found dead, 4.3's delayed retries coming due) is the reference.

Each scenario runs ``setup(node)`` on a fresh node; consumers it leaves open still hold messages when
the node is killed with SIGKILL (or stopped). The stopped data directory is copied (that copy is
what the tests import), then the node is restarted on the original (no earlier than the setup says:
every delay set before the stop due, an x-expires passed), and a live consumer reads each queue without
acking (the reference), waiting until it has every message the scenario leaves (``expect``): delays and
consumer timeouts the restart sets come due when they do, so no fixed sleep races a slow machine.

- ``qdelay-4.3`` (4.3.6): delayed retry by queue argument. ``qq-dr-returned`` (type returned, 15 s,
  set up last, just before the kill, so the delay outlasts it): two nacked messages are delayed, a
  consumer holds three at the kill (a dead consumer's messages
  are failed deliveries: back at once). ``qq-dr-all`` (type all, 3-6 s): nacks delayed and the dead
  consumer's messages delayed after the restart. ``qq-dr-failed`` (type failed, 2 s): nacks
  returned at once, the dead consumer's delayed. ``qq-dr-limit`` (type all, delivery limit 0): two
  messages rejected back (4.3 logs a ``modify`` with ``delivery_failed``) are dropped at once, the
  two the consumer took instead are held at the kill and past the limit at the restart (a dead
  consumer's messages count as failed deliveries).
- ``qcons-3.10`` / ``-4.0`` / ``-4.3``: ``qq-spare``: one consumer holds five, another one with credit
  left (it takes the first one's back at the restart, then returns all behind its own); ``qq-sac``
  (single active consumer): the active one holds four, two wait (unlimited prefetch, then prefetch
  2). ``qq-credit``: an AMQP 1.0 receiver (credited; 3.10: the rabbitmq_amqp1_0 plugin) with credit
  left behind a 0-9-1 consumer. On 4.x also ``qq-sac-prio``: a priority-5 consumer arrives while the active one holds three
  (it quiesces). On 4.3 the restart leaves that quiescing consumer active though dead (its last
  return puts it back in the waiting list after its down was processed): the consumer timeout
  (20 s here: the setup's consumers must not reach it before the kill) gives its messages back.
- ``qexpire-*``: ``qq-expires`` (x-expires 30 s, five messages, never consumed) is stopped cleanly
  before it expires (a 30 s margin for a stop that normally begins 1 s after the declare),
  restarted after: the restarted node deletes it (``sc.gone``, waited for).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import pika
import pika.exceptions

from support.brokers import wait_until
from support.node_qs_scenarios import QsScenario, reference
from support.node_scenarios import BUILDERS, VERSIONS
from support.private_node import PrivateNode

QQ = {"x-queue-type": "quorum"}
#: Ra registers a new queue's server in names.dets, which reaches the disk later: a queue created just
#: before a SIGKILL is restarted by the broker as a new, empty member (the import still reads its files).
DETS_SYNC = 5
EXPIRES = 30_000
CONSUMER_TIMEOUT_43 = 20_000
#: Delayed retry of ``qq-dr-returned``: set up last, it must not come due before the kill.
RETURNED_DELAY = 15_000


def publish(ch, queue: str, n: int, tag: str, start: int = 0) -> None:
    for i in range(start, start + n):
        ch.basic_publish("", queue, f"{tag}-{i}".encode(),
                         pika.BasicProperties(delivery_mode=2, message_id=f"{tag}{i}", headers={"n": i}))


def take(node: PrivateNode, queue: str, n: int, prefetch: int | None = None, **consume_args):
    """A consumer (own connection) with ``n`` deliveries unacked: (connection, channel, delivery tags)."""
    conn = node.connect("/")
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch or n)
    tags = []
    for method, _p, _b in ch.consume(queue, inactivity_timeout=60, **consume_args):
        assert method is not None, f"{queue}: consumer got too few messages"
        tags.append(method.delivery_tag)
        if len(tags) == n:
            break
    return conn, ch, tags


def _delayed_retry(node: PrivateNode) -> tuple[list[str], list]:
    conn = node.connect("/")
    ch = conn.channel()
    ch.confirm_delivery()
    held = []

    for q, kind, lo, hi, extra in (("qq-dr-returned", "returned", RETURNED_DELAY, RETURNED_DELAY, {}),
                                   ("qq-dr-all", "all", 3000, 6000, {}),
                                   ("qq-dr-failed", "failed", 2000, 2000, {}),
                                   ("qq-dr-limit", "all", 1000, 1000, {"x-delivery-limit": 0})):
        ch.queue_declare(q, durable=True, arguments=dict(QQ, **{
            "x-delayed-retry-type": kind, "x-delayed-retry-min": lo, "x-delayed-retry-max": hi}, **extra))
    time.sleep(DETS_SYNC)
    for q in ("qq-dr-returned", "qq-dr-all", "qq-dr-failed", "qq-dr-limit"):
        publish(ch, q, 12, q[6:])
    c, cch, tags = take(node, "qq-dr-all", 4)
    cch.basic_ack(tags[0])
    cch.basic_nack(tags[2], requeue=True)
    held.append(c)  # holds 1, 3, 4, 5

    c, cch, tags = take(node, "qq-dr-failed", 3, prefetch=3)
    cch.basic_nack(tags[1], requeue=True)  # not a failure: straight back (and redelivered to this consumer)
    held.append(c)

    c, cch, tags = take(node, "qq-dr-limit", 2)
    cch.basic_reject(tags[0], requeue=True)  # 4.3: a reject is a modify with delivery_failed: past limit 0
    cch.basic_reject(tags[1], requeue=True)
    time.sleep(1)  # the consumer took 2 and 3 instead, held at the kill
    publish(ch, "qq-dr-limit", 1, "late", 100)
    held.append(c)

    # Last, so its delay (longer than every other) is still running at the kill.
    c, cch, tags = take(node, "qq-dr-returned", 5)
    cch.basic_nack(tags[3], requeue=True)
    cch.basic_nack(tags[1], requeue=True)
    held.append(c)  # holds 0, 2, 4 and 5, 6 (the credit the nacks gave back) at the kill
    conn.close()
    # Restart once every delay set before the kill is due (what the import assumes of a restart).
    not_before = time.monotonic() + RETURNED_DELAY / 1000 + 2
    return ["qq-dr-returned", "qq-dr-all", "qq-dr-failed", "qq-dr-limit"], held, not_before


def _consumers(node: PrivateNode) -> tuple[list[str], list]:
    """Consumers alive at the kill: the restarted queue finds them dead one pid after the other, and those
    not yet found dead take what the others return (credit they still had, a waiting single active one)."""
    conn = node.connect("/")
    ch = conn.channel()
    ch.confirm_delivery()
    v4 = node.version.startswith("4")
    held, queues = [], ["qq-spare", "qq-sac", "qq-credit"] + (["qq-sac-prio"] if v4 else [])
    sac = dict(QQ, **{"x-single-active-consumer": True})
    for q in queues:
        ch.queue_declare(q, durable=True, arguments=sac if q.startswith("qq-sac") else QQ)
    time.sleep(DETS_SYNC)
    publish(ch, "qq-spare", 6, "spare")
    held.append(take(node, "qq-spare", 5)[0])  # 0-4, no credit left
    held.append(take(node, "qq-spare", 1, prefetch=10)[0])  # 5, credit 9 left
    publish(ch, "qq-sac", 12, "sac")
    c, cch, tags = take(node, "qq-sac", 4)
    cch.basic_ack(tags[0])  # holds 1-4
    held.append(c)
    c2 = node.connect("/")
    c2.channel().basic_consume("qq-sac", lambda *a: None)  # waits (default prefetch: unlimited)
    held.append(c2)
    c3 = node.connect("/")
    ch3 = c3.channel()
    ch3.basic_qos(prefetch_count=2)
    ch3.basic_consume("qq-sac", lambda *a: None)  # waits, prefetch 2
    held.append(c3)
    publish(ch, "qq-credit", 8, "credit")
    held.append(take(node, "qq-credit", 3)[0])  # 0-2
    # 3-7 over AMQP 1.0 (3.10: the rabbitmq_amqp1_0 plugin, credited mode), credit left
    held.append(_credited(node, "/queues/qq-credit" if v4 else "/amq/queue/qq-credit", 2, 10))
    if v4:
        publish(ch, "qq-sac-prio", 10, "prio")
        held.append(take(node, "qq-sac-prio", 3)[0])  # active, priority 0, holds 0-2
        c4 = node.connect("/")
        ch4 = c4.channel()
        ch4.basic_qos(prefetch_count=4)
        ch4.basic_consume("qq-sac-prio", lambda *a: None, arguments={"x-priority": 5})  # quiesces the first
        held.append(c4)
    conn.close()
    return queues, held, 0.0


class _Held:
    """An AMQP 1.0 receiver that got its messages and settles nothing (closed once the node is gone)."""

    def __init__(self, conn):
        self.conn = conn

    def close(self):
        self.conn.close()


def _credited(node: PrivateNode, address: str, n: int, credit: int) -> _Held:
    from proton.utils import BlockingConnection

    conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", allowed_mechs="PLAIN", timeout=30)
    rcv = conn.create_receiver(address, credit=credit)
    for _ in range(n):
        rcv.receive(timeout=60)  # unsettled (the link's default is to settle on accept, which never comes)
    return _Held(conn)


def _expiring(node: PrivateNode) -> tuple[list[str], list]:
    """``qq-expires`` (x-expires 30 s, no consumer) is stopped before it expires and restarted after.
    No DETS_SYNC wait: the node is stopped cleanly (names.dets is closed), and the stop must come early."""
    conn = node.connect("/")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("qq-expires", durable=True, arguments=dict(QQ, **{"x-expires": EXPIRES}))
    declared = time.monotonic()  # after the declare: the queue's creation time is earlier
    ch.queue_declare("qq-keep", durable=True, arguments=QQ)
    publish(ch, "qq-expires", 5, "exp")
    publish(ch, "qq-keep", 5, "keep")
    conn.close()
    return ["qq-expires", "qq-keep"], [], declared + EXPIRES / 1000 + 2


def _exists(node: PrivateNode, queue: str) -> bool:
    conn = node.connect("/")
    try:
        conn.channel().queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def build_restart(name: str, version: str, base: Path, setup, expect: dict[str, int], kill: bool = True,
                  conf: tuple[str, ...] = (), plugins: tuple[str, ...] = (), gone: tuple[str, ...] = ()) -> QsScenario:
    """``setup(node) -> (queues, held connections, restart not before (monotonic))``; ``expect``: how
    many messages each queue's reference read waits for; ``gone``: queues the restart deletes (waited for)."""
    node = PrivateNode(version, base, conf=list(conf), plugins=plugins).start()
    sc = QsScenario(name, version, node.data_dir, killed=kill)
    try:
        queues, held, not_before = setup(node)
        time.sleep(0.5)
        node.kill() if kill else node.stop()
        for c in held:
            with contextlib.suppress(Exception):  # its node is gone
                c.close()
        copy = base / "at-stop" / "mnesia" / node.data_dir.name
        shutil.copytree(node.data_dir, copy, symlinks=True)
        time.sleep(max(0.0, not_before - time.monotonic()))  # a lower bound: later is as good
        node.start()
        if gone:
            with contextlib.suppress(AssertionError):  # still there after 2 min: the test says so
                wait_until(lambda: not any(_exists(node, q) for q in gone), timeout=120,
                           what=f"the restarted node to delete {gone}")
        sc.gone = [q for q in queues if not _exists(node, q)]
        for q in queues:
            if q not in sc.gone:
                sc.quorum[("/", q)] = reference(node, "/", q, False, expect=expect[q])
        node.stop()
        sc.data_dir = copy
    except BaseException:
        node.cleanup()
        raise
    return sc


for _version in ("3.10", "4.0", "4.3"):
    # 4.3: a consumer the restart leaves active though dead (qq-sac-prio) gives its messages back at the
    # consumer timeout (its 30 min default shortened; the scenario's consumers hold theirs for less).
    BUILDERS[f"qcons-{_version}"] = lambda base, v=_version: build_restart(
        f"qcons-{v}", v, base, _consumers, {"qq-spare": 6, "qq-sac": 11, "qq-credit": 8, "qq-sac-prio": 10},
        conf=(f"consumer_timeout = {CONSUMER_TIMEOUT_43}",) if v == "4.3" else (),
        plugins=("rabbitmq_amqp1_0",) if v == "3.10" else ())
    VERSIONS[f"qcons-{_version}"] = _version

    BUILDERS[f"qexpire-{_version}"] = lambda base, v=_version: build_restart(
        f"qexpire-{v}", v, base, _expiring, {"qq-keep": 5}, kill=False, gone=("qq-expires",))
    VERSIONS[f"qexpire-{_version}"] = _version

BUILDERS["qdelay-4.3"] = lambda base: build_restart(
    "qdelay-4.3", "4.3", base, _delayed_retry,
    {"qq-dr-returned": 12, "qq-dr-all": 11, "qq-dr-failed": 12, "qq-dr-limit": 9})
VERSIONS["qdelay-4.3"] = "4.3"
