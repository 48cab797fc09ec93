"""Kubernetes events about our objects: best effort, never a reason for a reconcile to fail."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

log = logging.getLogger("rbak_operator")


def post(body: Mapping[str, Any], etype: str, reason: str, message: str) -> None:
    import kopf  # noqa: PLC0415 - here, not at import: kubectl-rbak reads storage through modules that import this one

    try:
        # kopf reads apiVersion, kind and metadata of any mapping; ours are the API's JSON objects.
        kopf.event(cast(kopf.Body, body), type=etype, reason=reason, message=message)
    except Exception:  # events are best effort
        log.exception("cannot post event %s", reason)
