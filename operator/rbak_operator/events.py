"""Kubernetes events about our objects: best effort, never a reason for a reconcile to fail."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("rbak_operator")


def post(body: dict[str, Any], etype: str, reason: str, message: str) -> None:
    import kopf  # here, not at import: kubectl-rbak reads storage through modules that import this one

    try:
        kopf.event(body, type=etype, reason=reason, message=message)
    except Exception:  # events are best effort
        log.exception("cannot post event %s", reason)
