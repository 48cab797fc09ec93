"""Deep validation throughput: one process (``rbak validate --deep``) vs Spark local[1] / local[2].

    python benchmarks/spark_validate.py [--dir /tmp/rbak-bench-validate] [--gb 1.0]

Writes (once; reused while its manifest is there) a backup of at least
``--gb`` GB of uncompressed record bytes with rbak's segment writer (lz4,
random 2 KiB bodies, 64 MiB segments (rbak's default is 128 MiB), 8 queues), then times in this one run:

* ``rbak.repo.validate.validate_backup(deep=True)`` in this process, with the
  CLI's default ``--workers 4`` threads (what ``rbak validate --deep`` runs);
* ``spark/validate.py``'s ``run_validate`` at ``local[1]`` and ``local[2]``
  (session start-up excluded, one warm-up on a tiny backup first).

Prints MB/s of uncompressed record bytes and the ratios against the targets
(local[2] >= 1.6x local[1]; local[1] >= 0.7x the single process). It is a
measurement, not a test: it exits 0 whatever the figures, 1 only if a
validation itself fails.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "spark"))

from rbak.repo.catalog import load_manifest
from rbak.errors import NotFoundError
from rbak.format.compression import Compression
from rbak.storage import open_storage
from rbak.repo.validate import validate_backup
from rbak_spark.synthetic import QueueSpec, write_backup

BACKUP_ID = "bench-validate"
BODY = 2048
SEGMENT_BYTES = 64 * 1024 * 1024  # Spark's per-task cost (~50 ms) stays small against a segment's check


def ensure_backup(url: str, gb: float, segment_bytes: int = SEGMENT_BYTES):
    storage = open_storage(url)
    try:
        m = load_manifest(storage, BACKUP_ID)
        if m.uncompressed_bytes >= gb * 1e9:
            return m
    except NotFoundError:
        pass
    per_record = BODY * 3.6 + 400  # a random byte is ~3.6 JSON characters; plus properties/headers
    n = int(gb * 1e9 / per_record * 1.03) + 1
    queues = [QueueSpec("/", f"bench-{i}", n // 8 + 1, BODY) for i in range(8)]
    t = time.perf_counter()
    m = write_backup(storage, BACKUP_ID, queues, compression=Compression.LZ4,
                     segment_max_bytes=segment_bytes, random_bodies=True)
    print(f"wrote {m.total_segments} segments, {m.total_messages} records, "
          f"{m.uncompressed_bytes / 1e9:.2f} GB uncompressed, {m.total_bytes / 1e9:.2f} GB stored "
          f"in {time.perf_counter() - t:.0f}s")
    return m


def time_spark(master: str, url: str, warm_url: str, repeat: int) -> tuple[float, float]:
    """Best wall time of ``repeat`` runs, and the executors' summed check time in that run."""
    from rbak_spark.session import get_session
    from rbak_spark.validate_job import run_validate
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    spark = get_session(f"bench-{master}", master, {"spark.ui.enabled": "false"})
    run_validate(spark, warm_url, "warm", write_report=False)  # starts the Python workers
    best = (float("inf"), 0.0)
    for _ in range(repeat):
        t = time.perf_counter()
        out = run_validate(spark, url, BACKUP_ID, write_report=False)
        elapsed = time.perf_counter() - t
        if not out["ok"]:
            raise SystemExit(f"Spark validation at {master} failed: {out['all_problems'][:5]}")
        best = min(best, (elapsed, sum(seg["seconds"] for seg in out["segments"])))
    spark.stop()
    return best


def _burn(_: int) -> float:
    data = b"x" * (32 << 20)
    t = time.perf_counter()
    for _ in range(8):
        hashlib.sha256(data).digest()
    return time.perf_counter() - t


def cpu_scaling() -> float:
    """How much two processes of pure CPU work gain over one right now (2.0 on two idle cores).

    The machine is shared; this tells whether local[2] could have scaled.
    """
    import multiprocessing

    one = _burn(0)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        t = time.perf_counter()
        pool.map(_burn, [0, 1])
        two = time.perf_counter() - t
    return 2 * one / two


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="where the backup is written (default /tmp/rbak-bench-validate-<MiB>m)")
    ap.add_argument("--segment-mib", type=int, default=SEGMENT_BYTES >> 20)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=2, help="runs per contender (best kept: the machine is shared)")
    args = ap.parse_args()
    url = "file://" + os.path.abspath(args.dir or f"/tmp/rbak-bench-validate-{args.segment_mib}m")
    m = ensure_backup(url, args.gb, args.segment_mib << 20)
    warm_url = url + "-warm"
    ws = open_storage(warm_url)
    if not ws.exists("warm/manifest.json"):
        write_backup(ws, "warm", [QueueSpec("/", "w", 10)])
    size = m.uncompressed_bytes
    print(f"backup: {m.total_segments} segments, {size / 1e9:.2f} GB uncompressed record bytes, "
          f"{m.total_bytes / 1e9:.2f} GB stored, {os.cpu_count()} CPUs")

    print(f"load average before: {os.getloadavg()}; CPU scaling 1->2 processes now: {cpu_scaling():.2f}x")
    single = float("inf")
    for _ in range(args.repeat):
        t = time.perf_counter()
        report = validate_backup(open_storage(url), BACKUP_ID, deep=True, workers=4)
        single = min(single, time.perf_counter() - t)
        if not report.ok:
            print(f"single-process validation failed: {report.all_problems()[:5]}")
            return 1
    l1, c1 = time_spark("local[1]", url, warm_url, args.repeat)
    l2, c2 = time_spark("local[2]", url, warm_url, args.repeat)
    print(f"load average after: {os.getloadavg()}; CPU scaling 1->2 processes now: {cpu_scaling():.2f}x")

    def mbps(sec: float) -> float:
        return size / 1e6 / sec

    print(f"single process (rbak validate --deep, 4 threads): {single:7.1f}s {mbps(single):8.1f} MB/s")
    print(f"spark local[1]:                                  {l1:7.1f}s {mbps(l1):8.1f} MB/s (tasks {c1:.1f}s)")
    print(f"spark local[2]:                                  {l2:7.1f}s {mbps(l2):8.1f} MB/s (tasks {c2:.1f}s)")
    r21, r1s = l1 / l2, single / l1
    print(f"local[2] / local[1] = {r21:.2f}x (target >= 1.6x): {'met' if r21 >= 1.6 else 'NOT met'}")
    print(f"local[1] / single   = {r1s:.2f}x (target >= 0.7x): {'met' if r1s >= 0.7 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
