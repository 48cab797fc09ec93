"""``rbak definitions-export`` / ``rbak definitions-import`` (the Rust tool's names).

Export reads ``/api/definitions`` of the config's ``source`` (or ``target``
when there is no source), through the same client and TLS rule as a backup,
scoped like a backup's definitions to ``source.queues`` (vhosts, queues). Import posts a definitions file into the config's
``target`` with the restore section's selection and vhost/queue remapping,
after saving the target's current definitions: into the backup as
``definitions/rollback-before-import-<ts><ext>`` when the config names a
backup id and storage, else next to the input file as
``<input>.rollback-before-import-<ts>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ..config import QueueSelection, load_config
from ..errors import ConfigError
from ..format.compression import Compression, compress
from ..restore.options import RestoreOptions, options_from_config
from . import output


def register(subparsers: Any, _import_subparsers: Any) -> None:
    e = subparsers.add_parser("definitions-export", help="export a broker's definitions (GET /api/definitions)")
    e.add_argument("--config", "-c", required=True)
    e.add_argument("--output", "-o", help="file to write (default: stdout)")
    e.set_defaults(handler=run_export)
    i = subparsers.add_parser("definitions-import", help="import a definitions file into the target broker")
    i.add_argument("--config", "-c", required=True)
    i.add_argument("--input", "-i", required=True, help="definitions JSON file")
    i.add_argument("--dry-run", action="store_true", help="report what would change; import nothing")
    i.add_argument("--json", action="store_true", help="print the result as JSON")
    i.set_defaults(handler=run_import)


def _client(conn: Any, role: str):
    from ..broker.management import ManagementClient  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    return ManagementClient.for_connection(conn, role)


def run_export(args: Any) -> int:
    from ..backup.definitions import scope_definitions  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    cfg = load_config(args.config)
    conn = cfg.source or cfg.target
    if conn is None:
        raise ConfigError(f"{args.config}: source: required (the broker to export from)")
    with _client(conn, "source" if cfg.source is not None else "target") as client:
        doc = client.get_definitions()
    if cfg.source is not None:
        doc = scope_definitions(doc, cfg.source.queues)
    data = json.dumps(doc, indent=2) + "\n"
    if args.output:
        tmp = args.output + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, args.output)
        print(f"rbak: wrote {len(doc.get('queues', []))} queues, {len(doc.get('exchanges', []))} exchanges "
              f"to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(data)
    return 0


def run_import(args: Any) -> int:
    from ..restore.definitions import apply_definitions, parse_definitions, rollback_timestamp  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    cfg = load_config(args.config)
    if cfg.target is None:
        raise ConfigError(f"{args.config}: target: required (the broker to import into)")
    try:
        with open(args.input, "rb") as f:
            doc = parse_definitions(f.read(), args.input)
    except OSError as e:
        raise ConfigError(f"--input {args.input!r}: cannot read: {e}") from None
    if cfg.backup_id:
        options = options_from_config(cfg, definitions_dry_run=args.dry_run or None)
    else:
        r = cfg.restore
        options = RestoreOptions(backup_id="definitions-import", target=cfg.target,
                                 definitions_dry_run=args.dry_run or r.definitions_dry_run,
                                 vhost_mapping=tuple(sorted(r.vhost_mapping.items())),
                                 queue_mapping=tuple(sorted(r.queue_mapping.items())),
                                 queues=QueueSelection(vhosts=list(r.queues.vhosts)),
                                 definitions_selection=r.definitions_selection,
                                 overwrite_users=r.overwrite_users, definitions_strict=r.definitions_strict,
                                 transient_queues=r.transient_queues)

    def write_rollback(data: bytes) -> str:
        ts = rollback_timestamp()
        if cfg.backup_id and cfg.storage is not None:
            comp = Compression.parse(cfg.backup.compression)
            key = cfg.layout().rollback_definitions(ts, comp)
            storage = cfg.storage.open()
            storage.put(key, compress(data, comp))
            return key
        path = f"{args.input}.rollback-before-import-{ts}.json"
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return path

    with _client(cfg.target, "target") as client:
        res = apply_definitions(doc, args.input, options, client, write_rollback)
    if args.json:
        output.emit(args, res.to_json_obj())
    else:
        head = "would change" if res.dry_run else f"imported (rollback snapshot: {res.rollback_key})"
        print(f"definitions from {args.input}: {head}")
        for line in res.report_lines():
            print(line)
        for kind, ch in res.changes.items():
            print(f"  {kind}: create {len(ch['create'])}, change {len(ch['change'])}")
    return 0
