"""What the operator decides for a RabbitMQArchive (pure): the archiver's config, ConfigMap and
Deployment, the status the archive's newest tick in the storage supports, and whether that status
is worth a write.

The status is judged from the storage, not from the pod: the newest tick says up to when every
stream is archived (``recoverable_until``) and when it was written. The archiver writes a tick at
least every ``IDLE_TICK_SECS`` even when nothing flows, so an idle archive's watermark keeps moving
and its lag stays near zero (no false alarm on a quiet system); when ticks stop (archiver down,
storage unreachable) the lag grows by how overdue the next tick is.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from rbak.errors import ConfigError
from rbak.format.archive import Tick
from rbak.format.manifest import StreamGap
from rbak_operator.crds.archive import DEFAULT_MAX_DELAY_SECONDS, DEFAULT_RPO_SECONDS
from rbak_operator.decide import naming
from rbak_operator.decide.bodies import _container, _env, _volumes, common_labels, owner_reference
from rbak_operator.decide.bodies import configmap_body as _configmap_body
from rbak_operator.decide.rbakconfig import (
    CONFIG_DIR,
    CONFIG_FILE,
    ENV_STATE,
    PodEnv,
    ResolvedBroker,
    _dedupe,
    backup_encryption,
    backup_vhosts,
    broker_connection,
    queue_selection,
    storage_section,
)
from rbak_operator.decide.status import in_user_words, last_error_line, set_condition, start_problem
from rbak_operator.decide.times import fmt, parse_time

L_ARCHIVE = "rbak.io/archive"
A_SPEC_HASH = "rbak.io/spec-hash"
IDLE_TICK_SECS = 30  # the archiver's archive.idle_tick_secs: the longest a healthy archive goes without a tick
TICK_GRACE_SECS = 5  # a tick may come this much later than due (the upload, a slow listing) before it is overdue
METRICS_PORT = 9100
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# status writes: offsets that moved are written at most this often; an idle archive (only its
# recoverable-until moves) at most every 3 h, so an idle archive costs 1/3 write per hour (with the
# 6-hourly resync's Deployment GET, 0.5 request per object per hour: benchmarks/operator_scale.py)
PROGRESS_WRITE_SECS = 30.0
IDLE_WRITE_SECS = 3 * 3600.0
VOLATILE = ("recoverableUntil", "lagSeconds", "lastTickTime", "generation", "streams")


def resource_name(name: str) -> str:
    """The Deployment's and ConfigMap's name."""
    return naming.dns_label(f"rbak-archive-{name}")


def labels(name: str) -> dict[str, str]:
    return {**common_labels("archive"), L_ARCHIVE: naming.label_value(name)}


def rpo_seconds(spec: dict[str, Any]) -> int:
    return int(spec.get("rpoSeconds") or DEFAULT_RPO_SECONDS)


def max_delay_seconds(spec: dict[str, Any]) -> int:
    return int(spec.get("maxDelaySeconds") or DEFAULT_MAX_DELAY_SECONDS)


def archive_config(spec: dict[str, Any], namespace: str, name: str,
                   resolved: ResolvedBroker | None = None) -> tuple[dict[str, Any], list[PodEnv]]:
    """The ``rbak archive`` config (mode: archive) and the Secret env its pod needs. The archive's name in
    the storage is the object's name: its generations are ``<name>.<UTC time>``."""
    if rpo_seconds(spec) < max_delay_seconds(spec):
        raise ConfigError(f"spec.maxDelaySeconds: {max_delay_seconds(spec)} exceeds spec.rpoSeconds "
                          f"{rpo_seconds(spec)}: the objective could never be met")
    source, env1 = broker_connection(spec.get("broker"), namespace, "spec.broker", resolved)
    queues = queue_selection(spec.get("queues"))
    if backup_vhosts(spec):
        queues["vhosts"] = backup_vhosts(spec)
    if queues:
        source["queues"] = queues
    storage, env2 = storage_section(spec.get("storage"))
    encryption, env3 = backup_encryption(spec, storage)
    cfg: dict[str, Any] = {
        "mode": "archive",
        "source": source,
        "storage": storage,
        "archive": {"name": name, "max_delay_secs": max_delay_seconds(spec), "idle_tick_secs": IDLE_TICK_SECS},
        "backup": {"compression": spec.get("compression") or "zstd"},
        "offset_storage": {"path": f"${{{ENV_STATE}}}/offsets.db"},
    }
    if encryption:
        cfg["encryption"] = encryption
    taps = spec.get("taps")
    if taps:  # rbak archive's archive.taps, key for key
        cfg["archive"]["taps"] = {k: list(taps[k]) for k in ("include", "exclude", "vhosts") if taps.get(k)}
        if taps.get("maxAge"):
            cfg["archive"]["taps"]["max_age"] = taps["maxAge"]
        if taps.get("maxLengthBytes") is not None:
            cfg["archive"]["taps"]["max_length_bytes"] = int(taps["maxLengthBytes"])
    return cfg, _dedupe([*env1, *env2, *env3])


def archive_args(metrics_port: int = METRICS_PORT) -> list[str]:
    return ["archive", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}", "--metrics-port", str(metrics_port)]


def configmap_body(owner: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return _configmap_body(resource_name(meta["name"]), meta["namespace"], owner, cfg, labels(meta["name"]))


def deployment_body(owner: dict[str, Any], env: list[PodEnv], config_map: dict[str, Any],
                    metrics_port: int = METRICS_PORT) -> dict[str, Any]:
    """One replica (0 while suspended) running ``rbak archive``; Recreate, so an old pod has stopped before
    the new one starts (the lease would make it wait anyway). The spec hash (config included) is on the
    pod template: a changed spec rolls the pod."""
    meta, spec = owner["metadata"], owner.get("spec") or {}
    name, ns = resource_name(meta["name"]), meta["namespace"]
    lab = labels(meta["name"])
    vols, mounts = _volumes(name, spec.get("storage") or {})
    container = _container("archiver", spec, archive_args(metrics_port), _env(env), mounts)
    if metrics_port:
        container["ports"] = [{"name": "metrics", "containerPort": metrics_port}]
    pod: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
        "volumes": vols,
        "containers": [container],
        # SIGTERM: the archiver stores what it read and closes its generation (a few max delays)
        "terminationGracePeriodSeconds": max(30, 4 * max_delay_seconds(spec) + 10),
    }
    if spec.get("serviceAccountName"):
        pod["serviceAccountName"] = spec["serviceAccountName"]
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": dict(lab), "annotations": {},
                     "ownerReferences": [owner_reference(owner)]},
        "spec": {
            "replicas": 0 if spec.get("suspend") else 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {L_ARCHIVE: lab[L_ARCHIVE], "app.kubernetes.io/component": "archive"}},
            "template": {"metadata": {"labels": dict(lab), "annotations": {}}, "spec": pod},
        },
    }
    digest = spec_hash(body, config_map)
    body["metadata"]["annotations"][A_SPEC_HASH] = digest
    body["spec"]["template"]["metadata"]["annotations"][A_SPEC_HASH] = digest
    return body


def spec_hash(deployment: dict[str, Any], config_map: dict[str, Any]) -> str:
    """What the operator applied: the Deployment's spec and the config (a change in either is applied)."""
    data = json.dumps([deployment.get("spec"), config_map.get("data")], sort_keys=True, default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def applied_hash(obj: dict[str, Any] | None) -> str | None:
    return (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(A_SPEC_HASH)


# ---------------------------------------------------------------------------------------------
# status from the newest tick


def _ms_time(ms: int | None) -> str | None:
    return None if ms is None else fmt(datetime.fromtimestamp(ms / 1000, timezone.utc))


def gap_text(g: StreamGap) -> str:
    text = f"offsets {g.from_offset}..{g.to_offset} ({g.count} messages)"
    if g.after_timestamp is not None and g.before_timestamp is not None:
        text += f" between {_ms_time(g.after_timestamp)} and {_ms_time(g.before_timestamp)}"
    return text


@dataclass(frozen=True)
class ArchiveView:
    """What the newest tick says, judged at ``now``."""

    status: dict[str, Any]
    lag: float | None  # seconds, None: no tick yet or no stream complete yet
    overdue: float  # seconds past when the next tick was due (0: current)
    gaps: list[str]  # "vhost/stream offsets A..B (N messages) ..." of every gap recorded so far


def overdue_seconds(written_ms: int, now_ms: int, max_delay: int) -> float:
    """How much later than due the next tick is: a healthy archiver ticks at least every IDLE_TICK_SECS."""
    return max(0.0, (now_ms - written_ms) / 1000 - IDLE_TICK_SECS - max_delay - TICK_GRACE_SECS)


def view(tick: Tick | None, now_ms: int, spec: dict[str, Any], previous: dict[str, Any]) -> ArchiveView:
    """The status fields the tick supports. Gaps are kept from ``previous`` (the status written so far):
    a tick names only its own generation's, and a gap once recorded stays reported."""
    if tick is None:
        return ArchiveView({"streamCount": 0, "gapMessages": int(previous.get("gapMessages") or 0)}, None, 0.0,
                           [])
    overdue = overdue_seconds(tick.written_at, now_ms, max_delay_seconds(spec))
    old = {(s.get("vhost"), s.get("name")): s for s in previous.get("streams") or []}
    streams: list[dict[str, Any]] = []
    all_gaps: list[str] = []
    gap_messages = 0
    for s in sorted(tick.streams, key=lambda s: (s.vhost, s.name)):
        prev = old.get((s.vhost, s.name)) or {}
        texts = list(prev.get("gaps") or [])
        counted = int(prev.get("gapMessages") or 0)
        for g in s.info.gaps:
            t = gap_text(g)
            if t not in texts:
                texts.append(t)
                counted += g.count
        cu = s.complete_until
        entry: dict[str, Any] = {"vhost": s.vhost, "name": s.name, "epoch": s.epoch, "present": s.present,
                                 "firstOffset": s.info.first_offset, "archivedOffset": s.info.last_offset,
                                 "committedOffset": s.committed.offset if s.committed is not None else None,
                                 "committedAt": _ms_time(s.committed.at) if s.committed is not None else None,
                                 "completeUntil": _ms_time(cu),
                                 "lagSeconds": None if cu is None else math.ceil(max(0.0, (tick.written_at - cu) / 1000
                                                                                     + overdue)),
                                 "gapMessages": counted, "gaps": texts}
        streams.append({k: v for k, v in entry.items() if v is not None})
        all_gaps.extend(f"{s.vhost}/{s.name} {t}" for t in texts)
        gap_messages += counted
    ru = tick.recoverable_until
    lag = None if ru is None else max(0.0, (tick.written_at - ru) / 1000 + overdue)
    status: dict[str, Any] = {"generation": tick.generation, "lastTickTime": _ms_time(tick.written_at),
                              "streamCount": len(streams), "gapMessages": gap_messages, "streams": streams}
    if ru is not None:
        status["recoverableUntil"] = _ms_time(ru)
    if lag is not None:
        status["lagSeconds"] = math.ceil(lag)  # rounded up: lagSeconds > rpoSeconds exactly when RPOMet is false
    return ArchiveView(status, lag, overdue, all_gaps)


def conditions(v: ArchiveView, spec: dict[str, Any], existing: list[dict[str, Any]] | None, now: datetime,
               generation: int | None, storage_error: str | None = None) -> tuple[str, list[dict[str, Any]]]:
    """(phase, conditions) for a view. Messages hold no live figure (the lag is its own field), so an idle
    archive's conditions never change and cost no write."""
    rpo = rpo_seconds(spec)
    conds = existing

    def cond(ctype: str, value: str, reason: str, message: str) -> None:
        nonlocal conds
        conds = set_condition(conds, ctype, value, reason, message, now, generation)

    has_tick = "lastTickTime" in v.status
    if storage_error is not None:
        cond("Ready", "False", "StorageUnreadable", f"the operator cannot read the archive: {storage_error}")
    elif spec.get("suspend"):
        cond("Ready", "False", "Suspended", "spec.suspend: the archiver is scaled to 0")
    elif not has_tick:
        cond("Ready", "False", "NoTick", "no tick in the storage yet: the archiver has not started archiving")
    elif v.overdue > 0:
        cond("Ready", "False", "TicksOverdue",
             f"no tick since {v.status['lastTickTime']}: the archiver is down or cannot reach the storage")
    else:
        cond("Ready", "True", "Archiving", "the archiver's ticks are current")
    if v.lag is None:
        cond("RPOMet", "Unknown", "NoRecoveryPoint", "the archive holds no recoverable-until yet")
    elif v.lag > rpo:
        cond("RPOMet", "False", "ObjectiveMissed",
             f"the archive is more than rpoSeconds={rpo} behind: recoverable until "
             f"{v.status.get('recoverableUntil')}")
    else:
        cond("RPOMet", "True", "WithinObjective", f"the archive is within rpoSeconds={rpo} of now")
    if v.gaps:
        cond("Degraded", "True", "GapRecorded",
             "retention removed messages before the archive read them: " + "; ".join(v.gaps))
    else:
        cond("Degraded", "False", "NoGap", "no gap recorded")
    if spec.get("suspend"):
        phase = "Suspended"
    elif v.lag is None:
        phase = "Pending"
    elif v.lag > rpo:
        phase = "Lagging"
    else:
        phase = "Archiving"
    return phase, conds or []


def archiver_exit(pods: list[dict[str, Any]], last_tick: str | None) -> str | None:
    """Why the archiver makes no tick, from its pods: a container that exited non-zero since ``last_tick`` (the
    newest tick's time; None: no tick yet), named with the last error line of its termination message
    (FallbackToLogsOnError: ``rbak: Configuration error: ...``), or one that cannot start (an image, a Secret).
    None when the pods say nothing of the kind (the storage may be what is slow). No time or restart count in
    it: a crash loop writes the status once, not at every restart."""
    since = parse_time(last_tick) if last_tick else None
    exits = []
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            for where in ("state", "lastState"):
                term = (cs.get(where) or {}).get("terminated") or {}
                at = parse_time(term["finishedAt"]) if term.get("finishedAt") else None
                if term.get("exitCode", 0) != 0 and (since is None or (at is not None and at > since)):
                    exits.append((term.get("finishedAt") or "", (pod.get("metadata") or {}).get("name"), term))
    if not exits:  # a CrashLoopBackOff names no cause (its exit above does): said only without one
        found = start_problem(pods)
        return found[1] if found is not None else None
    _, pod_name, term = max(exits, key=lambda e: e[0])
    why = in_user_words(last_error_line(term.get("message") or "") or term.get("reason") or "no message", "archive")
    return f"the archiver (pod {pod_name}) exited with code {term['exitCode']}: {why}"[:1000]


def _shape(status: dict[str, Any]) -> Any:
    """The fields whose change is always written at once (everything but the moving figures)."""
    streams = [{k: v for k, v in s.items() if k not in ("archivedOffset", "firstOffset", "committedOffset",
                                                         "committedAt", "completeUntil", "lagSeconds")}
               for s in status.get("streams") or []]
    conds = [{k: c.get(k) for k in ("type", "status", "reason", "message")} for c in status.get("conditions") or []]
    rest = {k: v for k, v in status.items() if k not in VOLATILE and k != "conditions"}
    return json.dumps([rest, conds, streams], sort_keys=True, default=str)


def _offsets(status: dict[str, Any]) -> Any:
    return [(s.get("vhost"), s.get("name"), s.get("firstOffset"), s.get("archivedOffset"), s.get("committedOffset"))
            for s in status.get("streams") or []]


def status_patch(written: dict[str, Any], new: dict[str, Any], since_write: float, lag_step: float,
                 progress_every: float = PROGRESS_WRITE_SECS) -> dict[str, Any]:
    """The merge patch to write now ({}: nothing). ``written``: the status as last written;
    ``since_write``: seconds since it was written (the operator counts from its own start when it did
    not write it itself).

    - phase, conditions, streams and gaps: at once;
    - the lag: at once when it moved by ``lag_step`` or more (freshness: a lag change shows within a poll);
    - archived offsets that moved: at most every ``progress_every`` seconds;
    - anything else (an idle archive's recoverable-until): at most every IDLE_WRITE_SECS."""
    changed = {k: v for k, v in new.items() if written.get(k) != v}
    changed.update({k: None for k in written if k not in new and k in VOLATILE})
    if not changed:
        return {}
    if _shape(written) != _shape(new):
        return changed
    old_lag, new_lag = written.get("lagSeconds"), new.get("lagSeconds")
    if (old_lag is None) != (new_lag is None) or (new_lag is not None and abs(new_lag - old_lag) >= lag_step):
        return changed
    if _offsets(written) != _offsets(new) and since_write >= progress_every:
        return changed
    if since_write >= IDLE_WRITE_SECS:
        return changed
    return {}


def lag_step(spec: dict[str, Any]) -> float:
    """A lag change this large is written at once: a quarter of the objective, at least 5 s."""
    return max(5.0, rpo_seconds(spec) / 4)


def restore_point(point_in_time: Any, recoverable_until: int | None, archive: str, began: int | None = None) -> int:
    """The instant (epoch ms) a restore of ``spec.archiveRef`` goes up to: ``pointInTime`` (RFC 3339 or
    epoch ms), or the archive's recoverable-until (``recoverable``, the default). Refused past the
    recoverable-until (some stream would not be complete up to it) and before ``began``, when the archive's
    first generation began (no record is stamped that early: the restore Job would be refused, or restore
    nothing), on reconcile, naming the range the archive can be restored to."""
    if recoverable_until is None:
        raise ConfigError(f"spec.archiveRef.name: the archive {archive!r} holds no recoverable-until yet "
                          "(no tick names every stream)")
    if is_recoverable(point_in_time):
        return recoverable_until
    text = str(point_in_time).strip()
    try:
        at = None if text.isdigit() else datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        if at is not None and at.tzinfo is None:
            raise ValueError(text)  # the CRD asks for a zone: no local time of the operator's
        # exact milliseconds: a float's 0.999 ms short would pass a bound the instant is on
        ms = int(text) if at is None else (at - EPOCH) // timedelta(milliseconds=1)
    except ValueError:
        raise ConfigError(f"spec.archiveRef.pointInTime: {text!r} is not RFC 3339, epoch milliseconds or "
                          "'recoverable'") from None
    span = (f"; archive {archive!r} can be restored to a point from {_ms_iso(began)} (its first generation "
            f"began) to {_ms_iso(recoverable_until)} (its recoverable-until)" if began is not None else "")
    if ms > recoverable_until:
        raise ConfigError(f"spec.archiveRef.pointInTime: {text} is after the archive's recoverable-until "
                          f"{_ms_iso(recoverable_until)}: not every stream is archived up to it{span}")
    if began is not None and ms < began:
        raise ConfigError(f"spec.archiveRef.pointInTime: {text} is before archive {archive!r} began: no record is "
                          f"stamped that early, nothing would be restored{span}")
    return ms


def is_recoverable(point_in_time: Any) -> bool:
    """``pointInTime`` unset or ``recoverable``: the newest recoverable-until, always in the archive's range."""
    return point_in_time is None or str(point_in_time).strip().lower() == "recoverable"


def _ms_iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
