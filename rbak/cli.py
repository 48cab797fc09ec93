"""The ``rbak`` command line.

Each subcommand lives in ``rbak/commands/<module>.py`` and exposes
``register(subparsers, import_subparsers)``; that keeps one file per feature
and lets this module stay a thin dispatcher. A handler returns an exit code.
Every ``RbakError`` becomes one clear line on stderr and its exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

from . import __version__
from .errors import RbakError

COMMAND_MODULES = (
    "inspect",          # list, describe, validate
    "backup",           # backup
    "archive",          # archive (continuous stream archiving)
    "restore",          # restore
    "prune",            # prune (retention)
    "drill",            # drill (restore drill into a scratch vhost)
    "doctor",           # doctor (storage settings and rights that can lose or expose backups)
    "keys",             # keys rewrap (envelope encryption: wrap data keys for another key)
    "definitions",      # definitions-export, definitions-import
    "import_rabbitmq",  # import rabbitmq-dir
    "import_mosquitto", # import mosquitto-db
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rbak", description="RabbitMQ backups in the RBAK format")
    parser.add_argument("--version", action="version", version=f"rbak {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    imp = sub.add_parser("import", help="turn a broker's on-disk files into an RBAK backup")
    imp_sub = imp.add_subparsers(dest="import_source", metavar="SOURCE", required=True)
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(f"rbak.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"rbak.commands.{name}":
                continue  # feature not built into this tree
            raise
        mod.register(sub, imp_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .logsafe import configure

    # no credentials (botocore's Authorization at -vv, URL passwords) or raw control bytes in logs
    configure(logging.WARNING - 10 * min(args.verbose, 2) if args.verbose else logging.INFO, stream=sys.stderr)
    # pika logs every dropped socket with a traceback at ERROR; rbak reports
    # connection failures itself, naming the queue, so keep pika quiet unless -vv.
    logging.getLogger("pika").setLevel(logging.DEBUG if args.verbose >= 2 else logging.CRITICAL)
    try:
        return int(args.handler(args) or 0)
    except RbakError as e:
        print(f"rbak: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("rbak: interrupted", file=sys.stderr)
        return 130
