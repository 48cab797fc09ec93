"""Live progress records of a real backup and a real restore (every broker): they appear in the
storage while the run is under way, carry the right counts, and leave nothing behind (or, on
write-once storage, are never rewritten); the CLI stores them with --store-progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from rbak.backup import BackupEngine
from rbak.repo.catalog import list_backups
from rbak.repo.progress import (
    FINISHED, RUNNING, ProgressRecord, ProgressSession, StorageReporter, Tracker, backup_events, latest_progress, restore_events,
)
from rbak.restore import run_restore
from rbak.storage.base import Storage
from rbak.repo.validate import validate_backup

from support.backups import backup_config, fast_publish
from support.restores import options_for, storage_for

BIG, SMALL = 1200, 50  # the backup reports every 500 messages of a queue


class Spy(Storage):
    """The test's view of every progress object put (delegates everything to the real storage)."""

    def __init__(self, inner: Storage):
        self.inner, self.url, self.write_once = inner, inner.url, inner.write_once
        self.progress_puts: list[tuple[str, bytes]] = []

    def put(self, key, data):
        if "_progress/" in key:
            assert key not in {k for k, _ in self.progress_puts}, f"progress key {key} put twice"
            self.progress_puts.append((key, bytes(data)))
        self.inner.put(key, data)

    def get(self, key):
        return self.inner.get(key)

    def get_range(self, key, start, length):
        return self.inner.get_range(key, start, length)

    def list(self, prefix=""):
        return self.inner.list(prefix)

    def delete(self, key):
        self.inner.delete(key)

    def size(self, key):
        return self.inner.size(key)


def wait_record(storage, kind, run_id, pred, what, timeout=30.0):
    """Block the caller (a reading/publishing thread of the run) until the stored record satisfies pred."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = latest_progress(storage, "", kind, run_id)
        if last is not None and pred(last):
            return last
        time.sleep(0.02)
    raise AssertionError(f"no stored progress record {what}; last: {last}")


def test_progress_records_during_a_real_backup_and_restore(broker, vhost, tmp_path):
    fast_publish(broker, vhost, "a", [b"a-%04d" % i for i in range(BIG)], declare={})
    fast_publish(broker, vhost, "b", [b"b-%d" % i for i in range(SMALL)], declare={"x-queue-type": "quorum"})
    storage = Spy(storage_for(tmp_path))
    cfg = backup_config(broker, vhost, tmp_path / "store", "live-1", tmp_path / "state.db", max_concurrent_queues=1)
    seen_mid: list = []

    def mid_queue(n: int) -> None:  # the reading thread, inside queue "a" (queues run in name order here)
        if n == BIG - 100 and not seen_mid:
            seen_mid.append(wait_record(storage, "backup", "live-1", lambda r: r.records >= 1000,
                                        "with 1000 records while queue a is read"))

    tracker = Tracker("backup", "live-1")
    with ProgressSession(tracker, [StorageReporter(storage, "", interval=0.05)]):
        summary = BackupEngine(cfg, storage=storage, progress=backup_events(tracker), throttle=mid_queue).run()
    assert summary.completed and summary.total_messages == BIG + SMALL
    mid = seen_mid[0]
    assert (mid.state, mid.queues_done, mid.queues_total, mid.current_queue) == (RUNNING, 0, 2, f"{vhost}/a")
    assert 1000 <= mid.records < BIG
    final = json.loads(storage.progress_puts[-1][1])
    assert final["state"] == FINISHED and (final["queues_done"], final["queues_total"]) == (2, 2)
    assert final["records"] == BIG + SMALL
    assert final["bytes"] == sum(len(b"a-%04d" % i) for i in range(BIG)) + sum(len(b"b-%d" % i) for i in range(SMALL))
    keys = [k for k, _ in storage.progress_puts]
    assert keys == sorted(keys) and all(k.startswith("_progress/backup/live-1/") for k in keys)
    assert [k for k in storage.list("") if k.startswith("_progress/")] == []  # cleaned up at the end
    assert [b.backup_id for b in list_backups(storage)] == ["live-1"]
    assert validate_backup(storage, "live-1", deep=True).ok

    # Restore into the same queues after deleting and re-declaring them, as users do.
    for q, qtype in (("a", "classic"), ("b", "quorum")):
        broker.delete_queue(vhost, q)
        broker.declare_queue(vhost, q, arguments={"x-queue-type": qtype})
    storage.progress_puts.clear()
    rt = Tracker("restore", "restore-live-1")
    on_plan, on_progress = restore_events(rt)
    seen_restore: list = []

    def watch(r) -> None:
        on_progress(r)
        if r.source_queue == "a" and r.status == "pending" and r.confirmed >= 600 and not seen_restore:
            seen_restore.append(wait_record(storage, "restore", "restore-live-1",
                                            lambda x: x.records >= 600, "with 600 confirmed during the restore"))

    with ProgressSession(rt, [StorageReporter(storage, "", interval=0.05)]):
        rs = run_restore(storage, options_for(broker, "live-1", max_concurrent_queues=1, produce_batch_size=100),
                     on_progress=watch, on_plan=on_plan)
    assert rs.ok and rs.confirmed == BIG + SMALL, rs.to_json_obj()
    mid = seen_restore[0]
    assert mid.state == RUNNING and (mid.queues_total, mid.records_total) == (2, BIG + SMALL)
    assert 600 <= mid.records < BIG + SMALL and mid.current_queue == f"{vhost}/a"
    final = json.loads(storage.progress_puts[-1][1])
    assert (final["state"], final["queues_done"], final["records"]) == (FINISHED, 2, BIG + SMALL)
    assert broker.message_count(vhost, "a") == BIG and broker.message_count(vhost, "b") == SMALL


def cli_backup_write_once(broker, vh, bucket, tmp_path, backup_id: str, days: float) -> subprocess.CompletedProcess:
    cfg = tmp_path / f"{backup_id}.yaml"
    cfg.write_text(json.dumps({
        "mode": "backup", "backup_id": backup_id,
        "source": {"amqp_url": broker.amqp_url(vh), "management_url": broker.management_url, "queues": {"vhosts": [vh]}},
        "storage": {"backend": "s3", "bucket": bucket.bucket, "prefix": "locked", "endpoint": bucket.endpoint,
                    "path_style": True, "region": "us-east-1", "object_lock_mode": "GOVERNANCE",
                    "object_lock_retain_days": days},
        "backup": {"include_definitions": False},
        "offset_storage": {"path": str(tmp_path / f"{backup_id}.db")},
    }))
    return subprocess.run([sys.executable, "-m", "rbak", "backup", "--config", str(cfg), "--store-progress",
                           "--progress-interval", "0.05"], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ), timeout=120)


def test_retention_removes_a_write_once_backups_progress_records_once_unlocked(rmq310, vhost_factory, lock_bucket,
                                                                              tmp_path):
    import datetime as dt

    from rbak.repo.immutable import delete_backup
    from rbak.storage import open_storage

    vh = vhost_factory(rmq310)
    fast_publish(rmq310, vh, "orders", [b"o-%d" % i for i in range(100)], declare={})
    r = cli_backup_write_once(rmq310, vh, lock_bucket, tmp_path, "short-1", days=2 / 86400)
    assert r.returncode == 0, r.stderr
    storage = open_storage(lock_bucket.url_with_prefix(""))
    keys = list(storage.list("locked/_progress/backup/short-1/"))
    assert keys
    until = max(storage.locked_until(k) for k in keys)
    while dt.datetime.now(dt.timezone.utc) <= until:  # S3 refuses earlier: wait for the 2-second locks
        time.sleep(0.3)
    assert delete_backup(storage, "short-1", "locked") is None
    c = lock_bucket.client()
    left = c.list_object_versions(Bucket=lock_bucket.bucket, Prefix="locked/")
    assert not left.get("Versions") and not left.get("DeleteMarkers"), left.get("Versions")


def test_cli_backup_stores_progress_on_write_once_storage(rmq310, vhost_factory, lock_bucket, tmp_path):
    """--store-progress on an S3 Object Lock bucket: every record is a new key (nothing rewritten), the
    records stay (they cannot be deleted) and list/validate/retention never take them for a backup."""
    from rbak.storage import open_storage

    vh = vhost_factory(rmq310)
    fast_publish(rmq310, vh, "orders", [b"o-%d" % i for i in range(600)], declare={})
    r = cli_backup_write_once(rmq310, vh, lock_bucket, tmp_path, "wo-1", days=1)
    assert r.returncode == 0, r.stderr
    assert "progress backup wo-1: 1/1 queues, 600 records" in r.stderr  # the plain final line (no terminal)
    storage = open_storage(lock_bucket.url_with_prefix(""))
    keys = list(storage.list("locked/_progress/backup/wo-1/"))
    assert keys and keys == sorted(keys)
    versions = lock_bucket.client().list_object_versions(Bucket=lock_bucket.bucket, Prefix="locked/_progress/")
    assert len(versions["Versions"]) == len(keys) and not versions.get("DeleteMarkers")  # nothing rewritten or hidden
    last = latest_progress(storage, "locked", "backup", "wo-1")
    assert (last.state, last.queues_done, last.queues_total, last.records) == (FINISHED, 1, 1, 600)
    assert [b.backup_id for b in list_backups(storage, "locked")] == ["wo-1"]
    assert validate_backup(storage, "wo-1", "locked").ok
    # rbak restore --store-progress RUN_ID into the same bucket: its own run id, its totals from the manifest
    r = subprocess.run([sys.executable, "-m", "rbak", "restore", "--path", lock_bucket.url_with_prefix(""),
                        "--prefix", "locked", "--backup-id", "wo-1", "--management-url", rmq310.management_url,
                        "--publish-mode", "queue", "--allow-non-empty", "--json", "--store-progress", "restore-wo-1",
                        "--progress-interval", "0.05"], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "RBAK_TARGET_URL": rmq310.amqp_url(vh)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["confirmed"] == 600
    # a storage URL does not say Object Lock: the run removed its records (delete markers on this bucket)
    assert latest_progress(storage, "locked", "restore", "restore-wo-1") is None
    c = lock_bucket.client()
    vs = c.list_object_versions(Bucket=lock_bucket.bucket, Prefix="locked/_progress/restore/restore-wo-1/")["Versions"]
    newest = max(vs, key=lambda v: v["Key"])
    body = c.get_object(Bucket=lock_bucket.bucket, Key=newest["Key"], VersionId=newest["VersionId"])["Body"].read()
    last = ProgressRecord.from_json(body, newest["Key"])
    assert (last.state, last.queues_done, last.queues_total, last.records, last.records_total) == (FINISHED, 1, 1, 600, 600)
    assert rmq310.message_count(vh, "orders") == 1200  # the source's 600 plus the restored 600


def test_progress_counts_each_record_once_for_queues_and_streams(broker, vhost, tmp_path):
    """Issue 45: a stream was counted twice (as read and again at its end). The final stored snapshot
    equals the summary for classic, quorum and stream queues together, and for an incremental stream backup."""
    fast_publish(broker, vhost, "c", [b"c-%d" % i for i in range(700)], declare={})
    fast_publish(broker, vhost, "q", [b"q-%d" % i for i in range(300)], declare={"x-queue-type": "quorum"})
    fast_publish(broker, vhost, "s", [b"s-%d" % i for i in range(1000)], declare={"x-queue-type": "stream"})
    storage = Spy(storage_for(tmp_path))

    def run(backup_id: str):
        storage.progress_puts.clear()
        cfg = backup_config(broker, vhost, tmp_path / "store", backup_id, tmp_path / f"{backup_id}.db")
        tracker = Tracker("backup", backup_id)
        with ProgressSession(tracker, [StorageReporter(storage, "", interval=0.05)]):
            summary = BackupEngine(cfg, storage=storage, progress=backup_events(tracker)).run()
        final = ProgressRecord.from_json(storage.progress_puts[-1][1], "final")
        return summary, final

    summary, final = run("once-1")
    assert summary.completed and {q.name: q.messages for q in summary.queues} == {"c": 700, "q": 300, "s": 1000}
    assert (final.state, final.queues_done, final.queues_total) == (FINISHED, 3, 3)
    assert final.records == summary.total_messages == 2000, final.line()
    assert "3/3 queues, 2000 records" in final.line()

    fast_publish(broker, vhost, "s", [b"s2-%d" % i for i in range(250)])
    summary, final = run("once-2")  # the stream continues once-1's chain: its 250 new records only
    stream = next(q for q in summary.queues if q.name == "s")
    assert stream.messages == 250 and summary.total_messages == 1250
    assert (final.state, final.queues_done, final.records) == (FINISHED, 3, 1250), final.line()
