"""SIGKILL a real ``rbak backup`` process mid-run, rerun the same backup id: no gap, no duplicate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.backups import drain, fast_publish, load, records
from support.brokers import wait_until

REPO = Path(__file__).resolve().parents[2]


def _config(broker, vhost: str, tmp: Path) -> Path:
    p = tmp / "backup.yaml"
    p.write_text(f"""
mode: backup
backup_id: killed
source:
  amqp_url: {broker.amqp_url(vhost)}
  management_url: {broker.management_url}
  queues: {{vhosts: ["{vhost}"]}}
storage: {{backend: filesystem, path: "{tmp / 'store'}"}}
backup:
  include_definitions: false
  segment_max_bytes: 2048        # a segment every few records: many durable steps to die between
  max_concurrent_queues: 2
offset_storage: {{path: "{tmp / 'state' / 'offsets.db'}", sync_interval_secs: 0.5}}
""")
    return p


def _segments(store: Path, vhost_dir: str, queue: str) -> int:
    d = store / "killed" / "queues" / vhost_dir / queue
    return len(list(d.glob("segment-*"))) if d.is_dir() else 0


@pytest.mark.slow
def test_sigkill_mid_backup_then_resume(broker, vhost, tmp_path):
    n_stream, n_classic = 1500, 1000
    sbodies = [b"s-%05d" % i for i in range(n_stream)]
    cbodies = [b"c-%05d" % i for i in range(n_classic)]
    broker.declare_queue(vhost, "st", arguments={"x-queue-type": "stream"})
    fast_publish(broker, vhost, "st", sbodies)
    fast_publish(broker, vhost, "cq", cbodies, declare={})
    cfg = _config(broker, vhost, tmp_path)
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "rbak", "backup", "--config", str(cfg)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    deadline = time.time() + 120
    while _segments(store, vhost, "st") < 20:  # well into the stream, far from its end
        assert proc.poll() is None, f"backup ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
        assert time.time() < deadline, "the backup wrote no segments"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    m = load(store, "killed")
    assert m.completed_at is None  # incomplete manifest from the killed run
    assert _segments(store, vhost, "st") < n_stream // 12  # really killed mid-stream (~6 records a segment)

    # the classic queue lost nothing while the backup was dead (its messages went back in order)
    # (the broker returns them as it notices the dead connection: waited for, never fewer)
    wait_until(lambda: broker.message_count(vhost, "cq") == n_classic, timeout=120, what="cq's messages back")

    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    m = load(store, "killed")
    assert m.completed_at is not None
    srecs = records(store, m, vhost, "st")
    assert [x.body for x in srecs] == sbodies  # no gap, no duplicate, in order
    seqs = [s.sequence for s in m.find_queue(vhost, "st").segments]
    assert seqs == list(range(1, len(seqs) + 1))
    on_disk = sorted(p.name for p in (store / "killed" / "queues" / vhost / "st").glob("segment-*"))
    assert len(on_disk) == len(seqs)  # no orphan segment left by the killed run
    assert [x.body for x in records(store, m, vhost, "cq")] == cbodies
    assert [x[0] for x in drain(broker, vhost, "cq")] == cbodies
