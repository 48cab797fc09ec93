"""Status values from what is observable: Jobs, pods, SparkApplications, manifests.

Counts always come from the run's ``manifest.json`` (never from a log). A
failed run's reason comes from the pod's termination message (the CLI's one
error line, e.g. ``rbak: AMQP error: ... ACCESS_REFUSED``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rbak.format.manifest import BackupManifest
from rbak.base.units import human_bytes
from rbak_operator.decide.times import fmt, parse_time

SPARK_DONE = {"COMPLETED": "Succeeded", "FAILED": "Failed", "SUBMISSION_FAILED": "Failed"}

A_START_FAILED = "rbak.io/start-failed"
"""Annotation the operator puts on a Job whose pod could not start within the bound: the JSON
``{"reason", "message", "time"}`` that makes the run Failed (``job_state``), whatever the Job
controller makes of it later."""

START_TIMEOUT = float(os.environ.get("RBAK_OPERATOR_START_TIMEOUT_SECONDS", "300"))
"""How long a run's pod may wait to start (a missing Secret, an image that cannot be pulled, a
container crash-looping, no node to run on) before the run is marked Failed with the pod's reason."""

WAITING_REASONS = {
    "CreateContainerConfigError": "ContainerConfigError",  # refined to SecretMissing / ConfigMapMissing
    "CreateContainerError": "ContainerConfigError",
    "ErrImagePull": "ImagePull",
    "ImagePullBackOff": "ImagePull",
    "InvalidImageName": "ImagePull",
    "ErrImageNeverPull": "ImagePull",
    "CrashLoopBackOff": "CrashLoop",
}
"""Container waiting reasons a kubelet keeps a pod in without ever failing it, and the run's reason."""

GONE = "gone"  # what a reconcile returns when its object is gone or finished: its loop ends


@dataclass(frozen=True, slots=True)
class RunState:
    phase: str  # Running | Succeeded | Failed
    reason: str = ""
    message: str = ""
    start: datetime | None = None
    end: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def duration(self) -> float | None:
        if self.start and self.end:
            return max(0.0, (self.end - self.start).total_seconds())
        return None


def _t(v: Any) -> datetime | None:
    return parse_time(v) if isinstance(v, str) and v else None


def job_state(job: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> RunState:
    """Phase of a batch/v1 Job from its conditions (and its pods, for the cause of a failure), or
    Failed when the operator gave up on its pod starting (``A_START_FAILED``)."""
    st = job.get("status") or {}
    start = _t(st.get("startTime"))
    mark = ((job.get("metadata") or {}).get("annotations") or {}).get(A_START_FAILED)
    if mark and not any(c.get("type") == "Complete" and c.get("status") == "True" for c in st.get("conditions") or []):
        try:
            m = json.loads(mark)
        except ValueError:
            m = {}
        return RunState("Failed", m.get("reason") or "StartFailed", m.get("message") or "", start, _t(m.get("time")))
    for c in st.get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "Complete":
            return RunState("Succeeded", c.get("reason") or "Completed", c.get("message") or "", start,
                            _t(st.get("completionTime")) or _t(c.get("lastTransitionTime")))
        if c.get("type") == "Failed":
            cause = pod_failure_message(pods or [])
            return RunState("Failed", c.get("reason") or "Failed", cause or c.get("message") or "", start,
                            _t(c.get("lastTransitionTime")))
    return RunState("Running", "", "", start)


FAILURE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("AuthenticationFailed", r"ACCESS_REFUSED|authentication failed|\b401\b|unauthori[sz]ed|not authori[sz]ed|"
                             r"login was refused|access refused"),
    ("TargetNotEmpty", r"refusing to publish into a non-empty queue|already holds \d+"),
    ("SourceBusy", r"Backup lease:|lease .* held by"),
    ("StorageUnreachable", r"Storage error|NoSuchBucket|EndpointConnectionError|Could not connect to the endpoint|"
                           r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied"),
    ("BrokerUnreachable", r"Connection refused|cannot connect|timed out|Name or service not known|"
                          r"Temporary failure in name resolution"),
    ("VhostMissing", r"vhost .* does not exist|NOT_ALLOWED - vhost"),
    ("InvalidConfiguration", r"Configuration error"),
)
"""A failed run's reason from the error line its pod ended with (first match wins), for the status, the
events and the ``reason`` label of the failure metrics: an alert can tell a bad password from a
missing bucket. A pod that never started has its own reasons (``WAITING_REASONS``)."""

FAILURE_REASONS = ("AuthenticationFailed", "SecretMissing", "ConfigMapMissing", "ContainerConfigError", "ImagePull",
                   "CrashLoop", "Unschedulable", "StorageUnreachable", "BrokerUnreachable", "TargetNotEmpty",
                   "SourceBusy", "VhostMissing", "InvalidConfiguration", "PartiallyFailed", "ValidationFailed",
                   "DeadlineExceeded", "RunFailed")
"""Every reason a failed run can carry (docs/operator.md lists them; the PrometheusRule names them)."""


SPEC_WORDS: dict[str, tuple[tuple[str, str], ...]] = {
    "backup": (
        ("check source.management_username/password",
         "check the username and password in the Secret of spec.broker.credentialsSecretRef (or of the "
         "RabbitmqCluster's default user)"),
        ("choose another backup_id (backup.overwrite: true replaces it)",
         "trigger a new run with another rbak.io/backup-now value"),
        ("source.queues.vhosts", "spec.queues.vhosts (or the vhost of spec.broker.amqpUrl)"),
        ("source.queues", "spec.queues"),
        ("source.amqp_url", "spec.broker.amqpUrl"),
        ("source.management_url", "spec.broker.managementUrl"),
        ("source.tls", "spec.broker"),
        ("backup_id: ", "backup id: "),
    ),
    "restore": (
        ("check target.management_username/password",
         "check the username and password in the Secret of spec.target.credentialsSecretRef (or of the "
         "RabbitmqCluster's default user)"),
        ("(set restore.allow_non_empty: true to add to it)",
         "(drain it, or restore elsewhere with spec.vhostMapping or spec.queueMapping)"),
        ("restore.time_window_start", "spec.pitr.start"),
        ("restore.time_window_end", "spec.pitr.end"),
        ("restore.vhost_mapping", "spec.vhostMapping"),
        ("restore.queue_mapping", "spec.queueMapping"),
        ("restore.queues", "spec.queues"),
        ("restore.dry_run", "spec.dryRun"),
        ("target.amqp_url", "spec.target.amqpUrl"),
        ("target.management_url", "spec.target.managementUrl"),
        ("backup_id: ", "backup id: "),
    ),
    "archive": (  # the archiver's exit (decide/archive.archiver_exit): the most specific first
        ("archive.taps.max_length_bytes", "spec.taps.maxLengthBytes"),
        ("archive.taps.max_age", "spec.taps.maxAge"),
        ("archive.taps", "spec.taps"),
        ("source.queues", "spec.queues"),
        ("archive.max_delay_secs", "spec.maxDelaySeconds"),
    ),
}
"""The run's internal config keys in its error lines, and the spec fields the user wrote (or what to do
instead, where the CRD has no such field)."""


def in_user_words(message: str, kind: str) -> str:
    """A run's error line with the config keys of the run's own config file replaced by the spec's fields."""
    for key, words in SPEC_WORDS.get(kind, ()):
        message = message.replace(key, words)
    return message


def failure_reason(state: RunState) -> str:
    """The specific reason of a failed run: a start failure's own, else what its error line says."""
    if state.reason in FAILURE_REASONS:
        return state.reason
    for reason, pattern in FAILURE_PATTERNS:
        if re.search(pattern, state.message or "", re.I):
            return reason
    return "DeadlineExceeded" if state.reason == "DeadlineExceeded" else "RunFailed"


def start_problem(pods: list[dict[str, Any]]) -> tuple[str, str, datetime | None] | None:
    """(reason, message, since) of a run whose newest pod cannot start: a container waiting in one of
    ``WAITING_REASONS``, or the pod unschedulable. None while it starts, runs or has ended."""
    if not pods:
        return None
    pod = max(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
    st = pod.get("status") or {}
    if st.get("phase") in ("Succeeded", "Failed"):
        return None
    since = _t((pod.get("metadata") or {}).get("creationTimestamp"))
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        why = waiting.get("reason") or ""
        if why in WAITING_REASONS:
            msg = (waiting.get("message") or "").strip()
            reason = WAITING_REASONS[why]
            if reason == "ContainerConfigError" and re.search(r"\bsecrets?\b", msg, re.I):
                reason = "SecretMissing"
            elif reason == "ContainerConfigError" and re.search(r"\bconfigmaps?\b", msg, re.I):
                reason = "ConfigMapMissing"
            return reason, f"pod {(pod.get('metadata') or {}).get('name')} container {cs.get('name')}: {why}" + (
                f": {msg}" if msg else ""), since
    for c in st.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return ("Unschedulable", f"pod {(pod.get('metadata') or {}).get('name')} is unschedulable: "
                    f"{c.get('message') or ''}".rstrip(": "), _t(c.get("lastTransitionTime")) or since)
    return None


def start_failure(pods: list[dict[str, Any]], now: datetime, bound: float = START_TIMEOUT
                  ) -> tuple[tuple[str, str] | None, datetime | None]:
    """Whether a running Job's pod has waited past ``bound`` seconds to start: ((reason, message) or
    None, the time it will have if it keeps waiting, for the next pass)."""
    found = start_problem(pods)
    if found is None:
        newest = max(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "") if pods else {}
        if ((newest.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
            return None, None
        # no pod yet, or one whose containers may still come to wait: a kubelet's report changes no Job
        # (no event wakes the owner), so look again one bound later while the run is active
        return None, datetime.fromtimestamp(now.timestamp() + bound, tz=now.tzinfo)
    reason, message, since = found
    due = since.timestamp() + bound if since is not None else now.timestamp()
    if now.timestamp() >= due:
        return (reason, f"{message} (not started after {int(bound)}s)"), None
    return None, datetime.fromtimestamp(due, tz=now.tzinfo)


def pod_failure_message(pods: list[dict[str, Any]]) -> str:
    """The termination message of the first failed container of the newest pod."""
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "", reverse=True):
        st = pod.get("status") or {}
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            term = (cs.get("state") or {}).get("terminated") or {}
            if term and term.get("exitCode", 0) != 0:
                msg = (term.get("message") or "").strip()
                return last_error_line(msg) or f"container {cs.get('name')} exited with code {term.get('exitCode')} ({term.get('reason', '')})"
    return ""


def run_result(pods: list[dict[str, Any]], container: str = "rbak") -> dict[str, Any] | None:
    """The result a run wrote to its termination-message file (``rbak.commands.result_file``): what a
    restore published and confirmed where; None when its pod has none (a crash before the end)."""
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "", reverse=True):
        term = _terminated(pod, container, init=False) or _terminated(pod, container, init=True) or {}
        text = (term.get("message") or "").strip()
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except ValueError:
                continue
            if isinstance(obj, dict) and "confirmed" in obj:
                return obj
    return None


def restore_outcome(result: dict[str, Any], limit: int = 50) -> dict[str, Any]:
    """The status fields of a restore's result: restored (confirmed) and published counts, what a dry
    run would publish, the target vhosts and queues."""
    dry = bool(result.get("dry_run"))
    out: dict[str, Any] = {
        "dryRun": dry, "messages": int(result.get("confirmed") or 0), "confirmedMessages": int(result.get("confirmed") or 0),
        "publishedMessages": int(result.get("published") or 0),
        "targetVhosts": list(result.get("target_vhosts") or [])[:limit],
        "targetQueues": list(result.get("target_queues") or [])[:limit],
    }
    if dry:
        out["wouldPublish"] = int(result.get("selected") or 0)
    if result.get("failed_queues"):
        out["failedQueues"] = list(result["failed_queues"])[:limit]
    return out


def restore_summary_line(st: dict[str, Any]) -> str:
    """One line for events and the plugin: what a restore did (or, dry, would do) and where."""
    where = ", ".join(st.get("targetQueues") or []) or "no queue"
    if st.get("dryRun"):
        return f"dry run: would publish {st.get('wouldPublish', 0)} messages to {where}; nothing published"
    return (f"{st.get('messages', 0)} messages restored (published {st.get('publishedMessages', 0)}, confirmed "
            f"{st.get('confirmedMessages', 0)}) to {where}")


def _terminated(pod: dict[str, Any], name: str, init: bool) -> dict[str, Any] | None:
    key = "initContainerStatuses" if init else "containerStatuses"
    for cs in (pod.get("status") or {}).get(key) or []:
        if cs.get("name") == name:
            return (cs.get("state") or {}).get("terminated")
    return None


def in_pod_validation(state: RunState, pods: list[dict[str, Any]] | None, run_container: str = "rbak",
                      validate_container: str = "validate") -> str | None:
    """Outcome of validation run in the run's own pod (the backup as init container).

    Passed when the Job completed; Failed when the backup container exited 0
    and the validation container then failed (the backup was written but does
    not validate); None when the backup itself failed or is still running.
    """
    if state.phase == "Succeeded":
        return "Passed"
    if state.phase != "Failed" or not pods:
        return None
    pod = max(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
    run = _terminated(pod, run_container, init=True)
    check = _terminated(pod, validate_container, init=False)
    if run and run.get("exitCode") == 0 and check and check.get("exitCode", 0) != 0:
        return "Failed"
    return None


def last_error_line(text: str) -> str:
    """The line of a termination message that names the cause."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("rbak:") or "error" in ln.lower():
            return ln[:1000]
    return lines[-1][:1000] if lines else ""


def spark_state(app: dict[str, Any]) -> RunState:
    st = app.get("status") or {}
    state = ((st.get("applicationState") or {}).get("state") or "").upper()
    phase = SPARK_DONE.get(state, "Running")
    msg = (st.get("applicationState") or {}).get("errorMessage") or ""
    return RunState(phase, state or "PENDING", msg, _t(st.get("lastSubmissionAttemptTime")), _t(st.get("terminationTime")))


def manifest_counts(m: BackupManifest) -> dict[str, Any]:
    """messages/bytes/segments/queues of a backup, from its manifest."""
    messages = m.total_messages or sum(q.message_count for q in m.queues)
    nbytes = m.total_bytes or sum(q.size_bytes for q in m.queues)
    segments = m.total_segments or sum(len(q.segments) for q in m.queues)
    out: dict[str, Any] = {"messages": messages, "bytes": nbytes, "size": human_bytes(nbytes), "segments": segments,
                           "queues": len(m.queues)}
    if m.state != "complete":  # said only when it is news: partial (or incomplete)
        out["backupState"] = m.state
    if m.held_by_consumers:  # said only when some: messages a consumer held are not in the backup
        out["heldByConsumers"] = m.held_by_consumers
        out["heldQueues"] = [f"{q.vhost}/{q.name} ({q.held_by_consumers})" for q in m.queues if q.held_by_consumers][:20]
    out.update(partial_and_gaps(m))
    return out


def partial_and_gaps(m: BackupManifest, limit: int = 20) -> dict[str, Any]:
    """The status fields that say a backup is partial or has stream gaps (empty when neither)."""
    out: dict[str, Any] = {}
    if m.queue_status:
        out["partialQueues"] = [f"{s.vhost}/{s.name} ({s.status}): {s.reason}"[:500] for s in m.queue_status[:limit]]
    gaps = m.gaps
    if gaps:
        out["gapMessages"] = sum(g.count for _, g in gaps)
        out["gaps"] = [f"{q.vhost}/{q.name} offsets {g.from_offset}..{g.to_offset} ({g.count} messages)"
                       for q, g in gaps[:limit]]
    return out


def run_summary(*, backup_id: str, job_name: str, trigger: str, state: RunState, slot: datetime | None,
                manifest: BackupManifest | None, validation: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"backupId": backup_id, "jobName": job_name, "trigger": trigger, "phase": state.phase}
    if state.phase == "Failed":
        out["reason"] = failure_reason(state)
    elif state.reason:
        out["reason"] = state.reason
    if state.message:
        out["message"] = in_user_words(state.message, "backup")
    if slot:
        out["scheduledTime"] = fmt(slot)
    if state.start:
        out["startTime"] = fmt(state.start)
    if state.end:
        out["completionTime"] = fmt(state.end)
    if state.duration is not None:
        out["durationSeconds"] = round(state.duration, 3)
    if manifest is not None:
        out.update(manifest_counts(manifest))
    if validation:
        out["validation"] = validation
    return out


def set_condition(conditions: list[dict[str, Any]] | None, ctype: str, status: str, reason: str, message: str,
                  now: datetime, generation: int | None) -> list[dict[str, Any]]:
    """Conditions with one updated; lastTransitionTime moves only when status changes."""
    out = [dict(c) for c in conditions or [] if c.get("type") != ctype]
    old = next((c for c in conditions or [] if c.get("type") == ctype), None)
    ltt = old.get("lastTransitionTime") if old and old.get("status") == status else fmt(now)
    new = {"type": ctype, "status": status, "reason": reason, "message": message[:1000], "lastTransitionTime": ltt}
    if generation is not None:
        new["observedGeneration"] = int(generation)
    out.append(new)
    order = {"Ready": 0, "Progressing": 1, "Completed": 2}
    out.sort(key=lambda c: (order.get(c["type"], 9), c["type"]))
    return out


def push_history(history: list[dict[str, Any]] | None, entry: dict[str, Any], limit: int = 10) -> list[dict[str, Any]]:
    """Newest first, one entry per job, at most ``limit``."""
    rest = [h for h in history or [] if h.get("jobName") != entry.get("jobName")]
    return ([entry] + rest)[:limit]
