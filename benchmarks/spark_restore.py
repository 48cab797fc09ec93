"""Spark restore of 8 queues vs the ``rbak restore`` CLI of the same backup, same broker, same run (issue 20).

    python benchmarks/spark_restore.py [--broker rmq310] [--per-queue 20000] [--masters 'local[2]'] [--repeat 2]

A backup of 8 queues of M x 1 KiB (rbak's SegmentWriter, zstd, default 128 MiB
segments) is written once; then, alternating, in pairs:

* the CLI: ``python -m rbak restore --publish-mode queue`` in a child process
  (its defaults: ``max_concurrent_queues`` 4 threads, 500 confirms in flight per
  queue); the figure is its wall time, interpreter start-up included, and the
  summary's own ``duration_secs`` is printed too;
* Spark: ``spark/restore.py``'s ``run_restore_job`` (``--ordering strict``) at each
  ``--masters`` and each ``--per-task`` (``publishers_per_task``: 1 = one task per
  queue; 2, the job's default, = two queues per task on two threads) in this process, on a session made before the
  timing and warmed by a one-message restore (Spark's start-up, ~5-10 s here, is a
  fixed cost paid once per application: printed, not in the ratio).

Each run restores into 8 freshly declared durable queues of the same vhost and
is checked (depth == M for every queue) before they are deleted. Ratio =
CLI seconds / Spark seconds, target >= 1.5. The load average is printed beside
every figure, and the CPU time of the broker's OS process (``/proc``) and of
rbak's processes over each run, to show where the 2 cores went.
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
sys.path.insert(0, str(HERE.parent / "spark"))
sys.path.insert(0, str(HERE))

from bench_common import BROKER_HELP, Broker, broker_pid, cpu_secs, load, verdict
from restore_scale import build_backup, declare

QUEUES = [f"sq{i}" for i in range(8)]


def children_cpu() -> float:
    """CPU of this process, its reaped children and its live descendants (Spark's JVM, its Python workers)."""
    t = os.times()
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parents[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    tree, grew = {os.getpid()}, True
    while grew:
        new = {p for p, pp in parents.items() if pp in tree and p not in tree}
        tree |= new
        grew = bool(new)
    return t.user + t.system + t.children_user + t.children_system + sum(
        cpu_secs(p) for p in tree if p != os.getpid())


def check_and_delete(broker: Broker, vh: str, n: int) -> None:
    with pika.BlockingConnection(broker.params(vh)) as c:
        ch = c.channel()
        for q in QUEUES:
            d = ch.queue_declare(q, passive=True).method.message_count
            if d != n:
                raise SystemExit(f"queue {q}: {d} messages after the restore, expected {n}")
            ch.queue_delete(q)


def cli_restore(broker: Broker, vh: str, store: str, backup_id: str) -> tuple[float, float]:
    """(wall seconds of ``python -m rbak restore``, its own duration_secs)."""
    cmd = [sys.executable, "-m", "rbak", "restore", "--path", store, "--backup-id", backup_id,
           "--target-url", broker.amqp_url(vh), "--management-url", broker.mgmt_url, "--publish-mode", "queue",
           "--checkpoint", os.path.join(store, f"cp-{uuid.uuid4().hex}.db"), "--json", "--no-progress"]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(f"rbak restore failed ({r.returncode}):\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout)
    return wall, float(out.get("duration_secs") or out.get("seconds") or 0.0)


def options(broker: Broker, vh: str, backup_id: str):
    from rbak.restore.options import RestoreOptions, local_target

    return RestoreOptions(backup_id=backup_id, publish_mode="queue",
                          target=local_target(broker.amqp_url(vh), broker.mgmt_url))


def spark_session(master: str):
    from pyspark.sql import SparkSession
    from rbak_spark.session import get_session

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    return get_session(f"bench-restore-{master}", master, {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})


def spark_restore(spark, broker: Broker, vh: str, store: str, backup_id: str, per_task: int = 1) -> float:
    from rbak_spark.restore_job import run_restore_job

    t = time.perf_counter()
    out = run_restore_job(spark, f"file://{store}", options(broker, vh, backup_id), "strict",
                          progress_id="bench-" + uuid.uuid4().hex[:8], log=lambda *_: None,
                          publishers_per_task=per_task)
    secs = time.perf_counter() - t
    if not out["ok"]:
        raise SystemExit(f"Spark restore failed: {[r.get('error') for r in out['runs'] if r.get('error')]}")
    return secs


def reaped_cpu() -> float:
    """CPU of this process's reaped children (the CLI child, once it has exited)."""
    t = os.times()
    return t.children_user + t.children_system


def measure(label: str, broker: Broker, fn) -> tuple[float, str]:
    """fn's result and where the CPU went: the broker, and rbak (the CLI child alone, or
    for Spark this process with its JVM and Python workers; the idle JVM is not billed to the CLI)."""
    rbak_cpu = reaped_cpu if label == "cli" else children_cpu
    bpid = broker_pid(broker)
    b0, r0 = cpu_secs(bpid), rbak_cpu()
    secs = fn()
    b1, r1 = cpu_secs(bpid), rbak_cpu()
    split = f"broker CPU {b1 - b0:.1f}s, rbak CPU {r1 - r0:.1f}s" if bpid else f"rbak CPU {r1 - r0:.1f}s"
    return secs, split


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", default="rmq310", choices=["rmq310", "rmq40", "rmq43"], help=BROKER_HELP)
    ap.add_argument("--per-queue", type=int, default=20_000)
    ap.add_argument("--masters", default="local[2]", help="comma-separated Spark masters to time")
    ap.add_argument("--per-task", default="1,2", help="comma-separated publishers_per_task values to time")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    broker = Broker(a.broker)
    n = a.per_queue
    masters = [m.strip() for m in a.masters.split(",") if m.strip()]
    per_task = [int(k) for k in a.per_task.split(",")]
    with broker.vhost() as vh, tempfile.TemporaryDirectory(prefix="rbak-bench-spark-") as store:
        t = time.perf_counter()
        build_backup(store, "b8", QUEUES, n, 1024, vhost=vh)
        build_backup(store, "warm", ["warm"], 1, 16, vhost=vh)
        print(f"backup: 8 queues x {n:,} x 1 KiB ({8 * n * 1024 / 2**20:.0f} MiB of bodies) written in "
              f"{time.perf_counter() - t:.1f}s; {broker.id} {broker.version()}, {os.cpu_count()} cores", flush=True)
        results: dict[str, list[tuple[float, float]]] = {f"{m} x{k}": [] for m in masters for k in per_task}
        for m in masters:
            t = time.perf_counter()
            spark = spark_session(m)
            declare(broker, vh, ["warm"])
            spark_restore(spark, broker, vh, store, "warm")  # starts the Python workers
            with pika.BlockingConnection(broker.params(vh)) as c:
                c.channel().queue_delete("warm")
            print(f"{m}: session start and warm-up {time.perf_counter() - t:.1f}s (not in the ratio)", flush=True)
            for i in range(a.repeat):
                for k in per_task:
                    declare(broker, vh, QUEUES)
                    (cli, own), csplit = measure("cli", broker, lambda: cli_restore(broker, vh, store, "b8"))
                    check_and_delete(broker, vh, n)
                    declare(broker, vh, QUEUES)
                    sp, ssplit = measure("spark", broker,
                                         lambda k=k, s=spark: spark_restore(s, broker, vh, store, "b8", k))
                    check_and_delete(broker, vh, n)
                    results[f"{m} x{k}"].append((cli, sp))
                    print(f"  run {i + 1}: CLI {cli:.2f}s ({8 * n / cli:,.0f} msg/s; its own duration {own:.2f}s; "
                          f"{csplit}), Spark {m}, {k} publisher(s) per task {sp:.2f}s ({8 * n / sp:,.0f} msg/s; "
                          f"{ssplit}): ratio {cli / sp:.2f}  [{load()}]", flush=True)
            spark.stop()
        for m, pairs in results.items():
            ratios = [c / s for c, s in pairs]
            verdict(f"Spark {m} publishers per task, restore of 8 x {n} vs the CLI {broker.id}", statistics.median(ratios), 1.5,
                    detail="runs " + ", ".join(f"{r:.2f}" for r in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
