"""``kubectl rbak list``, ``describe`` and ``restore``: what a RabbitMQBackup's (or RabbitMQArchive's) storage holds, read with the
credentials of the Secret the object names and shown as ``rbak list``/``describe`` show it
(``rbak.repo.report``), and a RabbitMQRestore of one of those backups."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import yaml

from rbak.repo.catalog import list_backups, load_manifest
from rbak.config.validation import parse_time_bound
from rbak.errors import RbakError
from rbak.repo.report import describe_obj, fmt_ts, list_notes, list_obj
from rbak.base.units import human_bytes
from rbak_kubectl.context import Ctx, PluginError, out, table
from rbak_kubectl.runs import archive_row, show_progress
from rbak_operator.crds.schema import GROUP, RESTORE_PLURAL, VERSION
from rbak_operator.decide import naming, policy, rbakconfig
from rbak_operator.decide.status import restore_summary_line
from rbak_operator.kube.errors import ApiError
from rbak_operator.reconcile.archive import generations
from rbak_operator.reconcile.storage import open_backup_storage


def cmd_list(c: Ctx) -> int:
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
    d = st.get("restoreDrill") or {}
    if d.get("result"):  # the last drill: the recovery point it measured beside the objective
        out(f"Drill:       {d['result']} at {d.get('lastRunTime') or '-'}: recovery point achieved "
            f"{d.get('recoveryPointSeconds', '-')}s (objective {r['rpo']}), RTO {d.get('restoreSeconds', '-')}s, "
            f"restored up to {d.get('restorePoint') or '-'}" + (f", signed by {d['signer']}" if d.get("signer") else ""))
        if d.get("result") != "Passed":
            out(f"  {d.get('reason')}: {d.get('message')}")
        if d.get("evidenceKey"):
            out(f"  evidence {d['evidenceKey']}")
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
    except ApiError:
        raise  # the API's own error line (ApiError is a RbakError too)
    except RbakError as e:
        raise PluginError(f"RabbitMQBackup {c.ns}/{name}: {e}") from None
    if st is not None:  # refuse a backup that is not there before creating anything
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
    rname = create_restore(c, name, spec)
    out(f"rabbitmqrestore/{rname} created (backup {bid} of rabbitmqbackup/{name})")
    return follow_restore(c, rname)


def restore_archive(c: Ctx) -> int:
    """``restore --archive NAME [--pitr TIME]``: every stream of the archive up to TIME (default: its
    recoverable-until); the operator refuses a TIME past it, naming the field."""
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
    rname = create_restore(c, name, spec)
    out(f"rabbitmqrestore/{rname} created (rabbitmqarchive/{name} up to {point})")
    return follow_restore(c, rname)


def create_restore(c: Ctx, source: str, spec: dict[str, Any]) -> str:
    """Create the RabbitMQRestore (``--restore-name`` or SOURCE plus the time); its name. A refusal names it."""
    rname = c.args.restore_name or naming.dns_label(f"{source}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}")
    obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RabbitMQRestore",
           "metadata": {"name": rname, "namespace": c.ns}, "spec": spec}
    try:
        c.kube.create_cr(RESTORE_PLURAL, c.ns, obj)
    except ApiError as e:
        raise PluginError(f"RabbitMQRestore {c.ns}/{rname} refused: HTTP {e.status} {e.reason}") from None
    return rname


def follow_restore(c: Ctx, rname: str) -> int:
    """Follow a RabbitMQRestore to its end (unless ``--no-wait``)."""
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
