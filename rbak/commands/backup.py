"""``rbak backup [--config FILE]`` and ``rbak config-reference``.

With no config, the embedded default backs up the local broker
(amqp://guest:guest@localhost:5672, management on 15672) to ``./rbak-backups``.
Progress (``rbak.repo.progress``): a rich bar on a terminal, plain periodic log lines otherwise;
``--json`` prints the summary as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
from urllib.parse import parse_qs, unquote, urlsplit

from .. import metrics as bmetrics
from ..config import Config, config_reference_markdown, default_backup_id, json_schema, load_config
from ..errors import ConfigError
from ..format.layout import check_backup_id
from ..repo import progress
from . import output

log = logging.getLogger("rbak.backup")


def register(sub, import_sub) -> None:
    p = sub.add_parser("backup", help="back up a RabbitMQ cluster (queues are never consumed)",
                       description="Back up queues, streams and definitions. Without --config: the local broker "
                                   "(guest/guest) to ./rbak-backups.")
    p.add_argument("--config", "-c", metavar="FILE", help="YAML config (mode: backup); see `rbak config-reference`")
    p.add_argument("--backup-id", help="override backup_id (default: the config's, else backup-<UTC timestamp>)")
    p.add_argument("--path", help="override the storage: a directory, or a storage URL (file://, s3://...)")
    p.add_argument("--vhost", action="append", metavar="VHOST",
                   help="back up only this vhost (repeatable; overrides source.queues.vhosts)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")

    progress.add_arguments(p)
    p.set_defaults(handler=run)

    r = sub.add_parser("config-reference", help="print the configuration reference (Markdown) or --json-schema")
    how = r.add_mutually_exclusive_group()
    how.add_argument("--json-schema", action="store_true", help="the configuration file's JSON Schema")
    how.add_argument("--output-schema", action="store_true",
                     help="the JSON Schema of what every command prints with --json / --format json, "
                          "failures included (docs/cli-json.md)")
    r.set_defaults(handler=reference)


def reference(args) -> int:
    if args.json_schema:
        print(json.dumps(json_schema(), indent=2))
    elif args.output_schema:
        print(json.dumps(output.SCHEMA, indent=2))
    else:
        print(config_reference_markdown())
    return 0


def build_config(args: argparse.Namespace) -> Config:
    if args.config:
        cfg = load_config(args.config)
    else:
        cfg = Config.default_backup()
    if args.backup_id:
        cfg.backup_id = args.backup_id
    if not cfg.backup_id:
        cfg.backup_id = default_backup_id()

    check_backup_id(cfg.backup_id, "--backup-id" if args.backup_id else "backup_id")
    if args.path:
        _apply_path(cfg, args.path)
    if cfg.mode != "backup":
        raise ConfigError(f"mode: {args.config} is a {cfg.mode!r} configuration; rbak backup needs mode: backup")
    if getattr(args, "vhost", None):
        assert cfg.source is not None  # a backup config without a source is refused when loaded
        cfg.source.queues.vhosts = list(args.vhost)
    return cfg


def _apply_path(cfg, path: str) -> None:
    if "://" not in path:
        cfg.storage.backend, cfg.storage.path = "filesystem", path
        return
    u = urlsplit(path)
    if u.scheme == "file":
        cfg.storage.backend, cfg.storage.path = "filesystem", unquote(u.path)
    elif u.scheme == "memory":
        cfg.storage.backend, cfg.storage.path = "memory", u.netloc + u.path
    elif u.scheme == "s3":
        qs = {k: v[-1] for k, v in parse_qs(u.query).items()}
        cfg.storage.backend, cfg.storage.bucket = "s3", u.netloc
        cfg.storage.prefix = unquote(u.path).strip("/") or cfg.storage.prefix
        cfg.storage.region = qs.get("region", cfg.storage.region)
        cfg.storage.endpoint = qs.get("endpoint", cfg.storage.endpoint)
        cfg.storage.path_style = qs.get("path_style", "").lower() in ("1", "true", "yes") or cfg.storage.path_style
    else:
        raise ConfigError(f"--path: unsupported storage URL {path!r} (a directory, file://, s3:// or memory://)")


def run(args) -> int:
    from ..backup import BackupEngine  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    cfg = build_config(args)
    assert cfg.backup_id is not None  # build_config sets one
    server = bmetrics.serve(cfg.metrics) if cfg.metrics.enabled else None
    try:
        storage = cfg.storage.open()
        with progress.cli_session("backup", cfg.backup_id, args, storage=storage, prefix=cfg.storage.prefix) as ps:
            summary = BackupEngine(cfg, storage=storage, progress=progress.backup_events(ps.tracker)).run()
    finally:
        if server is not None:
            server.shutdown()
    if args.json:
        output.emit(args, summary.to_json_obj())  # a failed run's summary: the CLI's failure object (e.summary)
    else:
        print(f"backup {summary.backup_id}: {summary.total_messages} messages from {len(summary.queues)} queue(s), "
              f"{sum(q.segments for q in summary.queues)} segment(s), {summary.total_bytes} bytes, "
              f"{summary.duration_secs:.1f}s -> {summary.storage} ({summary.manifest_key})")
        print(f"  vhosts read: {', '.join(summary.vhosts) or '-'}"
              + (" (every vhost of the cluster)" if summary.vhost_scope is None else ""))
        for q in summary.queues:
            held = f", {q.held_by_consumers} held by consumers (not backed up)" if q.held_by_consumers else ""
            print(f"  {q.vhost}/{q.name} ({q.queue_type}): {q.messages} messages{held} [{q.status}]")
        if summary.held_by_consumers:
            print(f"  WARNING: {summary.held_by_consumers} message(s) held unacknowledged by consumers are not in "
                  "the backup")
        if summary.definitions:
            d = summary.definitions
            print(f"  definitions: {d.vhost_count} vhosts, {d.queue_count} queues, {d.exchange_count} exchanges, "
                  f"{d.user_count} users -> {d.key}")
    return 0
