"""The ``rbak`` command line.

Each subcommand lives in ``rbak/commands/<module>.py`` and exposes
``register(subparsers, import_subparsers)``; that keeps one file per feature
and lets this module stay a thin dispatcher. A handler returns an exit code.
Every ``RbakError`` becomes one clear line on stderr and its exit code; a
command asked for JSON also gets one JSON object on stdout, success or failure
(``commands/output.py``): written here, once, never by the commands.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from typing import Any, NoReturn, Sequence

from . import __version__
from .base.logsafe import configure
from .commands import output
from .errors import RbakError, UsageError

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

#: Libraries' loggers and their level below -vvv (which sets DEBUG on each).
_QUIET_LIBRARIES = {"pika": logging.CRITICAL, "proton": logging.WARNING, "botocore": logging.INFO,
                    "boto3": logging.INFO, "s3transfer": logging.INFO, "urllib3": logging.INFO}


class _Parser(argparse.ArgumentParser):
    """argparse's usage and message on stderr as ever, then a ``UsageError`` (exit 2) the CLI
    handles like any other error: a command asked for JSON gets it on stdout too."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(f"{self.prog}: {message}")


def _json_asked(argv: Sequence[str]) -> bool:
    """Whether a command line that did not parse asked for JSON output."""
    args = list(argv)
    return "--json" in args or "--format=json" in args or any(
        a == "--format" and b == "json" for a, b in zip(args, args[1:]))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rbak", description="RabbitMQ backups in the RBAK format")
    parser.add_argument("--version", action="version", version=f"rbak {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: rbak's debug log; -vvv: the libraries' too)")
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
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        print(f"rbak: {e}", file=sys.stderr)
        if _json_asked(argv):
            _print_json(output.failure(None, e.exit_code, e))
        return e.exit_code

    # no credentials (botocore's Authorization at -vvv, URL passwords) or raw control bytes in logs
    configure(logging.WARNING - 10 * min(args.verbose, 2) if args.verbose else logging.INFO, stream=sys.stderr)
    # -vv is rbak's own debug log; the libraries' debug logs come with -vvv. botocore logs every request
    # it signs at DEBUG: an archiver storing a segment per stream per tick at -vv spent most of its
    # storing threads' time in the log handler's lock (py-spy, 2026-12-06), which moved its lag.
    # pika logs every dropped socket with a traceback at ERROR; rbak reports connection failures
    # itself, naming the queue; qpid-proton logs each AMQP 1.0 connect and disconnect at INFO.
    libraries = args.verbose >= 3
    for name, quiet in _QUIET_LIBRARIES.items():
        logging.getLogger(name).setLevel(logging.DEBUG if libraries else quiet)
    err: BaseException | None = None
    message: str | None = None
    try:
        code = int(args.handler(args) or 0)
    except RbakError as e:
        print(f"rbak: {e}", file=sys.stderr)
        code, err = e.exit_code, e
    except KeyboardInterrupt as e:
        print("rbak: interrupted", file=sys.stderr)
        code, err, message = 130, e, "interrupted"
    except Exception as e:  # a bug: its traceback follows on stderr, the JSON still says it failed
        if output.wants_json(args):
            _print_json(output.final(args, 1, e, f"{type(e).__name__}: {e}"))
        raise
    if output.wants_json(args):
        if code and err is None:
            message = f"the command failed with exit code {code}"
        res = output.final(args, code, err, message)
        if res is not None:
            _print_json(res)
    return code


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))
