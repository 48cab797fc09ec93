"""spark/restore.py against the real local RabbitMQ (a fresh vhost per test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from rbak.format.layout import BackupLayout
from rbak.config import ConnectionConfig
from rbak.restore.options import RestoreOptions
from rbak.restore.plan import plan_queue
from rbak.storage import open_storage
from rbak_spark.restore_job import RestoreUnit, group_units, main as restore_main, parse_args, run_restore_job, split_plan
from rbak_spark.synthetic import QueueSpec, write_backup

SPARK_DIR = Path(__file__).resolve().parents[2] / "spark"
START = 1_700_000_000_000


def options(broker, vhost, **kw) -> RestoreOptions:
    kw.setdefault("vhost_mapping", (("/", vhost),))
    return RestoreOptions(target=ConnectionConfig(amqp_url=broker.server_url(), management_url=broker.management_url),
                          **kw)


def ids(msgs) -> list[str]:
    return [m.properties.message_id for m in msgs]


# Both brokers; S3 once (the storage layer does not depend on the broker).
@pytest.mark.broker
@pytest.mark.parametrize("which,where", [("rmq310", "file"), ("rmq310", "s3"), ("rmq40", "file")])
def test_strict_restore_keeps_order_per_queue(spark, tmp_path, which, where, request):
    broker = request.getfixturevalue(which)
    vh = request.getfixturevalue("vhost_factory")(broker, "test-spark")
    url = f"file://{tmp_path}" if where == "file" else str(request.getfixturevalue("s3_bucket"))
    queues = [QueueSpec("/", "orders", 300), QueueSpec("/", "events", 120), QueueSpec("prod", "audit", 80)]
    m = write_backup(open_storage(url), "b1", queues, segment_max_bytes=3000)
    for q in queues:
        broker.declare_queue(vh, q.name)
    both = (("/", vh), ("prod", vh))
    out = run_restore_job(spark, url, options(broker, vh, backup_id="b1", vhost_mapping=both))
    assert out["ok"], out
    assert out["confirmed"] == m.total_messages == 500
    assert {r["runs"] for r in out["runs"]} == {1}
    for q in queues:
        msgs = broker.drain_queue(vh, q.name)
        assert ids(msgs) == [f"{q.name}-{i}" for i in range(q.messages)]  # each once, in backup order
        assert msgs[3].properties.headers == {"seq": 3, "origin": "synthetic"}
    # a rerun of the finished restore publishes nothing (stored progress says done)
    again = run_restore_job(spark, url, options(broker, vh, backup_id="b1", vhost_mapping=both))
    assert {r["status"] for r in again["runs"]} == {"already-done"} and again["published"] == 0
    assert broker.message_count(vh, "orders") == 0


def test_window_mapping_and_dry_run_use_the_cli_plan(spark, target, tmp_path):
    broker, vh = target
    url = f"file://{tmp_path}"
    write_backup(open_storage(url), "b2", [QueueSpec("/", "orders", 200)], segment_max_bytes=3000)
    broker.declare_queue(vh, "orders-copy")
    argv = ["--path", url, "--backup-id", "b2", "--target-amqp-url", broker.server_url(),
            "--vhost-map", f"/={vh}", "--queue-map", "orders=orders-copy",
            "--time-window-start", str(START + 50_000), "--time-window-end", "2023-11-14T22:15:29Z"]  # i in 50..129
    assert restore_main(argv + ["--dry-run"]) == 0
    assert broker.message_count(vh, "orders-copy") == 0
    assert restore_main(argv) == 0
    msgs = broker.drain_queue(vh, "orders-copy")
    assert ids(msgs) == [f"orders-{i}" for i in range(50, 130)]


def test_the_target_url_vhost_and_mapping_checks_are_the_clis(spark, target, tmp_path):
    broker, vh = target
    url = f"file://{tmp_path}"
    write_backup(open_storage(url), "b7", [QueueSpec("/", "orders", 30)], segment_max_bytes=3000)
    broker.declare_queue(vh, "orders")
    base = ["--path", url, "--backup-id", "b7", "--target-management-url", broker.management_url]
    # a mapping key that names nothing and a URL vhost that disagrees with the mapping: exit 2, nothing published
    assert restore_main(base + ["--target-amqp-url", broker.server_url(), "--vhost-map", f"prod={vh}"]) == 2
    assert restore_main(base + ["--target-amqp-url", broker.amqp_url(vh), "--vhost-map", "/=elsewhere"]) == 2
    assert broker.message_count(vh, "orders") == 0
    # the URL's vhost is the target of this single-vhost backup
    assert restore_main(base + ["--target-amqp-url", broker.amqp_url(vh)]) == 0
    assert ids(broker.drain_queue(vh, "orders")) == [f"orders-{i}" for i in range(30)]


def test_relaxed_splits_a_large_queue_and_says_so(spark, target, tmp_path):
    broker, vh = target
    url = f"file://{tmp_path}"
    m = write_backup(open_storage(url), "b3", [QueueSpec("/", "big", 400)], segment_max_bytes=3000)
    broker.declare_queue(vh, "big")
    lines = []
    out = run_restore_job(spark, url, options(broker, vh, backup_id="b3"), ordering="relaxed", log=lines.append)
    assert out["ok"], out
    assert [r["runs"] for r in out["runs"]] == [2, 2]
    assert any("split into 2 runs" in n and "NOT restored in backup order" in n for n in out["notes"])
    assert lines == [f"restore plan: vhost '/' -> {vh!r} (restore.vhost_mapping)"] + out["notes"]  # said while running
    assert out["targets"] == [f"vhost '/' -> {vh!r} (restore.vhost_mapping)"]
    got = ids(broker.drain_queue(vh, "big"))
    assert sorted(got) == sorted(f"big-{i}" for i in range(400))  # every message once
    # each run is in order on its own
    plan_runs = split_plan(plan_queue(m.queues[0], options(broker, vh, backup_id="b3")), 2)
    for run in plan_runs:
        first = sum(s.record_count for s in m.queues[0].segments if s.sequence < run.segments[0].sequence)
        mine = [x for x in got if first <= int(x.split("-")[1]) < first + run.candidate_records]
        assert mine == [f"big-{i}" for i in range(first, first + run.candidate_records)]


def test_killed_driver_then_rerun_delivers_each_message_once_in_order(spark, target, tmp_path):
    broker, vh = target
    url = f"file://{tmp_path}"
    queues = [QueueSpec("/", f"q{i}", 4000, 16) for i in range(3)]
    write_backup(open_storage(url), "b4", queues, segment_max_bytes=20_000)
    for q in queues:
        broker.declare_queue(vh, q.name)
    argv = ["--path", url, "--backup-id", "b4", "--target-amqp-url", broker.server_url(), "--vhost-map", f"/={vh}",
            "--publish-mode", "queue", "--batch-size", "20"]
    proc = subprocess.Popen([sys.executable, str(SPARK_DIR / "restore.py"), *argv, "--master", "local[2]"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    storage = open_storage(url)
    prefix = BackupLayout("b4").state("spark-restore/")
    deadline = time.monotonic() + 300
    try:
        while True:
            assert proc.poll() is None, "the restore finished before it could be killed: " + proc.stdout.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no restore progress appeared"
            runs = [orjson.loads(storage.get(k)) for k in storage.list(prefix) if "/run-" in k]
            if any(r["confirmed"] >= 200 for r in runs):
                break
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started (JVM, Python workers)
        proc.wait()
    time.sleep(1)
    landed = sum(broker.message_count(vh, q.name) for q in queues)
    assert 0 < landed < 12_000
    assert restore_main(argv) == 0
    for q in queues:
        assert ids(broker.drain_queue(vh, q.name)) == [f"{q.name}-{i}" for i in range(q.messages)]


def test_config_file_drives_the_spark_restore(spark, target, tmp_path, capsys):
    """The rbak YAML config (as the operator mounts it) with flags overriding it."""
    broker, vh = target
    store = tmp_path / "store"
    write_backup(open_storage(f"file://{store}"), "b5", [QueueSpec("/", "orders", 60), QueueSpec("/", "skip", 5)],
                 segment_max_bytes=3000, prefix="team")
    broker.declare_queue(vh, "orders")
    cfg = tmp_path / "rbak.yaml"
    cfg.write_text(
        "mode: restore\n"
        "backup_id: b5\n"
        f"target: {{amqp_url: '{broker.server_url()}', management_url: '{broker.management_url}'}}\n"
        f"storage: {{backend: filesystem, path: '{store}', prefix: team}}\n"
        "restore:\n"
        "  publish_mode: queue\n"
        f"  vhost_mapping: {{'/': '{vh}'}}\n"
        "  queues: {include: [orders]}\n"
        f"  time_window_end: {START + 39_000}\n"
    )
    assert restore_main(["--config", str(cfg), "--time-window-start", str(START + 10_000)]) == 0
    assert ids(broker.drain_queue(vh, "orders")) == [f"orders-{i}" for i in range(10, 40)]
    assert restore_main(["--config", str(cfg), "--vhost-map", "nope"]) == 2  # a bad flag is a config error
    # a file that names no backup_id takes --backup-id's, as `rbak restore --config F --backup-id ID` does
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text(cfg.read_text().replace("backup_id: b5\n", ""))
    capsys.readouterr()
    assert restore_main(["--config", str(unnamed), "--backup-id", "b5", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "restore b5 (dry run): nothing published" in lines, lines
    assert f"  //orders -> {vh}/orders: 40 record(s) would be published, 20 outside the window" in lines, lines


def test_runs_are_grouped_into_tasks_of_at_most_n_balanced_by_records():
    """Several runs share a task (one publisher thread each): every run once, at most N per task,
    the biggest runs in different tasks."""
    from types import SimpleNamespace

    sizes = [900, 800, 100, 100, 50, 50, 40, 10]
    units = [RestoreUnit(SimpleNamespace(candidate_records=n, label=f"q{i}"), True, 0, 1) for i, n in enumerate(sizes)]
    tasks = group_units(units, 3)
    assert len(tasks) == 3 and all(1 <= len(t) <= 3 for t in tasks)
    assert sorted(u.plan.label for t in tasks for u in t) == sorted(f"q{i}" for i in range(8))
    assert not any({"q0", "q1"} <= {u.plan.label for u in t} for t in tasks)
    assert [[u.plan.label] for u in units] == [[u.plan.label for u in t] for t in group_units(units, 1)]
    assert group_units([], 4) == []
    assert parse_args(["--publishers-per-task", "2"]).publishers_per_task == 2
    with pytest.raises(SystemExit):
        parse_args(["--publishers-per-task", "0"])


def test_one_publisher_per_task_still_restores_in_order(spark, target, tmp_path):
    """``--publishers-per-task 1`` (one task per queue) and the default (queues share a task) give the same queues."""
    broker, vh = target
    url = f"file://{tmp_path}"
    queues = [QueueSpec("/", f"p{i}", 300, 16) for i in range(5)]
    write_backup(open_storage(url), "b6", queues, segment_max_bytes=2_000)
    for per_task in (1, 3):
        for q in queues:
            broker.declare_queue(vh, q.name)
        out = run_restore_job(spark, url, options(broker, vh, backup_id="b6"), progress_id=f"pt{per_task}",
                              publishers_per_task=per_task)
        assert out["ok"] and out["confirmed"] == 1500
        for q in queues:
            assert ids(broker.drain_queue(vh, q.name)) == [f"{q.name}-{i}" for i in range(300)]


def test_a_record_over_the_targets_max_message_size_refuses_then_is_skipped(spark, rmq43, vhost_factory, tmp_path):
    """Issue 45: the driver refuses before any executor publishes, naming size, limit and setting; with
    allow_oversize_skip the executors restore the rest and each skipped record is in the summary."""
    import dataclasses

    from rbak.errors import RestoreError
    from support.restores import build_backup, make_records

    limit = 16 * 1024 * 1024  # 4.x's default max_message_size
    vh = vhost_factory(rmq43, "test-spark")
    url = f"file://{tmp_path}"
    bodies = [b"a-0", b"B" * (limit + 1), b"a-2"]
    build_backup(open_storage(url), "big", [("/", "big", "classic", make_records("/", "big", bodies, every_type=False))],
                 max_bytes=64 << 20)
    rmq43.declare_queue(vh, "big")
    opts = options(rmq43, vh, backup_id="big")
    with pytest.raises(RestoreError, match=f"has a {limit + 1}-byte body, over the target's max_message_size {limit} "):
        run_restore_job(spark, url, opts, progress_id="size-1")
    assert rmq43.message_count(vh, "big") == 0  # nothing published
    out = run_restore_job(spark, url, dataclasses.replace(opts, allow_oversize_skip=True), progress_id="size-2")
    assert out["ok"] and out["confirmed"] == 2, out
    (run,) = out["runs"]
    assert [o["index"] for o in run["oversize_skipped"]] == [1] and run["oversize_skipped"][0]["bytes"] == limit + 1
    assert rmq43.read_bodies(vh, "big") == [b"a-0", b"a-2"]
