"""``rbak import rabbitmq-dir PATH --to URL --backup-id ID``: a node's files become a backup."""

from __future__ import annotations

import argparse
import sys

from ..errors import PARTIAL_EXIT_CODE
from ..format.compression import Compression
from ..repo import progress
from ..storage import open_storage
from .secrets import add_encryption_args, import_codec_from


def register(subparsers, import_subparsers) -> None:
    p = import_subparsers.add_parser(
        "rabbitmq-dir",
        help="read a stopped RabbitMQ node's data directory (classic, quorum, stream) into a new backup",
        description=(
            "Reads the classic queues (index v1 and v2, embedded messages and the shared message "
            "store), quorum queues (Ra logs) and streams (Osiris segments) of a stopped RabbitMQ "
            "node's data directory, read-only, and writes an ordinary RBAK backup that 'rbak restore' "
            "can publish into any RabbitMQ. Acked messages are not exported; unacked ones are, in "
            "queue order; streams from their first offset present (or --from-offset)."
        ),
    )
    p.add_argument("path", metavar="PATH", help="node data dir (e.g. /var/lib/rabbitmq/mnesia/rabbit@host), "
                   "its mnesia base, or msg_stores/vhosts")
    p.add_argument("--to", required=True, metavar="URL", help="storage URL: file:///dir, s3://bucket/prefix, ...")
    p.add_argument("--backup-id", required=True, metavar="ID")
    p.add_argument("--prefix", default="", help="storage prefix for the backup")
    p.add_argument("--compression", default="zstd", choices=[c.name.lower() for c in Compression])
    p.add_argument("--skip-damaged", action="store_true",
                   help="export everything readable and report the damaged files/offsets that were skipped")
    p.add_argument("--vhost", action="append", default=None, metavar="V", help="only this vhost (repeatable)")
    p.add_argument("--queue", action="append", default=None, metavar="Q", help="only this queue (repeatable)")
    p.add_argument("--types", default="classic,quorum,stream", metavar="T[,T...]",
                   help="queue types to export: classic, quorum, stream (comma-separated; default all)")
    p.add_argument("--from-offset", type=int, default=None, metavar="N",
                   help="start every stream at this offset instead of the first one present")
    add_encryption_args(p)

    progress.add_arguments(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..offline.rabbitmq.rabbitmq_dir import import_rabbitmq_dir  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    codec = import_codec_from(args, args.backup_id)  # a missing key stops the import before anything else
    with progress.cli_session("import", args.backup_id, args, storage=lambda: open_storage(args.to),
                              prefix=args.prefix) as ps:
        res = import_rabbitmq_dir(
            args.path, args.to, args.backup_id, prefix=args.prefix, compression=args.compression,
            skip_damaged=args.skip_damaged,
            vhosts=set(args.vhost) if args.vhost else None,
            queues=set(args.queue) if args.queue else None,
            types={t.strip() for t in args.types.split(",") if t.strip()},
            from_offset=args.from_offset,
            codec=codec,
            progress=ps.tracker,
        )
    m = res.manifest
    out = sys.stdout
    counts: dict[str, list[int]] = {}
    for q in res.queues:
        what = f"index v{q.version}" if q.kind == "classic" else q.kind + (f", {q.detail}" if q.detail else "")
        print(f"vhost {q.vhost!r} queue {q.name!r} ({what}): {q.exported} message(s)", file=out)
        c = counts.setdefault(q.kind, [0, 0])
        c[0] += 1
        c[1] += q.exported
    print(f"backup {m.backup_id!r}: {m.total_messages} message(s) in {len(m.queues)} queue(s), "
          f"{m.total_segments} segment(s), {m.total_bytes} bytes", file=out)
    for kind in ("classic", "quorum", "stream"):
        if kind in counts:
            print(f"  {kind}: {counts[kind][0]} queue(s), {counts[kind][1]} message(s)", file=out)
    for n in res.ctx.notes:
        print(f"note: {n}", file=out)
    if res.ctx.skipped:
        print(f"skipped {len(res.ctx.skipped)} damaged item(s):", file=sys.stderr)
        for s in res.ctx.skipped:
            print(f"  {s}", file=sys.stderr)
    if m.is_partial:  # --skip-damaged stepped over damage: recorded in the manifest, and a distinct exit
        names = ", ".join(f"{q.vhost}/{q.name}" for q in m.queue_status)
        print(f"backup {m.backup_id!r} is PARTIAL: damaged data was skipped in {names} (see 'rbak describe')",
              file=sys.stderr)
        return PARTIAL_EXIT_CODE
    return 0
