"""``python -m rbak_operator``: run the operator (kopf) with env-based settings.

RBAK_OPERATOR_NAMESPACES  comma-separated namespaces to serve (default: all)
RBAK_OPERATOR_STANDALONE  1: no leader election (a single replica, tests)
RBAK_LEASE_NAME           the Lease replicas elect their leader on (default rbak-operator),
RBAK_LEASE_NAMESPACE      in this namespace (default POD_NAMESPACE, then the service account's);
POD_NAME                  this replica's identity in it (default hostname-pid);
RBAK_LEASE_SECONDS        lease duration (default 15): see runtime/leader.py
RBAK_OPERATOR_LIVENESS    liveness endpoint, e.g. http://0.0.0.0:8081/healthz
RBAK_OPERATOR_RESYNC_SECONDS, RBAK_OPERATOR_WATCH_TIMEOUT_SECONDS,
RBAK_OPERATOR_EVIDENCE_RECHECK_SECONDS, RBAK_METRICS_PORT, RBAK_IMAGE: see
handlers/drill/metrics/bodies.

kopf always runs standalone: the Lease (not kopf's peering) decides which replica is active.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import logging
import os
import sys
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import kopf

from rbak.base.logsafe import configure
from rbak_operator import handlers  # noqa: F401  registers the kopf handlers
from rbak_operator.kube.client import Kube
from rbak_operator.metrics import runs as metrics
from rbak_operator.runtime import blocking, tasks
from rbak_operator.runtime.leader import Elector, LeaseConfig


@contextlib.contextmanager
def standby_liveness(endpoint: str | None) -> Iterator[None]:
    """Answer the liveness probe while this replica waits for the Lease: a standby is alive, and
    kopf (which serves the endpoint once leading) does not run yet. Freed before kopf binds it."""
    if not endpoint:
        yield
        return
    url = urlsplit(endpoint)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib's name
            ok = self.path.split("?")[0] == (url.path or "/")
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"standby": true}' if ok else b"{}")

        def log_message(self, *args: object) -> None:  # the probe every 20 s is not news
            pass

    server = http.server.ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 80), Health)
    thread = threading.Thread(target=server.serve_forever, name="rbak-standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def _leave(code: int) -> int:
    """``code``, or exit at once when a reconcile pass or progress poll is still blocked in a call
    (an unreachable storage endpoint, a slow API server): Python would wait for its pool thread, holding
    a stopped pod in Terminating until the kubelet's SIGKILL and its replica's handover with it. The
    pass is abandoned safely: every pass re-reads what it decides on, so the next leader redoes it."""
    blocked = blocking.busy()
    if blocked:
        logging.getLogger("rbak_operator").info("exiting; %d blocked call(s) abandoned", blocked)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def main() -> int:
    # the CLI's log filter: no credentials (botocore at DEBUG, URL passwords), no raw control bytes
    configure(os.environ.get("RBAK_OPERATOR_LOG_LEVEL", "INFO"))

    namespaces = [n for n in os.environ.get("RBAK_OPERATOR_NAMESPACES", "").split(",") if n]

    async def run(elector: Elector | None = None, stop: threading.Event | None = None) -> None:
        """kopf in this event loop; with an elector, until SIGTERM or the Lease is lost.

        The stop flag is the tasks' own asyncio.Event (``tasks.stopping``), set by a lost Lease and by
        kopf's cleanup: kopf awaits it without a thread (for a threading.Event kopf would block an
        executor thread, which keeps the process alive after a SIGTERM stopped kopf), and a flag that
        stayed unset would be a task kopf waits 5 s for after every SIGTERM."""
        flag = tasks.stopping()
        if elector is not None and stop is not None:
            loop = asyncio.get_running_loop()

            def hold() -> None:
                elector.hold(stop)
                if elector.lost:
                    loop.call_soon_threadsafe(flag.set)

            threading.Thread(target=hold, name="rbak-lease", daemon=True).start()
        await kopf.operator(clusterwide=not namespaces, namespaces=namespaces or (), standalone=True, stop_flag=flag,
                            liveness_endpoint=os.environ.get("RBAK_OPERATOR_LIVENESS") or None)

    if os.environ.get("RBAK_OPERATOR_STANDALONE", "") in ("1", "true", "yes"):
        asyncio.run(run())
        return _leave(0)
    try:
        cfg = LeaseConfig.from_env()
    except ValueError as e:
        print(f"rbak-operator: {e}", file=sys.stderr)
        return 2
    # A standby serves /metrics too (its counters at zero): a scrape target that never answers would
    # read as a pod down (Prometheus' up == 0, TargetDown alerts). The leader's startup keeps this server.
    metrics.serve()
    elector, stop = Elector(Kube(), cfg), threading.Event()
    with standby_liveness(os.environ.get("RBAK_OPERATOR_LIVENESS")):
        if not elector.acquire(stop):
            return 0
    try:
        asyncio.run(run(elector, stop))
    finally:
        if not elector.lost:
            stop.set()
            elector.release()
    return _leave(1 if elector.lost else 0)


if __name__ == "__main__":
    sys.exit(main())
