"""Pure parts of live progress: which run to watch, ``status.progress`` from a stored record, the
status patch, and the CRD's schema and printer columns (no kopf here: ``crds.py`` imports it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from rbak.repo.progress import ENV_INTERVAL, ENV_RUN_ID, FAILED, FINISHED, ProgressRecord
from rbak.base.units import human_bytes
from rbak_operator.decide.times import fmt

STATE = {"running": "Running", FINISHED: "Finished", FAILED: "Failed"}
INTERVAL = float(os.environ.get("RBAK_OPERATOR_PROGRESS_SECONDS", "5"))
"""Seconds between a Job's progress records and between the operator's reads of them."""
RUN_ID_ENV, INTERVAL_ENV = ENV_RUN_ID, ENV_INTERVAL  # the CLI's names (rbak.repo.progress)


def watched_run(kind: str, status: Mapping[str, Any] | None) -> str | None:
    """The run whose progress the status should show (None: nothing running)."""
    st = status or {}
    if kind == "backup":
        active = st.get("active") or []
        return sorted(active)[-1] if active else None  # run names sort by slot: the newest
    if st.get("phase") == "Running" and st.get("engine") == "job" and st.get("jobName"):
        return st["jobName"]
    return None


def status_progress(rec: ProgressRecord) -> dict[str, Any]:
    """``status.progress`` from one stored record."""
    q = f"{rec.queues_done}/{rec.queues_total}" if rec.queues_total is not None else f"{rec.queues_done}/?"
    out: dict[str, Any] = {
        "runName": rec.run_id,
        "state": STATE.get(rec.state, rec.state),
        "queues": q,
        "queuesDone": rec.queues_done,
        "messages": rec.records,
        "bytes": rec.bytes,
        "size": human_bytes(rec.bytes),
        "rate": f"{rec.rate:.0f} msg/s",
        "messagesPerSecond": rec.rate,
        "currentQueue": rec.current_queue or "",
        "startTime": fmt_epoch(rec.started_at),
        "updateTime": fmt_epoch(rec.updated_at),
    }
    if rec.queues_total is not None:
        out["queuesTotal"] = rec.queues_total
    done = f"{q} queues, {rec.records} msgs"
    if rec.records_total:
        out["messagesTotal"] = rec.records_total
        out["percent"] = min(100, int(rec.records * 100 / rec.records_total))
        done += f" ({out['percent']}%)"
    out["summary"] = done
    return out


def fmt_epoch(t: float) -> str:
    return fmt(datetime.fromtimestamp(t, timezone.utc))


def progress_patch(status: dict[str, Any] | None, run: str | None, rec: ProgressRecord | None,
                   key: str | None = None) -> dict[str, Any] | None:
    """The status patch for a poll, or None when nothing changes (no write at all). ``key``: the id the
    run stores its records under (its backup id: the Job's name and the object's tag), when not ``run``.

    A record of another run (an older one's leftovers) is never shown."""
    current = (status or {}).get("progress")
    if run is None or rec is None or rec.run_id != (key or run):
        return None
    new = dict(status_progress(rec), runName=run)
    return None if new == current else {"progress": new}


def cleared(status: dict[str, Any] | None, running: bool) -> dict[str, Any]:
    """``{"progress": None}`` when a run has ended but its progress is still shown."""
    return {"progress": None} if not running and (status or {}).get("progress") else {}
