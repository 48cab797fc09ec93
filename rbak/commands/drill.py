"""``rbak drill``: restore a backup into a scratch vhost, compare it with the backup, delete the vhost.

Reads a config of any mode: the scratch vhost goes on ``drill.target``, else
the config's ``source`` (the cluster that was backed up), else its ``target``.
Without ``--backup-id`` the newest complete backup is drilled. The source
vhosts are never touched; the scratch vhost is deleted also when the drill
fails half-way or gets SIGTERM. Exit 0 only when every queue matched.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from ..errors import RbakError


class Terminated(RbakError):
    prefix = "Restore drill"
    exit_code = 143


def register(sub: argparse._SubParsersAction, _imp: argparse._SubParsersAction) -> None:
    p = sub.add_parser("drill", help="restore drill: restore into a scratch vhost, compare, delete it",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", "-c", required=True, help="YAML config file (storage, and drill.target or source)")
    p.add_argument("--backup-id", help="backup to drill (default: the newest complete one)")
    p.add_argument("--drill-id", help="id of this drill (letters, digits, '.', '_', '-'; default random): "
                                      "in the scratch vhost's name and the report's key")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run)


def _raise_on_sigterm(signum: int, _frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM must not interrupt the cleanup
    raise Terminated("terminated by SIGTERM")


def run(args: argparse.Namespace) -> int:
    from ..config import load_config
    from ..drill import options_from_config, run_drill
    from ..keys import check_backup_id

    cfg = load_config(args.config)
    if args.drill_id:
        check_backup_id(args.drill_id, "--drill-id")
    if args.backup_id:
        check_backup_id(args.backup_id, "--backup-id")
    options = options_from_config(cfg, args.backup_id, args.drill_id)
    storage = cfg.storage.open()
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)  # finally blocks run: the vhost goes
    try:
        report = run_drill(storage, options)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(json.dumps(report.to_json_obj(), indent=2))
    else:
        for line in report.lines():
            print(line)
    if not report.passed:
        print(f"rbak: restore drill FAILED: {report.reason}", file=sys.stderr)
        return 1
    return 0

