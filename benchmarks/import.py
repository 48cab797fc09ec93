"""Offline import throughput vs a plain sequential read of the same files (same run).

A private RabbitMQ 3.10.8 node (never the shared CI broker) writes the data:
one CQv1 and one CQv2 queue, each with messages big enough for the shared
message store (.rdq) and small ones embedded in the index / per-queue store,
``--size-mb`` in total (default 1024). The node is stopped cleanly, then:

1. baseline: read every file under ``msg_stores`` sequentially in 1 MiB
   chunks (page cache warmed first, so both sides read from memory);
2. decode only: the importer's readers (index, store, Erlang terms, AMQP
   properties) producing BackupRecords, nothing written;
3. decode + ``encode_record`` (the RBAK JSON of every record, no output):
   how much of the import the record format itself costs;
4. full import to ``file://`` with compression none and zstd.

Prints each throughput (MB of broker files per second) and its ratio to the
baseline; the issue's target is a full-import ratio >= 0.3.

    python benchmarks/import.py [--size-mb 1024] [--keep DIR] [--reuse DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pika

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "offline"))

from rabbitmq_private import PrivateNode  # noqa: E402

from rbak.format.record import encode_record  # noqa: E402
from rbak.offline.damage import ImportContext  # noqa: E402
from rbak.offline.rabbitmq_dir import import_rabbitmq_dir, iter_queues  # noqa: E402

BIG = 64 * 1024
SMALL = 1024


def generate(base: Path, size_mb: int) -> Path:
    node = PrivateNode("3.10", base).start()
    try:
        conn = node.connect()
        ch = conn.channel()
        per_queue = size_mb * 1024 * 1024 // 2
        for v in (1, 2):
            q = f"bench-v{v}"
            ch.queue_declare(q, durable=True, arguments={"x-queue-version": v})
            big_bytes = per_queue * 8 // 10
            n_big = big_bytes // BIG
            n_small = (per_queue - n_big * BIG) // SMALL
            props = pika.BasicProperties(delivery_mode=2, content_type="application/octet-stream",
                                         headers={"n": 1, "k": "v"})
            t = time.time()
            every = max(1, n_small // max(1, n_big))
            sent_big = 0
            for i in range(n_small):
                ch.basic_publish("", q, os.urandom(SMALL), props)  # distinct bodies: no free compression
                if i % every == 0 and sent_big < n_big:
                    ch.basic_publish("", q, os.urandom(BIG), props)
                    sent_big += 1
            for _ in range(n_big - sent_big):
                ch.basic_publish("", q, os.urandom(BIG), props)
            want = n_small + n_big
            while ch.queue_declare(q, durable=True, passive=True).method.message_count < want:
                time.sleep(0.5)
            print(f"published {want} messages ({n_big} x {BIG} B, {n_small} x {SMALL} B) to {q} "
                  f"in {time.time() - t:.1f} s", flush=True)
        conn.close()
        node.stop()
    except BaseException:
        node.cleanup()
        raise
    return node.data_dir


def files_of(data_dir: Path) -> list[Path]:
    return [p for p in sorted((data_dir / "msg_stores").rglob("*")) if p.is_file()]


def plain_read(files: list[Path]) -> int:
    n = 0
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
    return n


def timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--reuse", help="an existing node data dir (skip generation)")
    ap.add_argument("--keep", help="generate into this dir and keep it")
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="rbak-import-bench-"))
    try:
        if a.reuse:
            data_dir = Path(a.reuse)
        else:
            base = Path(a.keep) if a.keep else tmp / "node"
            data_dir = generate(base, a.size_mb)
        files = files_of(data_dir)
        total = sum(p.stat().st_size for p in files)
        mb = total / 1e6
        print(f"data dir {data_dir}: {len(files)} files, {mb:.0f} MB")

        plain_read(files)  # warm the page cache
        t_read = timed(lambda: plain_read(files), repeat=3)

        def decode_only():
            ctx = ImportContext()
            n = 0
            for _, recs in iter_queues(str(data_dir), ctx, 0):
                for _ in recs:
                    n += 1
            return n

        def decode_encode():
            # What the RBAK format itself costs: JSON of every record (bodies as integer arrays).
            ctx = ImportContext()
            n = 0
            for _, recs in iter_queues(str(data_dir), ctx, 0):
                for r in recs:
                    n += len(encode_record(r))
            return n

        t_decode = timed(decode_only)
        t_encode = timed(decode_encode)
        results = [("plain sequential read", t_read), ("decode only (no output)", t_decode),
                   ("decode + encode_record (JSON)", t_encode)]
        for comp in ("none", "zstd"):
            out = tmp / f"out-{comp}"
            t = time.perf_counter()
            res = import_rabbitmq_dir(str(data_dir), f"file://{out}", f"bench-{comp}", compression=comp)
            results.append((f"full import, compression {comp}", time.perf_counter() - t))
            print(f"  {comp}: {res.manifest.total_messages} messages, {res.manifest.total_bytes / 1e6:.0f} MB written")
            shutil.rmtree(out, ignore_errors=True)
        base_tp = mb / t_read
        print(f"\n{'step':32} {'seconds':>8} {'MB/s':>9} {'ratio vs read':>14}")
        for name, t in results:
            tp = mb / t
            print(f"{name:32} {t:8.2f} {tp:9.1f} {tp / base_tp:14.3f}")
        full = min(t for n, t in results if n.startswith("full"))
        ratio = t_read / full
        print(f"\nbest full-import ratio: {ratio:.3f} (target >= 0.3: {'met' if ratio >= 0.3 else 'NOT met'})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
