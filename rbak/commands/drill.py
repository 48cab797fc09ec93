"""``rbak drill``: restore a backup into a scratch vhost, compare it with the backup, delete the vhost.

Reads a config of any mode: the scratch vhost goes on ``drill.target``, else
the config's ``source`` (the cluster that was backed up), else its ``target``.
Without ``--backup-id`` the newest complete backup is drilled. ``--archive NAME`` drills a continuous
archive instead: its state of ``--lookback`` seconds ago (default 300) is restored into a scratch vhost
and each stream compared, offset by offset, with the live stream; the report records the recovery
point achieved and the restore time (docs/archive.md, "Drills"). The source
vhosts are never touched; the scratch vhost is deleted also when the drill
fails half-way or gets SIGTERM. Exit 0 only when every queue matched.

``rbak drill verify REPORT`` checks a signed report (``drill.signing_key_file``): its Ed25519
signature, and that every field it shows is the signed one. REPORT is a file, or the report's
storage URL (``s3://bucket/prefix/<backup>/drills/<name>.json?endpoint=...``, ``file:///...``).
"""

from __future__ import annotations

import argparse
import signal
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from ..config import load_config
from ..errors import ConfigError, DrillError, EvidenceError, StorageError, Terminated
from ..format.layout import check_backup_id
from ..repo.evidence import load_public_key
from ..repo.evidence import verify as check
from ..storage.url import open_storage
from . import output


def register(sub: argparse._SubParsersAction, _imp: argparse._SubParsersAction) -> None:
    p = sub.add_parser("drill", help="restore drill: restore into a scratch vhost, compare, delete it",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", "-c", help="YAML config file (storage, and drill.target or source); required "
                                           "to run a drill")
    p.add_argument("--backup-id", help="backup to drill (default: the newest complete one)")
    p.add_argument("--archive", metavar="NAME",
                   help="drill continuous archive NAME (rbak archive's archive.name) instead of a backup: restore "
                        "its state of --lookback seconds ago into a scratch vhost and compare every stream with the "
                        "live one (the config's source, else the drill target)")
    p.add_argument("--lookback", metavar="SECS", type=float, default=None,
                   help="with --archive: how far back the restored state is (default drill.lookback_secs, 300; "
                        "never past the archive's recoverable-until)")
    p.add_argument("--drill-id", help="id of this drill (letters, digits, '.', '_', '-'; default random): "
                                      "in the scratch vhost's name and the report's key")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run)
    vsub = p.add_subparsers(dest="drill_action", metavar="ACTION", required=False)
    v = vsub.add_parser("verify", help="check a signed drill report and print what it proves",
                        description="Check a signed drill report: its Ed25519 signature, and that each field it "
                                    "shows is the one signed. Exit 0 only when both hold (and the key matches "
                                    "--public-key when given); a changed field is named.")
    v.add_argument("report", metavar="REPORT",
                   help="the report: a file, or its storage URL (s3://bucket/prefix/<backup>/drills/<name>.json"
                        "?endpoint=..., file:///...)")
    v.add_argument("--public-key", metavar="FILE",
                   help="PEM public key of the signer (without it only the key embedded in the report is used: "
                        "integrity, not who signed)")
    v.add_argument("--json", action="store_true", help="print the verified report and the signer as JSON")
    v.set_defaults(handler=verify)


def _raise_on_sigterm(signum: int, _frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM must not interrupt the cleanup
    raise Terminated("terminated by SIGTERM")


def run(args: argparse.Namespace) -> int:
    from ..drill.archive import (  # noqa: PLC0415 - start-up, as the next line
        DEFAULT_LOOKBACK_SECS,
        report_lines,
        run_archive_drill,
    )
    from ..drill.backup import options_from_config, run_drill  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    if not args.config:
        raise ConfigError("rbak drill: --config is required to run a drill (or: rbak drill verify REPORT)")
    cfg = load_config(args.config)
    if args.drill_id:
        check_backup_id(args.drill_id, "--drill-id")
    if args.backup_id:
        check_backup_id(args.backup_id, "--backup-id")
    if args.archive is not None:
        if args.backup_id:
            raise ConfigError("--backup-id: not with --archive (an archive drill takes the archive's newest "
                              "generation and its whole chain)")
        check_backup_id(args.archive, "--archive")
    elif args.lookback is not None:
        raise ConfigError("--lookback: only with --archive NAME")
    elif cfg.drill.lookback_secs != DEFAULT_LOOKBACK_SECS:
        raise ConfigError(f"drill.lookback_secs: {cfg.drill.lookback_secs:g} is used only by a drill of an archive "
                          "(--archive NAME); a backup drill restores the whole backup")
    lookback = cfg.drill.lookback_secs if args.lookback is None else args.lookback
    if not 0 <= lookback <= 7 * 86400:
        raise ConfigError(f"--lookback: {lookback:g} is not between 0 and 604800 seconds")
    options = options_from_config(cfg, args.backup_id, args.drill_id)
    if args.archive is not None:
        options = replace(options, backup_id=None)
    storage = cfg.storage.open()
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)  # finally blocks run: the vhost goes
    try:
        if args.archive is not None:
            report = run_archive_drill(storage, options, args.archive, lookback, live=cfg.source)
        else:
            report = run_drill(storage, options)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        output.emit(args, report.to_json_obj())
    else:
        for line in (report_lines(report) if args.archive is not None else report.lines()):
            print(line)
    if not report.passed:
        raise DrillError(f"FAILED: {report.reason}")
    return 0



def read_report(where: str) -> bytes:
    """The bytes of a report given as a file path or a storage URL of the object."""
    if "://" not in where:
        try:
            with open(where, "rb") as f:
                return f.read()
        except OSError as e:
            raise EvidenceError(f"REPORT {where}: {e.strerror or e}") from None

    parts = urlsplit(where)
    folder, _, name = parts.path.rstrip("/").rpartition("/")
    if not name:
        raise StorageError(f"REPORT {where!r}: no object name in the URL")
    storage = open_storage(urlunsplit((parts.scheme, parts.netloc, folder or "/", parts.query, "")))
    return storage.get(name)


def verify(args: argparse.Namespace) -> int:
    data = read_report(args.report)
    try:
        report = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise EvidenceError(f"{args.report}: not JSON ({e})") from None
    key = load_public_key(args.public_key) if args.public_key else None
    ok = check(report, key, where=args.report)
    if args.json:
        output.emit(args, {"verified": True, "signer": ok.fingerprint, "authenticated": ok.authenticated,
                           "report": ok.report})
    else:
        for line in ok.lines():
            print(line)
    return 0
