"""SIGKILL a real `rbak restore` mid-way, rerun it: every message exactly once, in order."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml
from support.restores import build_backup, consume_all, declare, make_records, storage_for

N = 12_000


def _confirmed(db: str) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            row = c.execute("SELECT COALESCE(SUM(confirmed), 0) FROM queue_progress").fetchone()
            return row[0]
    except sqlite3.Error:
        return 0


def _kill_mid_restore(broker, vhost, tmp_path, qtype, kill_after: int):
    """A real `rbak restore` of N records, SIGKILLed once the checkpoint holds ``kill_after`` confirms
    (0: as soon as the queue is started). Returns (command to rerun, checkpoint path, bodies)."""
    storage = storage_for(tmp_path)
    bodies = [b"body-%06d" % i for i in range(N)]
    stream = qtype == "stream"
    build_backup(storage, "kill", [(vhost, "jobs", qtype, make_records(vhost, "jobs", bodies, every_type=False,
                                                                       stream=stream))],
                 max_bytes=256 * 1024)
    declare(broker, vhost, "jobs", qtype)
    db = str(tmp_path / "restore-checkpoint.db")
    cfg = {
        "mode": "restore",
        "backup_id": "kill",
        "target": {"amqp_url": broker.server_url(), "management_url": broker.management_url,
                   "stream_port": broker.stream_port},
        "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
        "restore": {"publish_mode": "queue", "checkpoint_state": db, "produce_batch_size": 500},
    }
    cfg_path = tmp_path / "restore.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "rbak", "restore", "--config", str(cfg_path), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while (_confirmed(db) < kill_after) if kill_after else not _started(db):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "restore made no progress"
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _confirmed(db) < N, "the restore finished before it could be killed"
    return cmd, db, bodies


def _started(db: str) -> bool:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            return c.execute("SELECT COUNT(*) FROM queue_progress").fetchone()[0] > 0
    except sqlite3.Error:
        return False


@pytest.mark.parametrize("qtype", ["classic", "quorum", "stream"])
def test_sigkill_mid_restore_then_rerun_publishes_each_message_exactly_once(broker, vhost, tmp_path, qtype):
    cmd, db, bodies = _kill_mid_restore(broker, vhost, tmp_path, qtype, kill_after=2000)
    rerun = subprocess.run(cmd, capture_output=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr.decode()
    (q,) = json.loads(rerun.stdout)["queues"]
    assert q["status"] == "restored" and q["confirmed"] == N
    assert q["resumed_from"] is not None
    got = consume_all(broker, vhost, "jobs", N, stream=qtype == "stream", extra_wait=1.0)
    assert len(got) == N  # no duplicate
    assert [d.body for d in got] == bodies  # no gap, same order


@pytest.mark.parametrize("kill_after", [0, 300, 7000])
def test_stream_restore_killed_at_any_point_then_killed_again_ends_exactly_once(broker, vhost, tmp_path, kill_after):
    """A stream's depth cannot tell what a killed run left: the stream's own offsets do."""
    cmd, db, bodies = _kill_mid_restore(broker, vhost, tmp_path, "stream", kill_after=kill_after)
    second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    before = _confirmed(db)
    deadline = time.monotonic() + 60
    while _confirmed(db) < before + 500 and second.poll() is None:
        assert time.monotonic() < deadline, "the resumed restore made no progress"
        time.sleep(0.002)
    if second.poll() is None:
        os.kill(second.pid, signal.SIGKILL)
    second.wait()
    rerun = subprocess.run(cmd, capture_output=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr.decode()
    (q,) = json.loads(rerun.stdout)["queues"]
    assert q["confirmed"] == N
    got = consume_all(broker, vhost, "jobs", N, stream=True, extra_wait=1.0)
    assert [d.body for d in got] == bodies  # each exactly once, in order


def test_stream_resume_refuses_when_another_publisher_wrote_after_the_kill(broker, vhost, tmp_path):
    cmd, db, _bodies = _kill_mid_restore(broker, vhost, tmp_path, "stream", kill_after=1000)
    time.sleep(1.0)  # the killed run's last messages settle
    with broker.connect(vhost) as conn:
        conn.channel().basic_publish("", "jobs", b"not from the backup")
    before = len(consume_all(broker, vhost, "jobs", 0, stream=True, extra_wait=1.0))
    rerun = subprocess.run(cmd, capture_output=True, timeout=120)
    assert rerun.returncode != 0
    err = rerun.stderr.decode()
    assert "another publisher" in err and "'jobs'" in err, err
    assert len(consume_all(broker, vhost, "jobs", 0, stream=True, extra_wait=1.0)) == before  # nothing published


def test_stream_deleted_and_declared_again_before_the_resume_is_refused(broker, vhost, tmp_path):
    cmd, db, _bodies = _kill_mid_restore(broker, vhost, tmp_path, "stream", kill_after=1000)
    with broker.connect(vhost) as conn:
        conn.channel().queue_delete("jobs")
    declare(broker, vhost, "jobs", "stream")
    rerun = subprocess.run(cmd, capture_output=True, timeout=120)
    assert rerun.returncode != 0
    err = rerun.stderr.decode()
    assert "deleted and declared again" in err and "'jobs'" in err, err
    assert consume_all(broker, vhost, "jobs", 0, stream=True, extra_wait=1.0) == []


def test_restore_into_a_non_empty_stream_is_refused_on_every_version(broker, vhost, tmp_path):
    """3.10 reports a stream's depth as 0: the non-empty check reads the stream's offsets instead."""
    storage = storage_for(tmp_path)
    build_backup(storage, "ne", [(vhost, "s", "stream", make_records(vhost, "s", [b"a", b"b"], every_type=False,
                                                                     stream=True))])
    declare(broker, vhost, "s", "stream")
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "s", b"already here")
    cfg = {
        "mode": "restore", "backup_id": "ne",
        "target": {"amqp_url": broker.server_url(), "management_url": broker.management_url,
                   "stream_port": broker.stream_port},
        "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
        "restore": {"publish_mode": "queue"},
    }
    cfg_path = tmp_path / "restore.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    run = subprocess.run([sys.executable, "-m", "rbak", "restore", "--config", str(cfg_path)], capture_output=True,
                         timeout=120)
    assert run.returncode != 0
    assert "already holds" in run.stderr.decode() and "'s'" in run.stderr.decode()
    assert [d.body for d in consume_all(broker, vhost, "s", 1, stream=True, extra_wait=1.0)] == [b"already here"]
