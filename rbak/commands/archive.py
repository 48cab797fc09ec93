"""``rbak archive --config F``: follow every selected stream and archive it continuously.

A long-running process (the operator runs it in a Deployment). It stops cleanly on SIGTERM or
SIGINT: every record read is stored, the open generation gets its manifest, and it exits 0.
``--json`` prints the summary (generations, recoverable-until, per-stream positions and gaps) then.
"""

from __future__ import annotations

import argparse
import json
import signal
from typing import Any

from ..config import load_config
from ..errors import ConfigError
from ..metrics import serve


def register(sub: argparse._SubParsersAction, _imp: argparse._SubParsersAction) -> None:
    p = sub.add_parser("archive", help="archive streams continuously (recovery point: seconds)",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", "-c", required=True, help="YAML config (mode: archive); see docs/archive.md")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on this port (overrides metrics.port; 0: any free port)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON when it stops")
    p.set_defaults(handler=run)


def run(args: Any) -> int:
    from ..archive.archiver import Archiver  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py

    cfg = load_config(args.config)
    if cfg.mode != "archive":
        raise ConfigError(f"mode: {args.config} is a {cfg.mode!r} configuration; rbak archive needs mode: archive")
    if args.metrics_port is not None:
        cfg.metrics.enabled, cfg.metrics.port = True, args.metrics_port
    if cfg.metrics.enabled:
        serve(cfg.metrics)
    archiver = Archiver(cfg)

    def stop(signum: int, _frame: Any) -> None:
        archiver.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    summary = archiver.run()
    if args.json:
        print(json.dumps(summary.to_json_obj(), indent=2))
    else:
        print(f"archive {summary.archive}: {len(summary.generations)} generation(s), {summary.segments} segment(s), "
              f"{summary.records} record(s); recoverable until {summary.to_json_obj()['recoverable_until_utc']}")
    return 0
