"""``rbak import mosquitto-db FILE --to URL --backup-id ID``: a Mosquitto persistence file as a backup."""

from __future__ import annotations

import argparse
import sys

from ..errors import PARTIAL_EXIT_CODE
from ..format.compression import Compression
from ..repo import progress
from ..storage import open_storage
from .secrets import add_encryption_args, import_codec_from


def register(sub: argparse._SubParsersAction, imp: argparse._SubParsersAction) -> None:
    p = imp.add_parser(
        "mosquitto-db",
        help="turn a Mosquitto persistence file (mosquitto.db) into an RBAK backup",
        description="Reads mosquitto.db (format versions 2-6, read-only) and writes its retained messages "
        "and persistent clients' queued messages as an RBAK backup: exchange amq.topic, routing key = "
        "topic with '/' -> '.', queues named as RabbitMQ's MQTT plugin names them. See docs/offline-import.md.",
    )
    p.add_argument("file", metavar="FILE", help="path of mosquitto.db (stop Mosquitto first or use a copy)")
    p.add_argument("--to", required=True, metavar="URL", help="storage URL (file:///dir, s3://bucket/prefix?..., memory://)")
    p.add_argument("--backup-id", required=True, metavar="ID", help="id of the new backup (must not exist)")
    p.add_argument("--prefix", default="", metavar="P", help="storage prefix to put the backup under")
    p.add_argument("--compression", default="zstd", choices=[c.config_name for c in Compression],
                   help="segment compression (default zstd)")
    p.add_argument("--skip-damaged", action="store_true",
                   help="export what can be read from a damaged file and report what was skipped")
    p.add_argument("--vhost", default="/", help="vhost recorded for the messages (default /)")
    add_encryption_args(p)

    progress.add_arguments(p)
    p.set_defaults(handler=cmd_import_mosquitto)


def cmd_import_mosquitto(args: argparse.Namespace) -> int:
    from ..offline.mosquitto import import_mosquitto_db  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    codec = import_codec_from(args, args.backup_id)  # a missing key stops the import before anything else
    with progress.cli_session("import", args.backup_id, args, storage=lambda: open_storage(args.to),
                              prefix=args.prefix) as ps:
        summary = import_mosquitto_db(
            args.file,
            args.to,
            args.backup_id,
            prefix=args.prefix,
            compression=args.compression,
            skip_damaged=args.skip_damaged,
            vhost=args.vhost,
            codec=codec,
            progress=ps.tracker,
        )
    print("\n".join(summary.lines()))
    if summary.partial:  # --skip-damaged stepped over damage: recorded in the manifest, and a distinct exit
        print(f"backup {args.backup_id!r} is PARTIAL: damaged data was skipped (see 'rbak describe')", file=sys.stderr)
        return PARTIAL_EXIT_CODE
    return 0
