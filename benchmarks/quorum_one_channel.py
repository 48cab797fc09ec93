"""Quorum reads: windows as consumers of one channel (issue 27) vs one channel per window (before).

A quorum queue of ``--messages`` 1 KiB messages is read with rbak's ``read_queue`` (a sink
that only counts: the read and the return are what differ), the delivery limit of 20 that
4.x applies by default (so the read takes growing windows: 1, 4, 16, ... 65,535), with
``MAX_CONSUMERS_PER_CHANNEL`` 32 (now) and 1 (a channel per window, the layout before),
alternating, ``--repeat`` pairs. Prints each pair's ratio now/before and the median
(target: >= 0.95, no slower) and the load average (the machine is shared).

    python benchmarks/quorum_one_channel.py [--broker rmq40] [--messages 50000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import BROKER_HELP, Broker


def fill(b: Broker, vh: str, q: str, n: int) -> None:
    conn = pika.BlockingConnection(b.params(vh))
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 1000})
    ch.confirm_delivery()
    body = b"x" * 1024
    for i in range(n):
        ch.basic_publish("", q, body, pika.BasicProperties(delivery_mode=2, message_id=str(i)))
    conn.close()


def read_once(b: Broker, vh: str, q: str, n: int, per_channel: int, limit: int) -> float:
    from rbak.backup import queue_reader
    from rbak.broker.connect import connect
    from rbak.config import ConnectionConfig

    queue_reader.MAX_CONSUMERS_PER_CHANNEL = per_channel
    conn = connect(ConnectionConfig(amqp_url=b.amqp_url(vh)), vh)  # rbak's own connection, as a backup reads
    got = [0]

    def sink(_m, _p, _b) -> None:
        got[0] += 1

    t = time.perf_counter()
    res = queue_reader.read_queue(conn, vh, q, "quorum", n, sink, queue_reader.ReadOptions(delivery_limit=limit))
    took = time.perf_counter() - t
    conn.close()
    assert got[0] == n == res.records, (got, n)
    return n / took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", default="rmq40", help=BROKER_HELP)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    b = Broker(a.broker)
    with b.vhost() as vh:
        fill(b, vh, "qq", a.messages)
        time.sleep(1)
        ratios = []
        limit = 1000  # windows as with the default limit of 20, without using it up over the runs
        for i in range(a.repeat):
            before = read_once(b, vh, "qq", a.messages, 1, limit)
            now = read_once(b, vh, "qq", a.messages, 32, limit)
            ratios.append(now / before)
            print(f"pair {i + 1}: one channel {now:,.0f} msg/s, channel per window {before:,.0f} msg/s, "
                  f"ratio {now / before:.2f}", flush=True)
        med = statistics.median(ratios)
        print(f"{a.broker} {b.version()} {a.messages} messages: median ratio {med:.2f} "
              f"(target >= 0.95: {'PASS' if med >= 0.95 else 'BELOW'}); load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
