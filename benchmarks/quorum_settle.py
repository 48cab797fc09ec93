"""What the settle wait costs a one-channel quorum read (issue 46): small quorum queues read whole.

Every quorum read now ends only once the queue holds its messages again (passive declares on the
connection's control channel, ``read_return.return_in_order``); before, a one-channel read returned
as soon as its channel was closed. ``--queues`` quorum queues of ``--messages`` 1 KiB messages are
read one after another on one rbak connection, as a worker reads them, with the wait (now) and
without it (no probe: the give-back before), alternating, ``--repeat`` pairs. Prints ms per queue
for each pair, the medians and the load average (the machine is shared).

    python benchmarks/quorum_settle.py [--broker rmq310] [--queues 100] [--messages 10] [--repeat 3]
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
from rbak.backup import read_return
from rbak.backup.queue_reader import read_queue
from rbak.broker.connect import connect
from rbak.config import ConnectionConfig


def fill(b: Broker, vh: str, queues: list[str], n: int) -> None:
    conn = pika.BlockingConnection(b.params(vh))
    ch = conn.channel()
    ch.confirm_delivery()
    body = b"x" * 1024
    for q in queues:
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 100_000})
        for _ in range(n):
            ch.basic_publish("", q, body, pika.BasicProperties(delivery_mode=2))
    conn.close()


def read_all(b: Broker, vh: str, queues: list[str], n: int, settle: bool) -> float:
    """ms per queue: every queue read whole and given back, with or without the settle wait."""
    # the measurement swaps the probe out: without one the return does not wait (the give-back before)
    probe = read_return._settle_probe  # noqa: SLF001 - restored below
    if not settle:
        read_return._settle_probe = lambda channels, i: None  # noqa: SLF001 - no probe, no wait
    conn = connect(ConnectionConfig(amqp_url=b.amqp_url(vh)), vh)
    try:
        t = time.perf_counter()
        for q in queues:
            res = read_queue(conn, vh, q, "quorum", n, lambda _m, _p, _b: None)
            assert res.records == n and res.channels == 1, (q, res)
        return (time.perf_counter() - t) * 1000 / len(queues)
    finally:
        conn.close()
        read_return._settle_probe = probe  # noqa: SLF001 - the probe swapped out above


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", default="rmq310", help=BROKER_HELP)
    ap.add_argument("--queues", type=int, default=100)
    ap.add_argument("--messages", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    b = Broker(a.broker)
    with b.vhost() as vh:
        queues = [f"qq-{i:04d}" for i in range(a.queues)]
        fill(b, vh, queues, a.messages)
        waits, nones = [], []
        for i in range(a.repeat):
            waits.append(read_all(b, vh, queues, a.messages, True))
            nones.append(read_all(b, vh, queues, a.messages, False))
            print(f"pair {i + 1}: with the wait {waits[-1]:.2f} ms/queue, without {nones[-1]:.2f} ms/queue", flush=True)
        w, n = statistics.median(waits), statistics.median(nones)
        print(f"{a.broker} {b.version()} {a.queues} quorum queues x {a.messages}: median {w:.2f} "
              f"ms/queue with the wait, {n:.2f} without: ratio without/with {n / w:.2f}; load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
