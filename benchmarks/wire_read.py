"""The read a backup does, on rbak's own connection (``rbak.broker.wire``) against the fast path inside
pika's BlockingConnection (``rbak.broker.fast_consume``) it is to replace (issue 32: measure first).

One queue of ``--messages`` 1 KiB messages (``--queue-type``) on one broker; each round reads every
message on each client in turn (timed: from Basic.Consume to the last delivery) (prefetch = the depth, one consumer, deliveries parsed whole by
``scan_deliveries``), then cancels and gives every message back (``basic.nack`` multiple, requeue) and
waits for them. Prints each pair's messages/s and CPU seconds of this process, and the medians' ratios
wire / pika-fast (a ratio >= 0.95 keeps issue 32's "no speed lost").

    python benchmarks/wire_read.py [--broker rmq43] [--messages 50000] [--rounds 5] [--queue-type quorum]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import pika
import pika.spec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_common import BROKERS, Broker, fill, load  # noqa: E402

from rbak.broker.fast_consume import DECLARE_OK, QOS_OK, FastConsume  # noqa: E402
from rbak.broker.wire import Connection, Params  # noqa: E402


def wait_ready(count, n: int) -> None:
    deadline = time.monotonic() + 60
    while count() != n:
        if time.monotonic() > deadline:
            raise SystemExit(f"the queue did not get its {n} messages back")
        time.sleep(0.05)


def read_pika_fast(broker, vh: str, queue: str, n: int) -> float:
    conn = pika.BlockingConnection(broker.params(vh))
    try:
        ch = conn.channel()
        fc = FastConsume.install(conn)
        assert fc is not None
        try:
            fc.call(ch, QOS_OK, pika.spec.Basic.Qos(prefetch_count=n))
            t0 = time.perf_counter()
            fc.consume(ch, queue, raw=True)
            got = 0
            while got < n:
                if not fc.wait(ch, 30):
                    raise SystemExit(f"pika-fast: {got} of {n} after 30 s idle")
                got += len(fc.take())
            took = time.perf_counter() - t0
            fc.cancel(ch)
            fc.send(ch, pika.spec.Basic.Nack(delivery_tag=0, multiple=True, requeue=True))

            def count() -> int:
                return int.from_bytes(fc.call(ch, DECLARE_OK, pika.spec.Queue.Declare(queue=queue, passive=True))[
                    1 + len(queue):5 + len(queue)], "big")
            wait_ready(count, n)
        finally:
            fc.uninstall()
    finally:
        conn.close()
    return took


def read_wire(broker, vh: str, queue: str, n: int) -> float:
    with Connection.open(Params(host="localhost", port=broker.amqp_port, vhost=vh, heartbeat=0)) as conn:
        ch = conn.channel()
        ch.qos(n)
        t0 = time.perf_counter()
        tag = ch.consume(queue)
        got = 0
        while got < n:
            if not conn.pump(lambda: bool(ch.deliveries), timeout=30):
                raise SystemExit(f"wire: {got} of {n} after 30 s idle")
            got += len(ch.deliveries)
            ch.deliveries.clear()
        took = time.perf_counter() - t0
        ch.cancel(tag)
        ch.nack(0, multiple=True, requeue=True)
        wait_ready(lambda: ch.declare_passive(queue)[0], n)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", default="rmq43", choices=sorted(BROKERS))
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--queue-type", default="quorum", choices=["classic", "quorum"])
    a = ap.parse_args()
    broker = Broker(a.broker)
    print(f"{a.messages} x 1 KiB, {a.queue_type} queue on {a.broker} ({broker.version()}); {load()}")
    with broker.vhost() as vh:
        fill(broker, vh, ["q"], a.messages, {"x-queue-type": a.queue_type})
        runs: dict[str, list[tuple[float, float]]] = {"pika-fast": [], "wire": []}
        for r in range(a.rounds):
            order = [("pika-fast", read_pika_fast), ("wire", read_wire)]
            if r % 2:
                order.reverse()
            for name, fn in order:
                c0 = os.times()
                wall = fn(broker, vh, "q", a.messages)
                c1 = os.times()
                cpu = (c1.user - c0.user) + (c1.system - c0.system)
                runs[name].append((a.messages / wall, cpu))
                print(f"round {r + 1} {name:9s} {a.messages / wall:10,.0f} msg/s  cpu {cpu:6.2f} s")
    med = {k: (statistics.median(x for x, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
    print(f"median msg/s: pika-fast {med['pika-fast'][0]:,.0f}, wire {med['wire'][0]:,.0f}; "
          f"ratio wire/pika-fast {med['wire'][0] / med['pika-fast'][0]:.2f}")
    print(f"median CPU s: pika-fast {med['pika-fast'][1]:.2f}, wire {med['wire'][1]:.2f}; "
          f"ratio wire/pika-fast {med['wire'][1] / med['pika-fast'][1]:.2f} (lower is better)")


if __name__ == "__main__":
    main()
