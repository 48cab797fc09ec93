"""Quorum-queue reads over AMQP 1.0 (one link, Qpid Proton) vs rbak's AMQP 0-9-1 read, on 4.x (issue 32).

Issue 32 asks whether a backup should read 4.x queues over AMQP 1.0: the broker's 1.0 side
is said to be faster, and one receiving link with credit holds any number of unsettled
messages, where a 0-9-1 read needs a consumer per prefetch window (32 per channel before a
cut can reorder them, issue 27). Both sides here do what a backup's read does: take every
message of a ``--messages`` x 1 KiB quorum queue without settling, decode it, and give all
back (0-9-1: rbak's ``read_queue`` with a counting sink; 1.0: ``proton.utils`` receiver,
credit ``--credit``, then ``released`` for all). Pairs alternate; prints each pair's ratio
1.0/0-9-1, the median and the load average.

``--cut`` instead measures order: the 1.0 read takes half the queue, its connection is closed
by the broker (``DELETE /api/connections/...``), and the drained queue is compared with the
published order.

    python benchmarks/amqp10_read.py [--broker rmq43] [--messages 50000] [--repeat 3] [--cut]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pika
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import BROKER_HELP, AUTH, Broker, publish_confirmed


def fill(b: Broker, vh: str, q: str, n: int) -> None:
    with pika.BlockingConnection(b.params(vh)) as conn:
        conn.channel().queue_declare(q, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 1000})
    pad = b"x" * 1016
    publish_confirmed(b.amqp_port, vh, ((q, b"%08d" % i + pad) for i in range(n)))


def read_091(b: Broker, vh: str, q: str, n: int) -> float:
    from rbak.backup import queue_reader
    from rbak.broker.connect import connect
    from rbak.config import ConnectionConfig

    conn = connect(ConnectionConfig(amqp_url=b.amqp_url(vh)), vh)
    got = [0]

    def sink(_m, _p, _b) -> None:
        got[0] += 1

    t = time.perf_counter()
    res = queue_reader.read_queue(conn, vh, q, "quorum", n, sink, queue_reader.ReadOptions(delivery_limit=1000))
    took = time.perf_counter() - t
    conn.close()
    assert got[0] == n == res.records, (got, n)
    return n / took


def _receiver(b: Broker, vh: str, q: str, credit: int, name: str):
    from proton.utils import BlockingConnection

    conn = BlockingConnection(f"amqp://localhost:{b.amqp_port}", timeout=60, virtual_host="vhost:" + vh,
                              user=AUTH[0], password=AUTH[1], allowed_mechs="PLAIN",
                              properties={"connection_name": name})
    return conn, conn.create_receiver("/queues/" + quote(q, safe=""), credit=credit)


def read_10(b: Broker, vh: str, q: str, n: int, credit: int) -> float:
    from proton import Delivery

    t = time.perf_counter()
    conn, rx = _receiver(b, vh, q, credit, "bench-10")
    size = 0
    for _ in range(n):
        size += len(rx.receive(timeout=30).body)
    rx.settle(Delivery.RELEASED)  # every unsettled message back, in one pass
    conn.close()
    took = time.perf_counter() - t
    assert size == n * 1024, size
    return n / took


def drain(b: Broker, vh: str, q: str) -> list[int]:
    with pika.BlockingConnection(b.params(vh)) as conn:
        ch = conn.channel()
        out = []
        while True:
            m, _p, body = ch.basic_get(q, auto_ack=True)
            if m is None:
                return out
            out.append(int(body[:8]))


def cut(b: Broker, vh: str, q: str, n: int, credit: int) -> None:
    from proton import ConnectionException, LinkException

    name = "bench-cut-" + uuid.uuid4().hex[:6]
    conn, rx = _receiver(b, vh, q, credit, name)
    for _ in range(n // 2):
        rx.receive(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        conns = requests.get(f"{b.api}/connections", auth=AUTH, timeout=30).json()
        mine = [c["name"] for c in conns if (c.get("client_properties") or {}).get("connection_name") == name]
        if mine:
            requests.delete(f"{b.api}/connections/{quote(mine[0], safe='')}", auth=AUTH, timeout=30)
            break
        time.sleep(0.5)
    else:
        raise SystemExit("the 1.0 connection never showed in the management API")
    try:
        rx.receive(timeout=5)
    except (ConnectionException, LinkException, Exception):  # noqa: BLE001 - any end of a cut connection
        pass
    t_cut = time.monotonic()
    with pika.BlockingConnection(b.params(vh)) as c:  # the broker returns them in its own time: wait for all
        ch = c.channel()
        while ch.queue_declare(q, passive=True).method.message_count < n and time.monotonic() - t_cut < 120:
            time.sleep(0.2)
    back = time.monotonic() - t_cut
    order = drain(b, vh, q)
    moved = [i for i, (x, y) in enumerate(zip(order, order[1:])) if y != x + 1]
    print(f"{b.id} {b.version()}: cut after {n // 2} of {n} unsettled on one 1.0 link: "
          f"all back after {back:.1f} s, {len(order)} drained, {'IN ORDER' if order == list(range(n)) else f'REORDERED at {moved[:4]}'}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", default="rmq43", help=BROKER_HELP)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--credit", type=int, default=1000)
    ap.add_argument("--cut", action="store_true")
    a = ap.parse_args()
    b = Broker(a.broker)
    with b.vhost() as vh:
        fill(b, vh, "qq", a.messages)
        if a.cut:
            cut(b, vh, "qq", a.messages, a.credit)
            return 0
        ratios = []
        for i in range(a.repeat):
            old = read_091(b, vh, "qq", a.messages)
            new = read_10(b, vh, "qq", a.messages, a.credit)
            ratios.append(new / old)
            print(f"pair {i + 1}: AMQP 1.0 {new:,.0f} msg/s, rbak 0-9-1 {old:,.0f} msg/s, ratio {new / old:.2f}",
                  flush=True)
        print(f"{a.broker} {b.version()} {a.messages} messages, credit {a.credit}: median ratio 1.0/0-9-1 "
              f"{statistics.median(ratios):.2f}; load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
