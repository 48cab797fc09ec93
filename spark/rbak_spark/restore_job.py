"""Parallel restore: ``rbak.restore``'s per-queue publisher, driven by Spark.

The driver builds the same ``RestoreOptions`` and the same plan as ``rbak
restore`` (``options_from_config`` / ``plan_restore``: queue selection, PITR
window, vhost and queue remapping), imports definitions if asked (driver,
once), then hands each *run* to an executor, which calls
``rbak.restore.engine.restore_queue_segments`` (publisher confirms, records
in sequence order, checkpointed after each batch of confirms).

* ``--ordering strict`` (default): a run is a whole queue, so a queue's
  segments are published in order by one thread; queues spread over executors,
  ``--publishers-per-task`` of them per task (each on its own thread and channel).
* ``--ordering relaxed``: when there are fewer queues than task slots, a large
  queue is cut into contiguous runs of segments published concurrently; the
  job prints which queues were split, since their messages then interleave.

Progress lives in backup storage (``progress.StorageProgress``), so a
restarted application skips what was confirmed before. With ``publish_mode:
queue`` a resumed queue is exact (the engine reconciles the in-flight tail
against the queue depth); in exchange mode up to ``produce_batch_size``
in-flight messages per run may be published twice after a crash, as with
the CLI. ``--dry-run`` runs the CLI's dry run (``run_restore``) on the driver.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Iterable, Iterator

import orjson

from rbak.archive.restore_point import (
    archive_restore_config,
    check_archive_end,
    newest_generation,
    recoverable_end,
    refuse_definitions,
)
from rbak.broker.connect import connect
from rbak.config import load_config, parse_time_bound
from rbak.errors import ConfigError, RbakError, RestoreError
from rbak.format.layout import BackupLayout
from rbak.restore.checkpoint import QueueState
from rbak.restore.definitions import import_definitions
from rbak.restore.engine import (
    checkpoint_fingerprint,
    load_complete_manifest,
    refuse_lossy_targets,
    refuse_missing_vhosts,
    refuse_oversize,
    resolve_restore,
    run_restore,
    skipped_by_definitions,
)
from rbak.restore.options import RestoreOptions, local_target, options_from_config
from rbak.restore.plan import plan_restore
from rbak.restore.target_types import refuse_mismatched_taps, target_types
from rbak.restore.queue_restore import QueueResult, held_description, restore_queue_segments, target_contents
from rbak.repo.catalog import load_manifest
from rbak.restore.source import BackupSource
from rbak.storage import open_storage

if TYPE_CHECKING:  # only for annotations
    from rbak.format.manifest import SegmentMetadata
    from rbak.restore.plan import QueuePlan


# Runs published concurrently by one task. A publisher waits on confirms most of the
# time; 4 per slot reached the 2-core ceiling with 8 queues on local[2] (docs/spark.md, Speed).
PUBLISHERS_PER_TASK = 4


@dataclasses.dataclass(frozen=True)
class RestoreUnit:
    """One task's work: a plan (a queue, or a contiguous run of its segments)."""

    plan: QueuePlan
    whole_queue: bool
    run_index: int
    runs: int


# --------------------------------------------------------------------------
# Options, from a config file and/or flags.
# --------------------------------------------------------------------------


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise ConfigError(f"{flag}: expected SOURCE=TARGET, got {it!r}")
        k, v = it.split("=", 1)
        if not k or not v:
            raise ConfigError(f"{flag}: expected SOURCE=TARGET with both sides non-empty, got {it!r}")
        out[k] = v
    return out


def build_options(args: argparse.Namespace):
    """(storage URL, RestoreOptions) exactly as ``rbak restore`` would build them, flags overriding the file."""
    start = parse_time_bound(args.time_window_start, "--time-window-start")
    recoverable = (args.time_window_end or "").strip().lower() == "recoverable"
    end = None if recoverable else parse_time_bound(args.time_window_end, "--time-window-end")
    url, opts = _options(args, start, end)
    if recoverable:  # an archive generation's recoverable-until, as `rbak restore --pitr-end recoverable`
        with open_storage(url) as storage:
            end = recoverable_end(load_manifest(storage, opts.backup_id, opts.prefix), "--time-window-end")
        opts = dataclasses.replace(opts, window_end_ms=end)
    return url, opts


def resolve_archive(args: argparse.Namespace) -> None:
    """``--archive NAME``: its newest generation (whose chain walks every older one) as ``--backup-id``,
    found by the manifests' archive name as ``rbak restore --archive`` finds it: in ``--path``, else in the
    storage of a ``--config`` that names no backup_id."""
    if getattr(args, "archive", None) is None:
        return
    if args.backup_id:
        raise ConfigError(f"--archive {args.archive}: give either --archive or --backup-id, not both")
    if args.config:
        cfg = archive_restore_config(args.config, args.archive)
        url = args.path or cfg.storage.storage_url()
        prefix = cfg.storage.prefix or "" if args.prefix is None else args.prefix
    elif not args.path:
        raise ConfigError(f"--archive {args.archive}: give the storage with --path URL (or --config FILE)")
    else:
        url, prefix = args.path, args.prefix or ""
    with open_storage(url) as storage:
        args.backup_id, count = newest_generation(storage, args.archive, prefix)
    print(f"restoring archive {args.archive!r} from its newest generation {args.backup_id!r} "
          f"({count} generation(s))", file=sys.stderr)


def _options(args: argparse.Namespace, start: int | None, end: int | None):
    vmap, qmap = _pairs(args.vhost_map, "--vhost-map"), _pairs(args.queue_map, "--queue-map")
    if args.config:
        cfg = load_config(args.config, overrides={"backup_id": args.backup_id} if args.backup_id else None)
        url = args.path or cfg.storage.storage_url()
        overrides = dict(
            backup_id=args.backup_id, prefix=args.prefix, window_start_ms=start, window_end_ms=end,
            dry_run=True if args.dry_run else None, publish_mode=args.publish_mode,
            allow_non_empty=True if args.allow_non_empty else None, produce_batch_size=args.batch_size,
            allow_lossy_target=True if args.allow_lossy_target else None,
            allow_oversize_skip=True if args.allow_oversize_skip else None,
            increment_only=True if getattr(args, "increment_only", False) else None,
        )
        opts = options_from_config(cfg, **overrides)
        if args.target_amqp_url:
            opts = dataclasses.replace(opts, target=dataclasses.replace(opts.target, amqp_url=args.target_amqp_url))
        if vmap or qmap:
            opts = dataclasses.replace(
                opts,
                vhost_mapping=tuple(sorted({**opts.vhost_map, **vmap}.items())),
                queue_mapping=tuple(sorted({**opts.queue_map, **qmap}.items())),
            )
        return url, opts
    if not args.path or not args.backup_id:
        raise ConfigError("give --config FILE, or --path URL and --backup-id ID")
    target = local_target(args.target_amqp_url, args.target_management_url)
    opts = RestoreOptions(
        backup_id=args.backup_id, prefix=args.prefix or "", target=target,
        window_start_ms=start, window_end_ms=end, dry_run=args.dry_run,
        publish_mode=args.publish_mode or "queue", allow_non_empty=args.allow_non_empty,
        allow_lossy_target=args.allow_lossy_target,
        allow_oversize_skip=args.allow_oversize_skip,
        produce_batch_size=args.batch_size or 500, increment_only=bool(getattr(args, "increment_only", False)),
        vhost_mapping=tuple(sorted(vmap.items())), queue_mapping=tuple(sorted(qmap.items())),
    )
    return args.path, opts


# --------------------------------------------------------------------------
# Planning runs.
# --------------------------------------------------------------------------


def split_plan(plan: QueuePlan, runs: int) -> list[QueuePlan]:
    """Cut a plan into at most ``runs`` contiguous runs of segments, balanced by record count."""
    segs = list(plan.segments)
    runs = max(1, min(runs, len(segs)))
    if runs == 1:
        return [plan]
    total = sum(s.record_count for s in segs)
    out: list[list[SegmentMetadata]] = []
    cur: list[SegmentMetadata] = []
    acc = 0
    for i, s in enumerate(segs):
        cur.append(s)
        acc += s.record_count
        left_runs = runs - len(out) - 1
        left_segs = len(segs) - i - 1
        if left_runs and (acc >= total * (len(out) + 1) / runs or left_segs == left_runs):
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return [
        dataclasses.replace(plan, segments=tuple(c), skipped_segments=plan.skipped_segments if j == 0 else 0,
                            skipped_records=plan.skipped_records if j == 0 else 0)
        for j, c in enumerate(out)
    ]


def plan_units(plans: list, ordering: str, slots: int) -> tuple[list[RestoreUnit], list[str]]:
    """Runs to publish and what ``relaxed`` did (messages for the operator to read)."""
    notes: list[str] = []
    if ordering == "strict" or len(plans) >= slots or not plans:
        units = [RestoreUnit(p, True, 0, 1) for p in plans]
        if ordering == "relaxed":
            notes.append(f"ordering relaxed: {len(plans)} queue(s) for {slots} task slot(s); no queue was split")
    else:
        total = sum(p.candidate_records for p in plans) or 1
        units = []
        for p in plans:
            k = max(1, round(slots * p.candidate_records / total))
            parts = split_plan(p, k)
            if len(parts) > 1:
                notes.append(
                    f"ordering relaxed: {p.label} split into {len(parts)} runs published concurrently; "
                    f"its messages are NOT restored in backup order across runs"
                )
            units += [RestoreUnit(part, len(parts) == 1, j, len(parts)) for j, part in enumerate(parts)]
    units.sort(key=lambda u: -u.plan.candidate_records)  # largest first: they start early
    return units, notes


# --------------------------------------------------------------------------
# Executors.
# --------------------------------------------------------------------------


def group_units(units: list[RestoreUnit], per_task: int) -> list[list[RestoreUnit]]:
    """Runs into tasks of at most ``per_task`` runs each, balanced by record count (largest first).

    A run's publisher mostly waits for confirms (in a CLI restore of 8 queues the
    broker used ~3x rbak's CPU), so one task slot can keep several publishers busy;
    each run stays on its own channel and thread, so a queue's order is kept.
    """
    per_task = max(1, per_task)
    count = -(-len(units) // per_task)
    tasks: list[list[RestoreUnit]] = [[] for _ in range(count)]
    loads = [0] * count
    for u in sorted(units, key=lambda u: -u.plan.candidate_records):
        i = min((j for j in range(count) if len(tasks[j]) < per_task), key=lambda j: loads[j])
        tasks[i].append(u)
        loads[i] += u.plan.candidate_records
    tasks.sort(key=lambda t: -sum(u.plan.candidate_records for u in t))  # largest first: they start early
    return tasks


def run_unit(storage, url: str, options, progress_id: str, u: RestoreUnit) -> dict:
    """Executor side: publish one run with the engine; its result dict."""
    from .progress import StorageProgress

    layout = BackupLayout(options.backup_id, options.prefix)
    fingerprint = orjson.loads(orjson.dumps(checkpoint_fingerprint(options)))
    p = u.plan
    cp = StorageProgress(storage, layout, progress_id, p.source_vhost, p.source_queue,
                         [s.sequence for s in p.segments], u.whole_queue, fingerprint)
    # a run of a split queue: the driver checked the target; the depth after it depends on the other runs
    opts = options if u.whole_queue else dataclasses.replace(options, allow_non_empty=True, verify_target_depth=False)
    t0 = time.perf_counter()
    try:
        res = restore_queue_segments(BackupSource(storage, options.prefix), p, opts, cp)
    except RbakError as e:
        failed: QueueResult | None = getattr(e, "queue_result", None)  # what the broker confirmed and the depth check found
        if failed is None:
            failed = QueueResult(p.source_vhost, p.source_queue, p.target_vhost, p.target_queue, p.queue_type)
            try:
                failed.confirmed = cp.load(p.source_vhost, p.source_queue).confirmed
            except RbakError:
                pass
        res = failed
        res.status, res.error = "failed", str(e)
    out = dataclasses.asdict(res)
    out.update(run=u.run_index, runs=u.runs, segments=len(p.segments),
               first_sequence=p.segments[0].sequence if p.segments else None,
               seconds=round(time.perf_counter() - t0, 3))
    return out


def run_units(url: str, options, progress_id: str, tasks: Iterable[list[RestoreUnit]]) -> Iterator[dict]:
    """Executor side: each task's runs published concurrently (one thread and channel each)."""
    from .executor import storage_for

    storage = storage_for(url)
    for task in tasks:
        if len(task) == 1:
            yield run_unit(storage, url, options, progress_id, task[0])
            continue
        with ThreadPoolExecutor(max_workers=len(task), thread_name_prefix="rbak-spark-restore") as ex:
            yield from ex.map(lambda u: run_unit(storage, url, options, progress_id, u), task)


# --------------------------------------------------------------------------
# Driver.
# --------------------------------------------------------------------------


def _check_split_targets(storage, options, units: list[RestoreUnit], progress_id: str) -> None:
    """Split queues skip the engine's empty-target check (runs overlap), so do it here, once."""
    from .progress import queue_progress_prefix

    if options.allow_non_empty:
        return
    layout = BackupLayout(options.backup_id, options.prefix)
    seen = set()
    for u in units:
        p = u.plan
        if u.whole_queue or (p.source_vhost, p.source_queue) in seen:
            continue
        seen.add((p.source_vhost, p.source_queue))
        if any(True for _ in storage.list(queue_progress_prefix(layout, progress_id, p.source_vhost, p.source_queue))):
            continue  # a resumed restore: the messages there are ours
        conn = connect(options.target, p.target_vhost, "target")
        try:
            held = held_description(*target_contents(conn, p, options))
        finally:
            conn.close()
        if held:
            raise RestoreError(f"{p.target_label} already holds {held}; "
                               f"refusing to publish into a non-empty queue (set restore.allow_non_empty: true)")


def _refuse_lossy_targets(storage, options, plans: list, progress_id: str) -> None:
    """Every target judged before any executor publishes (``rbak.restore.target_limits``), as ``rbak restore``
    does; a queue with stored progress is left to its executor, which checks what is still to publish."""
    from .progress import queue_progress_prefix

    layout = BackupLayout(options.backup_id, options.prefix)

    def state_of(p: QueuePlan) -> QueueState | None:
        if any(True for _ in storage.list(queue_progress_prefix(layout, progress_id, p.source_vhost, p.source_queue))):
            return None
        return QueueState(None, 0, False, {})

    refuse_lossy_targets(BackupSource(storage, options.prefix), plans, options, state_of)
    refuse_oversize(BackupSource(storage, options.prefix), plans, options, state_of)  # max_message_size


def run_restore_job(spark, url: str, options, ordering: str = "strict", progress_id: str | None = None,
                    reset: bool = False, log=print, publishers_per_task: int = PUBLISHERS_PER_TASK) -> dict:
    """The whole Spark restore; returns the summary (also stored next to the progress).

    ``publishers_per_task`` runs (queues) share one task, each publishing on its own thread.
    """
    from .progress import PROGRESS_DIR, default_progress_id, reset_progress

    if ordering not in ("strict", "relaxed"):
        raise ConfigError(f"--ordering: must be strict or relaxed, got {ordering!r}")
    url = str(url)  # a str subclass would be pickled by reference to its module
    t0 = time.perf_counter()
    storage = open_storage(url)
    source = BackupSource(storage, options.prefix, options.write_dir)
    warnings: list[str] = []
    manifest = load_complete_manifest(source, options, warnings)  # incremental streams: their whole chain, checked
    _check_archive(storage, manifest, options)
    options = options.with_data_key(source, manifest)  # envelope: the data key travels with the options
    options, targets = resolve_restore(source, manifest, options)  # mappings, selections, the URL's vhost
    for line in targets:
        log(f"restore plan: {line}")
    for w in warnings:
        log(f"warning: {w}")
    chains = {(q.vhost, q.name): list(q.chain) for q in manifest.queues if q.chain}
    if options.dry_run or options.definitions_dry_run or not options.restore_messages:  # dry runs write nothing
        summary = run_restore(storage, options, manifest=manifest)  # the CLI's code path, on the driver
        summary.warnings = warnings
        out = summary.to_json_obj()
        out.update(engine="spark", ordering=ordering)
        return out
    plans = all_plans = plan_restore(manifest, options)
    definitions = None
    if options.restore_definitions or options.definitions_dry_run:
        definitions = import_definitions(source, manifest, options)
    refuse_missing_vhosts(plans, options, definitions)
    refuse_mismatched_taps(plans, target_types(plans, options))  # a tap into a queue of another type: before publishing
    skipped = [r for r in (skipped_by_definitions(p, definitions) for p in plans) if r is not None]
    plans = [p for p in plans if skipped_by_definitions(p, definitions) is None]
    _refuse_speculation(spark)
    progress_id = progress_id or default_progress_id(options)
    layout = BackupLayout(options.backup_id, options.prefix)
    if reset:
        n = reset_progress(storage, layout, progress_id)
        log(f"progress {progress_id}: deleted {n} object(s)")
    sc = spark.sparkContext
    units, notes = plan_units(plans, ordering, sc.defaultParallelism)
    for note in notes:
        log(note)
    if any(not u.whole_queue for u in units):
        _check_split_targets(storage, options, units, progress_id)
    _refuse_lossy_targets(storage, options, plans, progress_id)
    results: list[dict] = [dict(dataclasses.asdict(r), run=0, runs=1, segments=0, first_sequence=None, seconds=0.0)
                           for r in skipped]
    if units:
        tasks = group_units(units, publishers_per_task)
        sc.setJobDescription(f"rbak restore {options.backup_id}: {len(units)} run(s) in {len(tasks)} task(s)")
        results += sc.parallelize(tasks, len(tasks)).mapPartitions(
            lambda it: run_units(url, options, progress_id, it)).collect()
    order = {(p.source_vhost, p.source_queue): i for i, p in enumerate(all_plans)}
    results.sort(key=lambda r: (order[(r["source_vhost"], r["source_queue"])], r["run"]))
    for r in results:
        r["chain"] = chains.get((r["source_vhost"], r["source_queue"]), [])
    out = _summary(options, sc.master, ordering, notes, warnings, progress_id, results, definitions, t0)
    out["targets"] = targets
    key = layout.state(f"{PROGRESS_DIR}/{progress_id}/summary.json")
    storage.put(key, orjson.dumps(out, option=orjson.OPT_INDENT_2))
    out["summary_key"] = key
    return out


def precheck(url: str, options) -> None:
    """On the driver, before a Spark session starts (seconds, a JVM): the backup exists, and an archive
    generation's point in time and definitions are ones ``rbak restore`` takes (``run_restore_job`` checks
    again, for callers that skip this)."""
    with open_storage(url) as storage:
        _check_archive(storage, load_manifest(storage, options.backup_id, options.prefix), options)


def _check_archive(storage, manifest, options) -> None:
    """An archive generation: the point in time and definitions ``rbak restore`` would refuse are refused here
    too (``rbak.archive.restore_point``), before anything is published."""
    if manifest.archive is None:
        return
    if options.restore_definitions or options.definitions_dry_run:
        refuse_definitions(manifest, "restore.restore_definitions")
    if options.window_end_ms is not None:
        check_archive_end(storage, manifest, options.prefix, options.window_end_ms,
                          "--time-window-end (restore.time_window_end)")


def _refuse_speculation(spark) -> None:
    if spark.conf.get("spark.speculation", "false").lower() == "true":
        raise ConfigError("spark.speculation is on: a speculative copy of a task would publish messages twice; turn it off")


def _summary(options, master: str, ordering: str, notes: list[str], warnings: list[str], progress_id: str,
             results: list[dict], definitions, t0: float) -> dict:
    """The restore's summary (stored next to its progress and printed)."""
    ok = all(r["status"] != "failed" for r in results) and (definitions is None or getattr(definitions, "ok", True))
    out = {
        "backup_id": options.backup_id,
        "engine": "spark",
        "master": master,
        "ordering": ordering,
        "notes": notes,
        "warnings": warnings,
        "progress_id": progress_id,
        "dry_run": False,
        "ok": ok,
        "published": sum(r["published"] for r in results),
        "confirmed": sum(r["confirmed"] for r in results),
        "duration_secs": round(time.perf_counter() - t0, 3),
        "definitions": definitions.to_json_obj() if definitions is not None else None,
        "runs": results,
    }
    return out


def summary_lines(out: dict) -> list[str]:
    if out.get("dry_run"):
        lines = [f"restore {out['backup_id']} (dry run): nothing published"]
        for q in out["queues"]:
            lines.append(f"  {q['source_vhost']}/{q['source_queue']} -> {q['target_vhost']}/{q['target_queue']}: "
                         f"{q['selected']} record(s) would be published, {q['skipped_records']} outside the window"
                         + (f"; chain {' -> '.join(q['chain'])}" if q.get("chain") else ""))
        lines += [f"  warning: {w}" for w in out.get("warnings") or []]
        return lines
    lines = [f"restore {out['backup_id']} ({out['master']}, ordering {out['ordering']}): {out['confirmed']} confirmed "
             f"in {out['duration_secs']:.1f}s: {'OK' if out['ok'] else 'FAILED'}"]
    lines += [f"  {n}" for n in out["notes"]]
    lines += [f"  warning: {w}" for w in out.get("warnings") or []]
    for r in out["runs"]:
        run = f" run {r['run'] + 1}/{r['runs']}" if r["runs"] > 1 else ""
        lines.append(f"  {r['source_vhost']}/{r['source_queue']}{run} -> {r['target_vhost']}/{r['target_queue']}: "
                     f"{r['status']}, {r['confirmed']} confirmed" + (f": {r['error']}" if r.get("error") else "")
                     + (f"; chain {' -> '.join(r['chain'])}" if r.get("chain") else ""))
    lines.append(f"progress: {out['progress_id']} (summary {out['summary_key']})")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="spark/restore.py", description="Restore an rbak backup with Spark.")
    ap.add_argument("--config", help="rbak YAML config (mode: restore); flags below override it")
    ap.add_argument("--path", help="storage URL (default: the config's storage)")
    ap.add_argument("--backup-id")
    ap.add_argument("--archive", metavar="NAME", help="an `rbak archive`'s newest generation, whose chain walks back "
                                                      "through the older ones (with --path; not with --backup-id)")
    ap.add_argument("--prefix", default=None)
    ap.add_argument("--target-amqp-url")
    ap.add_argument("--target-management-url")
    ap.add_argument("--ordering", choices=["strict", "relaxed"], default="strict")
    ap.add_argument("--publish-mode", choices=["exchange", "queue"], default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--time-window-start", help="epoch ms or RFC 3339")
    ap.add_argument("--time-window-end", help="epoch ms or RFC 3339; 'recoverable': an archive generation's "
                                              "recoverable-until (later points are refused for an archive)")
    ap.add_argument("--vhost-map", action="append", metavar="SRC=DST")
    ap.add_argument("--queue-map", action="append", metavar="[VHOST/]QUEUE=NEW")
    ap.add_argument("--allow-non-empty", action="store_true")
    ap.add_argument("--allow-lossy-target", action="store_true",
                    help="publish into queues whose max-length, message TTL or expiry may drop restored messages")
    ap.add_argument("--allow-oversize-skip", action="store_true",
                    help="skip records over the target's max_message_size, listing each in the summary")
    ap.add_argument("--increment-only", action="store_true",
                    help="a stream from an incremental backup: its own offsets only (default: base through it)")
    ap.add_argument("--batch-size", type=int, default=None, help="unconfirmed messages in flight per run")
    ap.add_argument("--progress-id", help="name of the stored progress (default: a hash of the restore's settings)")
    ap.add_argument("--reset-progress", action="store_true", help="forget stored progress and publish everything")
    ap.add_argument("--publishers-per-task", type=int, default=PUBLISHERS_PER_TASK,
                    help=f"queues (runs) one task publishes concurrently, one thread each (default {PUBLISHERS_PER_TASK})")
    ap.add_argument("--master", default=None, help="Spark master when run with plain python (default local[*])")
    args = ap.parse_args(argv)
    if args.publishers_per_task < 1:
        ap.error("--publishers-per-task: must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    from .session import get_session, setup_logging

    setup_logging()
    args = parse_args(argv)
    try:
        resolve_archive(args)
        url, options = build_options(args)
        precheck(url, options)
        spark = get_session(f"rbak-restore-{options.backup_id}", args.master)
        out = run_restore_job(spark, url, options, args.ordering, args.progress_id, args.reset_progress,
                              publishers_per_task=args.publishers_per_task)
    except RbakError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    print("\n".join(summary_lines(out)))
    return 0 if out["ok"] else 1
