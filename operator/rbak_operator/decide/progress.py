"""Pure parts of live progress: which run to watch, ``status.progress`` from a stored record, the
status patch, and the CRD's schema and printer columns (no kopf here: ``crds.py`` imports it)."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from collections.abc import Mapping
from typing import Any

from rbak.repo.progress import ENV_INTERVAL, ENV_RUN_ID, FAILED, FINISHED, ProgressRecord
from rbak.base.units import human_bytes

from rbak_operator.runtime.clock import fmt

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


def progress_schema() -> dict[str, Any]:
    s = lambda d, **kw: {"type": "string", "description": d, **kw}  # noqa: E731
    i = lambda d: {"type": "integer", "description": d}  # noqa: E731
    return {
        "type": "object",
        "description": "live progress of the running Job (from its progress records in the storage); "
                       "removed when the run ends",
        "properties": {
            "runName": s("the run (Job) reporting"),
            "state": s("Running, Finished or Failed", enum=["Running", "Finished", "Failed"]),
            "summary": s("queues done of total and messages, e.g. '3/10 queues, 12000 msgs (40%)'"),
            "queues": s("queues done / total"),
            "queuesDone": i("queues finished"),
            "queuesTotal": i("queues in the run"),
            "messages": i("messages read (backup) or confirmed (restore) so far"),
            "messagesTotal": i("messages expected, when known"),
            "percent": i("messages / messagesTotal in percent"),
            "bytes": i("message body bytes so far"),
            "size": s("bytes, human readable"),
            "rate": s("recent messages per second, human readable"),
            "messagesPerSecond": {"type": "number", "description": "recent messages per second"},
            "currentQueue": s("the queue being worked on (vhost/name)"),
            "startTime": s("when the run started", format="date-time"),
            "updateTime": s("when the Job wrote this", format="date-time"),
        },
    }


def printer_columns(kind: str) -> list[tuple[str, str, str, int]]:
    """(name, type, jsonPath, priority) of the progress columns of ``kubectl get``."""
    return [
        ("Progress", "string", ".status.progress.summary", 0),
        ("Rate", "string", ".status.progress.rate", 0),
        ("Current Queue", "string", ".status.progress.currentQueue", 1),
        ("Transferred", "string", ".status.progress.size", 1),
    ]


