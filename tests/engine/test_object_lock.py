"""S3 Object Lock (write-once) mode against moto's server with a bucket created with Object Lock enabled:
a full backup and retention cycle in which no locked object is ever rewritten or deleted."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from rbak.backup import BackupEngine
from rbak.repo.catalog import list_backups, load_manifest
from rbak.config import Config
from rbak.errors import ConfigError
from rbak.repo.immutable import delete_backup, retained_until
from rbak.storage import open_storage
from rbak.repo.validate import validate_backup

from support.backups import fast_publish
from support.s3 import S3Bucket


def lock_config(broker, vhost, bucket: S3Bucket, backup_id, state, days: float) -> Config:
    return Config.from_dict({
        "mode": "backup", "backup_id": backup_id,
        "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                   "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "s3", "bucket": bucket.bucket, "prefix": "locked", "endpoint": bucket.endpoint,
                    "path_style": True, "region": "us-east-1", "object_lock_mode": "GOVERNANCE",
                    "object_lock_retain_days": days},
        "backup": {"include_definitions": True, "segment_max_bytes": 4096},
        "offset_storage": {"path": str(state), "sync_interval_secs": 0.05},  # would rewrite state often
    }, env={})



def versions(bucket: S3Bucket, prefix: str):
    vs, markers = [], []
    for page in bucket.client().get_paginator("list_object_versions").paginate(Bucket=bucket.bucket, Prefix=prefix):
        vs += page.get("Versions", [])
        markers += page.get("DeleteMarkers", [])
    return vs, markers


def test_write_once_backup_and_retention_cycle(broker, vhost, lock_bucket, tmp_path):
    fast_publish(broker, vhost, "orders", [b"o-%d" % i for i in range(400)], declare={})
    fast_publish(broker, vhost, "quorum", [b"q-%d" % i for i in range(50)], declare={"x-queue-type": "quorum"})
    root = lock_bucket.url_with_prefix("")
    storage = open_storage(root)

    s1 = BackupEngine(lock_config(broker, vhost, lock_bucket, "lock-1", tmp_path / "s.db", days=1)).run()
    s2 = BackupEngine(lock_config(broker, vhost, lock_bucket, "lock-2", tmp_path / "s.db", days=3 / 86400)).run()
    assert s1.completed and s2.completed and s1.total_messages == s2.total_messages == 450
    assert broker.message_count(vhost, "orders") == 400

    # every object written exactly once, each locked; the manifest complete on its only version
    vs, markers = versions(lock_bucket, "locked/")
    keys = [v["Key"] for v in vs]
    assert not markers and len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    for bid in ("lock-1", "lock-2"):
        mine = {k for k in keys if k.startswith(f"locked/{bid}/")}
        assert {f"locked/{bid}/manifest.json", f"locked/{bid}/state/offsets.db"} <= mine
        assert any("/definitions/" in k for k in mine) and sum("/queues/" in k for k in mine) >= 3
    c = lock_bucket.client()
    for k in keys:
        head = c.head_object(Bucket=lock_bucket.bucket, Key=k)
        assert head["ObjectLockMode"] == "GOVERNANCE" and head["ObjectLockRetainUntilDate"], k
    assert load_manifest(storage, "lock-1", "locked").is_complete
    assert validate_backup(storage, "lock-1", "locked", deep=True).ok
    assert [e.status for e in list_backups(storage, "locked")] == ["complete", "complete"]

    # a rerun with a used id is refused before anything is written
    with pytest.raises(ConfigError, match="'lock-1' already has objects.*written once"):
        BackupEngine(lock_config(broker, vhost, lock_bucket, "lock-1", tmp_path / "s.db", days=1)).run()

    # retention: lock-1 is locked for a day: kept, nothing deleted, no delete marker
    now = dt.datetime.now(dt.timezone.utc)
    until = delete_backup(storage, "lock-1", "locked", now)
    assert until is not None and until > now + dt.timedelta(hours=23)
    assert versions(lock_bucket, "locked/") == (vs, [])
    # lock-2's lock expires after 3 seconds; then retention deletes it, every version
    until2 = retained_until(storage, "lock-2", "locked")
    assert until2 is not None
    assert delete_backup(storage, "lock-2", "locked", now) in (None, until2)
    while dt.datetime.now(dt.timezone.utc) <= until2:
        time.sleep(0.5)
    assert delete_backup(storage, "lock-2", "locked") is None
    left, markers = versions(lock_bucket, "locked/")
    assert not markers and not [v for v in left if v["Key"].startswith("locked/lock-2/")]
    # what stays: lock-1, and the delivery guards (they belong to the source queues, not to a backup)
    assert left == [v for v in vs if not v["Key"].startswith("locked/lock-2/")]
    assert any(v["Key"].startswith("locked/_guards/") for v in left)
    assert [e.backup_id for e in list_backups(storage, "locked")] == ["lock-1"]


def test_object_lock_needs_s3_and_a_period():
    base = {"mode": "backup", "backup_id": "b", "source": {"amqp_url": "amqp://h"}}
    with pytest.raises(ConfigError, match="object_lock_retain_days: required"):
        Config.from_dict({**base, "storage": {"backend": "s3", "bucket": "b", "object_lock_mode": "COMPLIANCE"}}, env={})
    with pytest.raises(ConfigError, match="object_lock_mode: only for the s3 backend"):
        Config.from_dict({**base, "storage": {"backend": "filesystem", "path": "/x", "object_lock_mode": "GOVERNANCE",
                                              "object_lock_retain_days": 1}}, env={})
