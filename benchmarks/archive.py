"""``rbak archive``: lag percentiles, throughput against a bare client, and metadata writes when idle.

On one CI broker (``--broker rmq310|rmq40|rmq43``, default rmq43), in private vhosts deleted
afterwards, with the file backend (each object's mtime is when it became durable):

1. lag: ``--rate`` msg/s (default 1,000) of 1 KiB for ``--seconds`` (default 30) on one stream,
   each body carrying its publish time; the archiver runs with the default ``max_delay_secs`` (5).
   A record's lag is the mtime of the first tick naming its segment minus its publish time (what
   the issue asks: publish -> durable and named). Prints p50 / p99 / p99.9 beside the targets
   (p99 <= 5 s, p99.9 <= 15 s).
2. throughput: ``--messages`` (default 100,000) x 1 KiB already in a stream. Baseline: a bare pika
   consumer (prefetch 2,000, ``x-stream-offset: first``) reading them all, in the same run. Then the
   archiver from scratch until every record is named by a tick. Prints both rates and the ratio
   (target >= 0.8).
3. idle: ``--idle-streams`` (default 20) streams with nothing published, the archiver running for
   ``--idle-seconds`` (default 65): the objects it writes, extrapolated to an hour, beside what one
   object per stream per tick would cost (target <= 120 metadata writes per hour, 0 data objects).

    python benchmarks/archive.py [--broker rmq43] [--rate 1000] [--seconds 30] [--messages 100000]
"""

from __future__ import annotations

import argparse
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from support.backups import fast_publish
from support.brokers import BROKERS, unique_name

from rbak.archive.archiver import Archiver
from rbak.config import Config
from rbak.format.archive import Tick

BODY = 1024


def config(broker, vhost: str, store: Path, **archive) -> Config:
    return Config.from_dict({
        "mode": "archive",
        "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                   "stream_port": broker.stream_port, "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "filesystem", "path": str(store)},
        "archive": {"name": "bench", **archive},
    }, env={})


def start(cfg: Config) -> tuple[Archiver, threading.Thread]:
    a = Archiver(cfg)
    t = threading.Thread(target=a.run, daemon=True)
    t.start()
    return a, t


def ticks(store: Path) -> list[tuple[float, Tick]]:
    out = []
    for p in sorted(store.glob("bench.*/archive/tick-*.json")):
        out.append((p.stat().st_mtime, Tick.from_json(p.read_bytes(), str(p))))
    return out


def named_records(store: Path) -> int:
    return sum(s.record_count for _, t in ticks(store) for st in t.streams for s in st.segments)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def lag(broker, rate: float, seconds: float) -> None:
    vh = unique_name("bench")
    broker.create_vhost(vh)
    try:
        broker.declare_queue(vh, "lag", arguments={"x-queue-type": "stream"})
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "store"
            a, t = start(config(broker, vh, store))
            while a.state != "archiving":  # steady state: start-up is the throughput part's business
                time.sleep(0.1)
            time.sleep(1)
            conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url(vh)))
            ch = conn.channel()
            n, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < seconds:
                body = struct.pack(">d", time.time()) + b"x" * (BODY - 8)
                ch.basic_publish("", "lag", body)
                n += 1
                time.sleep(max(0.0, t0 + n / rate - time.monotonic()))
            conn.close()
            deadline = time.time() + 120
            while named_records(store) < n and time.time() < deadline:
                time.sleep(0.5)
            a.stop()
            t.join(120)
            from rbak.format.reader import read_segment
            from rbak.storage import open_storage

            st = open_storage(str(store))
            lags = []
            for mtime, tick in ticks(store):
                for ts in tick.streams:
                    for seg in ts.segments:
                        for _, r in read_segment(st, seg):
                            lags.append(mtime - struct.unpack(">d", r.body[:8])[0])
            print(f"lag ({broker.name}, {rate:g} msg/s x 1 KiB, {seconds:g} s, max_delay_secs 5): {len(lags)} of {n} "
                  f"records; p50 {percentile(lags, .5):.2f} s, p99 {percentile(lags, .99):.2f} s (target <= 5), "
                  f"p99.9 {percentile(lags, .999):.2f} s (target <= 15)")
    finally:
        broker.delete_vhost(vh)


def throughput(broker, messages: int) -> None:
    vh = unique_name("bench")
    broker.create_vhost(vh)
    try:
        fast_publish(broker, vh, "tp", (b"y" * BODY for _ in range(messages)), declare={"x-queue-type": "stream"})
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url(vh)))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=2000)
        got, t0 = 0, time.monotonic()
        for method, _props, _body in ch.consume("tp", arguments={"x-stream-offset": "first"}, inactivity_timeout=5):
            if method is None:
                break
            got += 1
            if got % 1000 == 0:
                ch.basic_ack(method.delivery_tag, multiple=True)
            if got >= messages:
                break
        bare = got / (time.monotonic() - t0)
        conn.close()
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "store"
            t0 = time.monotonic()
            a, t = start(config(broker, vh, store))
            while named_records(store) < messages and time.monotonic() - t0 < 600:
                time.sleep(0.2)
            took = time.monotonic() - t0
            a.stop()
            t.join(120)
        ours = messages / took
        print(f"throughput ({broker.name}, {messages} x 1 KiB): bare pika {bare:,.0f} msg/s, rbak archive "
              f"{ours:,.0f} msg/s (start-up included): ratio {ours / bare:.2f} (target >= 0.8)")
    finally:
        broker.delete_vhost(vh)


def idle(broker, streams: int, seconds: float) -> None:
    vh = unique_name("bench")
    broker.create_vhost(vh)
    try:
        for i in range(streams):
            broker.declare_queue(vh, f"idle-{i}", arguments={"x-queue-type": "stream"})
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "store"
            a, t = start(config(broker, vh, store))
            time.sleep(5)  # started: its first tick is written
            since = time.time()
            time.sleep(seconds)
            until = time.time()
            a.stop()
            t.join(120)
            files = [p for p in store.rglob("*") if p.is_file()]
            data = [p for p in files if "/queues/" in str(p)]
            meta = sum(1 for p in files if p not in data and since <= p.stat().st_mtime < until)
            per_hour = meta * 3600 / (until - since)
            naive = streams * 3600 / 5
            print(f"idle ({broker.name}, {streams} streams, {seconds:g} s after start-up): {len(data)} data objects, "
                  f"{meta} metadata writes = {per_hour:.0f}/hour (target <= 120); one object per stream per 5 s tick "
                  f"would be {naive:.0f}/hour")
    finally:
        broker.delete_vhost(vh)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", default="rmq43", choices=list(BROKERS), help="a CI broker by id, not a URL")
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--idle-streams", type=int, default=20)
    ap.add_argument("--idle-seconds", type=float, default=65)
    ap.add_argument("--only", choices=("lag", "throughput", "idle"))
    a = ap.parse_args()
    broker = BROKERS[a.broker]
    if a.only in (None, "lag"):
        lag(broker, a.rate, a.seconds)
    if a.only in (None, "throughput"):
        throughput(broker, a.messages)
    if a.only in (None, "idle"):
        idle(broker, a.idle_streams, a.idle_seconds)


if __name__ == "__main__":
    main()
