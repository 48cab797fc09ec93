"""``rbak list``, ``rbak describe`` and ``rbak validate``: read-only views of storage."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import yaml

from ..base.units import human_bytes
from ..errors import StorageError, UnverifiedError, ValidationError
from ..format.layout import BackupLayout
from ..repo import progress
from ..repo.catalog import list_backups, load_manifest
from ..repo.report import describe_obj, encrypted_label, fmt_ms, fmt_ts, list_notes, list_obj
from ..repo.validate import UNVERIFIED, store_report, unverified_line, validate_backup
from ..sealing.crypto import load_keyring
from ..sealing.envelope import read_wraps
from ..storage.url import open_existing_storage
from . import output

if TYPE_CHECKING:
    from rich.console import Console


def register(sub: argparse._SubParsersAction, _imp: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list the backups stored at a path")
    p.add_argument("--path", required=True, help="storage URL (file:///dir, s3://bucket/prefix?..., memory://)")
    p.add_argument("--prefix", default="", help="storage prefix the backups live under")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=cmd_list)

    p = sub.add_parser("describe", help="show a backup's manifest")
    p.add_argument("--path", required=True)
    p.add_argument("--backup-id", required=True)
    p.add_argument("--prefix", default="")
    p.add_argument("--format", choices=("text", "json", "yaml"), default="text")
    p.set_defaults(handler=cmd_describe)

    p = sub.add_parser("validate", help="check a backup against its manifest")
    p.add_argument("--path", required=True)
    p.add_argument("--backup-id", required=True)
    p.add_argument("--prefix", default="")
    p.add_argument("--deep", action="store_true", help="read every segment: CRC32, SHA-256, record counts")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--workers", type=int, default=4, help="segments checked at once")
    p.add_argument("--keys-file", default=None,
                   help="encryption keyring (file or Secret directory; RBAK_ENCRYPTION_KEYS is also read): "
                        "with the key, --deep decrypts and checks everything; without it, stored sizes and SHA-256")
    p.add_argument("--write-report", action="store_true",
                   help="store the report next to the backup (validation/report-<ts>.json); a backup whose newest "
                        "report failed is skipped when a restore picks the latest backup")

    progress.add_arguments(p)
    p.set_defaults(handler=cmd_validate)


def _console() -> "Console":
    from rich.console import Console  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    # piped (a script, a test, `| grep`): no 80-column wrap that splits a backup id or a note over lines
    # (COLUMNS is no guide there: pytest and some shells export 80 to children that write to a pipe)
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 1000)


def _existing_storage(path: str):
    """The storage at ``--path``; a directory that does not exist is an error (``open_existing_storage``)."""

    return open_existing_storage(path)


def cmd_list(args: argparse.Namespace) -> int:
    entries = list_backups(_existing_storage(args.path), args.prefix)
    unreadable = [e for e in entries if e.unreadable]
    if args.format == "json":
        output.emit(args, list_obj(entries))
        _refuse_unreadable(unreadable)
        return 0
    from rich.table import Table  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    if not entries:
        print(f"no backups at {args.path}")
        return 0
    t = Table("BACKUP ID", "STATUS", "CREATED", "QUEUES", "MESSAGES", "SIZE", "ENCRYPTED", "NOTES", box=None,
              pad_edge=False)
    for e in entries:
        m = e.manifest
        t.add_row(
            e.backup_id, e.status, fmt_ts(m.created_at) if m else "-",
            str(len(m.queues)) if m else "-", str(m.total_messages) if m else "-",
            human_bytes(m.total_bytes) if m else "-", encrypted_label(m) if m else "-",
            list_notes(m) if m else (e.error or e.note or ""),
        )
    _console().print(t)
    _refuse_unreadable(unreadable)
    return 0


def _refuse_unreadable(unreadable: list) -> None:
    """After the listing: every backup whose manifest could not be read, named on stderr, and exit 1
    (a script must not take a listing missing a backup for the whole storage)."""
    for e in unreadable:
        print(f"rbak: backup {e.backup_id!r}: {e.error}", file=sys.stderr)
    if unreadable:
        raise StorageError(f"{len(unreadable)} backup(s) listed as unreadable (their manifest could not be read: "
                           f"{', '.join(repr(e.backup_id) for e in unreadable)}); the others are listed")


def key_wraps(storage, backup_id: str, prefix: str) -> list[dict]:
    """The wrap objects of an envelope backup: which key-encryption keys can open its data key."""

    out: list[dict] = []
    for key, rec in read_wraps(storage, BackupLayout(backup_id, prefix)):
        if isinstance(rec, Exception):
            out.append({"key": key, "error": str(rec)})
        else:
            out.append({"key": key, "kek": str(rec.kek), "kek_source": rec.kek_source, "kek_id": rec.kek_id,
                        "created_at": rec.created_at})
    return out


def cmd_describe(args: argparse.Namespace) -> int:
    storage = _existing_storage(args.path)
    m = load_manifest(storage, args.backup_id, args.prefix)
    obj = describe_obj(m)
    if m.encryption is not None and m.encryption.envelope:
        obj["key_wraps"] = key_wraps(storage, m.backup_id, args.prefix)
    if args.format == "json":
        output.emit(args, obj)
        return 0
    if args.format == "yaml":

        print(yaml.safe_dump(obj, sort_keys=False, allow_unicode=True), end="")
        return 0
    from rich.table import Table  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    c = _console()
    c.print(f"[bold]Backup[/bold] {m.backup_id} ({obj['status']})")
    c.print(f"  created    {fmt_ts(m.created_at)}")
    c.print(f"  completed  {fmt_ts(m.completed_at)}")
    c.print(f"  source     {m.source_cluster or '-'} (RabbitMQ {m.rabbitmq_version or '?'})")
    if m.encryption and m.encryption.envelope:
        c.print(f"  encryption {m.encryption.algorithm}, envelope: data key {m.encryption.key_id} wrapped by "
                + (", ".join(w["kek"] if "kek" in w else f"(unreadable {w['key']})" for w in obj["key_wraps"])
                   or "no key (no wrap object found)"))
    elif m.encryption:
        c.print(f"  encryption {m.encryption.algorithm}, key id {m.encryption.key_id}")
    else:
        c.print("  encryption none: segments and definitions are stored in plaintext")
    if m.content:
        c.print(f"  content    {list_notes(m).split(';')[0]}")
    c.print(f"  totals     {m.total_messages} messages, {m.total_segments} segments, {human_bytes(m.total_bytes)}")
    if m.archive is not None:
        a = m.archive
        c.print(f"  archive    {a.name}: generation {'open' if a.open else 'closed'}, {a.ticks} tick(s); "
                f"recoverable until {fmt_ms(a.recoverable_until)} ({a.recoverable_until} ms)", markup=False)
        for q in m.queues:  # what the broker held at the last probe, beside what is archived (else JSON only)
            ce = a.committed.get(f"{q.vhost}/{q.name}")
            if ce is not None:
                last = q.stream.last_offset if q.stream is not None else None
                behind = ""
                if last is not None and ce.offset is not None and ce.offset >= 0:
                    behind = f", {max(0, ce.offset - last)} behind"
                end = "unknown" if ce.offset is None else "none (empty)" if ce.offset < 0 else ce.offset
                c.print(f"  committed  {q.vhost}/{q.name}: broker's end offset {end} at {fmt_ms(ce.at)}, "
                        f"archived up to {'-' if last is None else last}{behind}", markup=False)
    if m.definitions:
        d = m.definitions
        c.print(f"  definitions {d.vhost_count} vhosts, {d.queue_count} queues, "
                f"{d.exchange_count} exchanges, {d.user_count} users")
    t = Table("VHOST", "QUEUE", "TYPE", "MESSAGES", "SEGMENTS", "SIZE", "FIRST", "LAST", box=None, pad_edge=False)
    for q in m.queues:
        tap = q.stream.tap if q.stream is not None else None
        t.add_row(q.vhost, q.name, q.queue_type + (f", tap of {tap.queue}" if tap else ""), str(q.message_count), str(len(q.segments)),
                  human_bytes(q.size_bytes), fmt_ts(q.first_message_timestamp), fmt_ts(q.last_message_timestamp))
    c.print(t)
    for s in m.queue_status:
        counts = f" (read {s.read} of {s.expected})" if s.status == "partial" else ""
        c.print(f"  [bold]{s.status}[/bold] {s.vhost}/{s.name}{counts}: {s.reason}", markup=True)
    for q, g in m.gaps:
        c.print(f"  gap {q.vhost}/{q.name}: offsets {g.from_offset}..{g.to_offset} (at most {g.count} message(s)) removed by "
                f"the stream's retention before this backup; in no backup")
    for q in m.queues:
        if q.stream is not None and q.stream.previous_backup:
            c.print(f"  chain {q.vhost}/{q.name}: continues backup {q.stream.previous_backup} after offset "
                    f"{q.stream.previous_last_offset}")
        elif q.stream is not None and q.stream.recreated:
            c.print(f"  recreated {q.vhost}/{q.name}: the stream was declared again; backed up from its first offset")
        if q.stream is not None and q.stream.tap is not None:
            tap = q.stream.tap
            c.print(f"  tap {q.vhost}/{q.name}: what was published to {tap.queue_type} queue {tap.queue!r} through "
                    f"its bindings (not what remained in it, nor what came through the default exchange); "
                    f"restored into {tap.queue!r} by default", markup=False)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:

    storage = _existing_storage(args.path)
    m = load_manifest(storage, args.backup_id, args.prefix)
    with progress.cli_session("validate", args.backup_id, args, storage=storage, prefix=args.prefix,
                              display=args.format == "text") as ps:
        report = validate_backup(storage, args.backup_id, args.prefix, deep=args.deep, workers=args.workers,
                                 progress=progress.validate_events(ps.tracker, m),
                                 keyring=load_keyring(args.keys_file))
    report_key = None
    if args.write_report:
        obj = report.to_json_obj()
        obj.update(engine="cli", all_problems=report.all_problems())
        report_key = store_report(storage, obj, args.backup_id, args.prefix)
    if args.format == "json":
        obj = report.to_json_obj()
        if report_key:
            obj["report_key"] = report_key
        output.emit(args, obj)
    else:
        kind = "deep" if args.deep else "shallow"
        n = len(report.segments)
        if report.result == UNVERIFIED:
            pass  # said by the error below, the one line of a failure
        elif report.ok:
            notes = "".join(f"\n  - {w}" for w in report.notes)
            qual = ", with gaps" if report.gaps else ""
            qual += ", partial" if report.partial else ""
            print(f"backup {args.backup_id} is valid{qual} ({kind}: {n} segments checked){notes}")
        else:
            print(f"backup {args.backup_id} is NOT valid ({kind}: {n} segments checked, "
                  f"{len(report.bad_segments)} bad):", file=sys.stderr)
            for line in report.all_problems():
                print(f"  - {line}", file=sys.stderr)
        for note in report.notes:
            print(f"note: {note}", file=sys.stderr)
        if report_key:
            print(f"report: {report_key}", file=sys.stderr)
    if report.result == UNVERIFIED:
        raise UnverifiedError(f"backup {args.backup_id!r} is {unverified_line(report.unverified or '')} "
                              f"({len(report.segments)} segment(s))")
    if not report.ok:
        raise ValidationError(f"backup {args.backup_id!r} is NOT valid: {len(report.bad_segments)} bad segment(s), "
                              f"{len(report.all_problems())} problem(s)", report.all_problems())
    return 0
