"""``kubectl rbak status``, ``backup``, ``drill``, ``logs``, ``suspend`` and ``resume``: the runs of a
RabbitMQBackup, started the way a user asks the operator (an annotation) and followed to their end."""

from __future__ import annotations

import json
import sys
from typing import Any

from rbak.errors import ConfigError
from rbak_kubectl.context import Ctx, PluginError, out, request_unpicked, table
from rbak_operator.crds.schema import ARCHIVE_PLURAL, BACKUP_PLURAL, RESTORE_PLURAL
from rbak_operator.decide import bodies, naming, policy
from rbak_operator.decide.status import restore_summary_line
from rbak_operator.kube.errors import ApiError
from rbak_operator.reconcile import drill
from rbak_operator.reconcile.backup import TRIGGER_ANNOTATION


def cmd_status(c: Ctx) -> int:
    named_archive = c.args.name is not None and c.kube.get_backup(c.ns, c.args.name) is None \
        and c.kube.get_archive(c.ns, c.args.name) is not None
    objs = [] if named_archive else [c.backup(c.args.name)] if c.args.name else sorted(
        c.kube.list_cr(BACKUP_PLURAL, c.ns), key=lambda b: b["metadata"]["name"])
    restores, why_not = restores_of(c, c.args.name)
    if c.args.output == "json":
        archives = archives_in(c, c.args.name)[0]
        out(json.dumps([status_row(b) for b in objs] + [restore_row(r) for r in restores]
                       + [archive_row(a) for a in archives], indent=2))
        return 0
    if named_archive:
        pass
    elif not objs:
        out(f"No RabbitMQBackups in namespace {c.ns}.")
    else:
        rows, notes = [], []
        for b in objs:
            r = status_row(b)
            rows.append([r["name"], r["phase"], r["lastRun"], r["result"], r["messages"], r["size"], r["finished"],
                         r["nextRun"], r["drill"]])
            notes += [f"{r['name']}: {m}" for m in r["notes"]]
        for line in table(["NAME", "PHASE", "LAST RUN", "RESULT", "MESSAGES", "SIZE", "FINISHED", "NEXT RUN",
                           "DRILL"], rows) + notes:
            out(line)
    if restores:
        rows, notes = [], []
        for x in restores:
            r = restore_row(x)
            rows.append([r["name"], r["backup"], r["backupId"], r["phase"], r["messages"], r["target"], r["finished"]])
            notes += [f"{r['name']}: {m}" for m in r["notes"]]
        out()
        for line in table(["RESTORE", "FROM", "BACKUP ID", "PHASE", "RESTORED", "TARGET", "FINISHED"], rows) + notes:
            out(line)
    archives, why_not_archives = archives_in(c, c.args.name)
    if archives:
        rows, notes = [], []
        for a in archives:
            r = archive_row(a)
            rows.append([r["name"], r["phase"], r["rpo"], r["lag"], r["recoverableUntil"], r["streams"], r["gaps"]])
            notes += [f"{r['name']}: {m}" for m in r["notes"]]
        out()
        for line in table(["ARCHIVE", "PHASE", "RPO", "LAG", "RECOVERABLE UNTIL", "STREAMS", "GAPS"], rows) + notes:
            out(line)
    for why in (why_not, why_not_archives):
        if why:
            out(why)
    return 0


def archives_in(c: Ctx, name: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """The namespace's RabbitMQArchives (the one named ``name`` when there is one), by name."""
    try:
        items = c.kube.list_cr(ARCHIVE_PLURAL, c.ns)
    except ApiError as e:
        return [], f"(RabbitMQArchives not listed: HTTP {e.status} {e.reason})"
    if name and any(a["metadata"]["name"] == name for a in items):
        items = [a for a in items if a["metadata"]["name"] == name]
    elif name:
        items = []
    return sorted(items, key=lambda a: a["metadata"]["name"]), None


def archive_row(body: dict[str, Any]) -> dict[str, Any]:
    """One RabbitMQArchive's line of ``status``: the printer columns, and why it misses its objective or
    is degraded."""
    spec, st = body.get("spec") or {}, body.get("status") or {}
    conds = {c.get("type"): c for c in st.get("conditions") or []}
    notes = [f"{t} {c.get('reason')}: {c.get('message')}" for t, c in conds.items()
             if (t in ("Ready", "RPOMet") and c.get("status") == "False") or (t == "Degraded" and c.get("status") == "True")]
    return {"kind": "RabbitMQArchive", "name": body["metadata"]["name"], "phase": st.get("phase") or "Pending",
            "rpo": f"{spec.get('rpoSeconds', 30)}s",
            "lag": f"{st['lagSeconds']}s" if st.get("lagSeconds") is not None else None,
            "recoverableUntil": st.get("recoverableUntil"), "streams": st.get("streamCount"),
            "gaps": st.get("gapMessages"), "rpoMet": (conds.get("RPOMet") or {}).get("status"), "notes": notes}


def restores_of(c: Ctx, backup: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """The namespace's RabbitMQRestores (only those of ``backup`` when named), oldest first; a user who
    may not list them still gets the backups' table, with a line saying why restores are missing."""
    try:
        items = c.kube.list_cr(RESTORE_PLURAL, c.ns)
    except ApiError as e:
        return [], f"(RabbitMQRestores not listed: HTTP {e.status} {e.reason})"
    if backup:
        items = [r for r in items if (((r.get("spec") or {}).get("backupRef") or (r.get("spec") or {}).get("archiveRef")
                                       or {}).get("name")) == backup]
    return sorted(items, key=lambda r: (r["metadata"].get("creationTimestamp") or "", r["metadata"]["name"])), None


def restore_row(body: dict[str, Any]) -> dict[str, Any]:
    """One RabbitMQRestore's line of ``status``: what it restores from, its phase and outcome."""
    spec, st = body.get("spec") or {}, body.get("status") or {}
    ref = spec.get("backupRef") or {}
    aref = spec.get("archiveRef") or {}
    phase = st.get("phase") or "Pending"
    prog = st.get("progress") or {}
    if prog.get("summary") and phase == "Running":
        phase += f" ({prog['summary']})"
    notes = []
    if phase == "Failed" and st.get("message"):
        notes.append(f"{st.get('reason') or 'Failed'}: {st['message']}")
    if st.get("dryRun"):
        phase += " (dry run)"
        notes.append(restore_summary_line(st))
    targets = st.get("targetVhosts") or []
    return {"kind": "RabbitMQRestore", "name": body["metadata"]["name"],
            "backup": f"rabbitmqbackup/{ref['name']}" if ref.get("name") else f"rabbitmqarchive/{aref['name']}"
            + (f" @ {st.get('pointInTime') or aref.get('pointInTime') or 'recoverable'}") if aref.get("name")
            else "spec.storage",
            "backupId": st.get("backupId") or ref.get("backupId"), "phase": phase, "messages": st.get("messages"),
            "published": st.get("publishedMessages"), "confirmed": st.get("confirmedMessages"),
            "dryRun": bool(st.get("dryRun")), "target": ",".join(targets) or None, "targetQueues": st.get("targetQueues"),
            "size": st.get("size"), "finished": st.get("completionTime"), "notes": notes}


def status_row(body: dict[str, Any]) -> dict[str, Any]:
    """One object's line of ``status`` and the messages that explain it."""
    spec, st = body.get("spec") or {}, body.get("status") or {}
    last = st.get("lastRun") or {}
    prog = st.get("progress") or {}
    drill = st.get("restoreDrill") or {}
    phase = st.get("phase") or "Pending"
    if prog.get("summary"):
        phase += f" ({prog['summary']})"
    result = last.get("phase")
    if result and last.get("validation") in ("Pending", "Failed"):
        result += f", validation {last['validation']}"
    if spec.get("suspend"):
        next_run = "suspended"
    else:
        next_run = st.get("nextScheduleTime") or ("-" if spec.get("schedule") else "on demand")
    drill_col = "Running" if drill.get("active") else drill.get("result")
    if drill_col and drill.get("lastRunTime") and not drill.get("active"):
        drill_col += f" ({drill['lastRunTime']})"
    notes = []
    if last.get("message"):
        notes.append(f"last run {last.get('jobName', '')}: {last['message']}")
    ready = next((x for x in st.get("conditions") or [] if x.get("type") == "Ready"), None)
    if ready and ready.get("status") == "False" and ready.get("message") not in (None, "", last.get("message")) \
            and not (last.get("message") and last["message"] in ready["message"]):
        notes.append(f"{ready.get('reason')}: {ready['message']}")
    if drill.get("result") in ("Failed", "Skipped") and drill.get("message"):
        notes.append(f"drill {drill['result'].lower()}: {drill['message']}")
    return {"kind": "RabbitMQBackup", "name": body["metadata"]["name"], "phase": phase, "lastRun": last.get("backupId"),
            "result": result,
            "messages": last.get("messages"), "size": last.get("size"), "finished": last.get("completionTime"),
            "nextRun": next_run, "drill": drill_col, "notes": notes}


def cmd_backup(c: Ctx) -> int:
    name = c.args.name
    c.backup(name)
    value, run, before = c.request_now(name, TRIGGER_ANNOTATION, "backup",
                                       lambda v: naming.manual_run_name(name, v))
    if c.args.no_wait:
        return 0
    seen: dict[str, Any] = {}

    def step() -> int | None:
        body = c.backup(name)
        st = body.get("status") or {}
        done = next((h for h in [st.get("lastRun") or {}] + list(st.get("history") or [])
                     if h.get("jobName") == run), None)
        if done and done.get("phase") in ("Succeeded", "Failed"):
            return report_run(run, done)
        if run in (st.get("active") or []) and not seen.get("running"):
            seen["running"] = True
            out(f"job/{run}: running")
        elif (st.get("lastManualTrigger") != value and not seen.get("queued")
              and waits_for_active((body.get("spec") or {}).get("concurrencyPolicy"), st.get("active") or [])):
            seen["queued"] = True
            out(f"job/{run}: waiting for {', '.join(st['active'])} to finish (spec.concurrencyPolicy Forbid)")
        show_progress(run, st.get("progress"), seen)
        return None

    def unpicked() -> str | None:
        return c.unpicked_request(name, TRIGGER_ANNOTATION, value, before,
                                  lambda st: st.get("lastManualTrigger") == value or run in (st.get("active") or []),
                                  "status.lastManualTrigger")

    return c.wait(f"RabbitMQBackup {c.ns}/{name} run {run}", step, unpicked)


def waits_for_active(concurrency_policy: str | None, active: list[str]) -> bool:
    """Whether the operator holds a trigger back until the active runs end (``policy.concurrency``)."""
    try:
        return policy.concurrency(concurrency_policy, active) == "skip"
    except ConfigError:
        return False


def show_progress(run: str, prog: dict[str, Any] | None, seen: dict[str, Any]) -> None:
    """A line each time the run's ``status.progress`` says something new."""
    prog = prog or {}
    if prog.get("runName") != run or not prog.get("summary"):
        return
    line = f"job/{run}: {prog['summary']}"
    if prog.get("size"):
        line += f", {prog['size']}"
    if prog.get("rate"):
        line += f", {prog['rate']}"
    if prog.get("currentQueue"):
        line += f", at {prog['currentQueue']}"
    if line != seen.get("progress"):
        seen["progress"] = line
        out(line)


def report_run(run: str, h: dict[str, Any]) -> int:
    if h["phase"] == "Succeeded":
        line = f"job/{run}: Succeeded: backup {h.get('backupId')}"
        if h.get("messages") is not None:
            line += f": {h['messages']} messages, {h.get('size')}, {h.get('queues')} queues"
        if h.get("validation"):
            line += f" (validation {h['validation']})"
        out(line)
        return 0 if h.get("validation") != "Failed" else 1
    out(f"job/{run}: Failed: {h.get('message') or h.get('reason') or 'the Job failed'}")
    return 1


def cmd_drill(c: Ctx) -> int:
    """A RabbitMQBackup's drill (NAME), or a RabbitMQArchive's (``--archive NAME``: ``rbak drill --archive``,
    the archive's state of a few minutes ago restored and compared with the live streams)."""
    if bool(c.args.name) == bool(c.args.archive):
        raise PluginError("drill: give NAME (a RabbitMQBackup's drill) or --archive NAME (a RabbitMQArchive's), "
                          + ("not both" if c.args.name else "one of them"))
    name = c.args.archive or c.args.name
    kind, plural = ("RabbitMQArchive", ARCHIVE_PLURAL) if c.args.archive else ("RabbitMQBackup", BACKUP_PLURAL)

    def read() -> dict[str, Any]:
        return c.archive(name) if c.args.archive else c.backup(name)

    body = read()
    if drill.drill_spec(body.get("spec") or {}) is None:
        raise PluginError(f"{kind} {c.ns}/{name}: {drill.FIELD} is not enabled (it needs a schedule): "
                          "the operator runs no drill for it")
    base = drill.drill_base({**body, "kind": kind})
    value, run, before = c.request_now(name, drill.TRIGGER_ANNOTATION, "restore drill",
                                       lambda v: drill.manual_run_name(base, v), plural)
    if c.args.no_wait:
        return 0
    seen: dict[str, bool] = {}

    def step() -> int | None:
        d = (read().get("status") or {}).get("restoreDrill") or {}
        if run in (d.get("recordedJobs") or []) and d.get("lastJob") == run:
            return report_drill(run, d, archive=bool(c.args.archive))
        if d.get("active") == run:
            if not seen.get("running"):
                seen["running"] = True
                job = c.kube.get_job(c.ns, run) or {}
                bid = ((job.get("metadata") or {}).get("annotations") or {}).get(bodies.A_BACKUP_ID)
                out(f"job/{run}: running" + (f" (archive {name})" if c.args.archive else f" (backup {bid})" if bid
                                             else ""))
        elif d.get("lastManualTrigger") == value and run not in (d.get("recordedJobs") or []):
            out(f"job/{run}: not started: {d.get('reason')}: {d.get('message')}")
            return 1
        return None

    def unpicked() -> str | None:
        def acted(st: dict[str, Any]) -> bool:
            d = st.get("restoreDrill") or {}
            return d.get("lastManualTrigger") == value or d.get("active") == run

        return request_unpicked(c.ns, {**read(), "kind": kind}, drill.TRIGGER_ANNOTATION, value, before, acted,
                                "status.restoreDrill.lastManualTrigger")

    return c.wait(f"{kind} {c.ns}/{name} drill {run}", step, unpicked)


def report_drill(run: str, d: dict[str, Any], archive: bool = False) -> int:
    """The drill's result line: a backup drill's backup and messages, an archive drill's generation, the
    recovery point it achieved and the RTO (its records are in the message) when its report said them (a Job
    that stored none leaves an earlier drill's figures in the status: not shown as this one's)."""
    line = f"job/{run}: {d.get('result')}: {d.get('message')}"
    reported = d.get("reason") in ("DrillPassed", "DrillFailed")
    facts = []
    if not archive:
        facts.append(f"backup {d.get('backupId')}")
        if d.get("messages") is not None:
            facts.append(f"{d['messages']} messages")
    elif reported:
        facts.append(f"generation {d.get('backupId')}")
        if d.get("recoveryPointSeconds") is not None:
            facts.append(f"recovery point achieved {d['recoveryPointSeconds']}s")
        if d.get("restoreSeconds") is not None:
            facts.append(f"RTO {d['restoreSeconds']}s")
    if d.get("scratchVhost") and (reported or not archive):
        facts.append(f"scratch vhost {d['scratchVhost']}")
    if d.get("signer"):
        facts.append(f"signed by {d['signer']}")
    out(line + (f" ({', '.join(facts)})" if facts else ""))
    if d.get("failedQueues") and not archive:
        out(f"failed queues: {', '.join(d['failedQueues'])}")
    if d.get("failedStreams") and archive and reported:
        out(f"failed streams: {', '.join(d['failedStreams'])}")
    return 0 if d.get("result") == "Passed" else 1


def cmd_logs(c: Ctx) -> int:
    name = c.args.name
    st = c.backup(name).get("status") or {}
    active = sorted(st.get("active") or [])
    job = active[-1] if active else (st.get("lastRun") or {}).get("jobName")
    if not job:
        raise PluginError(f"RabbitMQBackup {c.ns}/{name} has no run yet (kubectl rbak backup {name} starts one)")
    pods = c.kube.job_pods(c.ns, job)
    if not pods:
        raise PluginError(f"RabbitMQBackup {c.ns}/{name}: Job {job} has no pod (deleted with its Job by "
                          "spec.successfulJobsHistoryLimit/failedJobsHistoryLimit, or not scheduled yet)")
    pod = max(pods, key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "", p["metadata"]["name"]))
    pname = pod["metadata"]["name"]
    spec = pod.get("spec") or {}
    containers = [x["name"] for x in (spec.get("initContainers") or []) + (spec.get("containers") or [])]
    for cname in containers:
        if len(containers) > 1:
            out(f"==> pod/{pname} container {cname} <==")
        try:
            text = c.kube.pod_log(c.ns, pname, cname)
        except ApiError as e:
            raise PluginError(f"logs of pod {c.ns}/{pname} container {cname}: HTTP {e.status} {e.reason}") from None
        sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return 0


def cmd_suspend(c: Ctx, suspend: bool) -> int:
    name = c.args.name
    body = c.backup(name)
    word = "suspended" if suspend else "resumed"
    if bool((body.get("spec") or {}).get("suspend")) == suspend:
        out(f"rabbitmqbackup/{name} already {word}")
        return 0
    c.kube.patch_cr(BACKUP_PLURAL, c.ns, name, {"spec": {"suspend": suspend}})
    out(f"rabbitmqbackup/{name} {word}")
    return 0


# --------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------
