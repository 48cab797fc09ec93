"""spark/validate.py against real backups on local files and on the moto S3 server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
import sys

import orjson
import pytest

from rbak.format.compression import Compression
from rbak.format.record import BackupRecord
from rbak.format.segment import encode_segment
from rbak.format.layout import BackupLayout
from rbak.storage import open_storage
from rbak.repo.validate import validate_backup
from rbak_spark.synthetic import QueueSpec, write_backup
from rbak_spark.validate_job import run_validate

SPARK_DIR = Path(__file__).resolve().parents[2] / "spark"

QUEUES = [QueueSpec("/", "orders", 120, 300), QueueSpec("prod", "a/b c", 60, 200), QueueSpec("prod", "empty", 0)]
SEG = 12000  # bytes: ~10 segments, enough to damage four different ones


def _segments(m):
    return [s for q in m.queues for s in q.segments]


def corrupt(storage, m) -> dict[str, str]:
    """Damage four segments four ways; returns key -> a phrase its report must contain."""
    segs = _segments(m)
    bad = {}
    k = segs[1].key  # one flipped payload byte
    d = bytearray(storage.get(k))
    d[45] ^= 0x01
    storage.put(k, bytes(d))
    bad[k] = "CRC32 mismatch"
    k = segs[4].key  # truncated
    storage.put(k, storage.get(k)[:-3])
    bad[k] = "bad end magic"
    k = segs[-2].key  # missing
    storage.delete(k)
    bad[k] = "cannot read"
    k = segs[-1].key  # a valid segment, but not the one the manifest describes
    storage.put(k, encode_segment([BackupRecord(body=b"x", backed_up_at=1)], Compression.ZSTD))
    bad[k] = "record count mismatch: manifest says"
    return bad


def test_good_backup_on_files(spark, tmp_path):
    url = f"file://{tmp_path}"
    storage = open_storage(url)
    m = write_backup(storage, "b-good", QUEUES, segment_max_bytes=SEG)
    assert m.total_segments >= 8
    out = run_validate(spark, url, "b-good")
    assert out["ok"] is True and out["all_problems"] == []
    assert out["summary"]["segments"] == m.total_segments
    assert out["summary"]["records"] == m.total_messages == 180
    assert out["summary"]["uncompressed_bytes"] == m.uncompressed_bytes
    assert out["report_key"].startswith("b-good/validation/report-")
    stored = orjson.loads(storage.get(out["report_key"]))
    assert stored["ok"] is True
    assert [s["key"] for s in stored["segments"]] == [s.key for s in _segments(m)]


def test_every_bad_segment_found_on_s3(spark, s3_bucket):
    storage = open_storage(s3_bucket)
    m = write_backup(storage, "b-bad", QUEUES, segment_max_bytes=SEG)
    bad = corrupt(storage, m)
    out = run_validate(spark, s3_bucket, "b-bad", report_key="reports/b-bad.json")
    assert out["ok"] is False
    found = {s["key"]: s for s in out["segments"] if not s["ok"]}
    assert set(found) == set(bad)
    for key, phrase in bad.items():
        assert any(phrase in p for p in found[key]["problems"]), (key, found[key]["problems"])
    assert out["summary"]["bad_segments"] == 4
    assert out["summary"]["segments"] == m.total_segments  # the good ones were checked too
    # the report is where we asked, under the bucket's prefix, and says the same
    assert "backups/reports/b-bad.json" in s3_bucket.keys()
    assert orjson.loads(storage.get("reports/b-bad.json"))["all_problems"] == out["all_problems"]
    # exactly the findings of the single-process `rbak validate --deep` (one shared check)
    single = validate_backup(storage, "b-bad", deep=True)
    assert single.all_problems() == out["all_problems"]


@pytest.mark.slow  # starts its own Spark (a JVM): not for the quick lane
def test_script_exit_code_and_summary(tmp_path):
    """`python spark/validate.py` from another directory: non-zero exit, bad keys named."""
    url = f"file://{tmp_path / 'store'}"
    storage = open_storage(url)
    m = write_backup(storage, "b1", QUEUES[:1], segment_max_bytes=SEG, prefix="team")
    bad = corrupt(storage, m)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    p = subprocess.run(
        [sys.executable, str(SPARK_DIR / "validate.py"), "--path", url, "--backup-id", "b1", "--prefix", "team",
         "--master", "local[1]"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 1, p.stderr[-3000:]
    for key in bad:
        assert key in p.stdout
    assert "FAILED" in p.stdout
    reports = [k for k in storage.list("team/b1/validation/")]
    assert len(reports) == 1 and reports[0] == BackupLayout("b1", "team").validation_report(
        reports[0].rsplit("report-", 1)[1][: -len(".json")])


def test_an_unknown_backup_or_a_missing_path_exits_1_naming_it_as_rbak_validate_does(tmp_path):
    """Issue 45: spark.md's exit codes, run as a user runs the job (before Spark starts: no JVM)."""
    (tmp_path / "store").mkdir()
    cases = {"unknown backup": ([f"file://{tmp_path}/store", "nope"], "nope/manifest.json"),
             "missing path": ([f"file://{tmp_path}/nowhere", "b1"], "does not exist")}
    for what, ((path, bid), named) in cases.items():
        spark_job = subprocess.run([sys.executable, str(SPARK_DIR / "validate.py"), "--path", path,
                                    "--backup-id", bid], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        cli = subprocess.run([sys.executable, "-m", "rbak", "validate", "--path", path, "--backup-id", bid],
                             capture_output=True, text=True, timeout=120)
        assert spark_job.returncode == cli.returncode == 1, (what, spark_job.stderr[-2000:], cli.stderr)
        assert named in spark_job.stderr and named in cli.stderr, (what, spark_job.stderr[-2000:])
        assert "Traceback" not in spark_job.stderr, spark_job.stderr[-2000:]


@pytest.mark.parametrize("missing", ["--path", "--backup-id"])
def test_cli_requires_path_and_backup_id(missing):
    from rbak_spark.validate_job import parse_args

    argv = {"--path": ["--path", "file:///x"], "--backup-id": ["--backup-id", "b"]}
    args = [a for k, v in argv.items() if k != missing for a in v]
    with pytest.raises(SystemExit):
        parse_args(args)


def test_small_segments_share_balanced_tasks():
    from rbak_spark.validate_job import group_segments, task_count

    items = [("/", "q", {"key": f"k{i}", "size_bytes": size}) for i, size in enumerate([16 << 20] * 64 + [1000] * 7)]
    n = task_count(items, 2)
    assert n == 17  # ~64 MiB per task, not 71 tasks
    groups = group_segments(items, n)
    assert sorted(x[2]["key"] for g in groups for x in g) == sorted(x[2]["key"] for x in items)  # each exactly once
    loads = [sum(x[2]["size_bytes"] for x in g) for g in groups]
    assert max(loads) - min(loads) <= 16 << 20 and loads == sorted(loads, reverse=True)
    big = [("/", "q", {"key": f"b{i}", "size_bytes": 128 << 20}) for i in range(5)]
    assert task_count(big, 2) == 5  # large segments: one task each
