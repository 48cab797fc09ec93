"""``rbak doctor``: what in a storage's settings and rights can lose or expose backups.

Each finding has a severity (``error``: backups are or will be lost, or cannot be written or
deleted; ``warning``: a risk; ``ok``/``info``: what was found) and the fix. S3: lifecycle rules that
can expire a backup ``rbak prune`` keeps (any expiry of backups: prune keeps the newest backup and
chain bases whatever their age), versioning, Object Lock mode
and default period, default encryption, the public access block, put/get/list/delete rights (a probe
object under ``<prefix>/.rbak-doctor/``, deleted after) and the clock against the storage's HTTP
``Date``. A directory: existence, writability (the same probe), free space. Pure functions judge
what was read, so each rule is tested without a bucket.
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any

import botocore.exceptions

from .base.units import human_bytes
from .errors import RbakError
from .format.layout import BACKUP_ID_RE
from .repo.catalog import list_backups
from .repo.retention import RetentionPolicy, plan_retention, stored_backups
from .storage.base import Storage
from .storage.fs import FilesystemStorage
from .storage.s3 import S3Storage
from .storage.url import open_storage

PROBE_DIR = ".rbak-doctor"
SKEW_WARN = 30.0  # seconds: Object Lock retain-until dates and backup ids come from the local clock
SKEW_ERROR = 900.0  # S3 refuses requests signed more than 15 minutes off (RequestTimeTooSkewed)
MONTH_DAYS = 31


@dataclass(frozen=True)
class Finding:
    severity: str  # error | warning | ok | info
    check: str
    message: str
    fix: str = ""

    def to_json_obj(self) -> dict[str, str]:
        return asdict(self)

    def lines(self) -> list[str]:
        out = [f"{self.severity.upper():7} {self.check}: {self.message}"]
        if self.fix:
            out.append(f"        fix: {self.fix}")
        return out


# --------------------------------------------------------------------------
# Pure judgements.
# --------------------------------------------------------------------------


def retention_horizon(policy: RetentionPolicy | None) -> tuple[timedelta | None, str]:
    """How old a backup the retention may still keep, and how that was worked out (None: unknown)."""
    if policy is None or policy.empty:
        return None, "no retention given"
    if policy.max_age is not None:
        return policy.max_age, f"--max-age {_days(policy.max_age)}"
    spans = [(timedelta(days=policy.keep_daily or 0), f"keep-daily {policy.keep_daily}"),
             (timedelta(days=7 * (policy.keep_weekly or 0)), f"keep-weekly {policy.keep_weekly}"),
             (timedelta(days=MONTH_DAYS * (policy.keep_monthly or 0)), f"keep-monthly {policy.keep_monthly}")]
    span, why = max(spans, key=lambda s: s[0])
    if span > timedelta(0):
        return span, why
    return None, f"keep-last {policy.keep_last} (an age depends on how often backups run)"


def _days(td: timedelta) -> str:
    d = td.total_seconds() / 86400
    return f"{d:g} day(s)"


def _rule_prefix(rule: dict[str, Any]) -> str | None:
    """A lifecycle rule's key prefix ('' = whole bucket); None when it filters by tags only."""
    if "Prefix" in rule:
        return rule["Prefix"] or ""
    f = rule.get("Filter") or {}
    if "Prefix" in f:
        return f["Prefix"] or ""
    if "And" in f:
        return f["And"].get("Prefix") or ""
    if "Tag" in f:
        return None
    return ""  # {} or ObjectSize filters: every key


def _covers(rule_prefix: str, prefix: str) -> str | None:
    """'all' when a rule with this prefix applies to every backup under ``prefix``, 'some' when to part
    of them (a longer prefix inside it), None when not at all."""
    ours = prefix.strip("/") + "/" if prefix.strip("/") else ""
    if ours.startswith(rule_prefix):
        return "all"
    if rule_prefix.startswith(ours):
        return "some"
    return None


@dataclass(frozen=True)
class KeptBackup:
    """A backup ``rbak prune`` would keep now, and why (what a lifecycle rule must not expire)."""

    backup_id: str
    created_at_ms: int
    reasons: tuple[str, ...]


def kept_backups(entries: Any, policy: RetentionPolicy | None, now: _dt.datetime) -> list[KeptBackup]:
    """What prune keeps of these catalogue entries under ``policy`` (none given: every backup), oldest
    first: the same ``plan_retention`` prune runs, so the chain bases and the newest backup it keeps
    whatever their age are in it."""
    backups = stored_backups(entries)
    created = {b.backup_id: b.created_at_ms for b in backups}
    plan = plan_retention(backups, policy or RetentionPolicy(), now)
    return [KeptBackup(v.backup_id, created[v.backup_id], tuple(v.reasons)) for v in plan.verdicts if v.keep]


def _outside_backups(rule_prefix: str, prefix: str) -> bool:
    """Whether a rule inside ``prefix`` is for a folder no backup can be named as (``_progress/``, the
    expiry deploy.md recommends for progress records on write-once buckets; ``.rbak-doctor/``)."""
    ours = prefix.strip("/") + "/" if prefix.strip("/") else ""
    folder, slash, _ = rule_prefix[len(ours):].partition("/")
    return bool(slash) and not BACKUP_ID_RE.match(folder)


def judge_lifecycle(rules: list[dict[str, Any]], bucket: str, prefix: str, policy: RetentionPolicy | None,
                    kept: list[KeptBackup] | None = None, now: _dt.datetime | None = None,
                    locked: bool = False) -> list[Finding]:
    """Lifecycle rules that delete (or hide behind a delete marker) backups under the prefix.

    A rule is fine only if it cannot expire anything prune keeps. Prune keeps the newest complete
    backup and every base an incremental stream chain continues whatever their age (and Object Lock
    retains what it locks, which an expiry's delete marker still hides), so an ``Expiration`` that
    covers backups is an error: it names the oldest backup prune would keep now (``kept``, oldest
    first) and its age, against the rule's days; ``locked``: the bucket has Object Lock, which the
    finding says does not stop it."""
    horizon, why = retention_horizon(policy)
    where = f"s3://{bucket}/{prefix.strip('/')}".rstrip("/")
    now = now or _dt.datetime.now(_dt.timezone.utc)
    out: list[Finding] = []
    for rule in rules:
        if rule.get("Status") != "Enabled":
            continue
        rid = rule.get("ID") or "(no id)"
        rp = _rule_prefix(rule)
        cover = _covers(rp, prefix) if rp is not None else None
        if cover is None or (cover == "some" and _outside_backups(rp or "", prefix)):
            continue
        scope = ("every object under " + where if cover == "all"
                 else f"the objects under s3://{bucket}/{rp} (part of the backups under {where})")
        exp = rule.get("Expiration") or {}
        part = "" if cover == "all" else " (a backup missing those objects cannot be restored)"
        fix_rule = (f"remove the Expiration from lifecycle rule {rid!r} and let 'rbak prune' delete backups (it never "
                    f"breaks a chain or deletes the newest backup), or limit its filter to keys outside {where}/")
        if exp.get("Date"):
            out.append(Finding("error", "lifecycle", f"rule {rid!r} expires {scope} on {exp['Date']}: every backup "
                                                     f"there is deleted then, whatever the retention says{part}",
                               fix_rule))
        elif exp.get("Days"):
            days = int(exp["Days"])
            sooner = (f", sooner than the retention keeps backups ({why})" if horizon is not None
                      and timedelta(days=days) < horizon else "")
            lock = ("; Object Lock does not stop it: the expiry puts a delete marker over each locked backup, "
                    "which then no longer lists" if locked else "")
            out.append(Finding("error", "lifecycle", f"rule {rid!r} expires {scope} after {days} day(s){sooner}"
                               f"{part}; {_kept_at_risk(kept, days, now, why)}{lock}", fix_rule))
        for tr in rule.get("Transitions") or []:
            if tr.get("StorageClass") in ("GLACIER", "DEEP_ARCHIVE"):
                out.append(Finding("warning", "lifecycle",
                                   f"rule {rid!r} moves {scope} to {tr['StorageClass']} after {tr.get('Days')} "
                                   "day(s): those backups cannot be read (restore, validate, drill) until each "
                                   "object is restored from the archive",
                                   f"use GLACIER_IR or STANDARD_IA in rule {rid!r}, or plan the rehydration"))
    if not out:
        out.append(Finding("ok", "lifecycle", f"no lifecycle rule expires objects under {where}"))
    return out


def _kept_at_risk(kept: list[KeptBackup] | None, days: int, now: _dt.datetime, why: str) -> str:
    """What the rule does to what prune keeps, said with the oldest kept backup."""
    always = ("rbak prune keeps the newest complete backup and every base of an incremental stream chain "
              "whatever their age")
    if kept is None:
        return always + ", so this rule can expire backups prune keeps"
    if not kept:
        return always + f" ({why}; no backup here yet), so this rule can expire backups prune keeps"
    oldest = kept[0]
    age = (now.timestamp() * 1000 - oldest.created_at_ms) / 86_400_000
    when = ("S3 has expired it already (or does at its next lifecycle run)" if age >= days
            else f"S3 expires it in {days - age:.1f} day(s) though prune keeps it")
    return (f"{always} ({why}): the oldest backup prune would keep now is {oldest.backup_id!r}, {age:.1f} day(s) "
            f"old ({'; '.join(oldest.reasons)}), and {when}")


def judge_versioning(status: str | None, lock_enabled: bool) -> Finding:
    if status == "Enabled":
        return Finding("ok", "versioning", "enabled: an overwritten or deleted object keeps its older versions")
    state = "suspended" if status == "Suspended" else "never enabled"
    return Finding("warning", "versioning",
                   f"{state}: a backup object deleted or overwritten (by a person, a script or ransomware) cannot "
                   "be recovered" + (" (and Object Lock needs versioning)" if lock_enabled else ""),
                   "aws s3api put-bucket-versioning --bucket BUCKET --versioning-configuration Status=Enabled "
                   "(and a lifecycle rule with NoncurrentVersionExpiration to bound the cost)")


def judge_object_lock(config: dict[str, Any] | None, policy: RetentionPolicy | None, write_once: bool
                      ) -> list[Finding]:
    if not config or config.get("ObjectLockEnabled") != "Enabled":
        if write_once:
            return [Finding("error", "object-lock", "the storage URL asks for object_lock_mode but the bucket has "
                                                    "no Object Lock: every backup write is refused",
                            "create a bucket with Object Lock enabled (it cannot be turned on later for most "
                            "buckets) or remove object_lock_mode from the storage URL")]
        return [Finding("warning", "object-lock", "not enabled: anyone with delete rights can delete every backup",
                        "use a bucket created with Object Lock and write backups with object_lock_mode=COMPLIANCE "
                        "and object_lock_retain_days (storage URL or storage config)")]
    rule = (config.get("Rule") or {}).get("DefaultRetention") or {}
    out = []
    if rule:
        days = int(rule.get("Days") or 0) or 365 * int(rule.get("Years") or 0)
        mode = rule.get("Mode")
        msg = f"enabled, default retention {mode} {days} day(s)"
        sev, fix = "ok", ""
        if mode == "GOVERNANCE":
            msg += " (GOVERNANCE: a user with s3:BypassGovernanceRetention can still delete)"
            sev, fix = "warning", "use COMPLIANCE mode if no one may delete a backup before its period ends"
        out.append(Finding(sev, "object-lock", msg, fix))
        horizon, why = retention_horizon(policy)
        if horizon is not None and timedelta(days=days) > horizon:
            out.append(Finding("info", "object-lock",
                               f"each object is locked {days} day(s), longer than the retention keeps backups "
                               f"({why}): prune lists such backups as 'retained until DATE' and deletes them on a "
                               "later run"))
    else:
        out.append(Finding("ok" if write_once else "warning", "object-lock",
                           "enabled, no default retention" + (
                               ": rbak locks each object itself (object_lock_mode in the storage URL)" if write_once
                               else ": objects written without a lock are not protected"),
                           "" if write_once else "set object_lock_mode and object_lock_retain_days in the storage "
                                                 "URL, or a default retention on the bucket"))
    return out


def judge_encryption(rules: list[dict[str, Any]] | None) -> Finding:
    if not rules:
        return Finding("warning", "encryption", "no default bucket encryption: objects are stored as sent",
                       "aws s3api put-bucket-encryption --bucket BUCKET --server-side-encryption-configuration "
                       "'{\"Rules\":[{\"ApplyServerSideEncryptionByDefault\":{\"SSEAlgorithm\":\"aws:kms\"}}]}' "
                       "(or rbak's client-side encryption: docs/encryption.md)")
    d = rules[0].get("ApplyServerSideEncryptionByDefault") or {}
    key = f" (key {d['KMSMasterKeyID']})" if d.get("KMSMasterKeyID") else ""
    return Finding("ok", "encryption", f"default bucket encryption {d.get('SSEAlgorithm')}{key}")


def judge_public_access(block: dict[str, Any] | None) -> Finding:
    names = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")
    off = [n for n in names if not (block or {}).get(n)]
    if not off:
        return Finding("ok", "public-access", "all four public access blocks are on")
    return Finding("warning", "public-access",
                   f"public access block off ({', '.join(off)}): a bucket policy or ACL can expose the backups",
                   "aws s3api put-public-access-block --bucket BUCKET --public-access-block-configuration "
                   "BlockPublicAcls=true,IgnorePublicAcls=true,BlockPublicPolicy=true,RestrictPublicBuckets=true")


def judge_clock(server_date: str | None, sent: float, received: float) -> Finding:
    """The local clock against the storage's HTTP ``Date`` (1 s resolution: 2 s allowed)."""
    if not server_date:
        return Finding("warning", "clock", "the storage sent no Date header: clock skew not checked")
    try:
        server = email.utils.parsedate_to_datetime(server_date).timestamp()
    except (TypeError, ValueError):
        return Finding("warning", "clock", f"unreadable Date header {server_date!r}: clock skew not checked")
    local = (sent + received) / 2
    skew = local - server
    slack = (received - sent) / 2 + 1.0
    off = max(0.0, abs(skew) - slack)
    where = "ahead of" if skew > 0 else "behind"
    fix = "synchronise the clock (NTP / chrony / systemd-timesyncd) of the host running rbak"
    if off >= SKEW_ERROR:
        return Finding("error", "clock", f"local clock {abs(skew):.0f} s {where} the storage's: S3 refuses "
                                         "requests signed more than 15 minutes off", fix)
    if off >= SKEW_WARN:
        return Finding("warning", "clock", f"local clock {abs(skew):.0f} s {where} the storage's: Object Lock "
                                           "retain-until dates and backup times are taken from it", fix)
    return Finding("ok", "clock", f"local clock within {max(2, round(abs(skew) + slack))} s of the storage's")


def judge_free_space(free: int, total: int, newest_backup: int | None) -> Finding:
    msg = f"{human_bytes(free)} free of {human_bytes(total)}"
    fix = "free space or grow the volume (or prune old backups: rbak prune)"
    if newest_backup is not None and free < newest_backup:
        return Finding("error", "free-space", f"{msg}: less than the newest backup ({human_bytes(newest_backup)}), "
                                              "the next one will not fit", fix)
    if free < 1024**3 or free < total * 0.05:
        return Finding("warning", "free-space", f"{msg}: less than 1 GiB or 5%", fix)
    return Finding("ok", "free-space", msg)


# --------------------------------------------------------------------------
# Reading the storage.
# --------------------------------------------------------------------------


def _code(e: Exception) -> str:
    if isinstance(e, botocore.exceptions.ClientError):
        err = e.response.get("Error", {})
        return f"{err.get('Code', '?')}: {err.get('Message', '')}".rstrip(": ")
    return f"{type(e).__name__}: {e}"


def _error_code(e: Exception) -> str:
    return e.response.get("Error", {}).get("Code", "") if isinstance(e, botocore.exceptions.ClientError) else ""


def _kept_in(storage: Storage, policy: RetentionPolicy | None, prefix: str) -> list[KeptBackup] | None:
    """What prune would keep in this storage now (None when the catalogue cannot be read)."""
    try:
        return kept_backups(list_backups(storage, prefix), policy, _dt.datetime.now(_dt.timezone.utc))
    except RbakError:
        return None


def check_s3(storage: Any, policy: RetentionPolicy | None, rbak_prefix: str = "") -> list[Finding]:
    c, bucket, prefix = storage.client, storage.bucket, storage.prefix
    errs = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)
    out: list[Finding] = []
    sent = time.time()
    try:  # a list, as every rbak run starts with (HeadBucket needs the same s3:ListBucket right)
        head = c.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except errs as e:
        return [Finding("error", "bucket", f"s3://{bucket}: cannot be listed ({_code(e)})",
                        f"check the bucket name, region/endpoint and credentials; grant s3:ListBucket on "
                        f"arn:aws:s3:::{bucket}")]
    out.append(judge_clock(head["ResponseMetadata"].get("HTTPHeaders", {}).get("date"), sent, time.time()))

    def read(call, missing: tuple[str, ...], what: str):
        try:
            return call(Bucket=bucket)
        except errs as e:
            if _error_code(e) in missing:
                return None
            out.append(Finding("warning", what, f"cannot read the bucket's {what} settings ({_code(e)})",
                               f"grant s3:Get*Configuration on arn:aws:s3:::{bucket} to check it"))
            return False

    lock = read(c.get_object_lock_configuration, ("ObjectLockConfigurationNotFoundError",), "object-lock")
    versioning = read(c.get_bucket_versioning, (), "versioning")
    lifecycle = read(c.get_bucket_lifecycle_configuration, ("NoSuchLifecycleConfiguration",), "lifecycle")
    enc = read(c.get_bucket_encryption, ("ServerSideEncryptionConfigurationNotFoundError",), "encryption")
    pab = read(c.get_public_access_block, ("NoSuchPublicAccessBlockConfiguration",), "public-access")
    lock_cfg = (lock or {}).get("ObjectLockConfiguration") if lock is not False else None
    if lock is not False:
        out.extend(judge_object_lock(lock_cfg, policy, storage.write_once))
    if versioning is not False:
        out.append(judge_versioning((versioning or {}).get("Status"),
                                    bool(lock_cfg and lock_cfg.get("ObjectLockEnabled") == "Enabled")))
    if lifecycle is not False:
        out.extend(judge_lifecycle((lifecycle or {}).get("Rules") or [], bucket, prefix, policy,
                                   _kept_in(storage, policy, rbak_prefix), _dt.datetime.now(_dt.timezone.utc),
                                   bool(lock_cfg and lock_cfg.get("ObjectLockEnabled") == "Enabled")))
    if enc is not False:
        out.append(judge_encryption(((enc or {}).get("ServerSideEncryptionConfiguration") or {}).get("Rules")))
    if pab is not False:
        out.append(judge_public_access((pab or {}).get("PublicAccessBlockConfiguration")))
    out.extend(probe_s3(storage))
    return [replace(f, fix=f.fix.replace("--bucket BUCKET", f"--bucket {bucket}")) for f in out]


def probe_s3(storage: Any) -> list[Finding]:
    """put, get, list and delete one small object under ``<prefix>/.rbak-doctor/``; every version of it
    is removed after (a version the bucket's default retention locks stays hidden behind its marker)."""
    c, bucket = storage.client, storage.bucket
    key = storage.full_key(f"{PROBE_DIR}/probe-{uuid.uuid4().hex}")
    body = b"rbak doctor probe: safe to delete\n"
    arn = f"arn:aws:s3:::{bucket}/{storage.prefix + '/' if storage.prefix else ''}*"
    errs = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)
    out: list[Finding] = []

    def step(right: str, action: str, call) -> Any:
        try:
            return call()
        except errs as e:
            out.append(Finding("error", "rights", f"{action} s3://{bucket}/{key} refused ({_code(e)})",
                               f"grant {right} on {arn}" if right != "s3:ListBucket"
                               else f"grant s3:ListBucket on arn:aws:s3:::{bucket}"))
            return None

    put = step("s3:PutObject", "put", lambda: c.put_object(Bucket=bucket, Key=key, Body=body))
    if put is None:
        return out
    got = step("s3:GetObject", "get", lambda: c.get_object(Bucket=bucket, Key=key)["Body"].read())
    if got is not None and got != body:
        out.append(Finding("error", "rights", f"get s3://{bucket}/{key} returned other bytes than were put",
                           "check for a proxy or gateway rewriting objects"))
    listed = step("s3:ListBucket", "list",
                  lambda: c.list_objects_v2(Bucket=bucket, Prefix=key.rpartition("/")[0]).get("Contents", []))
    if listed is not None and not any(o["Key"] == key for o in listed):
        out.append(Finding("error", "rights", f"list does not show s3://{bucket}/{key} just put",
                           "rbak finds backups by listing: the storage must list what it holds"))
    deleted = step("s3:DeleteObject", "delete", lambda: c.delete_object(Bucket=bucket, Key=key))
    left = _remove_versions(c, bucket, key)
    if deleted is not None:
        msg = "put, get, list and delete under the prefix work (probe object removed)"
        if left:
            msg = (f"put, get, list and delete work; the probe's version stays locked until {left} by the "
                   "bucket's default retention (hidden behind a delete marker)")
        out.append(Finding("ok", "rights", msg))
    return out


def _remove_versions(c: Any, bucket: str, key: str) -> str | None:
    """Delete every version of the probe, then its delete markers (only when no version is left: a
    marker is what hides a version the bucket's default retention locks). The latest retain-until
    date of a version left, or None."""
    errs = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)
    left: list[str] = []
    try:
        versions = c.list_object_versions(Bucket=bucket, Prefix=key)
    except errs:
        return None  # not versioned or no right to see versions: the plain delete was all there is
    for v in versions.get("Versions", []):
        if v["Key"] != key:
            continue
        try:
            c.delete_object(Bucket=bucket, Key=key, VersionId=v["VersionId"])
        except errs:
            try:
                until = c.head_object(Bucket=bucket, Key=key, VersionId=v["VersionId"]).get(
                    "ObjectLockRetainUntilDate")
            except errs:
                until = None
            left.append(until.isoformat() if isinstance(until, _dt.datetime) else "its lock ends")
    if not left:
        for m in versions.get("DeleteMarkers", []):
            if m["Key"] == key:
                try:
                    c.delete_object(Bucket=bucket, Key=key, VersionId=m["VersionId"])
                except errs:
                    pass  # a marker left behind hides nothing
    return max(left) if left else None


def check_directory(path: str, storage: Storage, prefix: str = "") -> list[Finding]:
    out: list[Finding] = []
    if not os.path.exists(path):
        return [Finding("error", "directory", f"{path} does not exist", f"mkdir -p {path} (or fix --path)")]
    if not os.path.isdir(path):
        return [Finding("error", "directory", f"{path} is not a directory", "point --path at a directory")]
    probe = os.path.join(path, PROBE_DIR, f"probe-{uuid.uuid4().hex}")
    try:
        os.makedirs(os.path.dirname(probe), exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"rbak doctor probe\n")
            f.flush()
            os.fsync(f.fileno())
        os.remove(probe)
        os.rmdir(os.path.dirname(probe))
        out.append(Finding("ok", "rights", f"{path} is writable (probe file written, synced and removed)"))
    except OSError as e:
        out.append(Finding("error", "rights", f"cannot write in {path}: {e.strerror or e}",
                           f"give the user running rbak (uid {os.getuid()}) write access to {path}"))
    usage = shutil.disk_usage(path)
    newest = None
    try:
        done = [e.manifest for e in list_backups(storage, prefix) if e.manifest is not None and e.manifest.is_complete]
        if done:
            newest = max(done, key=lambda m: m.created_at).total_bytes
    except RbakError:
        pass  # an unreadable catalogue is validate's business
    out.append(judge_free_space(usage.free, usage.total, newest))
    return out


def run_doctor(url: str, policy: RetentionPolicy | None, prefix: str = "") -> list[Finding]:
    """Every finding for a storage URL (file://, a bare path, or s3://)."""
    storage = open_storage(url)
    if isinstance(storage, S3Storage):
        return check_s3(storage, policy, prefix)
    if isinstance(storage, FilesystemStorage):
        return check_directory(str(storage.root), storage, prefix)
    return [Finding("info", "storage", f"{url}: nothing to check for this kind of storage")]
