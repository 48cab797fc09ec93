"""Runs whose pod never starts: a real kubelet keeps such a pod waiting (a missing Secret, an image
that cannot be pulled, a crash loop, no node) and its Job never fails, so the run would stay Running
and every later slot would wait behind it. Past ``status.START_TIMEOUT`` the operator marks the Job
Failed with the pod's reason (``status.A_START_FAILED``) and gives it a deadline, so the Job
controller stops the pod; the decision itself is ``status.start_failure`` (pure)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from rbak_operator.decide.status import A_START_FAILED, RunState, job_state, start_failure
from rbak_operator.decide.times import fmt
from rbak_operator.kube.client import Kube


def check_start(kube: Kube, namespace: str, job: dict[str, Any], now: datetime) -> tuple[RunState, datetime | None]:
    """The state of a Job the conditions call Running: Failed (and marked so) when its pod has waited past
    the bound, else Running and the time a still-waiting pod would reach it (the next pass)."""
    name = job["metadata"]["name"]
    failed, due = start_failure(kube.job_pods(namespace, name), now)
    if failed is None:
        return job_state(job), due
    reason, message = failed
    mark = json.dumps({"reason": reason, "message": message, "time": fmt(now)})
    started = (job.get("status") or {}).get("startTime")
    # The Job controller then fails the Job (DeadlineExceeded) and deletes its pod: nothing keeps waiting.
    deadline = max(1, int((now - datetime.fromisoformat(started.replace("Z", "+00:00"))).total_seconds())) \
        if started else 1
    kube.patch_job(namespace, name, {"metadata": {"annotations": {A_START_FAILED: mark}},
                                     "spec": {"activeDeadlineSeconds": deadline}})
    marked = dict(job, metadata={**job["metadata"],
                                 "annotations": {**(job["metadata"].get("annotations") or {}), A_START_FAILED: mark}})
    return job_state(marked), None
