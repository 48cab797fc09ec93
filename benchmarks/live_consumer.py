"""What a live application sees while rbak backs up its queue (issue 27 scenario 5). A measurement.

A publisher sends sequence-numbered messages at ``RATE`` a second, an acking consumer
(prefetch ``PREFETCH``) takes them, and three backups run one after another meanwhile.
Printed per broker and queue type: messages received, how many arrived after a higher
sequence number (out of order), how many were ``redelivered``, duplicates, lost, and the
backups' sizes (what each held at once).

    python benchmarks/live_consumer.py [rmq310 rmq40 rmq43] [classic quorum]
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import pika
from bench_common import BROKER_HELP, BROKERS, Broker

RATE = 1500
SECONDS = 12
PREFETCH = 50


def _publisher(b: Broker, vh: str, q: str, n: int, done: threading.Event) -> None:
    conn = pika.BlockingConnection(b.params(vh))
    ch = conn.channel()
    start = time.monotonic()
    for i in range(n):
        ch.basic_publish("", q, b"%08d" % i, pika.BasicProperties(delivery_mode=2))
        if i % 50 == 0:
            ahead = start + i / RATE - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    conn.process_data_events(0.5)
    conn.close()
    done.set()


def _consumer(b: Broker, vh: str, q: str, n: int, got: list, stop: threading.Event) -> None:
    conn = pika.BlockingConnection(b.params(vh))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=PREFETCH)

    def on(c, m, _p, body) -> None:
        got.append((int(body), m.redelivered))
        c.basic_ack(m.delivery_tag)

    ch.basic_consume(q, on)
    while not stop.is_set() and len(got) < n:
        conn.process_data_events(0.1)
    conn.close()


def measure(bid: str, qtype: str) -> None:
    from rbak.backup import BackupEngine
    from rbak.config import Config

    b = Broker(bid)
    n = RATE * SECONDS
    with b.vhost() as vh, tempfile.TemporaryDirectory() as tmp:
        setup = pika.BlockingConnection(b.params(vh))
        setup.channel().queue_declare("live", durable=True, arguments={"x-queue-type": qtype})
        setup.close()
        got: list = []
        done, stop = threading.Event(), threading.Event()
        threads = [threading.Thread(target=_publisher, args=(b, vh, "live", n, done)),
                   threading.Thread(target=_consumer, args=(b, vh, "live", n, got, stop))]
        for t in threads:
            t.start()
        sizes = []
        time.sleep(2)
        for i in range(3):
            cfg = Config.from_dict({
                "mode": "backup", "backup_id": f"live{i}",
                "source": {"amqp_url": b.amqp_url(vh), "management_url": b.mgmt_url,
                           "stream_port": b.stream_port, "queues": {"vhosts": [vh]}},
                "storage": {"backend": "filesystem", "path": str(Path(tmp) / "store")},
                "backup": {"include_definitions": False},
                "offset_storage": {"path": str(Path(tmp) / "st.db"), "sync_interval_secs": 0},
            }, env={})
            try:
                sizes.append(BackupEngine(cfg).run().total_messages)
            except Exception as e:  # noqa: BLE001 - a measurement: report it
                sizes.append(repr(e)[:80])
            time.sleep(2)
        done.wait(120)
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join(30)
        seqs = [s for s, _ in got]
        high = -1
        late = 0
        for s in seqs:
            if s < high:
                late += 1
            high = max(high, s)
        redelivered = sum(1 for _, r in got if r)
        dups = len(seqs) - len(set(seqs))
        lost = n - len(set(seqs))
        print(f"{bid} {b.version()} {qtype}: {len(got)} received of {n}; out of order {late}, "
              f"redelivered {redelivered}, duplicates {dups}, lost {lost}; backups held {sizes}", flush=True)


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]) or not all(a in BROKERS or a in ("classic", "quorum")
                                                                    for a in sys.argv[1:]):
        print(__doc__.rstrip() + "\n\nBrokers: " + BROKER_HELP + ".")
        sys.exit(0 if any(a in ("-h", "--help") for a in sys.argv[1:]) else 2)
    ids = [a for a in sys.argv[1:] if a.startswith("rmq")] or ["rmq310", "rmq40", "rmq43"]
    types = [a for a in sys.argv[1:] if a in ("classic", "quorum")] or ["classic", "quorum"]
    for bid in ids:
        for qt in types:
            measure(bid, qt)
