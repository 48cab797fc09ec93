"""Distributed deep validation: ``rbak.repo.validate.check_segment`` on executors.

The driver loads the manifest and runs the manifest-level checks; every
segment becomes one task (largest first, so the long ones start early; small
segments share a task, see ``task_count``) that runs the very function
``rbak validate --deep`` runs. Every segment is
checked, whatever failed before it; the report (JSON, per segment: ok or
exactly what is wrong) is stored next to the backup at
``BackupLayout.validation_report(ts)`` unless ``--report-key`` says where.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import heapq
import sys
import time
from typing import Iterable, Iterator

from rbak.archive.restore_point import newest_generation
from rbak.errors import UNVERIFIED_EXIT_CODE, RbakError
from rbak.format.layout import BackupLayout
from rbak.format.manifest import SegmentMetadata
from rbak.repo.catalog import load_manifest
from rbak.repo.validate import (
    SegmentCheck,
    ValidationReport,
    backup_problems,
    check_segment,
    store_report,
    unverified_line,
    utc_stamp,
)
from rbak.sealing.crypto import EncryptionInfo, codec_for
from rbak.storage import open_storage
from rbak.storage.url import open_existing_storage

MAX_TASKS = 20_000
TASK_BYTES = 64 * 1024 * 1024  # below this, Spark's per-task cost (~50 ms) starts to show


def task_count(items: list, parallelism: int) -> int:
    """One task per segment, except that small segments share tasks of about TASK_BYTES,
    keeping at least four tasks per slot so the slots stay balanced."""
    total = sum(it[2]["size_bytes"] for it in items)
    return max(1, min(len(items), MAX_TASKS, max(4 * parallelism, -(-total // TASK_BYTES))))


def group_segments(items: list, n: int) -> list[list]:
    """``n`` groups of similar total size (largest first into the lightest group), each largest first."""
    groups: list[list] = [[] for _ in range(max(1, min(n, len(items))))]
    heap = [(0, i) for i in range(len(groups))]
    for it in sorted(items, key=lambda it: -it[2]["size_bytes"]):
        load, i = heapq.heappop(heap)
        groups[i].append(it)
        heapq.heappush(heap, (load + it[2]["size_bytes"], i))
    loads = dict((i, load) for load, i in heap)
    return [groups[i] for i in sorted(loads, key=lambda i: -loads[i])]  # heaviest tasks start first


def check_partition(url: str, items: Iterable[tuple[str, str, dict]], backup_id: str = "",
                    encryption: dict | None = None, prefix: str = "") -> Iterator[dict]:
    """Executor side: check each (vhost, queue, segment-metadata) and say what was found. An encrypted
    backup (``encryption``: the manifest's field) is opened with the executor's ``RBAK_ENCRYPTION_KEYS``;
    without that key only stored sizes and checksums are checked."""
    from .executor import keyring_for, storage_for

    storage = storage_for(url)
    codec = None
    if encryption:
        info = EncryptionInfo.from_json_obj(encryption, "manifest")
        codec = codec_for(backup_id, info, keyring_for(storage, url, prefix, backup_id, info), required=False)
    for vhost, queue, seg_obj in items:
        seg = SegmentMetadata.from_json_obj(seg_obj)
        t0 = time.perf_counter()
        try:
            check = check_segment(storage, seg, codec)
        except Exception as e:  # noqa: BLE001 - a bug or an unexpected storage failure must not hide the other segments
            check = SegmentCheck(key=seg.key, ok=False, problems=[f"check failed: {type(e).__name__}: {e}"])
        out = check.to_json_obj()
        out.update(vhost=vhost, queue=queue, sequence=seg.sequence, seconds=round(time.perf_counter() - t0, 4))
        yield out


def run_validate(spark, url: str, backup_id: str, prefix: str = "", report_key: str | None = None,
                 partitions: int | None = None, write_report: bool = True) -> dict:
    """Validate a backup with Spark; returns the report (also stored unless ``write_report`` is false)."""
    url = str(url)  # a str subclass would be pickled by reference to its module
    started = _dt.datetime.now(_dt.timezone.utc)
    t0 = time.perf_counter()
    layout = BackupLayout(backup_id, prefix)
    storage = open_storage(url)
    m = load_manifest(storage, backup_id, prefix)
    report = ValidationReport(backup_id, deep=True, complete=m.is_complete, problems=backup_problems(storage, m))

    items = [(q.vhost, q.name, s.to_json_obj()) for q in m.queues for s in q.segments]
    enc = m.encryption.to_json_obj() if m.encryption else None
    order = {obj["key"]: i for i, (_, _, obj) in enumerate(items)}
    results: list[dict] = []
    if items:
        sc = spark.sparkContext
        groups = group_segments(items, partitions or task_count(items, sc.defaultParallelism))
        sc.setJobDescription(f"rbak validate {backup_id}: {len(items)} segments in {len(groups)} tasks")
        results = (
            sc.parallelize(groups, len(groups))
            .mapPartitions(lambda it: check_partition(url, (x for group in it for x in group), backup_id, enc,
                                                            prefix))
            .collect()
        )
    results.sort(key=lambda r: order[r["key"]])
    for r in results:
        report.segments.append(SegmentCheck(
            key=r["key"], ok=r["ok"], problems=r["problems"], record_count=r["record_count"],
            size_bytes=r["size_bytes"], uncompressed_bytes=r["uncompressed_bytes"],
            contents_checked=bool(r.get("contents_checked")),
        ))
    report.unverified = unverified_reason(m.encryption, report.segments)
    elapsed = time.perf_counter() - t0
    total_uncompressed = sum(r["uncompressed_bytes"] for r in results)
    out = report.to_json_obj()
    out["segments"] = results  # the SegmentCheck fields plus vhost, queue, sequence, seconds
    out.update(
        engine="spark",
        master=spark.sparkContext.master,
        storage=storage.url or url,
        prefix=layout.prefix,
        started_at=started.isoformat(),
        seconds=round(elapsed, 3),
        summary={
            "segments": len(results),
            "bad_segments": sum(1 for r in results if not r["ok"]),
            "records": sum(r["record_count"] for r in results),
            "size_bytes": sum(r["size_bytes"] for r in results),
            "uncompressed_bytes": total_uncompressed,
            "uncompressed_mb_per_s": round(total_uncompressed / 1e6 / elapsed, 2) if elapsed else None,
        },
        all_problems=report.all_problems(),
    )
    if write_report:
        out["report_key"] = store_report(storage, out, backup_id, prefix,
                                         report_key or layout.validation_report(utc_stamp(started)))
    return out


def unverified_reason(encryption, checks: list) -> str | None:
    """Why an encrypted backup's deep check proves nothing: some executor could not decrypt its segments
    (no key in its RBAK_ENCRYPTION_KEYS, only a newer key, an envelope's KMS key unreachable); else None."""
    if encryption is None:
        return None
    closed = [c for c in checks if c.ok and not c.contents_checked]
    if not closed:
        return None
    how = (f"data key {encryption.key_id!r} could not be unwrapped with the executors' keyring "
           "(RBAK_ENCRYPTION_KEYS) or KMS" if encryption.envelope else
           f"key id {encryption.key_id!r} is not in the executors' keyring (RBAK_ENCRYPTION_KEYS)")
    return f"{len(closed)} of {len(checks)} segment(s) not decrypted: {how}"


def summary_lines(out: dict) -> list[str]:
    s = out["summary"]
    verdict = {"valid": "OK", "unverified": "UNVERIFIED"}.get(out.get("result", ""), "FAILED")
    lines = [
        f"validate {out['backup_id']} ({out['master']}): {s['segments']} segments, {s['records']} records, "
        f"{s['uncompressed_bytes'] / 1e6:.1f} MB uncompressed in {out['seconds']:.1f}s: {verdict}"
    ]
    if not out["complete"]:
        lines.append("  backup is incomplete (manifest completed_at is null)")
    if s["bad_segments"]:
        lines.append(f"  {s['bad_segments']} bad segment(s):")
    if out.get("result") == "unverified":
        lines.append(f"  {unverified_line(out['unverified'])}")
    lines += [f"  - {p}" for p in out["all_problems"]]
    if out.get("report_key"):
        lines.append(f"report: {out['report_key']}")
    return lines


def newest_archive_generation(storage, name: str, prefix: str) -> str:
    """``--archive NAME``: the id of its newest generation, said on stderr with what is not checked."""
    backup_id, count = newest_generation(storage, name, prefix)
    older = f"; the {count - 1} older generation(s) are not checked (--backup-id each)" if count > 1 else ""
    print(f"validating archive {name!r}: its newest generation {backup_id!r}, its own segments{older}",
          file=sys.stderr)
    return backup_id


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="spark/validate.py", description="Deep-validate an rbak backup with Spark.")
    ap.add_argument("--path", required=True, help="storage URL (file:///..., s3://bucket/prefix?endpoint=...)")
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--backup-id")
    which.add_argument("--archive", metavar="NAME", help="the newest generation of `rbak archive` NAME: its own "
                                                         "segments, not the older generations' (--backup-id each)")
    ap.add_argument("--prefix", default="", help="storage prefix the backup lives under")
    ap.add_argument("--report-key", default=None, help="storage key of the JSON report (default: {backup}/validation/report-<ts>.json)")
    ap.add_argument("--no-report", action="store_true", help="do not store the report")
    ap.add_argument("--partitions", type=int, default=None, help="tasks (default: one per segment, small segments grouped to ~64 MiB per task, >= 4 per slot)")
    ap.add_argument("--master", default=None, help="Spark master when run with plain python (default local[*])")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from .session import get_session, setup_logging

    setup_logging()
    args = parse_args(argv)
    try:
        # A typo in --path or --backup-id fails as 'rbak validate' does (exit 1, named), before Spark starts.
        storage = open_existing_storage(args.path)
        if args.archive is not None:
            args.backup_id = newest_archive_generation(storage, args.archive, args.prefix)
        load_manifest(storage, args.backup_id, args.prefix)
        spark = get_session(f"rbak-validate-{args.backup_id}", args.master)
        out = run_validate(spark, args.path, args.backup_id, args.prefix, args.report_key,
                           args.partitions, write_report=not args.no_report)
    except RbakError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code

    print("\n".join(summary_lines(out)))
    if out.get("result") == "unverified":
        return UNVERIFIED_EXIT_CODE
    return 0 if out["ok"] else 1
