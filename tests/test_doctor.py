"""``rbak doctor`` against moto's S3 server over real HTTP (lifecycle, versioning, Object Lock, bucket
encryption, public access block, the rights probe, the clock) and local directories, run as a user
runs it; the judgements (retention horizon, lifecycle coverage, clock skew) also as pure functions."""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import re
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
import yaml
from support.s3 import create_bucket, iam_user, storage_url

from rbak.doctor import (
    judge_clock,
    judge_free_space,
    judge_lifecycle,
    retention_horizon,
)
from rbak.format.manifest import BackupManifest, QueueBackup, SegmentMetadata, StreamInfo
from rbak.repo.retention import RetentionPolicy


def doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", "doctor", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def findings(p: subprocess.CompletedProcess) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in json.loads(p.stdout)["findings"]:
        out.setdefault(f["check"], []).append(f)
    return out


def lifecycle(bucket, *rules):
    bucket.client().put_bucket_lifecycle_configuration(Bucket=bucket.bucket,
                                                       LifecycleConfiguration={"Rules": list(rules)})


def expire(rid: str, prefix: str, days: int) -> dict:
    return {"ID": rid, "Status": "Enabled", "Filter": {"Prefix": prefix}, "Expiration": {"Days": days}}


def probe_keys(bucket) -> list[str]:
    stored = bucket.keys()
    return [k for k in stored if ".rbak-doctor" in k]


def test_a_lifecycle_rule_expiring_backups_before_the_retention_is_an_error(s3_bucket, tmp_path):
    lifecycle(s3_bucket, expire("expire-30", "backups/", 30), expire("logs", "logs/", 1))
    p = doctor("--path", str(s3_bucket), "--max-age", "90d", "--format", "json")
    assert p.returncode == 1, p.stderr
    got = findings(p)
    (rule,) = got["lifecycle"]
    assert rule["severity"] == "error" and "rule 'expire-30' expires every object under s3://" in rule["message"]
    assert "after 30 day(s), sooner than the retention keeps backups (--max-age 90 day(s))" in rule["message"]
    assert "remove the Expiration from lifecycle rule 'expire-30'" in rule["fix"]
    assert json.loads(p.stdout)["errors"] == 1
    # The same retention from a RabbitMQBackup's spec.retention, in text.
    spec = {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQBackup", "metadata": {"name": "nightly"},
            "spec": {"retention": {"keepDaily": 7, "keepWeekly": 4, "keepMonthly": 2}}}
    (tmp_path / "backup.yaml").write_text(yaml.safe_dump(spec))
    p = doctor("--path", str(s3_bucket), "--retention-file", str(tmp_path / "backup.yaml"))
    assert p.returncode == 1
    assert "sooner than the retention keeps backups (keep-monthly 2)" in p.stdout
    # A retention shorter than the rule is no safer: prune keeps the newest backup (and chain bases)
    # whatever their age, which the rule expires all the same. So is none at all.
    for flags in (["--keep-daily", "14"], ["--keep-last", "3"], []):
        p = doctor("--path", str(s3_bucket), *flags, "--format", "json")
        assert p.returncode == 1, (flags, p.stdout)
        (rule,) = findings(p)["lifecycle"]
        assert rule["severity"] == "error" and "sooner than" not in rule["message"], rule
        assert "rbak prune keeps the newest complete backup and every base of an incremental stream chain " \
               "whatever their age" in rule["message"] and "no backup here yet" in rule["message"], rule


def put_backup(storage, backup_id: str, age_days: float, previous: str | None = None) -> None:
    """A stored backup of one stream, ``age_days`` old, continuing ``previous`` (an incremental link)."""
    created = int((dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=age_days)).timestamp() * 1000)
    key = f"{backup_id}/queues/v/s/segment-0001.rbak"
    storage.put(key, b"segment")
    m = BackupManifest(backup_id=backup_id, created_at=created, completed_at=created + 1)
    q = QueueBackup(vhost="/", name="s", queue_type="stream",
                    stream=StreamInfo(first_offset=0, last_offset=9, previous_backup=previous,
                                      previous_last_offset=0 if previous else None))
    q.add_segment(SegmentMetadata(key=key, sequence=1, record_count=1, size_bytes=7, uncompressed_bytes=7,
                                  first_timestamp=1, last_timestamp=2, checksum="x"))
    m.queues.append(q)
    m.recompute_totals()
    storage.put(f"{backup_id}/manifest.json", m.to_json())


def test_a_rule_that_would_expire_a_chain_base_prune_keeps_names_it_and_its_age(s3_bucket):
    """Issue 45: a 7-day rule and --max-age 5d, on a storage whose stream chain's base prune keeps at 100
    days: doctor must not call the rule safe; it names the rule, the backup and its age, as prune decides."""
    from rbak.storage.url import open_storage

    st = open_storage(str(s3_bucket))
    put_backup(st, "full-60", 60)  # an old full backup: prune deletes it
    put_backup(st, "base-100", 100)
    put_backup(st, "link-40", 40, previous="base-100")
    put_backup(st, "newest-1", 1, previous="link-40")
    lifecycle(s3_bucket, expire("expire-7", "backups/", 7))
    plan = subprocess.run([sys.executable, "-m", "rbak", "prune", "--path", str(s3_bucket), "--max-age", "5d",
                           "--dry-run"], capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert "keep   base-100: base of link-40" in plan.stdout and "delete full-60" in plan.stdout, plan.stdout
    p = doctor("--path", str(s3_bucket), "--max-age", "5d", "--format", "json")
    assert p.returncode == 1, p.stdout
    (rule,) = findings(p)["lifecycle"]
    assert rule["severity"] == "error", rule
    msg = rule["message"]
    assert msg.startswith("rule 'expire-7' expires every object under s3://") and "after 7 day(s)" in msg, msg
    assert re.search(r"the oldest backup prune would keep now is 'base-100', 100\.0 day\(s\) old \(.*base of "
                     r"link-40.*\), and S3 has expired it already", msg), msg
    assert "remove the Expiration from lifecycle rule 'expire-7'" in rule["fix"]
    # A rule for other keys in the bucket is not ours, nor one for the progress records under the prefix
    # (deploy.md recommends it on write-once buckets): OK.
    lifecycle(s3_bucket, expire("logs", "logs/", 1), expire("rbak-progress", "backups/_progress/", 40))
    p = doctor("--path", str(s3_bucket), "--max-age", "5d", "--format", "json")
    assert [f["severity"] for f in findings(p)["lifecycle"]] == ["ok"], p.stdout


def test_a_plain_bucket_warns_of_versioning_lock_encryption_and_public_access(s3_bucket):
    p = doctor("--path", str(s3_bucket), "--format", "json")
    assert p.returncode == 0, p.stderr
    got = findings(p)
    sev = {check: [f["severity"] for f in fs] for check, fs in got.items()}
    assert sev == {"clock": ["ok"], "object-lock": ["warning"], "versioning": ["warning"], "lifecycle": ["ok"],
                   "encryption": ["warning"], "public-access": ["warning"], "rights": ["ok"]}
    assert got["versioning"][0]["message"].startswith("never enabled")
    assert "put-bucket-versioning" in got["versioning"][0]["fix"]
    assert "put-bucket-encryption" in got["encryption"][0]["fix"]
    assert got["rights"][0]["message"] == "put, get, list and delete under the prefix work (probe object removed)"
    assert probe_keys(s3_bucket) == []  # the probe is gone
    c = s3_bucket.client()
    c.put_bucket_versioning(Bucket=s3_bucket.bucket, VersioningConfiguration={"Status": "Suspended"})
    c.put_bucket_encryption(Bucket=s3_bucket.bucket, ServerSideEncryptionConfiguration={"Rules": [
        {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "alias/backups"}}]})
    c.put_public_access_block(Bucket=s3_bucket.bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True})
    got = findings(doctor("--path", str(s3_bucket), "--format", "json"))
    assert got["versioning"][0]["message"].startswith("suspended")
    assert got["encryption"][0] == {"severity": "ok", "check": "encryption",
                                    "message": "default bucket encryption aws:kms (key alias/backups)", "fix": ""}
    assert got["public-access"][0]["severity"] == "ok"
    assert probe_keys(s3_bucket) == []


def test_object_lock_mode_and_period_and_the_probe_left_locked(lock_bucket):
    c = lock_bucket.client()
    c.put_object_lock_configuration(Bucket=lock_bucket.bucket, ObjectLockConfiguration={
        "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 40}}})
    p = doctor("--path", str(lock_bucket), "--max-age", "30d", "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    got = findings(p)
    lock = got["object-lock"]
    assert lock[0]["severity"] == "warning" and lock[0]["message"].startswith(
        "enabled, default retention GOVERNANCE 40 day(s)")
    assert lock[1]["severity"] == "info" and "locked 40 day(s), longer than the retention" in lock[1]["message"]
    assert got["versioning"][0]["severity"] == "ok"
    assert "the probe's version stays locked until" in got["rights"][0]["message"]
    # hidden behind its delete marker: nothing under the prefix lists
    assert c.list_objects_v2(Bucket=lock_bucket.bucket).get("KeyCount", 0) == 0


def test_a_storage_url_asking_for_object_lock_on_a_bucket_without_it_is_an_error(s3_bucket):
    url = str(s3_bucket) + "&object_lock_mode=COMPLIANCE&object_lock_retain_days=7"
    p = doctor("--path", url)
    assert p.returncode == 1
    assert "ERROR   object-lock: the storage URL asks for object_lock_mode but the bucket has no Object Lock" in p.stdout


def test_a_missing_bucket_is_an_error(moto_s3):
    p = doctor("--path", storage_url(moto_s3, "no-such-bucket-doctor"))
    assert p.returncode == 1
    assert "ERROR   bucket: s3://no-such-bucket-doctor: cannot be listed" in p.stdout and "fix: " in p.stdout


def test_a_rule_covering_part_of_the_backups_or_a_date_is_an_error_and_tag_rules_are_not_ours(moto_s3):
    b = create_bucket(moto_s3, "doctor-part", prefix="rmq")
    lifecycle(b, expire("segments", "rmq/nightly-1/queues/", 7),
              {"ID": "tagged", "Status": "Enabled", "Filter": {"Tag": {"Key": "tmp", "Value": "1"}},
               "Expiration": {"Days": 1}},
              {"ID": "off", "Status": "Disabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 1}})
    got = findings(doctor("--path", str(b), "--max-age", "30d", "--format", "json"))
    (f,) = got["lifecycle"]
    assert f["severity"] == "error" and "rule 'segments'" in f["message"]
    assert "(a backup missing those objects cannot be restored)" in f["message"]
    rules = [{"ID": "cutoff", "Status": "Enabled", "Filter": {}, "Expiration": {"Date": "2030-01-01T00:00:00Z"}}]
    (f,) = judge_lifecycle(rules, "b", "rmq", None)
    assert f.severity == "error" and "on 2030-01-01T00:00:00Z" in f.message
    # Object Lock does not make an expiry safe: its delete marker hides the locked backup.
    (f,) = judge_lifecycle([expire("days", "rmq/", 400)], "b", "rmq", RetentionPolicy(keep_last=2), kept=[],
                           locked=True)
    assert f.severity == "error" and "Object Lock does not stop it" in f.message and "no backup here yet" in f.message


def test_local_directories(tmp_path):
    p = doctor("--path", str(tmp_path / "missing"))
    assert p.returncode == 1 and f"ERROR   directory: {tmp_path / 'missing'} does not exist" in p.stdout
    p = doctor("--path", f"file://{tmp_path}", "--format", "json")
    assert p.returncode == 0, p.stdout
    got = findings(p)
    assert got["rights"][0]["severity"] == "ok" and got["free-space"][0]["message"].endswith(" GiB")
    assert list(tmp_path.iterdir()) == []  # the probe and its folder are gone
    (tmp_path / "file").write_text("x")
    p = doctor("--path", str(tmp_path / "file"))
    assert p.returncode == 1 and "is not a directory" in p.stdout


def test_free_space_judgement():
    g = 1024**3
    assert judge_free_space(100 * g, 200 * g, 5 * g).severity == "ok"
    assert judge_free_space(3 * g, 200 * g, 5 * g).severity == "error"
    assert judge_free_space(g // 2, 200 * g, None).severity == "warning"


def test_retention_horizon():
    assert retention_horizon(None)[0] is None
    assert retention_horizon(RetentionPolicy(keep_last=5))[0] is None
    assert retention_horizon(RetentionPolicy(keep_daily=7, keep_weekly=4)) == (timedelta(days=28), "keep-weekly 4")
    assert retention_horizon(RetentionPolicy(keep_daily=7, max_age=timedelta(days=3)))[0] == timedelta(days=3)


@pytest.mark.parametrize("offset, severity, word", [(0, "ok", "within"), (120, "warning", "ahead of"),
                                                    (-1200, "error", "behind")])
def test_clock_skew(offset, severity, word):
    now = 1_900_000_000.0
    date = email.utils.formatdate(now - offset, usegmt=True)
    f = judge_clock(date, now - 0.2, now + 0.2)
    assert f.severity == severity and word in f.message, f
    assert judge_clock(None, now, now).severity == "warning"


def test_bad_retention_input_is_named(s3_bucket, tmp_path):
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"retention": {"keepYearly": 3}}))
    p = doctor("--path", str(s3_bucket), "--retention-file", str(tmp_path / "r.yaml"))
    assert p.returncode == 2 and "retention.keepYearly: unknown" in p.stderr
    p = doctor("--path", str(s3_bucket), "--max-age", "soon")
    assert p.returncode == 2 and "max-age: 'soon' is not a duration" in p.stderr


def test_missing_delete_right_is_an_error_naming_the_right(moto_s3):
    """moto enforces IAM while its auth switch is on: a user allowed everything but s3:DeleteObject.
    (A bucket without a prefix: moto's signature check trips over a '/' in a list prefix.)"""
    s3_bucket = create_bucket(moto_s3, f"doctor-rights-{uuid.uuid4().hex[:8]}")
    actions = ["s3:PutObject", "s3:GetObject", "s3:ListBucket", "s3:GetBucket*", "s3:GetLifecycleConfiguration",
               "s3:GetEncryptionConfiguration", "s3:GetBucketObjectLockConfiguration", "s3:GetBucketVersioning",
               "s3:ListBucketVersions", "s3:GetBucketPublicAccessBlock", "s3:GetPublicAccessBlock"]
    with iam_user(moto_s3, f"doctor-{s3_bucket.bucket}", actions, s3_bucket.bucket) as env:
        p = subprocess.run([sys.executable, "-m", "rbak", "doctor", "--path", str(s3_bucket), "--format", "json"],
                           capture_output=True, text=True, timeout=120, check=False, env=env)
    assert p.returncode == 1, p.stdout + p.stderr
    rights = findings(p).get("rights", p.stdout)
    assert not isinstance(rights, str), rights
    assert [f["severity"] for f in rights] == ["error"], rights
    assert rights[0]["message"].startswith(f"delete s3://{s3_bucket.bucket}/.rbak-doctor/probe-")
    assert "AccessDenied" in rights[0]["message"]
    assert rights[0]["fix"] == f"grant s3:DeleteObject on arn:aws:s3:::{s3_bucket.bucket}/*"
    assert probe_keys(s3_bucket)  # it could not be deleted
