"""``kubectl rbak``: run, follow and inspect RabbitMQBackups from the command line.

Installed as the ``kubectl-rbak`` console script, which kubectl finds on the
``PATH`` as a plugin. It runs with the user's own credentials (the kubeconfig,
``--kubeconfig``/``--context`` as kubectl reads them) through the operator's
client (``k8s.Kube``), and asks the operator to act only the way a user can:
the ``rbak.io/backup-now`` and ``rbak.io/drill-now`` annotations, ``spec.suspend``
and new RabbitMQRestore objects. What is stored is read directly from the
object's storage with the credentials of the Secret the object names, the way
the operator reads it (``storage_access.open_backup_storage``).

Every bad input is one ``error: ...`` line on stderr naming the object or flag,
and exit code 1 (2 for usage errors, from argparse).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable

from rbak.errors import RbakError

from rbak_operator.decide import bodies, naming
from rbak_operator.crds.schema import ARCHIVE_PLURAL, BACKUP_PLURAL, GROUP, RESTORE_PLURAL, VERSION
from rbak_operator.kube.client import ApiError, Connection, Kube, _path, use_connection
from rbak_operator.decide.status import restore_summary_line

PROG = "kubectl rbak"
USER_AGENT = "kubectl-rbak"
POLL_SECONDS = float(os.environ.get("RBAK_KUBECTL_POLL_SECONDS", "1"))
DEFAULT_TIMEOUT = 3600.0
DEFAULT_PICKUP_TIMEOUT = 30.0  # an operator acts on a request in about a second; a dead one never does
# The chart's operator pods (templates/_helpers.tpl: rbak.labels + component), whatever the release is called.
OPERATOR_PODS = "kubectl get pods -A -l app.kubernetes.io/part-of=rbak,app.kubernetes.io/component=operator"


class PluginError(Exception):
    """One line for the user; exit code 1."""


class PluginKube(Kube):
    """The operator's client plus the calls only a user makes (the operator's RBAC has none of them)."""

    def list_cr(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        return self._call("GET", _path(GROUP, VERSION, plural, namespace)).get("items") or []

    def patch_cr(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", _path(GROUP, VERSION, plural, namespace, name), patch,
                          content_type="application/merge-patch+json")

    def create_cr(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", _path(GROUP, VERSION, plural, namespace), body)

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        data = self._call("GET", _path("", "v1", "pods", namespace, pod, "log"), params={"container": container},
                          raw=True)
        return data.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------
# Connection, output helpers.
# --------------------------------------------------------------------------

def connect(kubeconfig: str | None, context: str | None) -> Connection:
    """The kubeconfig (``--kubeconfig``, else ``KUBECONFIG``, else ``~/.kube/config``) and its context
    (``--context``, else the current one), as kubectl reads them; in a pod without a kubeconfig the
    service account."""
    from kubernetes import config as kconfig
    from kubernetes.client import Configuration

    cfg = Configuration()
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    has_file = bool(kubeconfig) or any(os.path.exists(os.path.expanduser(p))
                                       for p in where.split(os.pathsep) if p)
    if not has_file and os.environ.get("KUBERNETES_SERVICE_HOST"):
        from rbak_operator.kube.client import SA_NAMESPACE

        kconfig.load_incluster_config(client_configuration=cfg)
        ns = open(SA_NAMESPACE).read().strip() if os.path.exists(SA_NAMESPACE) else None
        return Connection(cfg, ns)
    if kubeconfig and not os.path.exists(kubeconfig):
        raise PluginError(f"--kubeconfig: {kubeconfig} does not exist")
    try:
        contexts, active = kconfig.list_kube_config_contexts(config_file=kubeconfig)
        if context is not None:
            chosen = next((c for c in contexts or [] if c.get("name") == context), None)
            if chosen is None:
                names = ", ".join(sorted(c.get("name", "") for c in contexts or [])) or "none"
                raise PluginError(f"--context: no context {context!r} in the kubeconfig {where} (it has: {names})")
            active = chosen
        kconfig.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (kconfig.ConfigException, OSError, ValueError) as e:
        raise PluginError(f"the kubeconfig {where} is unusable: {e}") from None
    return Connection(cfg, ((active or {}).get("context") or {}).get("namespace"))


def out(line: str = "") -> None:
    print(line, flush=True)


def table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    """kubectl's layout: left-aligned columns, three spaces apart, no trailing blanks."""
    cells = [headers] + [["-" if v is None or v == "" else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def unique_value() -> str:
    """An annotation value never used before: each one runs once."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


class Ctx:
    """What every command gets: the client, the namespace and the output format."""

    def __init__(self, kube: PluginKube, namespace: str, args: argparse.Namespace):
        self.kube, self.ns, self.args = kube, namespace, args

    def backup(self, name: str) -> dict[str, Any]:
        body = self.kube.get_backup(self.ns, name)
        if body is None:
            raise PluginError(f'RabbitMQBackup "{name}" not found in namespace "{self.ns}"')
        return body

    def archive(self, name: str) -> dict[str, Any]:
        body = self.kube.get_archive(self.ns, name)
        if body is None:
            raise PluginError(f'RabbitMQArchive "{name}" not found in namespace "{self.ns}"')
        return body

    def storage(self, body: dict[str, Any]):
        """(storage, prefix) of a RabbitMQBackup or RabbitMQArchive, opened with the credentials its Secret holds."""
        from rbak_operator.decide import rbakconfig
        from rbak_operator.reconcile.storage import open_backup_storage

        name, kind = body["metadata"]["name"], body.get("kind") or "RabbitMQBackup"
        spec = body.get("spec") or {}
        try:
            st = open_backup_storage(self.kube, self.ns, spec.get("storage"))
        except RbakError as e:
            raise PluginError(f"{kind} {self.ns}/{name}: {e}") from None
        if st is None:
            raise PluginError(f"{kind} {self.ns}/{name}: spec.storage is a PersistentVolumeClaim, which is "
                              "only readable inside the cluster (use rbak list in a pod that mounts it)")
        return st, rbakconfig.storage_prefix(spec.get("storage"))

    @staticmethod
    def where(body: dict[str, Any]) -> str:
        """The storage as a user names it: ``s3://bucket/prefix`` (and a non-AWS endpoint)."""
        s3 = ((body.get("spec") or {}).get("storage") or {}).get("s3") or {}
        url = f"s3://{s3.get('bucket')}/{(s3.get('prefix') or '').strip('/')}".rstrip("/")
        return url + (f" at {s3['endpoint']}" if s3.get("endpoint") else "")

    def wait(self, what: str, step: Callable[[], int | None],
             unpicked: Callable[[], str | None] | None = None) -> int:
        """Call ``step`` every POLL_SECONDS until it returns an exit code (or ``--timeout`` passes).

        ``unpicked`` is asked once, ``--pickup-timeout`` seconds in: None when an operator has acted on
        the request, else what shows it has not, so a cluster without a running operator is named in
        seconds rather than after an hour's ``--timeout``."""
        start = time.monotonic()
        deadline = start + self.args.timeout
        pickup = start + self.args.pickup_timeout if unpicked is not None else None
        while True:
            code = step()
            if code is not None:
                return code
            now = time.monotonic()
            if pickup is not None and now > pickup and unpicked is not None:
                why = unpicked()
                if why is not None:
                    raise PluginError(f"no rbak operator acted on the request within {self.args.pickup_timeout:g}s: "
                                      f"{why}. Is the operator running? {OPERATOR_PODS}")
                pickup = None
            if now > deadline:
                raise PluginError(f"timed out after {self.args.timeout:g}s waiting for {what} "
                                  "(is the rbak operator running?); it goes on without this command")
            time.sleep(POLL_SECONDS)

    def request_now(self, name: str, annotation: str, what: str, run_name: Callable[[str], str]
                    ) -> tuple[str, str, dict[str, Any]]:
        """Ask the operator to act now, the way a user does: a new value of ``annotation`` on NAME.
        Prints the request and the Job it will make; returns (value, Job name, status as the patch left it)."""
        value = unique_value()
        body = self.kube.patch_cr(BACKUP_PLURAL, self.ns, name, {"metadata": {"annotations": {annotation: value}}})
        run = run_name(value)
        out(f"rabbitmqbackup/{name}: {what} requested ({annotation}={value})")
        out(f"job/{run}")
        return value, run, body.get("status") or {}

    def unpicked_request(self, name: str, annotation: str, value: str, before: dict[str, Any],
                         acted: Callable[[dict[str, Any]], bool], ack: str) -> str | None:
        return request_unpicked(self.ns, self.backup(name), annotation, value, before, acted, ack)


def request_unpicked(ns: str, body: dict[str, Any], annotation: str, value: str, before: dict[str, Any],
                     acted: Callable[[dict[str, Any]], bool], ack: str) -> str | None:
    """None when an operator acted on ``annotation=value`` (``acted`` on the status, or any change of the
    status since the request: an operator is watching the object, e.g. a run the request waits for);
    else what the object shows, naming ``ack``, the status field the operator sets when it acts."""
    st = body.get("status") or {}
    if acted(st) or st != before:
        return None
    name = body["metadata"]["name"]
    now = (body["metadata"].get("annotations") or {}).get(annotation)
    if now != value:
        return (f"RabbitMQBackup {ns}/{name}: {annotation} is now {now!r}, another request replaced {value!r}, "
                "and its status is unchanged")
    return (f"RabbitMQBackup {ns}/{name} still has {annotation}={value} and its status is unchanged since it was "
            f"set ({ack} is {_shown(st, ack)}); the request stays: an operator that starts runs it")


def _shown(status: dict[str, Any], dotted: str) -> str:
    v: Any = status
    for part in dotted.split(".")[1:]:
        v = v.get(part) if isinstance(v, dict) else None
    return repr(v) if v is not None else "unset"


# --------------------------------------------------------------------------
# Commands.
# --------------------------------------------------------------------------

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
    from rbak_operator.reconcile.backup import TRIGGER_ANNOTATION

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
    from rbak.errors import ConfigError

    from rbak_operator.decide import policy

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
    from rbak_operator.reconcile import drill

    name = c.args.name
    body = c.backup(name)
    if drill.drill_spec(body.get("spec") or {}) is None:
        raise PluginError(f"RabbitMQBackup {c.ns}/{name}: {drill.FIELD} is not enabled (it needs a schedule): "
                          "the operator runs no drill for it")
    value, run, before = c.request_now(name, drill.TRIGGER_ANNOTATION, "restore drill",
                                       lambda v: drill.manual_run_name(name, v))
    if c.args.no_wait:
        return 0
    seen: dict[str, bool] = {}

    def step() -> int | None:
        d = (c.backup(name).get("status") or {}).get("restoreDrill") or {}
        if run in (d.get("recordedJobs") or []) and d.get("lastJob") == run:
            return report_drill(run, d)
        if d.get("active") == run:
            if not seen.get("running"):
                seen["running"] = True
                job = c.kube.get_job(c.ns, run) or {}
                bid = ((job.get("metadata") or {}).get("annotations") or {}).get(bodies.A_BACKUP_ID)
                out(f"job/{run}: running" + (f" (backup {bid})" if bid else ""))
        elif d.get("lastManualTrigger") == value and run not in (d.get("recordedJobs") or []):
            out(f"job/{run}: not started: {d.get('reason')}: {d.get('message')}")
            return 1
        return None

    def unpicked() -> str | None:
        def acted(st: dict[str, Any]) -> bool:
            d = st.get("restoreDrill") or {}
            return d.get("lastManualTrigger") == value or d.get("active") == run

        return c.unpicked_request(name, drill.TRIGGER_ANNOTATION, value, before, acted,
                                  "status.restoreDrill.lastManualTrigger")

    return c.wait(f"RabbitMQBackup {c.ns}/{name} drill {run}", step, unpicked)


def report_drill(run: str, d: dict[str, Any]) -> int:
    line = f"job/{run}: {d.get('result')}: {d.get('message')}"
    facts = [f"backup {d.get('backupId')}"]
    if d.get("messages") is not None:
        facts.append(f"{d['messages']} messages")
    if d.get("scratchVhost"):
        facts.append(f"scratch vhost {d['scratchVhost']}")
    if d.get("signer"):
        facts.append(f"signed by {d['signer']}")
    out(f"{line} ({', '.join(facts)})")
    if d.get("failedQueues"):
        out(f"failed queues: {', '.join(d['failedQueues'])}")
    return 0 if d.get("result") == "Passed" else 1


def cmd_list(c: Ctx) -> int:
    from rbak.repo.catalog import list_backups
    from rbak.commands.inspect import fmt_ts, list_notes, list_obj
    from rbak.base.units import human_bytes

    from rbak_operator.decide import policy

    name = c.args.name
    body = c.backup(name)
    st, prefix = c.storage(body)
    try:
        entries = list_backups(st, prefix)
    except RbakError as e:
        raise PluginError(f"RabbitMQBackup {c.ns}/{name}: {e}") from None
    if c.args.output == "json":
        out(json.dumps(list_obj(entries), indent=2))
        return 0
    if not entries:
        out(f"No backups in the storage of RabbitMQBackup {c.ns}/{name} ({c.where(body)}).")
        return 0
    rows = []
    for entry in entries:
        m = entry.manifest
        rows.append([entry.backup_id, entry.status, fmt_ts(m.created_at) if m else None, len(m.queues) if m else None,
                     m.total_messages if m else None, human_bytes(m.total_bytes) if m else None,
                     "yes" if policy.owned(entry.backup_id, m, body["metadata"]) else "no",
                     (list_notes(m) if m else entry.error) or ""])
    for line in table(["BACKUP ID", "STATUS", "CREATED", "QUEUES", "MESSAGES", "SIZE", "OWN", "NOTES"], rows):
        out(line)
    return 0


def cmd_describe(c: Ctx) -> int:
    from rbak.repo.catalog import load_manifest
    from rbak.commands.inspect import describe_obj, fmt_ts
    from rbak.base.units import human_bytes

    if c.args.archive:
        if c.args.backup_id is not None:
            raise PluginError(f"describe --archive {c.args.archive}: give at most one GENERATION (a backup id)")
        body = c.archive(c.args.archive)
        st, prefix = c.storage(body)
        name, bid = c.args.archive, c.args.name or newest_generation(st, prefix, c.args.archive)
        describe_archive_status(body)
    else:
        name, bid = c.args.name, c.args.backup_id
        if not name or not bid:
            raise PluginError("describe: give NAME BACKUP_ID (a RabbitMQBackup's), or --archive NAME [GENERATION]")
        body = c.backup(name)
        st, prefix = c.storage(body)
    try:
        m = load_manifest(st, bid, prefix)
    except RbakError as e:
        raise PluginError(f"{body.get('kind') or 'RabbitMQBackup'} {c.ns}/{name}: BACKUP_ID {bid!r}: {e}") from None
    obj = describe_obj(m)
    if c.args.output == "json":
        out(json.dumps(obj, indent=2, ensure_ascii=False))
        return 0
    if c.args.output == "yaml":
        import yaml

        print(yaml.safe_dump(obj, sort_keys=False, allow_unicode=True), end="")
        return 0
    out(f"Backup:      {m.backup_id} ({obj['status']})")
    out(f"Storage:     {c.where(body)}")
    out(f"Created:     {fmt_ts(m.created_at)}")
    out(f"Completed:   {fmt_ts(m.completed_at)}")
    out(f"Source:      {m.source_cluster or '-'} (RabbitMQ {m.rabbitmq_version or '?'})")
    if m.encryption and m.encryption.envelope:
        out(f"Encryption:  {m.encryption.algorithm}, envelope (data key {m.encryption.key_id}; "
            "`rbak describe` lists the keys that wrap it)")
    elif m.encryption:
        out(f"Encryption:  {m.encryption.algorithm}, key id {m.encryption.key_id}")
    out(f"Totals:      {m.total_messages} messages, {m.total_segments} segments, {human_bytes(m.total_bytes)}")
    if m.definitions:
        d = m.definitions
        out(f"Definitions: {d.vhost_count} vhosts, {d.queue_count} queues, {d.exchange_count} exchanges, "
            f"{d.user_count} users")
    if m.depends_on:
        out(f"Continues:   {', '.join(sorted(m.depends_on))}")
    if m.archive is not None:
        out(f"Archive:     {m.archive.name} ({'open' if m.archive.open else 'closed'}, {m.archive.ticks} ticks), "
            f"recoverable until {obj.get('archive', {}).get('recoverable_until_utc') or fmt_ts(m.archive.recoverable_until)}")
    out()
    rows = [[q.vhost, q.name, q.queue_type, q.message_count, len(q.segments), human_bytes(q.size_bytes),
             fmt_ts(q.first_message_timestamp), fmt_ts(q.last_message_timestamp)] for q in m.queues]
    for line in table(["VHOST", "QUEUE", "TYPE", "MESSAGES", "SEGMENTS", "SIZE", "FIRST", "LAST"], rows):
        out(line)
    for s in m.queue_status:
        counts = f" (read {s.read} of {s.expected})" if s.status == "partial" else ""
        out(f"{s.status} {s.vhost}/{s.name}{counts}: {s.reason}")
    for q, g in m.gaps:
        out(f"gap {q.vhost}/{q.name}: offsets {g.from_offset}..{g.to_offset} ({g.count} message(s)) in no backup")
    return 0


def newest_generation(st: Any, prefix: str, archive: str) -> str:
    from rbak_operator.reconcile.archive import generations

    gens = generations(st, prefix, archive)
    if not gens:
        raise PluginError(f"RabbitMQArchive {archive}: nothing archived yet (no generation in its storage)")
    return gens[-1]


def describe_archive_status(body: dict[str, Any]) -> None:
    """The archive's status as the operator wrote it from the storage (before the generation's own lines)."""
    r = archive_row(body)
    st = body.get("status") or {}
    out(f"Archive:     rabbitmqarchive/{r['name']}: {r['phase']}, lag {r['lag'] or '-'} (objective {r['rpo']}), "
        f"RPOMet {r['rpoMet'] or 'Unknown'}")
    out(f"Recoverable: until {r['recoverableUntil'] or '-'} (newest tick {st.get('lastTickTime') or '-'})")
    for s in st.get("streams") or []:
        out(f"Stream:      {s.get('vhost')}/{s.get('name')}: archived to offset {s.get('archivedOffset')}, "
            f"lag {s.get('lagSeconds')}s, gaps {s.get('gapMessages', 0)}")
        for g in s.get("gaps") or []:
            out(f"  gap {g}")
    for n in r["notes"]:
        out(f"Note:        {n}")
    out()


def parse_pitr(text: str) -> dict[str, Any]:
    """``START..END`` (either side may be empty): RFC 3339 times or epoch milliseconds."""
    from rbak.config.validation import parse_time_bound

    start, sep, end = text.partition("..")
    if not sep or not (start or end):
        raise PluginError(f"--pitr: {text!r} must be START..END, START.. or ..END "
                          "(RFC 3339 times or epoch milliseconds)")
    window = {}
    for key, value in (("start", start), ("end", end)):
        if value:
            try:
                parse_time_bound(value, f"--pitr {key}")
            except RbakError as e:
                raise PluginError(str(e).removeprefix("Configuration error: ")) from None
            window[key] = int(value) if value.isdigit() else value
    return window


def vhost_mapping(values: list[str], backup_vhosts: list[str] | None, bid: str) -> dict[str, str]:
    """``--to-vhost TARGET`` (a backup of one vhost) or ``--to-vhost SOURCE=TARGET`` (repeatable)."""
    mapping: dict[str, str] = {}
    for v in values:
        src, eq, dst = v.partition("=")
        if not eq:
            if backup_vhosts is None:
                raise PluginError(f"--to-vhost {v}: give SOURCE=TARGET (the storage is not readable from here)")
            if len(backup_vhosts) != 1:
                raise PluginError(f"--to-vhost {v}: backup {bid} holds vhosts {', '.join(backup_vhosts) or 'none'}; "
                                  "give SOURCE=TARGET for each")
            src, dst = backup_vhosts[0], v
        if not src or not dst:
            raise PluginError(f"--to-vhost {v!r}: SOURCE and TARGET must not be empty")
        if backup_vhosts is not None and src not in backup_vhosts:
            raise PluginError(f"--to-vhost {v}: backup {bid} has no vhost {src!r} "
                              f"(it holds {', '.join(backup_vhosts) or 'none'})")
        mapping[src] = dst
    return mapping


def cmd_restore(c: Ctx) -> int:
    from rbak.repo.catalog import load_manifest

    from rbak_operator.reconcile.storage import open_backup_storage

    if c.args.archive:
        return restore_archive(c)
    name, bid = c.args.name, c.args.backup_id
    if not name or not bid:
        raise PluginError("restore: give NAME --backup-id BACKUP_ID (a RabbitMQBackup's), or --archive NAME")
    body = c.backup(name)
    pitr = parse_pitr(c.args.pitr) if c.args.pitr else None
    storage = (body.get("spec") or {}).get("storage")
    vhosts = None
    try:
        st = open_backup_storage(c.kube, c.ns, storage)
    except RbakError as e:
        raise PluginError(f"RabbitMQBackup {c.ns}/{name}: {e}") from None
    if st is not None:  # refuse a backup that is not there before creating anything
        from rbak_operator.decide import rbakconfig

        try:
            m = load_manifest(st, bid, rbakconfig.storage_prefix(storage))
        except RbakError as e:
            raise PluginError(f"--backup-id {bid}: not in the storage of RabbitMQBackup {c.ns}/{name}: {e}") from None
        if not m.is_complete:
            raise PluginError(f"--backup-id {bid}: the backup is incomplete (its manifest has no completed_at)")
        vhosts = sorted({q.vhost for q in m.queues})
    spec: dict[str, Any] = {"backupRef": {"name": name, "backupId": bid}}
    if pitr:
        spec["pitr"] = pitr
    if c.args.to_vhost:
        spec["vhostMapping"] = vhost_mapping(c.args.to_vhost, vhosts, bid)
    rname = c.args.restore_name or naming.dns_label(f"{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}")
    obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RabbitMQRestore",
           "metadata": {"name": rname, "namespace": c.ns}, "spec": spec}
    try:
        c.kube.create_cr(RESTORE_PLURAL, c.ns, obj)
    except ApiError as e:
        raise PluginError(f"RabbitMQRestore {c.ns}/{rname} refused: HTTP {e.status} {e.reason}") from None
    out(f"rabbitmqrestore/{rname} created (backup {bid} of rabbitmqbackup/{name})")
    return follow_restore(c, rname)


def restore_archive(c: Ctx) -> int:
    """``restore --archive NAME [--pitr TIME]``: every stream of the archive up to TIME (default: its
    recoverable-until); the operator refuses a TIME past it, naming the field."""
    from rbak.config.validation import parse_time_bound

    name = c.args.archive
    if c.args.name or c.args.backup_id:
        raise PluginError(f"restore --archive {name}: the archive's newest generation is restored (its chain walks "
                          "back); give no NAME or --backup-id")
    c.archive(name)
    point = (c.args.pitr or "recoverable").strip()
    if point.lower() != "recoverable":
        if ".." in point:
            raise PluginError(f"--pitr {point}: with --archive, one TIME (RFC 3339 or epoch ms) or 'recoverable'")
        try:
            parse_time_bound(point, "--pitr")
        except RbakError as e:
            raise PluginError(str(e).removeprefix("Configuration error: ")) from None
    spec: dict[str, Any] = {"archiveRef": {"name": name, "pointInTime": int(point) if point.isdigit() else point}}
    if c.args.to_vhost:
        spec["vhostMapping"] = vhost_mapping(c.args.to_vhost, None, name)
    rname = c.args.restore_name or naming.dns_label(f"{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}")
    obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RabbitMQRestore",
           "metadata": {"name": rname, "namespace": c.ns}, "spec": spec}
    try:
        c.kube.create_cr(RESTORE_PLURAL, c.ns, obj)
    except ApiError as e:
        raise PluginError(f"RabbitMQRestore {c.ns}/{rname} refused: HTTP {e.status} {e.reason}") from None
    out(f"rabbitmqrestore/{rname} created (rabbitmqarchive/{name} up to {point})")
    return follow_restore(c, rname)


def follow_restore(c: Ctx, rname: str) -> int:
    if c.args.no_wait:
        return 0
    seen: dict[str, Any] = {}

    def step() -> int | None:
        r = c.kube.get_restore(c.ns, rname)
        if r is None:
            raise PluginError(f"RabbitMQRestore {c.ns}/{rname} was deleted while being followed")
        st = r.get("status") or {}
        run = st.get("jobName") or st.get("sparkApplicationName")
        if st.get("phase") == "Running" and run and not seen.get("running"):
            seen["running"] = True
            out(f"{'job' if st.get('jobName') else 'sparkapplication'}/{run}: running")
        if run:
            show_progress(run, st.get("progress"), seen)
        if st.get("phase") == "Succeeded":
            done = restore_summary_line(st) if "dryRun" in st else "counts unknown (the run left no result)"
            out(f"rabbitmqrestore/{rname}: Succeeded: backup {st.get('backupId')}: {done}")
            return 0
        if st.get("phase") == "Failed":
            out(f"rabbitmqrestore/{rname}: Failed: {st.get('reason')}: {st.get('message')}")
            return 1
        return None

    def unpicked() -> str | None:
        r = c.kube.get_restore(c.ns, rname)
        if r is None or r.get("status"):
            return None  # step names a deleted one
        return (f"RabbitMQRestore {c.ns}/{rname} has no status yet (an operator writes it on first sight); "
                "the object stays: an operator that starts restores it")

    return c.wait(f"RabbitMQRestore {c.ns}/{rname}", step, unpicked)


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

def build_parser() -> argparse.ArgumentParser:
    def global_flags(p: argparse.ArgumentParser, default: Any) -> None:
        p.add_argument("-n", "--namespace", default=default, help="namespace (default: the context's)")
        p.add_argument("--kubeconfig", default=default, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
        p.add_argument("--context", default=default, help="kubeconfig context (default: the current one)")

    parser = argparse.ArgumentParser(
        prog=PROG, description="Run, follow and inspect rbak's RabbitMQBackups (a kubectl plugin).")
    global_flags(parser, None)
    # The same flags after the command, as with kubectl (SUPPRESS: an absent one does not reset
    # what was given before the command).
    common = argparse.ArgumentParser(add_help=False)
    global_flags(common, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def cmd(name: str, help: str, wait: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, parents=[common])
        if wait:
            p.add_argument("--no-wait", action="store_true", help="start it and return (do not follow)")
            p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                           help="seconds to follow before giving up (default %(default)g)")
            p.add_argument("--pickup-timeout", type=float, default=DEFAULT_PICKUP_TIMEOUT, metavar="SECONDS",
                           help="give up after this long when no operator has acted on the request "
                                "(default %(default)g)")
        return p

    p = cmd("backup", "run a backup now and follow it", wait=True)
    p.add_argument("name", metavar="NAME")
    p = cmd("status", "objects, last runs, next runs and drill results in one table")
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p = cmd("list", "the backups in the object's storage")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p = cmd("describe", "one stored backup: totals and queues (--archive NAME: an archive's status and generation)")
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("backup_id", metavar="BACKUP_ID", nargs="?")
    p.add_argument("--archive", metavar="ARCHIVE", help="a RabbitMQArchive: its status, then its newest generation "
                   "(or the one NAME names)")
    p.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    p = cmd("restore", "create a RabbitMQRestore of a backup (or an archive) and follow it", wait=True)
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("--backup-id", help="the backup to restore (kubectl rbak list NAME)")
    p.add_argument("--archive", metavar="ARCHIVE", help="restore every stream of a RabbitMQArchive up to --pitr TIME "
                   "(default: its recoverable-until)")
    p.add_argument("--pitr", metavar="START..END", help="restore only messages backed up in this window "
                   "(RFC 3339 times or epoch milliseconds; either side may be empty); with --archive one TIME "
                   "or 'recoverable'")
    p.add_argument("--to-vhost", action="append", default=[], metavar="[SOURCE=]TARGET",
                   help="restore a vhost into another one (TARGET alone: the backup's only vhost); repeatable")
    p.add_argument("--name", dest="restore_name", metavar="RESTORE", help="name of the RabbitMQRestore "
                   "(default NAME-<UTC time>)")
    p = cmd("drill", "run a restore drill now and follow it", wait=True)
    p.add_argument("name", metavar="NAME")
    p = cmd("logs", "the logs of the last (or running) run's pod")
    p.add_argument("name", metavar="NAME")
    p = cmd("suspend", "stop scheduled runs (spec.suspend: true)")
    p.add_argument("name", metavar="NAME")
    p = cmd("resume", "resume scheduled runs (spec.suspend: false)")
    p.add_argument("name", metavar="NAME")
    return parser


COMMANDS: dict[str, Callable[[Ctx], int]] = {
    "status": cmd_status, "backup": cmd_backup, "list": cmd_list, "describe": cmd_describe,
    "restore": cmd_restore, "drill": cmd_drill, "logs": cmd_logs,
    "suspend": lambda c: cmd_suspend(c, True), "resume": lambda c: cmd_suspend(c, False),
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for flag in ("timeout", "pickup_timeout"):
        if getattr(args, flag, 1) <= 0:
            print(f"error: --{flag.replace('_', '-')}: must be a positive number of seconds", file=sys.stderr)
            return 1
    try:
        conn = connect(args.kubeconfig, args.context)
        use_connection(conn, USER_AGENT)
        ctx = Ctx(PluginKube(), args.namespace or conn.namespace or "default", args)
        return COMMANDS[args.command](ctx)
    except PluginError as e:
        print(f"error: {e}", file=sys.stderr)
    except ApiError as e:
        print(f"error: {e}", file=sys.stderr)
    except RbakError as e:
        print(f"error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("error: interrupted (the run goes on in the cluster)", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
