"""The Spark jobs on a continuous archive (issue 47): the ``rbak`` data source, the Spark restore and the
Spark validation on generations written by a real ``rbak archive`` of two streams on RabbitMQ 4.3.6.

The archive: generation 1 (closed by SIGTERM) holds A, generation 2 (closed) holds B, generation 3 is
still OPEN (the archiver SIGKILLed: ticks, no manifest.json) and holds C1 then C2, C2 in later segments.
``t1`` is taken after B was archived and before C1 was published, ``t2`` between C1 and C2: every record
of A and B is stamped at or before ``t1``, every record of C2 after ``t2``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rbak.config import ConnectionConfig
from rbak.errors import ConfigError
from rbak.format.manifest import StreamInfo
from rbak.repo.catalog import load_manifest
from rbak.restore.options import RestoreOptions
from rbak.storage import open_storage
from rbak_spark import restore_job, validate_job
from rbak_spark.datasource import read_backup
from rbak_spark.restore_job import run_restore_job
from rbak_spark.validate_job import run_validate
from support.archives import Archiver, archive_config, declare_stream, fs_storage, generations
from support.backups import fast_publish
from support.brokers import BROKERS, REPO, unique_name, wait_until
from test_encrypted import RING, encrypted_backup, with_executor_keys

STREAMS = ("audit", "orders")  # the data source's (vhost, queue) order
A = {"orders": [b"a-%d" % i for i in range(30)], "audit": [b"b-%d" % i for i in range(20)]}
B = {"orders": [b"a-%d" % i for i in range(30, 60)], "audit": [b"b-%d" % i for i in range(20, 30)]}
C1 = {"orders": [b"a-%d" % i for i in range(60, 80)], "audit": [b"b-%d" % i for i in range(30, 40)]}
C2 = {"orders": [b"a-%d" % i for i in range(80, 100)], "audit": [b"b-%d" % i for i in range(40, 45)]}


def join(*parts: dict) -> dict[str, list[bytes]]:
    return {s: [b for p in parts for b in p[s]] for s in STREAMS}


@dataclasses.dataclass
class Arc:
    broker: object
    vhost: str
    store: Path
    url: str
    gens: list[str]
    t1: int
    t2: int
    recoverable_until: int


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture(scope="module")
def arc(tmp_path_factory):
    broker = BROKERS["rmq43"]
    tmp = tmp_path_factory.mktemp("arc")
    vhost = unique_name("test-spark-arc")
    broker.create_vhost(vhost)
    try:
        for s in STREAMS:
            declare_stream(broker, vhost, s)
        cfg = archive_config(tmp, broker, vhost, fs_storage(tmp))
        path = str(tmp / "store")

        def publish(batch: dict) -> None:
            for s in STREAMS:
                fast_publish(broker, vhost, s, batch[s])

        def archived(n: int, what: str) -> None:
            wait_until(lambda: sum(g["total_messages"] for g in generations(path)) == n, timeout=120, what=what)

        publish(A)
        run = Archiver(cfg, tmp / "a1.log").running()
        archived(50, "A archived")
        run.stop()
        publish(B)
        run = Archiver(cfg, tmp / "a2.log").running()
        archived(90, "B archived")
        run.stop()
        t1 = now_ms()
        time.sleep(0.05)
        run = Archiver(cfg, tmp / "a3.log").running()
        publish(C1)
        archived(120, "C1 archived")
        t2 = now_ms()
        time.sleep(0.05)
        publish(C2)
        archived(145, "C2 archived")
        t3 = now_ms()
        # a tick probed after every record was read: the recoverable-until covers them all
        wait_until(lambda: (generations(path)[-1]["archive"]["recoverable_until"] or 0) > t3, timeout=120,
                   what="the recoverable-until to pass the last read")
        run.kill()  # SIGKILL: generation 3 stays open (ticks, no manifest)
        gens = generations(path)
        assert [(g["total_messages"], g["archive"]["open"]) for g in gens] == [(50, False), (40, False), (55, True)]
        assert not (tmp / "store" / gens[2]["backup_id"] / "manifest.json").exists()
        assert list((tmp / "store" / gens[2]["backup_id"] / "archive").glob("tick-*.json"))
        yield Arc(broker, vhost, tmp / "store", f"file://{tmp / 'store'}", [g["backup_id"] for g in gens], t1, t2,
                  gens[2]["archive"]["recoverable_until"])
    finally:
        broker.delete_vhost(vhost)


def by_stream(rows) -> dict[str, list[bytes]]:
    """Bodies per stream in archive order (segment_sequence, record_index)."""
    rows = sorted(rows, key=lambda r: (r.vhost, r.queue, r.segment_sequence, r.record_index))
    return {s: [bytes(r.body) for r in rows if r.queue == s] for s in STREAMS}


def test_data_source_reads_closed_and_open_generations_and_the_whole_archive(spark, arc, rmq43):
    closed = read_backup(spark, arc.url, arc.gens[1]).collect()
    assert by_stream(closed) == B
    assert {(r.vhost, r.queue_type) for r in closed} == {(arc.vhost, "stream")}
    assert all(r.segment_key.startswith(f"{arc.gens[1]}/queues/") for r in closed)

    opened = read_backup(spark, arc.url, arc.gens[2])  # no manifest.json: assembled from its ticks
    rows = opened.collect()
    assert by_stream(rows) == join(C1, C2)
    # time_window_end prunes C2's segments and gives exactly the records stamped at or before t2
    early = read_backup(spark, arc.url, arc.gens[2], time_window_end=arc.t2)
    assert by_stream(early.collect()) == C1
    assert 0 < early.rdd.getNumPartitions() < opened.rdd.getNumPartitions()
    # an instant inside C1 (a record's own stamp): inclusive, exactly the rows stamped at or before it
    t = sorted(r.backed_up_at_ms for r in rows)[12]
    want = by_stream([r for r in rows if r.backed_up_at_ms <= t])
    assert by_stream(read_backup(spark, arc.url, arc.gens[2], time_window_end=t).collect()) == want
    assert by_stream(opened.filter(opened.backed_up_at_ms <= t).collect()) == want  # pushed down

    # the archive as a whole: the newest generation and its chain, in order along the chain
    everything = read_backup(spark, arc.url, None, archive="arc")
    assert by_stream(everything.collect()) == join(A, B, C1, C2)
    assert by_stream(read_backup(spark, arc.url, None, archive="arc", time_window_end=arc.t1).collect()) == join(A, B)
    chained = read_backup(spark, arc.url, arc.gens[1], chain="true").collect()
    assert by_stream(chained) == join(A, B)
    with pytest.raises(Exception, match="not both"):
        read_backup(spark, arc.url, arc.gens[1], archive="arc").count()
    with pytest.raises(Exception, match="no generation of archive 'nope'.*archives there: 'arc'"):
        read_backup(spark, arc.url, None, archive="nope").count()


def read_back(broker, vhost: str) -> dict[str, list[bytes]]:
    return {s: [m.body for m in broker.read_stream(vhost, s, "first")] for s in STREAMS}


def fresh_vhost(arc: Arc, vhost_factory) -> str:
    v = vhost_factory(arc.broker, "test-spark")
    for s in STREAMS:
        declare_stream(arc.broker, v, s)
    return v


def options(arc: Arc, dst: str, **kw) -> RestoreOptions:
    b = arc.broker
    return RestoreOptions(backup_id=arc.gens[2], vhost_mapping=((arc.vhost, dst),),
                          target=ConnectionConfig(amqp_url=b.server_url(), management_url=b.management_url), **kw)


def test_spark_restore_walks_the_chain_and_honours_points_in_time(spark, arc, rmq43, vhost_factory, capsys,
                                                                  tmp_path):
    b = arc.broker
    # the open generation's whole chain, exactly in order
    f1 = fresh_vhost(arc, vhost_factory)
    out = run_restore_job(spark, arc.url, options(arc, f1))
    assert out["ok"] and out["confirmed"] == 145, out
    assert [r["chain"] for r in out["runs"]] == [arc.gens, arc.gens]
    assert read_back(b, f1) == join(A, B, C1, C2)

    # spark/restore.py as a user runs it: --archive NAME, --time-window-end recoverable
    f2 = fresh_vhost(arc, vhost_factory)
    argv = ["--path", arc.url, "--target-amqp-url", b.server_url(), "--target-management-url", b.management_url,
            "--vhost-map", f"{arc.vhost}={f2}", "--master", "local[2]"]
    assert restore_job.main([*argv, "--archive", "arc", "--time-window-end", "recoverable"]) == 0
    said = capsys.readouterr()
    assert f"from its newest generation {arc.gens[2]!r} (3 generation(s))" in said.err
    assert f"chain {' -> '.join(arc.gens)}" in said.out and "145 confirmed" in said.out
    assert read_back(b, f2) == join(A, B, C1, C2)

    # an earlier point in time: exactly the records stamped at or before it, the same as `rbak restore`'s;
    # --archive with a --config that names no backup_id, as `rbak restore --archive --config` takes it
    f3, f4 = fresh_vhost(arc, vhost_factory), fresh_vhost(arc, vhost_factory)
    cfg = restore_config(tmp_path, arc, f3, time_window_end=arc.t2)
    assert restore_job.main(["--config", str(cfg), "--archive", "arc", "--master", "local[2]"]) == 0
    said = capsys.readouterr()
    assert f"from its newest generation {arc.gens[2]!r} (3 generation(s))" in said.err
    assert f"chain {' -> '.join(arc.gens)}" in said.out and ": 120 confirmed" in said.out, said.out
    assert read_back(b, f3) == join(A, B, C1)
    cli = subprocess.run([sys.executable, "-m", "rbak", "restore", "--path", str(arc.store), "--archive", "arc",
                          "--pitr-end", str(arc.t2), "--target-url", b.amqp_url(f4), "--management-url",
                          b.management_url, "--json"], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert json.loads(cli.stdout)["confirmed"] == 120
    assert read_back(b, f4) == read_back(b, f3)

    # past the recoverable-until: refused before anything is published, as `rbak restore` refuses it
    f5 = fresh_vhost(arc, vhost_factory)
    with pytest.raises(ConfigError, match="after the archive's recoverable-until"):
        run_restore_job(spark, arc.url, options(arc, f5, window_end_ms=arc.recoverable_until + 1))
    assert restore_job.main([*argv, "--archive", "arc", "--backup-id", arc.gens[2]]) == 2
    assert "give either --archive or --backup-id" in capsys.readouterr().err
    named = restore_config(tmp_path, arc, f5, backup_id=arc.gens[1])
    assert restore_job.main(["--config", str(named), "--archive", "arc"]) == 2
    assert f"--archive arc: {named} names a backup_id; give one of the two" in capsys.readouterr().err
    # spark/restore.py, run as spark-submit runs it (from elsewhere, with nothing of this test's path), refuses the
    # point on the driver before its Spark session (a JVM) would start
    job = ("import runpy, sys\n"
           "sys.argv = sys.argv[1:]\n"
           "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
           "except SystemExit as e:\n    rc = e.code\n"
           "print('pyspark loaded' if 'pyspark' in sys.modules else 'no pyspark'); sys.exit(rc)")
    t0 = time.monotonic()
    late = subprocess.run([sys.executable, "-c", job, str(SPARK_RESTORE), *argv[:-2], "--archive", "arc",
                           "--time-window-end", str(arc.recoverable_until + 1)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert late.returncode == 2 and late.stdout == "no pyspark\n", (late.stdout, late.stderr[-3000:])
    assert "--time-window-end (restore.time_window_end): " in late.stderr
    assert "after the archive's recoverable-until" in late.stderr and time.monotonic() - t0 < 10
    assert read_back(b, f5) == {s: [] for s in STREAMS}


SPARK_RESTORE = REPO / "spark" / "restore.py"


def restore_config(tmp_path: Path, arc: Arc, dst: str, **top) -> Path:
    """A restore config of the archive's storage into ``dst``; ``top``: keys beside ``restore:`` (a
    ``backup_id``) or in it."""
    b = arc.broker
    restore = {"vhost_mapping": {arc.vhost: dst}, **{k: v for k, v in top.items() if k != "backup_id"}}
    cfg = tmp_path / f"restore-{dst}.yaml"
    cfg.write_text(json.dumps({
        "mode": "restore", "storage": {"backend": "filesystem", "path": str(arc.store)}, "restore": restore,
        "target": {"amqp_url": b.server_url(), "management_url": b.management_url},
        **({"backup_id": top["backup_id"]} if "backup_id" in top else {}),
    }))
    return cfg


def test_spark_validate_on_archive_generations(spark, arc, rmq43, tmp_path, capsys):
    for gen, records in ((arc.gens[1], 40), (arc.gens[2], 55)):
        out = run_validate(spark, arc.url, gen, write_report=False)
        assert out["ok"] is True and out["all_problems"] == [], out["all_problems"]
        assert out["summary"]["records"] == records
    # --archive NAME: its newest generation, named on stderr with the older ones it does not check
    assert validate_job.main(["--path", arc.url, "--archive", "arc", "--no-report", "--master", "local[2]"]) == 0
    said = capsys.readouterr()
    assert said.out.startswith(f"validate {arc.gens[2]} (local[2]): ") and ", 55 records, " in said.out, said.out
    assert said.out.splitlines()[0].endswith(": OK")
    assert (f"validating archive 'arc': its newest generation {arc.gens[2]!r}, its own segments; the 2 older "
            "generation(s) are not checked (--backup-id each)") in said.err
    assert validate_job.main(["--path", arc.url, "--archive", "nope", "--no-report"]) == 1
    assert "--archive nope: no generation of archive 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as both:
        validate_job.main(["--path", arc.url, "--archive", "arc", "--backup-id", arc.gens[2]])
    assert both.value.code == 2
    assert "argument --backup-id: not allowed with argument --archive" in capsys.readouterr().err
    # a damaged segment, in a closed and in the open generation (on a copy: the other tests read the archive)
    copy = tmp_path / "copy"
    shutil.copytree(arc.store, copy)
    storage = open_storage(f"file://{copy}")
    for gen in arc.gens[1:]:
        key = load_manifest(storage, gen).queues[0].segments[0].key
        data = bytearray(storage.get(key))
        data[len(data) // 2] ^= 0x01
        storage.put(key, bytes(data))
        assert validate_job.main(["--path", f"file://{copy}", "--backup-id", gen, "--no-report",
                                  "--master", "local[2]"]) == 1
        said = capsys.readouterr().out
        assert "FAILED" in said and key in said and "SHA-256 mismatch" in said, said


def test_data_source_chain_opens_each_link_as_its_own_backup(spark, tmp_path):
    """An encrypted chain (an encrypted archive's generations are one): each segment is sealed with its own
    backup's id in the AAD, so an earlier link's segments must be opened as that backup's, not the newest's."""
    url = f"file://{tmp_path}"
    storage = open_storage(url)
    for bid, prev in (("e1", None), ("e2", "e1")):
        m = encrypted_backup(url, bid)[1]
        for q in m.queues:
            n = q.message_count
            first = 0 if prev is None else n
            q.queue_type = "stream"
            q.stream = StreamInfo(first_offset=first, last_offset=first + n - 1, previous_backup=prev,
                                  previous_last_offset=None if prev is None else n - 1)
        storage.put(f"{bid}/manifest.json", m.to_json())
    try:
        with_executor_keys(spark, RING)
        rows = read_backup(spark, url, "e2", chain="true").collect()
    finally:
        with_executor_keys(spark, None)
    orders = sorted((r for r in rows if r.queue == "orders"), key=lambda r: (r.segment_sequence, r.record_index))
    assert [r.properties.message_id for r in orders] == [f"orders-{i}" for i in range(80)] * 2
    assert [r.segment_key.split("/")[0] for r in orders] == ["e1"] * 80 + ["e2"] * 80
    assert len(rows) == 240
