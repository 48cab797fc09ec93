"""``rbak prune`` on write-once storage (moto's S3 Object Lock over HTTP): backups still locked are
listed as "retained until DATE", never failed, never half-deleted; a drill report put after the
manifest (with a later lock) keeps its backup retained too; an expired backup is deleted."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

from support.brokers import wait_until

from rbak.format.manifest import BackupManifest, QueueBackup, SegmentMetadata
from rbak.storage.url import open_storage


def prune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", "prune", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def locked(url: str, days: float):
    return open_storage(f"{url}&object_lock_mode=GOVERNANCE&object_lock_retain_days={days}")


def write_backup(storage, backup_id: str, created_ms: int) -> None:
    storage.put(f"{backup_id}/queues/v/q/segment-0001.rbak", b"segment")
    m = BackupManifest(backup_id=backup_id, created_at=created_ms, completed_at=created_ms + 1)
    q = QueueBackup(vhost="/", name="q")
    q.add_segment(SegmentMetadata(key=f"{backup_id}/queues/v/q/segment-0001.rbak", sequence=1, record_count=1,
                                  size_bytes=7, uncompressed_bytes=7, first_timestamp=1, last_timestamp=2,
                                  checksum="x"))
    m.queues.append(q)
    m.recompute_totals()
    storage.put(f"{backup_id}/manifest.json", m.to_json())


def expired(storage, key: str) -> bool:
    until = storage.locked_until(key)
    return until is None or until < dt.datetime.now(dt.timezone.utc)


def test_locked_backups_are_retained_until_their_date_not_failed(lock_bucket):
    url = str(lock_bucket)
    st = locked(url, 1)
    for i, bid in enumerate(("b1", "b2", "b3")):
        write_backup(st, bid, 1_000 + i)
    until = {bid: st.locked_until(f"{bid}/manifest.json").isoformat() for bid in ("b1", "b2")}
    dry = prune("--path", url, "--keep-last", "1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"retain b1: retained until {until['b1']} (S3 Object Lock; a later prune deletes it)" in dry.stdout
    assert dry.stdout.strip().splitlines()[-1] == "would delete 0 backup(s), kept 1, 2 retained by Object Lock"
    p = prune("--path", url, "--keep-last", "1", "--format", "json")
    assert p.returncode == 0 and "cannot delete" not in p.stderr, p.stderr
    out = json.loads(p.stdout)
    assert out["deleted"] == [] and out["failed"] == [] and out["retained_until"] == until
    assert {v["backup_id"]: v.get("retained_until") for v in out["verdicts"]} == {**until, "b3": None}
    assert all(st.exists(f"{b}/manifest.json") for b in ("b1", "b2", "b3"))


def test_a_later_drill_report_keeps_its_backup_retained_and_expired_ones_go(lock_bucket):
    url = str(lock_bucket)
    short = locked(url, 0.00002)  # about 1.7 s
    write_backup(short, "old", 1_000)
    write_backup(short, "older", 900)
    write_backup(locked(url, 1), "new", 2_000)
    wait_until(lambda: expired(short, "old/manifest.json") and expired(short, "older/manifest.json"),
               timeout=60, interval=0.2, what="the short locks to expire")
    report = "old/drills/20300101T000000Z-d1.json"
    locked(url, 1).put(report, b'{"passed": true}')  # a drill of "old", after its manifest
    p = prune("--path", url, "--keep-last", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (f"retain old: retained until {short.locked_until(report).isoformat()} (S3 Object Lock"
            in p.stdout), p.stdout
    assert "delete older:" in p.stdout and p.stdout.strip().splitlines()[-1] == (
        "deleted 1 backup(s), kept 1, 1 retained by Object Lock")
    # "old" is whole (manifest included), "older" is gone with every version
    assert short.exists("old/manifest.json") and short.exists("old/queues/v/q/segment-0001.rbak")
    assert list(short.list("older/")) == []
    versions = lock_bucket.client().list_object_versions(Bucket=lock_bucket.bucket, Prefix="older/")
    assert versions.get("Versions", []) == [] and versions.get("DeleteMarkers", []) == []
