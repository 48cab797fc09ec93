"""``rbak prune``: delete old backups by a retention policy that never breaks an incremental chain."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

from ..repo.catalog import list_backups
from . import output
from ..errors import ConfigError, RbakError, StorageError
from ..repo.immutable import delete_backup, retained_until
from ..repo.retention import RetentionPolicy, parse_duration, plan_retention, stored_backups
from ..storage import open_storage


def register(sub: argparse._SubParsersAction, _imp: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prune", help="delete old backups by a retention policy (keeps every chain a kept backup needs)")
    p.add_argument("--path", required=True, help="storage URL (file:///dir, s3://bucket/prefix?..., memory://)")
    p.add_argument("--prefix", default="", help="storage prefix the backups live under")
    p.add_argument("--keep-last", type=int, metavar="N", help="keep the newest N complete backups")
    p.add_argument("--keep-daily", type=int, metavar="D", help="keep the newest backup of each of the last D days")
    p.add_argument("--keep-weekly", type=int, metavar="W", help="keep the newest backup of each of the last W weeks")
    p.add_argument("--keep-monthly", type=int, metavar="M", help="keep the newest backup of each of the last M months")
    p.add_argument("--max-age", metavar="DUR", help="delete complete backups older than this (30d, 12h, 2w)")
    p.add_argument("--dry-run", action="store_true", help="print what would be kept and deleted; delete nothing")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=cmd_prune)


def cmd_prune(args: argparse.Namespace) -> int:
    policy = RetentionPolicy(args.keep_last, args.keep_daily, args.keep_weekly, args.keep_monthly,
                             parse_duration(args.max_age, "--max-age") if args.max_age else None)
    if policy.empty:
        raise ConfigError("prune: give at least one of --keep-last, --keep-daily, --keep-weekly, --keep-monthly, "
                          "--max-age")
    storage = open_storage(args.path)
    entries = list_backups(storage, args.prefix)
    plan = plan_retention(stored_backups(entries), policy, datetime.now(timezone.utc))
    deleted, failed, locked = [], [], {}
    now = datetime.now(timezone.utc)
    for bid in plan.delete:
        try:
            # a dry run asks the locks too: an object-locked backup is listed as retained, not deleted
            until = retained_until(storage, bid, args.prefix) if args.dry_run else delete_backup(
                storage, bid, args.prefix)
        except RbakError as e:
            failed.append(f"{bid}: {e}")
            continue
        if until is not None and until > now:  # S3 Object Lock: kept until the lock expires
            locked[bid] = until.isoformat()
        elif not args.dry_run:
            deleted.append(bid)
    if args.format == "json":
        output.emit(args, {"dry_run": args.dry_run, "keep": plan.keep, "delete": plan.delete, "deleted": deleted,
                          "retained_until": locked, "locked_until": locked, "failed": failed,
                          "verdicts": [{"backup_id": v.backup_id, "keep": v.keep, "reasons": v.reasons,
                                        **({"retained_until": locked[v.backup_id]} if v.backup_id in locked else {})}
                                       for v in plan.verdicts]})
    else:
        for v in plan.verdicts:
            if v.backup_id in locked:
                print(f"retain {v.backup_id}: retained until {locked[v.backup_id]} (S3 Object Lock; a later prune "
                      f"deletes it); {'; '.join(v.reasons)}")
            else:
                print(f"{'keep  ' if v.keep else 'delete'} {v.backup_id}: {'; '.join(v.reasons)}")
        verb = "would delete" if args.dry_run else "deleted"
        n = len([b for b in plan.delete if b not in locked]) - len(failed) if args.dry_run else len(deleted)
        print(f"{verb} {n} backup(s), kept {len(plan.keep)}"
              + (f", {len(locked)} retained by Object Lock" if locked else ""))
    for f in failed[1:]:
        print(f"rbak: cannot delete {f}", file=sys.stderr)
    if failed:
        raise StorageError(f"cannot delete {failed[0]}" + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""))
    return 0
