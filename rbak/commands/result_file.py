"""A run's outcome for whoever started it: with ``RBAK_RESULT_FILE`` set (the operator sets it to the
container's termination-message path), a compact JSON of what was published and confirmed where, which
Kubernetes keeps in the pod's status after the container ends (at most 4096 bytes: the queue lists are
cut to fit, and say how many were left out)."""

from __future__ import annotations

import json
import os
from typing import Any

ENV = "RBAK_RESULT_FILE"
LIMIT = 4096


def restore_result(summary: Any) -> dict[str, Any]:
    """What a restore did: counts (published, confirmed; selected: what a dry run would publish), the
    target vhosts and queues (as ``vhost/queue``), and whether it was a dry run."""
    queues = sorted({f"{q.target_vhost}/{q.target_queue}" for q in summary.queues})
    return {"backup_id": summary.backup_id, "dry_run": summary.dry_run, "ok": summary.ok,
            "published": summary.published, "confirmed": summary.confirmed,
            "selected": sum(q.selected for q in summary.queues),
            "target_vhosts": sorted({q.target_vhost for q in summary.queues}), "target_queues": queues,
            "failed_queues": sorted(f"{q.target_vhost}/{q.target_queue}" for q in summary.failed_queues),
            "errors": [f"{q.target_vhost}/{q.target_queue}: {(q.error or '')[:300]}" for q in summary.failed_queues]}


def write(obj: dict[str, Any]) -> None:
    """Write ``obj`` to ``$RBAK_RESULT_FILE`` (nothing when unset), its lists cut to fit ``LIMIT`` bytes."""
    path = os.environ.get(ENV)
    if not path:
        return
    obj = dict(obj)
    data = json.dumps(obj, separators=(",", ":"))
    for key in ("errors", "target_queues", "failed_queues", "target_vhosts"):
        while len(data.encode()) > LIMIT and obj.get(key):
            obj[key] = obj[key][:-1]
            obj[f"{key}_omitted"] = obj.get(f"{key}_omitted", 0) + 1
            data = json.dumps(obj, separators=(",", ":"))
    with open(path, "w", encoding="utf-8") as f:
        f.write(data)
