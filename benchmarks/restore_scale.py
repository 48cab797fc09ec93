"""Restore scale against baselines measured in the same run (issue 20).

    python benchmarks/restore_scale.py parallel [--broker rmq310] [--per-queue 10000]   (issue: 4 x 100,000)
    python benchmarks/restore_scale.py memory   [--broker rmq310] [--messages 10000]    (issue: 100,000 vs 1,000,000)

- parallel: a backup of 4 queues of M x 1 KiB (default 128 MiB segments, zstd).
  Baseline: one bare pipelined pika publisher (500 in flight, confirms) publishing
  the same 4 x M bodies. rbak restores the 4 queues with ``max_concurrent_queues`` 4
  (each queue's order kept). Ratio rate(rbak, 4 queues) / rate(one publisher),
  target >= 1.6 on 2 cores. Also printed: rbak with ``max_concurrent_queues`` 1.
- memory: peak RSS (VmHWM) of a restore subprocess (``benchmarks/restore.py``'s rbak
  phase, default 128 MiB segments) of a backup of 10 x N vs N messages.
  Ratio big/small, target <= 1.3.

Every phase runs in its own child process; the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_common import BROKER_HELP, Broker, load, verdict

RESTORE_BENCH = str(HERE / "restore.py")


def build_backup(store: str, backup_id: str, queues: list[str], n: int, size: int, vhost: str = "/") -> None:
    """A backup of ``vhost`` with ``n`` messages in each of ``queues`` (core SegmentWriter, zstd)."""
    from restore import bodies  # benchmarks/restore.py

    from rbak.format.compression import Compression
    from rbak.format.manifest import BackupManifest, QueueBackup
    from rbak.format.record import BackupProperties, BackupRecord
    from rbak.format.segment_writer import SegmentWriter
    from rbak.format.layout import BackupLayout
    from rbak.storage import open_storage

    storage = open_storage(f"file://{store}")
    layout = BackupLayout(backup_id)
    now = int(time.time() * 1000)
    props = BackupProperties(delivery_mode=2)
    qbs = []
    for q in queues:
        qb = QueueBackup(vhost=vhost, name=q)
        w = SegmentWriter(lambda seq, data, q=q: _put(storage, layout.segment(vhost, q, seq, Compression.ZSTD), data),
                          Compression.ZSTD)
        for i, b in enumerate(bodies(n, size)):
            m = w.append(BackupRecord(body=b, properties=props, routing_key=q, backed_up_at=now + i // 1000,
                                      source_queue=q))
            if m:
                qb.add_segment(m)
        m = w.flush()
        if m:
            qb.add_segment(m)
        qbs.append(qb)
    man = BackupManifest(backup_id=backup_id, created_at=now, completed_at=now, queues=qbs)
    man.recompute_totals()
    storage.put(layout.manifest, man.to_json())


def _put(storage, key, data):
    storage.put(key, data)
    return key


def depth_and_delete(broker: Broker, vh: str, queue: str) -> int:
    with pika.BlockingConnection(broker.params(vh)) as c:
        ch = c.channel()
        d = ch.queue_declare(queue, passive=True).method.message_count
        ch.queue_delete(queue)
    return d


def declare(broker: Broker, vh: str, queues: list[str]) -> None:
    with pika.BlockingConnection(broker.params(vh)) as c:
        ch = c.channel()
        for q in queues:
            ch.queue_declare(q, durable=True)


def run_child(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=3600, check=False)
    if r.returncode:
        raise SystemExit(f"child {args[:3]} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def pika_one_publisher(broker: Broker, vh: str, n: int) -> float:
    declare(broker, vh, ["pika"])
    d = run_child([RESTORE_BENCH, "--phase", "pika-pipelined", "--messages", str(n), "--size", "1024",
                   "--vhost-url", broker.amqp_url(vh), "--queue", "pika"])
    assert depth_and_delete(broker, vh, "pika") == n
    return d["secs"]


def rbak_restore(broker: Broker, vh: str, store: str, backup_id: str, queues: list[str], n: int, workers: int) -> float:
    declare(broker, vh, queues)
    d = run_child([__file__, "_restore_child", "--broker", broker.id, "--vhost", vh, "--store", store,
                   "--backup-id", backup_id, "--workers", str(workers)])
    for q in queues:
        got = depth_and_delete(broker, vh, q)
        assert got == n, (q, got, n)
    return d["secs"]


def restore_child(a, broker: Broker) -> None:
    from rbak.restore import run_restore
    from rbak.restore.options import RestoreOptions, local_target
    from rbak.storage import open_storage

    opts = RestoreOptions(backup_id=a.backup_id, publish_mode="queue", max_concurrent_queues=a.workers,
                          checkpoint_state=os.path.join(a.store, f"cp-{uuid.uuid4().hex}.db"),
                          vhost_mapping=(("/", a.vhost),),
                          target=local_target(broker.amqp_url(a.vhost), broker.mgmt_url))
    t = time.perf_counter()
    s = run_restore(open_storage(f"file://{a.store}"), opts)
    secs = time.perf_counter() - t
    assert s.ok, s.to_json_obj()
    print(json.dumps({"secs": secs, "messages": s.confirmed}))


def cmd_parallel(a, broker: Broker) -> None:
    m = a.per_queue
    queues = [f"q{i}" for i in range(4)]
    with broker.vhost() as vh, tempfile.TemporaryDirectory(prefix="rbak-bench-") as tmp:
        build_backup(tmp, "par", queues, m, 1024)
        print(f"restore of 4 queues x {m} x 1 KiB on {broker.id} {broker.version()} ({os.cpu_count()} cores)")
        ratios = []
        for i in range(a.repeat):
            base = pika_one_publisher(broker, vh, 4 * m)
            four = rbak_restore(broker, vh, tmp, "par", queues, m, 4)
            one = rbak_restore(broker, vh, tmp, "par", queues, m, 1)
            ratios.append(base / four)
            print(f"  run {i + 1}: one pika publisher {4 * m / base:,.0f} msg/s, rbak 4 queues in parallel "
                  f"{4 * m / four:,.0f} msg/s (ratio {base / four:.2f}), rbak 1 worker {4 * m / one:,.0f} msg/s "
                  f"(ratio {base / one:.2f})  [{load()}]", flush=True)
        verdict(f"restore 4 queues in parallel vs one publisher {broker.id}", statistics.median(ratios), 1.6,
                detail="runs " + ", ".join(f"{r:.2f}" for r in ratios))


def cmd_memory(a, broker: Broker) -> None:
    small = a.messages
    peaks = {}
    with broker.vhost() as vh, tempfile.TemporaryDirectory(prefix="rbak-rss-") as tmp:
        for count in (small, small * 10):
            store = os.path.join(tmp, str(count))
            build_backup(store, "mem", ["bench"], count, 1024)
            q = f"mem-{count}"
            declare(broker, vh, [q])
            d = run_child([RESTORE_BENCH, "--phase", "rbak", "--messages", str(count), "--size", "1024",
                           "--vhost-url", broker.amqp_url(vh), "--queue", q, "--vhost", vh,
                           "--amqp-url", broker.amqp_url(vh), "--management-url", broker.mgmt_url,
                           "--store", store, "--backup-id", "mem"])
            assert depth_and_delete(broker, vh, q) == count
            peaks[count] = d["rss_mib"]
            print(f"  backup of {count:>8} x 1 KiB ({count / 1024:.0f} MiB): restore peak RSS {d['rss_mib']:.1f} MiB "
                  f"({d['secs']:.1f}s)  [{load()}]", flush=True)
    verdict(f"restore memory {small * 10} vs {small} msgs {broker.id}", peaks[small * 10] / peaks[small], 1.3,
            at_most=True, detail=f"{peaks[small]:.0f} -> {peaks[small * 10]:.0f} MiB")


COMMANDS = {"parallel": cmd_parallel, "memory": cmd_memory, "_restore_child": restore_child}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=sorted(COMMANDS))
    ap.add_argument("--broker", default="rmq310", choices=["rmq310", "rmq40", "rmq43"], help=BROKER_HELP)
    ap.add_argument("--messages", type=int, default=10_000, help="memory: the small backup's messages")
    ap.add_argument("--per-queue", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--vhost", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--backup-id", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    COMMANDS[a.command](a, Broker(a.broker))
    return 0


if __name__ == "__main__":
    sys.exit(main())
