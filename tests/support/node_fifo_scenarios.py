"""Private nodes whose quorum queues are read back after a restart: what ``rabbit_fifo`` does when it
recovers (consumers found dead, 4.3's delayed retries coming due) is the reference.

Each scenario runs ``setup(node)`` on a fresh node; consumers it leaves open still hold messages when
the node is killed with SIGKILL (or stopped). The stopped data directory is copied (that copy is
what the tests import), then the node is restarted on the original, and once ``settle`` seconds have
passed (every delay due) a live consumer reads each queue without acking (the reference).

- ``qdelay-4.3`` (4.3.6): delayed retry by queue argument. ``qq-dr-returned`` (type returned, 4 s):
  two nacked messages are delayed, a consumer holds three at the kill (a dead consumer's messages
  are failed deliveries: back at once). ``qq-dr-all`` (type all, 3-6 s): nacks delayed and the dead
  consumer's messages delayed after the restart. ``qq-dr-failed`` (type failed, 2 s): nacks
  returned at once, the dead consumer's delayed. ``qq-dr-limit`` (type all, delivery limit 0): two
  messages rejected back (4.3 logs a ``modify`` with ``delivery_failed``) are dropped at once, the
  two the consumer took instead are held at the kill and past the limit at the restart (a dead
  consumer's messages count as failed deliveries).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pika

from support.node_qs_scenarios import QsScenario, reference
from support.node_scenarios import BUILDERS, VERSIONS
from support.private_node import PrivateNode

QQ = {"x-queue-type": "quorum"}


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
    for method, _p, _b in ch.consume(queue, inactivity_timeout=5, **consume_args):
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

    def declare(q: str, kind: str, lo: int, hi: int, **extra) -> None:
        ch.queue_declare(q, durable=True, arguments=dict(QQ, **{
            "x-delayed-retry-type": kind, "x-delayed-retry-min": lo, "x-delayed-retry-max": hi}, **extra))
        publish(ch, q, 12, q[6:])

    declare("qq-dr-returned", "returned", 4000, 4000)
    c, cch, tags = take(node, "qq-dr-returned", 5)
    cch.basic_nack(tags[3], requeue=True)
    cch.basic_nack(tags[1], requeue=True)
    held.append(c)  # holds 0, 2, 4 at the kill

    declare("qq-dr-all", "all", 3000, 6000)
    c, cch, tags = take(node, "qq-dr-all", 4)
    cch.basic_ack(tags[0])
    cch.basic_nack(tags[2], requeue=True)
    held.append(c)  # holds 1, 3

    declare("qq-dr-failed", "failed", 2000, 2000)
    c, cch, tags = take(node, "qq-dr-failed", 3, prefetch=3)
    cch.basic_nack(tags[1], requeue=True)  # not a failure: straight back (and redelivered to this consumer)
    held.append(c)

    declare("qq-dr-limit", "all", 1000, 1000, **{"x-delivery-limit": 0})
    c, cch, tags = take(node, "qq-dr-limit", 2)
    cch.basic_reject(tags[0], requeue=True)  # 4.3: a reject is a modify with delivery_failed: past limit 0
    cch.basic_reject(tags[1], requeue=True)
    time.sleep(1)  # the consumer took 2 and 3 instead, held at the kill
    publish(ch, "qq-dr-limit", 1, "late", 100)
    held.append(c)
    conn.close()
    return ["qq-dr-returned", "qq-dr-all", "qq-dr-failed", "qq-dr-limit"], held


def build_restart(name: str, version: str, base: Path, setup, settle: float, kill: bool = True) -> QsScenario:
    node = PrivateNode(version, base).start()
    sc = QsScenario(name, version, node.data_dir, killed=kill)
    try:
        queues, held = setup(node)
        time.sleep(0.5)
        node.kill() if kill else node.stop()
        for c in held:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - its node is gone
                pass
        copy = base / "at-stop" / "mnesia" / node.data_dir.name
        shutil.copytree(node.data_dir, copy, symlinks=True)
        time.sleep(settle)  # every delay set before the stop has come due before the restart
        node.start()
        time.sleep(settle)  # and those the restart sets
        for q in queues:
            sc.quorum[("/", q)] = reference(node, "/", q, False)
        node.stop()
        sc.data_dir = copy
    except BaseException:
        node.cleanup()
        raise
    return sc


BUILDERS["qdelay-4.3"] = lambda base: build_restart("qdelay-4.3", "4.3", base, _delayed_retry, 7)
VERSIONS["qdelay-4.3"] = "4.3"
