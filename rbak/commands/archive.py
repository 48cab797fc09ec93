"""``rbak archive --config F``: follow every selected stream and archive it continuously.

A long-running process (the operator runs it in a Deployment). It stops cleanly on SIGTERM or
SIGINT: every record read is stored, the open generation gets its manifest, and it exits 0.
``--json`` prints the summary (generations, recoverable-until, per-stream positions and gaps) then.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import signal
import sys
import threading
from typing import Any

from ..config import ConnectionConfig, load_config
from ..errors import AmqpConnectionError, ConfigError, RbakError
from ..metrics import serve

log = logging.getLogger("rbak.archive")


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
    assert cfg.source is not None  # required for mode: archive (the config check)
    preflight(cfg.source)
    if cfg.metrics.enabled:
        serve(cfg.metrics)
    archiver = Archiver(cfg)

    def stop(signum: int, _frame: Any) -> None:
        if not archiver.stopping.is_set():
            report = threading.Timer(STOP_REPORT_SECS, stuck, args=(signal.Signals(signum).name,))
            report.daemon = True  # a stop that finishes in time exits without waiting for it
            report.start()
        archiver.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    summary = archiver.run()
    if args.json:
        print(json.dumps(summary.to_json_obj(), indent=2))
    else:
        if summary.state != "archived":  # a clean stop (exit 0), but nothing this process archived
            print(f"archive {summary.archive}: stopped while "
                  + ("waiting for the archive lease another archiver of this source holds"
                     if summary.state == "waiting" else "starting") + ": this process archived nothing")
        until = summary.to_json_obj()["recoverable_until_utc"]
        print(f"archive {summary.archive}: {len(summary.generations)} generation(s), {summary.segments} segment(s), "
              f"{summary.records} record(s); " + (f"recoverable until {until}" if until else "nothing recoverable"))
    return 0


#: A stop still running this long after the signal (its last tick waits at most max_delay_secs, each stream
#: 30 s) is stuck somewhere: every thread's stack goes to the log, so the cause is in the pod's log before
#: the kubelet's SIGKILL (the next start resumes from the storage either way).
STOP_REPORT_SECS = 60.0


def stuck(signame: str) -> None:
    log.error("archive: still stopping %.0f s after %s; what each thread is doing:", STOP_REPORT_SECS, signame)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def preflight(src: ConnectionConfig) -> None:
    """Refuse at start what the archiver would otherwise live with for ever (a new user's trial, TRIAL.md):
    a vhost in ``amqp_url`` that does not exist (the selection never used it: every vhost was archived),
    and a ``stream_port`` of another cluster (the 5552 default on a host running several brokers), where
    each tick's end probe falls back, logged at INFO only. A broker that does not answer is left to the
    archiver, which retries and names it; a port that answers in HTTP (``amqp_url`` at the management
    port) is a setting, refused."""
    from ..broker.connect import answers_http, connect  # noqa: PLC0415 - start-up, see rbak/commands/__init__.py
    from ..broker.management import ManagementClient  # noqa: PLC0415 - start-up, as above
    from ..broker.stream_end import NO_STREAM_LISTENER, foreign_stream_cluster  # noqa: PLC0415 - start-up, as above

    try:
        connect(src, src.named_vhost or "/", "source", "rbak archive (start check)").close()
    except AmqpConnectionError as e:
        if answers_http(src):
            raise ConfigError(f"source.amqp_url: {e} (it answers in HTTP); nothing was archived") from None
    except RbakError:
        pass  # refused credentials or a vhost that is not there: named below, or retried by the archiver
    client = ManagementClient.for_connection(src, "source")
    try:
        try:
            cluster, known = client.overview().get("cluster_name"), client.vhosts()
        except RbakError:
            return
        vhost = src.named_vhost
        if vhost is not None and vhost not in known and vhost not in src.queues.vhosts:  # else named as selected
            raise ConfigError(f"source.amqp_url: vhost {vhost!r} does not exist on {src.management_url} (vhosts user "
                              f"{src.mgmt_username!r} can see: {', '.join(map(repr, known[:10]))}"
                              f"{', ...' if len(known) > 10 else ''}); nothing was archived")
        try:
            stream = foreign_stream_cluster(src, cluster)
        except NO_STREAM_LISTENER as e:
            log.warning("source.stream_port: no stream listener answers on %s:%d (%s): each stream's end is found "
                        "by a quiet period instead of being asked (docs/archive.md)", src.host, src.stream_port,
                        e or type(e).__name__)
            return
        if stream is not None:
            raise ConfigError(f"source.stream_port: {src.host}:{src.stream_port} answers for cluster {stream!r}, but "
                              f"{src.management_url} is cluster {cluster!r}: set source.stream_port to this broker's "
                              "stream port (default 5552); nothing was archived")
    finally:
        client.close()
