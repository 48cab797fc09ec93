"""``rbak archive``: lag percentiles, throughput against a bare client, and metadata writes when idle.

On one CI broker (``--broker rmq310|rmq40|rmq43``, default rmq43), in private vhosts deleted
afterwards. ``--storage file`` (default: each object's mtime is when it became durable) or
``--storage s3``: a moto server of the benchmark's own (``moto_server`` in a process of its own, or
``--s3-endpoint URL``), reached over HTTP as AWS would be; a tick's durable time is when a LIST
every 50 ms first saw it (late by at most that and the LIST).

1. lag (``--only lag``): ``--rate`` msg/s (default 1,000) of 1 KiB for ``--seconds`` (default 30) on one
   stream, each body carrying its publish time, ``--publishers`` processes sharing the rate; the
   archiver runs as ``rbak archive`` in a process of its own with the default ``max_delay_secs`` (5).
   A record's lag is the durable time of the first tick naming its segment minus its publish time
   (what the issue asks: publish -> durable and named). Prints p50 / p99 / p99.9 beside the targets
   (p99 <= 5 s, p99.9 <= 15 s), the load average, and a bare pika consumer's lag (publish ->
   received) on the same stream in the same run. ``--only scale`` is the same over
   ``--scale-streams`` streams at ``--scale-rate`` msg/s each, with the archiver's RSS and threads.
2. throughput: ``--messages`` (default 100,000) x 1 KiB already in a stream. Baseline: a bare pika
   consumer (prefetch 2,000, ``x-stream-offset: first``) reading them all, in the same run. Then the
   archiver from scratch (``max_delay_secs: 1``, so its progress is seen every second) until every
   record is named by a tick. Its sustained rate is the records named between its first tick naming
   any and the tick naming the last, over the time between them; the rate with its start-up and
   last tick included is printed too. Ratios beside the target (>= 0.8). File backend.
3. idle: ``--idle-streams`` (default 20) streams with nothing published, the archiver running for
   ``--idle-seconds`` (default 65): the objects it writes, extrapolated to an hour, beside what one
   object per stream per tick would cost (target <= 120 metadata writes per hour, 0 data objects).

    python benchmarks/archive.py --only lag --broker rmq43 --storage s3 --rate 5000 --seconds 30
    python benchmarks/archive.py --only scale --broker rmq310 --storage file --scale-streams 50 --scale-rate 100
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import struct
import subprocess
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
from support.s3 import FAKE_ENV, create_bucket, s3_client

from rbak.archive.archiver import Archiver
from rbak.broker.stream_end import stream_end
from rbak.config import Config
from rbak.format.archive import Tick

BODY = 1024


def paced_publish(broker, vhost: str, queues: list[str], rate: float, seconds: float,
                  halt: threading.Event | None = None) -> tuple[int, float]:
    """Publish 1 KiB bodies stamped with their publish time, round robin over ``queues``, at ``rate`` msg/s
    for ``seconds`` (or until ``halt``), on rbak's own connection in 5 ms slots (pika's blocking publish
    could not reach 5,000 msg/s here): (messages, the rate achieved)."""
    raw = b"".join(pika.BasicProperties().encode())
    pad = b"x" * (BODY - 8)
    n, t0 = 0, time.monotonic()
    with broker.wire(vhost, heartbeat=0) as conn:
        ch = conn.channel()
        while time.monotonic() - t0 < seconds and not (halt is not None and halt.is_set()):
            due = int((time.monotonic() - t0) * rate)
            while n < due:
                ch.publish("", queues[n % len(queues)], raw, struct.pack(">d", time.time()) + pad, flush=False)
                n += 1
            conn.flush()
            conn.pump(lambda: False, timeout=0.0)
            time.sleep(0.005)
    return n, n / (time.monotonic() - t0)


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


def bare_follower(broker, vhost: str, queue: str, halt: threading.Event, lags: list[float]) -> None:
    """The baseline of the lag: a bare pika consumer following the same stream in the same run, its lag
    publish -> received (no storage at all)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url(vhost)))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2000)
    got = 0
    for method, _props, body in ch.consume(queue, arguments={"x-stream-offset": "next"}, inactivity_timeout=1):
        if method is None:
            if halt.is_set():
                break
            continue
        lags.append(time.time() - struct.unpack(">d", body[:8])[0])
        got += 1
        if got % 1000 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)
    conn.close()


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
            t0 = time.time()
            a, t = start(config(broker, vh, store, max_delay_secs=1))  # a tick a second: the slope is seen
            while named_records(store) < messages and time.time() - t0 < 600:
                time.sleep(0.2)
            took = time.time() - t0
            a.stop()
            t.join(120)
            steps, n = [], 0
            for mtime, tick in ticks(store):
                n += sum(s.record_count for st in tick.streams for s in st.segments)
                steps.append((mtime, n))
        ours = messages / took
        named = [(m, k) for m, k in steps if k > 0]
        (ta, na), (tb, nb) = named[0], next((m, k) for m, k in named if k >= messages)
        how = "records named from its first tick with records to its last"
        if tb > ta and nb > na:
            sustained = (nb - na) / (tb - ta)
        else:  # all named by one tick (a small run): no slope to take
            sustained, how = ours, "one tick named them all: start-up included"
        print(f"throughput ({broker.name}, {messages} x 1 KiB): bare pika {bare:,.0f} msg/s; rbak archive "
              f"(max_delay_secs 1) sustained {sustained:,.0f} msg/s ({how}): ratio {sustained / bare:.2f} "
              f"(target >= 0.8); start-up and the last tick included "
              f"{ours:,.0f} msg/s: ratio {ours / bare:.2f}")
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


class Outage:
    """A storage that can be made unreachable: every call fails while ``down`` is set (as S3 does when
    the network to it is cut), then passes through again."""

    def __init__(self, inner):
        self._inner = inner
        self.down = threading.Event()

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self.down.is_set():
                from rbak.errors import StorageError

                raise StorageError(f"{self._inner.url}: unreachable (benchmark outage)")
            return attr(*args, **kwargs)

        return call


def catchup(broker, rate: float, outage: float) -> None:
    """A steady ``rate`` msg/s of 1 KiB on one stream; the storage unreachable for ``outage`` s; then the
    time until the lag (now minus recoverable-until) is back under 5 s, and the drain rate meanwhile
    (records named after the storage returned, over that time) against the ingest rate (target: lag
    under 5 s within 5 minutes after 10 minutes away at 2,000 msg/s, i.e. draining at >= 3x)."""
    from rbak.storage import open_storage

    vh = unique_name("bench")
    broker.create_vhost(vh)
    halt = threading.Event()
    try:
        broker.declare_queue(vh, "cu", arguments={"x-queue-type": "stream"})
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "store"
            store.mkdir()
            flaky = Outage(open_storage(str(store)))
            a = Archiver(config(broker, vh, store, retry_secs=2), storage=flaky)  # type: ignore[arg-type]
            t = threading.Thread(target=a.run, daemon=True)
            t.start()
            while a.state != "archiving":
                time.sleep(0.1)
            sent = [0]

            def publish() -> None:
                sent[0], _ = paced_publish(broker, vh, ["cu"], rate, 1e9, halt)

            pub = threading.Thread(target=publish, daemon=True)
            pub.start()
            began = time.monotonic()
            time.sleep(10)
            flaky.down.set()
            time.sleep(outage)
            flaky.down.clear()
            up, named_up = time.monotonic(), named_records(store)
            peak = 0.0
            while True:
                w = a.summary.recoverable_until
                lag = time.time() - w / 1000 if w else float("inf")
                peak = max(peak, lag) if lag != float("inf") else peak
                if lag < 5 and time.monotonic() - up > 1:
                    break
                if time.monotonic() - up > max(600, 3 * outage):
                    break
                time.sleep(0.5)
            took = time.monotonic() - up
            named = named_records(store) - named_up
            halt.set()
            pub.join(30)
            ingest = sent[0] / (time.monotonic() - began)
            a.stop()
            t.join(120)
        print(f"catch-up ({broker.name}, {rate:g} msg/s x 1 KiB, storage unreachable {outage:g} s): lag "
              f"{'back under 5 s' if lag < 5 else f'still {lag:.0f} s'} {took:.0f} s after it returned (target: within "
              f"5 minutes after 10 minutes away); drained {named / took:,.0f} msg/s meanwhile against {ingest:,.0f} "
              f"msg/s published: {named / took / ingest:.1f}x (target >= 3x)")
    finally:
        halt.set()
        broker.delete_vhost(vh)


def proc_status(pid: int) -> tuple[float, int]:
    """(RSS in MiB, threads) of a process, from /proc."""
    rss, threads = 0.0, 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds a process has used so far (0 for none), from /proc."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class FileStore:
    """The file backend: a tick is durable at its file's mtime."""

    name = "file"

    def __init__(self, tmp: Path):
        self.root = tmp / "store"

    def section(self) -> dict:
        return {"backend": "filesystem", "path": str(self.root)}

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def open(self):
        from rbak.storage import open_storage

        return open_storage(str(self.root))

    def ticks(self) -> list[tuple[float, Tick]]:
        return ticks(self.root)


class S3Store:
    """A fresh bucket on a moto server: a tick is durable when a LIST first sees it (every 50 ms)."""

    name = "s3 (moto)"

    def __init__(self, endpoint: str):
        os.environ.update(FAKE_ENV)  # moto's fake credentials, for this process and the archiver's
        self.endpoint = endpoint
        self.bucket = create_bucket(endpoint, unique_name("bench"))
        self.seen: dict[str, float] = {}
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def section(self) -> dict:
        return {"backend": "s3", "bucket": self.bucket.bucket, "endpoint": self.endpoint, "path_style": True,
                "region": "us-east-1"}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(10)

    def _watch(self) -> None:
        c = s3_client(self.endpoint)
        gens: list[str] = []
        next_dirs = 0.0
        while not self._halt.wait(0.05):
            now = time.monotonic()
            if now >= next_dirs:
                r = c.list_objects_v2(Bucket=self.bucket.bucket, Delimiter="/")
                gens = [p["Prefix"] for p in r.get("CommonPrefixes", [])]
                next_dirs = now + 1.0
            for g in gens[-2:]:
                for page in c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket.bucket,
                                                                         Prefix=g + "archive/"):
                    t = time.time()
                    for o in page.get("Contents", []):
                        self.seen.setdefault(o["Key"], t)

    def open(self):
        from rbak.storage import open_storage

        return open_storage(self.bucket.url)

    def ticks(self) -> list[tuple[float, Tick]]:
        c = s3_client(self.endpoint)
        return sorted(((t, Tick.from_json(c.get_object(Bucket=self.bucket.bucket, Key=k)["Body"].read(), k))
                       for k, t in list(self.seen.items())), key=lambda x: x[0])


def moto_server() -> tuple[str, subprocess.Popen]:
    """A moto S3 server in a process of its own (not a thread: it would share the benchmark's GIL)."""
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    exe = shutil.which("moto_server") or "moto_server"
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    return f"http://127.0.0.1:{port}", proc


def _publisher(broker, vhost: str, queues: list[str], rate: float, seconds: float, out) -> None:
    out.put(paced_publish(broker, vhost, queues, rate, seconds))


def publish_in_processes(broker, vhost: str, queues: list[str], rate: float, seconds: float,
                         processes: int) -> tuple[int, float]:
    """``paced_publish`` split over ``processes`` (each a share of the streams, or of the rate when fewer
    streams than processes): (messages, the rate achieved, all together)."""
    if processes <= 1:
        return paced_publish(broker, vhost, queues, rate, seconds)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    shares = [queues[i::processes] or queues for i in range(processes)]
    procs = [ctx.Process(target=_publisher, args=(broker, vhost, share, rate / processes, seconds, out))
             for share in shares]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    got = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    n = sum(k for k, _ in got)
    return n, n / (time.monotonic() - t0)


def follow(broker, storage: str, streams: int, per_stream_rate: float, seconds: float, publishers: int,
           s3_endpoint: str | None, what: str) -> None:
    """``streams`` streams, each receiving ``per_stream_rate`` msg/s of 1 KiB (bodies stamped), archived by
    ``rbak archive`` in its own process (default settings): its RSS and threads sampled all along, its
    connections counted by the management API, the lag percentiles of every record, and a bare pika
    consumer following the first stream in the same run as the baseline."""
    vh = unique_name("bench")
    broker.create_vhost(vh)
    proc = None
    moto = None
    load0 = os.getloadavg()
    try:
        names = ["lag"] if streams == 1 else [f"s-{i:03d}" for i in range(streams)]
        with broker.wire(vh) as conn:
            ch = conn.channel()
            for n in names:
                ch.declare(n, durable=True, arguments={"x-queue-type": "stream"})
        with tempfile.TemporaryDirectory() as tmp:
            if storage == "s3":
                if s3_endpoint is None:
                    s3_endpoint, moto = moto_server()
                store: FileStore | S3Store = S3Store(s3_endpoint)
            else:
                store = FileStore(Path(tmp))
            cfg = Path(tmp) / "archive.json"
            cfg.write_text(json.dumps({
                "mode": "archive",
                "source": {"amqp_url": broker.amqp_url(vh), "management_url": broker.management_url,
                           "stream_port": broker.stream_port, "queues": {"vhosts": [vh]}},
                "storage": store.section(), "archive": {"name": "bench"}}))
            log = Path(tmp) / "archive.log"
            env = {**os.environ, **FAKE_ENV, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
            store.start()
            proc = subprocess.Popen([sys.executable, "-m", "rbak", "-vv", "archive", "--config", str(cfg)],
                                    stdout=subprocess.DEVNULL, stderr=open(log, "wb"), cwd=str(REPO), env=env)
            t0 = time.monotonic()
            while "follows" not in log.read_text() and time.monotonic() - t0 < 300 and proc.poll() is None:
                time.sleep(0.2)
            started = time.monotonic() - t0
            samples = [proc_status(proc.pid)]
            halt = threading.Event()
            bare_halt, bare_lags = threading.Event(), []
            bare = threading.Thread(target=bare_follower, args=(broker, vh, names[0], bare_halt, bare_lags),
                                    daemon=True)
            bare.start()
            time.sleep(1)

            def sample() -> None:
                while not halt.wait(2):
                    samples.append(proc_status(proc.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            cpu0 = cpu_seconds(proc.pid), cpu_seconds(moto.pid if moto else None), time.monotonic()
            n, achieved = publish_in_processes(broker, vh, names, per_stream_rate * streams, seconds, publishers)
            load1 = os.getloadavg()
            cpu1 = cpu_seconds(proc.pid), cpu_seconds(moto.pid if moto else None), time.monotonic()
            halt.set()
            sampler.join()
            conns = [c for c in broker.api("GET", "/api/connections") or [] if c.get("vhost") == vh]
            amqp = sum(1 for c in conns if "AMQP" in str(c.get("protocol")))

            def named() -> int:
                return sum(sg.record_count for _, t in store.ticks() for st in t.streams for sg in st.segments)

            # what the broker holds, exactly: each stream's last offset (the publishers count, unconfirmed,
            # a tail sent as they stop, which the broker may never have taken)
            def held_now() -> int:
                ends = [stream_end(broker.host, broker.stream_port, vh, x, broker.user, broker.password) for x in names]
                return sum(e.last_offset + 1 for e in ends if e is not None and not e.empty)

            held, before = held_now(), -1
            while held != before:  # until the last chunks are committed
                time.sleep(1)
                before, held = held, held_now()
            k, last, since = 0, -1, time.time()  # until all are named, or 20 s without progress
            while time.time() - since < 20:
                k = named()
                if k >= held:
                    break
                if k != last:
                    last, since = k, time.time()
                time.sleep(1)
            bare_halt.set()
            bare.join(30)
            proc.terminate()
            proc.wait(120)
            store.stop()
            if os.environ.get("ARCHIVE_BENCH_LOG"):  # the archiver's -vv log, kept for a look
                shutil.copy(log, os.environ["ARCHIVE_BENCH_LOG"])
            text = log.read_text().splitlines()
            took = [float(line.split(" took ")[1].split()[0]) for line in text if " took " in line]
            left = [int(line.split(", ")[-1].split()[0]) for line in text if " left to the next tick" in line]
            from rbak.format.reader import read_segment

            st = store.open()
            lags = [mtime - struct.unpack(">d", r.body[:8])[0] for mtime, tick in store.ticks() for ts in tick.streams
                    for seg in ts.segments for _, r in read_segment(st, seg)]
        rss = [r for r, _ in samples]
        print(f"{what} ({broker.name}, {store.name}, {streams} stream(s) x {per_stream_rate:g} msg/s x 1 KiB asked, "
              f"{achieved:,.0f} msg/s published by {publishers} process(es), {seconds:g} s; load average "
              f"{load0[0]:.2f} before, {load1[0]:.2f} at the end of publishing): started in {started:.1f} s; "
              f"{amqp} AMQP and {len(conns) - amqp} stream-protocol connection(s); threads peak "
              f"{max(t for _, t in samples)}; RSS {rss[0]:.0f} MiB at start, peak {max(rss):.0f} MiB; CPU while "
              f"publishing: archiver {(cpu1[0] - cpu0[0]) / (cpu1[2] - cpu0[2]):.0%} of a core"
              + (f", moto {(cpu1[1] - cpu0[1]) / (cpu1[2] - cpu0[2]):.0%}" if moto else ""))
        if took:
            print(f"  ticks: {len(took)}, each took p50 {percentile(took, .5):.2f} s, max {max(took):.2f} s; "
                  f"{sum(1 for k in left if k)} left a stream's segment to the next tick")
        print(f"  the streams hold {held:,} records (their last offsets, over the stream protocol) of the "
              f"{n:,} published; the archive named {k:,}" + ("" if k == held else f": {held - k:,} MISSING"))
        if lags:
            print(f"  lag publish -> durable and named: {len(lags)} of {n} records; p50 {percentile(lags, .5):.2f} s, "
                  f"p99 {percentile(lags, .99):.2f} s (target <= 5), p99.9 {percentile(lags, .999):.2f} s "
                  f"(target <= 15), max {max(lags):.2f} s")
        if bare_lags:
            print(f"  baseline, same run: a bare pika consumer following {names[0]!r} received {len(bare_lags)} with "
                  f"p50 {percentile(bare_lags, .5):.2f} s, p99 {percentile(bare_lags, .99):.2f} s, p99.9 "
                  f"{percentile(bare_lags, .999):.2f} s after their publish")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if moto is not None:
            moto.kill()
        broker.delete_vhost(vh)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", default="rmq43", choices=list(BROKERS), help="a CI broker by id, not a URL")
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--idle-streams", type=int, default=20)
    ap.add_argument("--idle-seconds", type=float, default=65)
    ap.add_argument("--scale-streams", type=int, default=50)
    ap.add_argument("--scale-rate", type=float, default=100, help="msg/s per stream in the scale part")
    ap.add_argument("--scale-seconds", type=float, default=30)
    ap.add_argument("--outage-rate", type=float, default=2000)
    ap.add_argument("--outage-seconds", type=float, default=600)
    ap.add_argument("--only", choices=("lag", "throughput", "idle", "scale", "catchup"))
    ap.add_argument("--storage", choices=("file", "s3"), default="file", help="lag and scale: file, or S3 on moto")
    ap.add_argument("--s3-endpoint", help="an S3 (moto) endpoint to use instead of starting one")
    ap.add_argument("--publishers", type=int, default=1, help="lag and scale: publisher processes sharing the rate")
    a = ap.parse_args()
    broker = BROKERS[a.broker]
    if a.only in (None, "lag"):
        follow(broker, a.storage, 1, a.rate, a.seconds, a.publishers, a.s3_endpoint, "lag")
    if a.only in (None, "throughput"):
        throughput(broker, a.messages)
    if a.only in (None, "idle"):
        idle(broker, a.idle_streams, a.idle_seconds)
    if a.only in (None, "scale"):
        follow(broker, a.storage, a.scale_streams, a.scale_rate, a.scale_seconds, a.publishers, a.s3_endpoint,
               "scale")
    if a.only in (None, "catchup"):
        catchup(broker, a.outage_rate, a.outage_seconds)


if __name__ == "__main__":
    main()
