"""Prometheus metrics of the operator itself (runs by outcome, durations)."""

from __future__ import annotations

import os

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RUNS = Counter("rbak_operator_runs_total", "Finished runs by kind and outcome", ["kind", "outcome"])
STARTED = Counter("rbak_operator_runs_started_total", "Runs started by kind and trigger", ["kind", "trigger"])
DURATION = Histogram(
    "rbak_operator_run_duration_seconds", "Wall time of finished runs", ["kind"],
    buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, float("inf")),
)
MISSED = Counter("rbak_operator_missed_schedules_total", "Slots not run (deadline passed or concurrency Forbid)", ["reason"])
RETENTION_DELETED = Counter("rbak_operator_retention_deleted_total", "Backups deleted by retention policies")
ACTIVE = Gauge("rbak_operator_active_runs", "Runs in progress seen at the last reconcile", ["kind"])

_started = False


def serve() -> int | None:
    """Serve /metrics on RBAK_METRICS_PORT (default 8080; 0 disables). Idempotent."""
    global _started
    port = int(os.environ.get("RBAK_METRICS_PORT", "8080") or 0)
    if not port or _started:
        return None
    start_http_server(port, addr=os.environ.get("RBAK_METRICS_BIND", "0.0.0.0"))
    _started = True
    return port
