"""Classic queues read in worker processes (``backup.reader_processes``): same backup as threads,
children never outlive a SIGKILLed parent, and a run falls back to threads when no child starts."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from rbak.backup import BackupEngine
from rbak.backup import reader_process
from support.backups import backup_config, drain, fast_publish, load, records, wait_count
from support.brokers import wait_until

REPO = Path(__file__).resolve().parents[2]


def _fill(broker, vhost: str, queues: int, n: int) -> dict[str, list[bytes]]:
    out = {}
    for i in range(queues):
        name = f"rp-{i:03d}"
        bodies = [b"%s-%04d" % (name.encode(), j) for j in range(n)]
        props = pika.BasicProperties(delivery_mode=2, headers={"i": i, "tag": "x"}, message_id=f"m{i}")
        fast_publish(broker, vhost, name, bodies, declare={}, properties=props)
        out[name] = bodies
    return out


def test_processes_back_up_what_threads_do(broker, vhost, tmp_path, monkeypatch):
    monkeypatch.setattr(reader_process, "MIN_MESSAGES", 300)  # from the listing's depths (stats lag ~1 s)
    queues = _fill(broker, vhost, 5, 300)
    small = [b"small-%d" % i for i in range(5)]
    fast_publish(broker, vhost, "small", small, declare={})  # below MIN_MESSAGES: read by a thread
    wait_until(lambda: sum((q.get("messages") or 0) >= 300 for q in broker.list_queues(vhost)) == 5,
               what="management stats of the filled queues")
    queues["small"] = small
    summaries, engines = {}, {}
    for mode in (True, False):
        store = tmp_path / f"store-{mode}"
        eng = BackupEngine(backup_config(broker, vhost, store, "rp", tmp_path / f"st-{mode}.db",
                                         max_concurrent_queues=3, reader_processes=mode, segment_max_bytes=4096))
        summaries[mode], engines[mode] = eng.run(), eng
    assert engines[True]._child_connections > 0 and not engines[True]._readers_failed  # children did read
    assert engines[False]._child_connections == 0
    got = {}
    for mode, s in summaries.items():
        assert s.completed and not s.failed and s.total_messages == 5 * 300 + 5
        m = load(tmp_path / f"store-{mode}", "rp")
        for name, bodies in queues.items():
            recs = records(tmp_path / f"store-{mode}", m, vhost, name)
            assert [r.body for r in recs] == bodies  # queue order, nothing missing or doubled
            assert len(m.find_queue(vhost, name).segments) > (name != "small")  # several durable segments
            got[mode, name] = [(r.body, r.headers, r.properties) for r in recs]
    for name in queues:
        assert got[True, name] == got[False, name]  # the same records, properties and typed headers
        assert name == "small" or dict(got[True, name][0][1])["tag"] is not None
    assert engines[True].connections_opened <= 3 + 1  # children's (one per worker at most) and the thread's
    for name, bodies in queues.items():
        assert broker.message_count(vhost, name) == len(bodies)  # every message back in its queue
    assert [b for b, *_ in drain(broker, vhost, "rp-002")] == queues["rp-002"]


def test_no_child_falls_back_to_threads(broker, vhost, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(reader_process, "MIN_MESSAGES", 1)
    queues = _fill(broker, vhost, 3, 50)
    wait_until(lambda: sum((q.get("messages") or 0) >= 50 for q in broker.list_queues(vhost)) == 3, what="stats")

    def no_fork(*a, **k):
        raise OSError("No usable temporary directory")

    monkeypatch.setattr(reader_process, "_Child", no_fork)
    eng = BackupEngine(backup_config(broker, vhost, tmp_path / "store", "fb", tmp_path / "st.db", reader_processes=True))
    with caplog.at_level(logging.WARNING):
        s = eng.run()
    assert s.completed and not s.failed and s.total_messages == 150
    assert eng._readers_failed and eng._child_connections == 0
    assert "cannot start a reader process" in caplog.text
    m = load(tmp_path / "store", "fb")
    for name, bodies in queues.items():
        assert [r.body for r in records(tmp_path / "store", m, vhost, name)] == bodies


def _descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigkill_parent_kills_readers_then_resume(rmq310, vhost_factory, tmp_path):
    broker = rmq310
    vhost = vhost_factory(broker)
    queues = _fill(broker, vhost, 24, 1000)  # reader_process.MIN_MESSAGES: big enough for a child
    wait_until(lambda: sum((q.get("messages") or 0) >= 1000 for q in broker.list_queues(vhost)) == 24, what="stats")
    store = tmp_path / "store"
    cfg = tmp_path / "backup.yaml"
    cfg.write_text(f"""
mode: backup
backup_id: killed
source:
  amqp_url: {broker.amqp_url(vhost)}
  management_url: {broker.management_url}
  queues: {{vhosts: ["{vhost}"]}}
storage: {{backend: filesystem, path: "{store}"}}
backup: {{include_definitions: false, max_concurrent_queues: 4, segment_max_bytes: 16384, reader_processes: true}}
offset_storage: {{path: "{tmp_path / 'state' / 'offsets.db'}", sync_interval_secs: 0.5}}
""")
    cmd = [sys.executable, "-m", "rbak", "backup", "--config", str(cfg)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    qdir = store / "killed" / "queues" / vhost
    deadline = time.time() + 120
    while len(list(qdir.glob("*/segment-*"))) < 20 if qdir.is_dir() else True:
        assert proc.poll() is None, f"backup ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
        assert time.time() < deadline, "the backup wrote no segments"
        time.sleep(0.01)
    family = _descendants(proc.pid)
    assert len(family) >= 2  # the forkserver and at least one reader
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    end = time.time() + 10
    while any(_alive(p) for p in family) and time.time() < end:
        time.sleep(0.05)
    assert not [p for p in family if _alive(p)], "a reader process outlived its killed parent"
    assert load(store, "killed").completed_at is None
    assert len(list(qdir.glob("*/segment-*"))) < len(queues) * 1000 * 3600 // 16384  # really killed mid-run
    for name in queues:
        wait_count(broker, vhost, name, 1000)  # every message went back

    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    m = load(store, "killed")
    assert m.completed_at is not None and len(m.queues) == len(queues)
    for name, bodies in queues.items():
        assert [x.body for x in records(store, m, vhost, name)] == bodies


def test_processes_store_into_s3(rmq310, vhost_factory, s3_bucket, tmp_path, monkeypatch):
    """A child opens the same S3 storage from the configuration (credentials from the run's environment)."""
    from rbak.repo.catalog import load_manifest
    from rbak.config import Config
    from rbak.storage import open_storage
    from rbak.repo.validate import validate_backup

    monkeypatch.setattr(reader_process, "MIN_MESSAGES", 100)
    broker = rmq310
    vhost = vhost_factory(broker)
    queues = _fill(broker, vhost, 3, 200)
    wait_until(lambda: sum((q.get("messages") or 0) >= 200 for q in broker.list_queues(vhost)) == 3, what="stats")
    cfg = Config.from_dict({
        "mode": "backup", "backup_id": "rp-s3",
        "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                   "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "s3", "bucket": s3_bucket.bucket, "prefix": "rp", "endpoint": s3_bucket.endpoint,
                    "path_style": True, "region": "us-east-1"},
        "backup": {"include_definitions": False, "segment_max_bytes": 8192, "max_concurrent_queues": 3,
                   "reader_processes": True},
        "offset_storage": {"path": str(tmp_path / "st.db"), "sync_interval_secs": 0},
    }, env={})
    eng = BackupEngine(cfg)
    s = eng.run()
    assert s.completed and s.total_messages == 600
    assert eng._child_connections > 0 and not eng._readers_failed
    storage = open_storage(s3_bucket.url_with_prefix(""))
    m = load_manifest(storage, "rp-s3", "rp")
    assert m.is_complete and {q.name: q.message_count for q in m.queues} == {n: 200 for n in queues}
    assert validate_backup(storage, "rp-s3", "rp", deep=True).ok
