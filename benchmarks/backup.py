"""Backup throughput vs a bare pika consumer, and peak RSS as the queue grows 10x.

On the local broker (3.10, amqp://guest:guest@localhost:5672, management 15672),
in a private vhost deleted afterwards:

1. throughput: ``--messages`` (default 100,000) messages of 1 KiB in a classic
   queue. Baseline: a bare pika consumer (prefetch 0, no ack) that receives
   every message and closes the channel, exactly the read a backup needs.
   Then ``rbak`` backs the same queue up to a temp directory (zstd level 3).
   Both run ``--repeat`` times, in back-to-back pairs; prints each pair's
   throughput ratio rbak/baseline and their median (target >= 0.9, issue 20), and the
   ratio of CPU seconds (which a machine busy with other work distorts less).
2. memory: the backup runs in a fresh subprocess for queues of N/10 and N
   messages (segment_max_bytes 8 MiB) and reports its peak RSS beside the
   queue's byte size (target: flat as the queue grows 10x).

    python benchmarks/backup.py [--messages 100000] [--repeat 2] [--skip-rss]
"""

from __future__ import annotations

import argparse
import statistics
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika
import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

AMQP = ("localhost", 5672)
MGMT = "http://localhost:15672/api"
AUTH = ("guest", "guest")
BODY = 1024


def make_vhost() -> str:
    vh = "bench-" + uuid.uuid4().hex[:8]
    requests.put(f"{MGMT}/vhosts/{vh}", auth=AUTH, timeout=30).raise_for_status()
    requests.put(f"{MGMT}/permissions/{vh}/guest", auth=AUTH, timeout=30,
                 json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
    return vh


def drop_vhost(vh: str) -> None:
    requests.delete(f"{MGMT}/vhosts/{vh}", auth=AUTH, timeout=60)


def params(vh: str) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(*AMQP, vh, pika.PlainCredentials(*AUTH))


def fill(vh: str, queue: str, n: int) -> int:
    """Publish n persistent 1 KiB messages with confirms (windowed); returns the queue's byte size."""
    from bench_common import publish_confirmed

    body = os.urandom(BODY // 2).hex().encode()
    with pika.BlockingConnection(params(vh)) as conn:
        conn.channel().queue_declare(queue, durable=True)
    publish_confirmed(AMQP[1], vh, ((queue, body) for _ in range(n)), host=AMQP[0])
    with pika.BlockingConnection(params(vh)) as conn:
        assert conn.channel().queue_declare(queue, passive=True).method.message_count == n
    return n * BODY


def bare_consumer(vh: str, queue: str, n: int) -> tuple[float, float]:
    """The baseline: receive all n messages unacked (prefetch 0), then close (requeues them).
    Returns (wall seconds, CPU seconds of this process)."""
    t0, c0 = time.perf_counter(), time.process_time()
    with pika.BlockingConnection(params(vh)) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=0)
        got = 0
        for method, _props, _body in ch.consume(queue, auto_ack=False, inactivity_timeout=30):
            assert method is not None, "baseline consumer starved"
            got += 1
            if got == n:
                break
        ch.close()
    return time.perf_counter() - t0, time.process_time() - c0


def rbak_backup(vh: str, store: str, backup_id: str, seg_bytes: int | None = None) -> tuple[float, int, float]:
    from rbak.backup import BackupEngine
    from rbak.config import Config

    backup = {"include_definitions": False}
    if seg_bytes:
        backup["segment_max_bytes"] = seg_bytes
    cfg = Config.from_dict({
        "mode": "backup", "backup_id": backup_id,
        "source": {"amqp_url": f"amqp://guest:guest@localhost:5672/{vh}", "management_url": "http://localhost:15672",
                   "queues": {"vhosts": [vh]}},
        "storage": {"backend": "filesystem", "path": store},
        "backup": backup,
        "offset_storage": {"path": os.path.join(store, "state.db"), "sync_interval_secs": 0},
    }, env={})
    t0, c0 = time.perf_counter(), time.process_time()
    s = BackupEngine(cfg).run()
    return time.perf_counter() - t0, s.total_messages, time.process_time() - c0


def rss_child(vh: str, store: str) -> None:
    secs, n, _cpu = rbak_backup(vh, store, "rss-" + uuid.uuid4().hex[:6], seg_bytes=8 * 1024 * 1024)
    # VmHWM belongs to this process image (ru_maxrss would include the forked parent before exec)
    peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(f"{n} {secs:.3f} {peak_kib}")


def main() -> int:
    from bench_common import BROKER_HELP

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=f"Broker: rmq310 always ({BROKER_HELP}).")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--rss-child", nargs=2, metavar=("VHOST", "STORE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rss_child:
        rss_child(*a.rss_child)
        return 0

    n = a.messages
    vh = make_vhost()
    try:
        with tempfile.TemporaryDirectory(prefix="rbak-bench-") as tmp:
            t = time.perf_counter()
            size = fill(vh, "bench", n)
            print(f"filled {n} x {BODY} B ({size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f}s")
            ratios, cpu_ratios = [], []
            for i in range(a.repeat):
                bw, bc = bare_consumer(vh, "bench", n)
                mw, got, mc = rbak_backup(vh, os.path.join(tmp, f"s{i}"), f"bench-{i}")
                assert got == n, got
                ratios.append(bw / mw)
                cpu_ratios.append(bc / mc)
                print(f"  run {i + 1}: bare pika {n / bw:,.0f} msg/s ({bc:.1f}s CPU), rbak backup {n / mw:,.0f} msg/s "
                      f"({mc:.1f}s CPU, compression thread included) -> ratio {bw / mw:.2f}")
            med = statistics.median(ratios)
            print(f"backup throughput ratio rbak/bare pika consumer: median of paired runs {med:.2f} "
                  f"(runs {', '.join(f'{r:.2f}' for r in ratios)}; target >= 0.9); CPU-time ratio "
                  f"{statistics.median(cpu_ratios):.2f}")

        if not a.skip_rss:
            print("peak RSS of a backup subprocess (segment_max_bytes 8 MiB):")
            for count in (n // 10, n):
                v2 = make_vhost()
                try:
                    qbytes = fill(v2, "rss", count)
                    with tempfile.TemporaryDirectory(prefix="rbak-rss-") as tmp:
                        out = subprocess.run([sys.executable, __file__, "--rss-child", v2, tmp], check=True,
                                             capture_output=True, text=True).stdout.split()
                    got, secs, kib = int(out[0]), float(out[1]), int(out[2])
                    assert got == count, (got, count)
                    print(f"  queue {count:>7} msgs, {qbytes / 2**20:7.1f} MiB -> peak RSS {kib / 1024:7.1f} MiB "
                          f"({secs:.1f}s)")
                finally:
                    drop_vhost(v2)
    finally:
        drop_vhost(vh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
