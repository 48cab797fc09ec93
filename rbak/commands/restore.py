"""``rbak restore``: publish a backup into a broker (and optionally import its definitions).

Safe defaults without ``--config``: storage ``./rbak-backups`` (or ``--path``),
target the local broker (``amqp://guest:guest@localhost:5672``, management on
15672), definitions NOT imported, non-empty target queues refused. Without
``--backup-id`` the newest COMPLETE backup in the storage is used and named on
stderr before anything is published (incomplete backups are never chosen);
``--dry-run`` shows what that would do. ``--archive NAME``: the newest generation
of that ``rbak archive`` (its chain walks back through the older ones).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from typing import Any

from ..archive.restore_point import (
    archive_restore_config,
    check_archive_end,
    newest_generation,
    recoverable_end,
    refuse_definitions,
    utc,
)
from ..config import load_config, parse_time_bound
from ..config.validation import check_url
from ..errors import ConfigError, NotFoundError, RestoreError
from ..metrics import serve
from ..repo import progress
from ..repo.catalog import BackupEntry, archive_names, latest_complete, load_manifest
from ..restore.engine import run_restore
from ..restore.options import RestoreOptions, local_target, options_from_config
from ..sealing.crypto import load_keyring
from ..storage import open_storage
from . import output, result_file
from .secrets import url_from

log = logging.getLogger("rbak.restore")

DEFAULT_PATH = "./rbak-backups"


def register(subparsers: Any, _import_subparsers: Any) -> None:
    p = subparsers.add_parser("restore", help="restore a backup's messages (and definitions) into a broker",
                              description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", "-c", help="YAML config file (mode: restore)")
    p.add_argument("--path", help=f"storage URL or directory of the backups (default {DEFAULT_PATH}; refused with --config)")
    p.add_argument("--prefix", default=None, help="storage key prefix (without --config)")
    p.add_argument("--backup-id", help="backup to restore (default: the newest complete one)")
    p.add_argument("--archive", metavar="NAME", default=None,
                   help="restore the archive NAME (`rbak archive`'s archive.name) from its newest generation, "
                        "whose chain walks back through the older ones (with --path, or with a --config that names "
                        "no backup_id; not with --backup-id)")
    p.add_argument("--target-url", help="AMQP URL of the target broker (without --config; a password here is "
                                        "visible in ps: prefer $RBAK_TARGET_URL or --target-url-file)")
    p.add_argument("--target-url-file", help="file holding the target's AMQP URL (e.g. a mounted secret)")
    p.add_argument("--management-url", help="management API URL of the target (without --config)")
    p.add_argument("--dry-run", action="store_true", default=None, help="report what would be published; publish nothing")
    p.add_argument("--definitions", action="store_true", default=None, help="import the backup's definitions first")
    p.add_argument("--definitions-dry-run", action="store_true", default=None, help="report what the definitions import would change")
    p.add_argument("--publish-mode", choices=("exchange", "queue"), default=None)
    p.add_argument("--allow-non-empty", action="store_true", default=None, help="publish into queues that already hold messages")
    p.add_argument("--allow-lossy-target", action="store_true", default=None,
                   help="publish into queues whose max-length, message TTL or expiry may drop restored messages "
                        "(refused by default; the restore still fails if a target holds fewer than were confirmed)")
    p.add_argument("--allow-oversize-skip", action="store_true", default=None,
                   help="skip records over the target's max_message_size, listing each in the summary (by default "
                        "such a record refuses the whole restore before anything is published)")
    p.add_argument("--increment-only", action="store_true", default=None,
                   help="a stream from an incremental backup: restore that backup's own offsets only, not the "
                        "earlier backups of its chain (the default restores base through the chosen backup)")
    p.add_argument("--pitr-end", metavar="TIME", default=None,
                   help="point in time: only records stamped at or before TIME (RFC 3339 or epoch ms; 'recoverable': "
                        "the archive's recoverable-until, for a generation of `rbak archive`); overrides "
                        "restore.time_window_end")
    p.add_argument("--pitr-start", metavar="TIME", default=None,
                   help="only records stamped at or after TIME (overrides restore.time_window_start)")
    p.add_argument("--checkpoint", dest="checkpoint_state", default=None, help="restore checkpoint file (resumable)")
    p.add_argument("--keys-file", default=None, help="encryption keyring for encrypted backups (a file or a mounted "
                   "Secret directory; RBAK_ENCRYPTION_KEYS is also read; without --config)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")

    progress.add_arguments(p)
    p.set_defaults(handler=run)


def _overrides(args: Any) -> dict[str, Any]:
    o: dict[str, Any] = {
        "dry_run": args.dry_run,
        "restore_definitions": args.definitions,
        "definitions_dry_run": args.definitions_dry_run,
        "publish_mode": args.publish_mode,
        "allow_non_empty": args.allow_non_empty,
        "allow_lossy_target": args.allow_lossy_target,
        "allow_oversize_skip": args.allow_oversize_skip,
        "checkpoint_state": args.checkpoint_state,
        "increment_only": args.increment_only,
    }
    if args.definitions_dry_run:
        o["restore_definitions"] = True
    return o


def build(args: Any):
    """(storage, options, metrics config or None) from the command line."""
    if args.config:
        # flags that say what the config file says: one of the two would be silently ignored
        clash = [flag for flag, value in (("--path", args.path), ("--prefix", args.prefix),
                                          ("--target-url", args.target_url), ("--target-url-file", args.target_url_file),
                                          ("--management-url", args.management_url), ("--keys-file", args.keys_file))
                 if value is not None]
        if clash:
            raise ConfigError(f"{', '.join(clash)}: not used with --config {args.config}: set storage, target and "
                              "encryption in the file (or drop --config)")
        if args.archive is not None:  # the generation is found in the config's storage; the file names none
            if args.backup_id:
                raise ConfigError(f"--archive {args.archive}: give either --archive or --backup-id, not both")
            cfg = archive_restore_config(args.config, args.archive)
        else:
            cfg = load_config(args.config, overrides={"backup_id": args.backup_id} if args.backup_id else None)
        if cfg.mode != "restore":
            raise ConfigError(f"{args.config}: mode: must be restore for `rbak restore`, got {cfg.mode!r}")
        storage = cfg.storage.open()
        options = options_from_config(cfg, **_overrides(args))
        if args.archive is not None:
            options = replace(options, backup_id=_archive_newest(storage, args.archive, options.prefix, None))
        return storage, options, cfg.metrics

    storage = open_storage(args.path or DEFAULT_PATH)
    backup_id = args.backup_id
    if args.archive is not None:
        backup_id = _archive_newest(storage, args.archive, args.prefix or "", args.backup_id)
    elif not backup_id:
        empty: list[str] = []
        entry = latest_complete(storage, args.prefix or "", with_data=True, skipped_empty=empty)
        if entry is None:
            raise NotFoundError(f"{storage.url}: no complete backup holding data found"
                                + (f" (only empty ones: {', '.join(map(repr, empty))})" if empty else "")
                                + "; pass --backup-id or --path")
        backup_id = entry.backup_id
        _one_archive_only(storage, args.prefix or "", entry)
        why = (f" (passing over {len(empty)} newer empty backup(s) that hold no message: "
               f"{', '.join(map(repr, empty))})" if empty else "")
        print(f"rbak: restoring the newest complete backup {backup_id!r} from {storage.url}{why}", file=sys.stderr)
    url = url_from("--target-url", args.target_url, args.target_url_file, "RBAK_TARGET_URL")
    if url:
        check_url(url, ("amqp", "amqps"), "--target-url (or --target-url-file, $RBAK_TARGET_URL)")
    if args.management_url:
        check_url(args.management_url, ("http", "https"), "--management-url")
    target = local_target(url, args.management_url)
    opts = {k: v for k, v in _overrides(args).items() if v is not None}

    keys = tuple(sorted(load_keyring(args.keys_file).items()))
    return storage, RestoreOptions(backup_id=backup_id, prefix=args.prefix or "", target=target, keys=keys, **opts), None


def _archive_newest(storage: Any, name: str, prefix: str, backup_id: str | None) -> str:
    """The newest generation of archive ``name``: a restore of it walks every older one."""
    if backup_id:
        raise ConfigError(f"--archive {name}: give either --archive or --backup-id, not both")
    newest, count = newest_generation(storage, name, prefix)
    print(f"rbak: restoring archive {name!r} from its newest generation {newest!r} ({count} generation(s))",
          file=sys.stderr)
    return newest


def _one_archive_only(storage: Any, prefix: str, entry: BackupEntry) -> None:
    """A default pick among several archives' generations would restore whichever wrote last: refused."""
    if entry.manifest is None or entry.manifest.archive is None:
        return
    names = archive_names(storage, prefix)
    if len(names) > 1:
        raise ConfigError(f"{storage.url} holds the archives {', '.join(map(repr, names))}; the newest complete backup "
                          f"{entry.backup_id!r} is archive {entry.manifest.archive.name!r}'s: pass --archive NAME "
                          "(or --backup-id) to say which one to restore")


def _pitr(args: Any, storage: Any, options: Any) -> Any:
    """``--pitr-start`` / ``--pitr-end`` applied to the options (``recoverable``: the archive's recoverable-until);
    an end an archive generation cannot stand for (the flag's or ``restore.time_window_end``) is refused."""
    start, end = options.window_start_ms, options.window_end_ms
    where = "restore.time_window_end"
    if getattr(args, "pitr_start", None) is not None:
        start = parse_time_bound(args.pitr_start, "--pitr-start")
    if getattr(args, "pitr_end", None) is not None and args.pitr_end.strip().lower() == "recoverable":
        end = recoverable_end(load_manifest(storage, options.backup_id, options.prefix), "--pitr-end")
        print(f"rbak: restoring up to the archive's recoverable-until {utc(end)} ({end} ms)", file=sys.stderr)
        return replace(options, window_start_ms=start, window_end_ms=end)
    if getattr(args, "pitr_end", None) is not None:
        end, where = parse_time_bound(args.pitr_end, "--pitr-end"), "--pitr-end"
    if end is not None:
        check_archive_end(storage, load_manifest(storage, options.backup_id, options.prefix), options.prefix,
                          end, where)
    return replace(options, window_start_ms=start, window_end_ms=end)


def _no_archive_definitions(args: Any, storage: Any, options: Any) -> None:
    """An archive generation stores no definitions: asking to import them is refused before anything is done,
    rather than failing as a missing object once the restore has started."""
    if not (options.restore_definitions or options.definitions_dry_run) or not options.backup_id:
        return
    flag = ("--definitions-dry-run" if args.definitions_dry_run else "--definitions" if args.definitions
            else "restore.restore_definitions")
    refuse_definitions(load_manifest(storage, options.backup_id, options.prefix), flag)


def run(args: Any) -> int:
    storage, options, metrics_cfg = build(args)
    _no_archive_definitions(args, storage, options)
    options = _pitr(args, storage, options)
    if metrics_cfg is not None and metrics_cfg.enabled:
        serve(metrics_cfg)

    with progress.cli_session("restore", options.backup_id, args, storage=storage, prefix=options.prefix,
                              display=not options.dry_run) as ps:
        on_plan, on_progress = progress.restore_events(ps.tracker)
        summary = run_restore(storage, options, on_progress=on_progress, on_plan=on_plan)

    result_file.write(result_file.restore_result(summary))
    if args.json:
        output.emit(args, summary.to_json_obj())
    else:
        print_summary(summary)
    if not summary.ok:
        failed = summary.failed_queues
        first, said = failed[0], f"{RestoreError.prefix}: "
        why = first.error or ""
        why = why[len(said):] if why.startswith(said) else why  # this line says "Restore error" once
        raise RestoreError(f"{len(failed)} queue(s) failed, first queue {first.source_queue!r} in vhost "
                           f"{first.source_vhost!r}: {why}")
    return 0


def print_summary(summary: Any) -> None:
    verb = "would publish" if summary.dry_run else "confirmed"
    d = summary.definitions
    if d is not None:
        if d.dry_run:
            print(f"definitions (dry run) from {d.source_key}: {d.counts}")
        else:
            print(f"definitions imported from {d.source_key}; rollback snapshot at {d.rollback_key}")
        for line in d.report_lines():
            print(line)
        if d.report_key:
            print(f"  restore report: {d.report_key}")
        for kind, ch in d.changes.items():
            print(f"  {kind}: create {len(ch['create'])} {ch['create'][:10]}, change {len(ch['change'])} {ch['change'][:10]}")
    for line in summary.targets:
        print(f"target: {line}")
    for q in summary.queues:
        n = q.selected if summary.dry_run else q.confirmed
        extra = f" ({q.skipped_records} outside the time window)" if q.skipped_records else ""
        line = (f"{q.source_vhost}/{q.source_queue} -> {q.target_vhost}/{q.target_queue}: {q.status}, "
                f"{verb} {n}{extra}")
        if q.chain:
            line += f"; chain {' -> '.join(q.chain)}"
        if q.oversize_skipped:
            line += (f"; {len(q.oversize_skipped)} record(s) over the target's max_message_size skipped: "
                     + ", ".join(f"record {o['index']} of {o['segment']} ({o['bytes']} bytes)" for o in q.oversize_skipped))
        if q.error:
            line += f": {q.error}"
        print(line)
    for key in summary.written:
        print(f"wrote: {key}")
    total = sum(q.selected for q in summary.queues) if summary.dry_run else summary.confirmed
    print(f"backup {summary.backup_id}: {len(summary.queues)} queue(s), {verb} {total} message(s) "
          f"in {summary.duration_secs:.1f} s" + ("" if summary.ok else f"; {len(summary.failed_queues)} queue(s) FAILED"))
