"""``kubectl rbak``: run, follow and inspect RabbitMQBackups from the command line.

Installed as the ``kubectl-rbak`` console script, which kubectl finds on the
``PATH`` as a plugin. It runs with the user's own credentials (the kubeconfig,
``--kubeconfig``/``--context`` as kubectl reads them) through the operator's
client (``rbak_operator.kube.client.Kube``, its public API), and asks the operator to act only the way a user can:
the ``rbak.io/backup-now`` and ``rbak.io/drill-now`` annotations, ``spec.suspend``
and new RabbitMQRestore objects. What is stored is read directly from the
object's storage with the credentials of the Secret the object names, the way
the operator reads it (``rbak_operator.reconcile.storage.open_backup_storage``).

Every bad input is one ``error: ...`` line on stderr naming the object or flag,
and exit code 1 (2 for usage errors, from argparse).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from rbak.errors import RbakError
from rbak_kubectl.context import (
    DEFAULT_PICKUP_TIMEOUT,
    DEFAULT_TIMEOUT,
    PROG,
    USER_AGENT,
    Ctx,
    PluginError,
    PluginKube,
    connect,
)
from rbak_kubectl.runs import cmd_backup, cmd_drill, cmd_logs, cmd_status, cmd_suspend
from rbak_kubectl.stored import cmd_describe, cmd_list, cmd_restore
from rbak_operator.kube.client import use_connection
from rbak_operator.kube.errors import ApiError


def build_parser() -> argparse.ArgumentParser:
    def global_flags(p: argparse.ArgumentParser, default: Any) -> None:
        p.add_argument("-n", "--namespace", default=default, help="namespace (default: the context's)")
        p.add_argument("--kubeconfig", default=default, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
        p.add_argument("--context", default=default, help="kubeconfig context (default: the current one)")

    parser = argparse.ArgumentParser(
        prog=PROG, description="Run, follow and inspect rbak's RabbitMQBackups (a kubectl plugin).")
    global_flags(parser, None)
    # The same flags after the command, as with kubectl (SUPPRESS: an absent one does not reset
    # what was given before the command).
    common = argparse.ArgumentParser(add_help=False)
    global_flags(common, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def cmd(name: str, help: str, wait: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, parents=[common])
        if wait:
            p.add_argument("--no-wait", action="store_true", help="start it and return (do not follow)")
            p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                           help="seconds to follow before giving up (default %(default)g)")
            p.add_argument("--pickup-timeout", type=float, default=DEFAULT_PICKUP_TIMEOUT, metavar="SECONDS",
                           help="give up after this long when no operator has acted on the request "
                                "(default %(default)g)")
        return p

    p = cmd("backup", "run a backup now and follow it", wait=True)
    p.add_argument("name", metavar="NAME")
    p = cmd("status", "objects, last runs, next runs and drill results in one table")
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p = cmd("list", "the backups in the object's storage")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p = cmd("describe", "one stored backup: totals and queues (--archive NAME: an archive's status and generation)")
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("backup_id", metavar="BACKUP_ID", nargs="?")
    p.add_argument("--archive", metavar="ARCHIVE", help="a RabbitMQArchive: its status, then its newest generation "
                   "(or the one NAME names)")
    p.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    p = cmd("restore", "create a RabbitMQRestore of a backup (or an archive) and follow it", wait=True)
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("--backup-id", help="the backup to restore (kubectl rbak list NAME)")
    p.add_argument("--archive", metavar="ARCHIVE", help="restore every stream of a RabbitMQArchive up to --pitr TIME "
                   "(default: its recoverable-until)")
    p.add_argument("--pitr", metavar="START..END", help="restore only messages backed up in this window "
                   "(RFC 3339 times or epoch milliseconds; either side may be empty); with --archive one TIME "
                   "or 'recoverable'")
    p.add_argument("--to-vhost", action="append", default=[], metavar="[SOURCE=]TARGET",
                   help="restore a vhost into another one (TARGET alone: the backup's only vhost); repeatable")
    p.add_argument("--name", dest="restore_name", metavar="RESTORE", help="name of the RabbitMQRestore "
                   "(default NAME-<UTC time>)")
    p = cmd("drill", "run a restore drill now and follow it (--archive NAME: a RabbitMQArchive's)", wait=True)
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("--archive", metavar="ARCHIVE", help="drill a RabbitMQArchive: its state of a few minutes ago "
                   "(spec.verify.restoreDrill.lookbackSeconds) restored and compared with the live streams")
    p = cmd("logs", "the logs of the last (or running) run's pod")
    p.add_argument("name", metavar="NAME")
    p = cmd("suspend", "stop scheduled runs (spec.suspend: true)")
    p.add_argument("name", metavar="NAME")
    p = cmd("resume", "resume scheduled runs (spec.suspend: false)")
    p.add_argument("name", metavar="NAME")
    return parser


COMMANDS: dict[str, Callable[[Ctx], int]] = {
    "status": cmd_status, "backup": cmd_backup, "list": cmd_list, "describe": cmd_describe,
    "restore": cmd_restore, "drill": cmd_drill, "logs": cmd_logs,
    "suspend": lambda c: cmd_suspend(c, True), "resume": lambda c: cmd_suspend(c, False),
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for flag in ("timeout", "pickup_timeout"):
        if getattr(args, flag, 1) <= 0:
            print(f"error: --{flag.replace('_', '-')}: must be a positive number of seconds", file=sys.stderr)
            return 1
    try:
        conn = connect(args.kubeconfig, args.context)
        use_connection(conn, USER_AGENT)
        ctx = Ctx(PluginKube(), args.namespace or conn.namespace or "default", args)
        return COMMANDS[args.command](ctx)
    except PluginError as e:
        print(f"error: {e}", file=sys.stderr)
    except ApiError as e:
        print(f"error: {e}", file=sys.stderr)
    except RbakError as e:
        print(f"error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("error: interrupted (the run goes on in the cluster)", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
