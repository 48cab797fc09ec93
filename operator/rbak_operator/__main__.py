"""``python -m rbak_operator``: run the operator (kopf) with env-based settings.

RBAK_OPERATOR_NAMESPACES  comma-separated namespaces to serve (default: all)
RBAK_OPERATOR_STANDALONE  1 disables kopf peering (single replica, tests)
RBAK_OPERATOR_LIVENESS    liveness endpoint, e.g. http://0.0.0.0:8081/healthz
RBAK_OPERATOR_RESYNC_SECONDS, RBAK_OPERATOR_WATCH_TIMEOUT_SECONDS,
RBAK_OPERATOR_EVIDENCE_RECHECK_SECONDS, RBAK_METRICS_PORT, RBAK_IMAGE: see
handlers/drill/metrics/bodies.
"""

from __future__ import annotations

import os
import sys

import kopf


def main() -> int:
    from rbak.logsafe import configure

    # the CLI's log filter: no credentials (botocore at DEBUG, URL passwords), no raw control bytes
    configure(os.environ.get("RBAK_OPERATOR_LOG_LEVEL", "INFO"))
    from . import handlers  # noqa: F401  registers the handlers

    namespaces = [n for n in os.environ.get("RBAK_OPERATOR_NAMESPACES", "").split(",") if n]
    standalone = os.environ.get("RBAK_OPERATOR_STANDALONE", "") in ("1", "true", "yes")
    kopf.run(
        clusterwide=not namespaces,
        namespaces=namespaces or (),
        standalone=standalone,
        peering_name=None if standalone else os.environ.get("RBAK_PEERING_NAME", "rbak-operator"),
        liveness_endpoint=os.environ.get("RBAK_OPERATOR_LIVENESS") or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
