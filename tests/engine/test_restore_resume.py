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

sys.path.insert(0, os.path.dirname(__file__))
from _restore_helpers import build_backup, consume_all, declare, make_records, storage_for  # noqa: E402

N = 12_000


def _confirmed(db: str) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            row = c.execute("SELECT COALESCE(SUM(confirmed), 0) FROM queue_progress").fetchone()
            return row[0]
    except sqlite3.Error:
        return 0


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_sigkill_mid_restore_then_rerun_publishes_each_message_exactly_once(broker, vhost, tmp_path, qtype):
    storage = storage_for(tmp_path)
    bodies = [b"body-%06d" % i for i in range(N)]
    build_backup(storage, "kill", [(vhost, "jobs", qtype, make_records(vhost, "jobs", bodies, every_type=False))],
                 max_bytes=256 * 1024)
    declare(broker, vhost, "jobs", qtype)
    db = str(tmp_path / "restore-checkpoint.db")
    cfg = {
        "mode": "restore",
        "backup_id": "kill",
        "target": {"amqp_url": broker.amqp_url("/"), "management_url": broker.management_url},
        "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
        "restore": {"publish_mode": "queue", "checkpoint_state": db, "produce_batch_size": 500},
    }
    cfg_path = tmp_path / "restore.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "rbak", "restore", "--config", str(cfg_path), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while _confirmed(db) < 2000:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "restore made no progress"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = _confirmed(db)
    assert at_kill < N, "the restore finished before it could be killed"
    rerun = subprocess.run(cmd, capture_output=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr.decode()
    (q,) = json.loads(rerun.stdout)["queues"]
    assert q["status"] == "restored" and q["confirmed"] == N
    assert q["resumed_from"] is not None
    got = consume_all(broker, vhost, "jobs", N, extra_wait=1.0)
    assert len(got) == N  # no duplicate
    assert [d.body for d in got] == bodies  # no gap, same order
