"""Orchestration of ``rbak restore``: definitions first, then each queue's records in order.

Queues are restored concurrently by a bounded pool (``max_concurrent_queues``,
one AMQP connection per running queue); within a queue records are published
in backup order on one channel, so they are enqueued in that order. One
queue's run is ``queue_restore.restore_queue_segments``. The checks before the first publish share
one connection per target vhost (``TargetConnections``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from .. import metrics
from ..broker.cluster import amqp_cluster_name, split_cluster
from ..broker.transport import TargetConnection, Transport
from ..errors import ConfigError, ManifestError, RbakError, RestoreError
from ..format.manifest import BackupManifest
from ..storage.base import Storage
from .chain import expand_chains
from .checkpoint import QueueState, open_checkpoint
from .definitions import definition_vhosts, import_definitions
from .message_size import oversize_records, refusal as oversize_refusal, target_limit
from .options import RestoreOptions
from .plan import QueuePlan, check_selection, plan_restore, resolve_target_vhosts
from .queue_restore import QueueResult, count_selected, plan_codec, restore_queue_segments, target_problems
from .record_publisher import version_of
from .source import BackupSource
from .target_limits import refusal
from .target_types import dry_run_missing, refuse_mismatched_taps, target_types

log = logging.getLogger(__name__)


@dataclass
class RestoreSummary:
    backup_id: str
    dry_run: bool
    queues: list[QueueResult] = field(default_factory=list)
    definitions: Any = None  # definitions.DefinitionsResult
    duration_secs: float = 0.0
    warnings: list[str] = field(default_factory=list)  # said before anything was published
    targets: list[str] = field(default_factory=list)  # where each source vhost goes, and why (plan.TargetVhosts)
    written: list[str] = field(default_factory=list)  # what the restore wrote besides the target (rollback, report)

    @property
    def published(self) -> int:
        return sum(q.published for q in self.queues)

    @property
    def confirmed(self) -> int:
        return sum(q.confirmed for q in self.queues)

    @property
    def failed_queues(self) -> list[QueueResult]:
        return [q for q in self.queues if q.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed_queues

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "backup_id": self.backup_id,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "published": self.published,
            "confirmed": self.confirmed,
            "duration_secs": round(self.duration_secs, 3),
            "definitions": self.definitions.to_json_obj() if self.definitions is not None else None,
            "warnings": self.warnings,
            "targets": self.targets,
            "written": self.written,
            "queues": [asdict(q) for q in self.queues],
        }


# --------------------------------------------------------------------------
# The whole restore.
# --------------------------------------------------------------------------


def checkpoint_fingerprint(options: RestoreOptions) -> dict[str, object]:
    return {
        "backup_id": options.backup_id,
        "prefix": options.prefix,
        "window": [options.window_start_ms, options.window_end_ms],
        "vhost_mapping": [list(p) for p in options.vhost_mapping],
        "queue_mapping": [list(p) for p in options.queue_mapping],
        "publish_mode": options.publish_mode,
        **({"increment_only": True} if options.increment_only else {}),
    }


def load_complete_manifest(source: BackupSource, options: RestoreOptions,
                           warnings: list[str] | None = None) -> BackupManifest:
    """The chosen backup's manifest, its incremental streams expanded to their whole chain (unless
    ``increment_only``); every link is checked here, before anything is published. Warnings (a partial
    backup, retention gaps, an increment restored alone) are logged and appended to ``warnings``."""
    manifest = source.manifest(options.backup_id)
    if not manifest.is_complete:
        raise ManifestError(f"backup {options.backup_id!r} is incomplete (completed_at is null): refusing to restore "
                            f"from it; rerun the backup to finish it")
    sel = dataclasses.replace(manifest, queues=[q for q in manifest.queues
                                                if options.queues.matches(q.vhost, q.name, q.queue_type, q.message_count)])
    expanded, notes = expand_chains(sel, source.manifest, follow=not options.increment_only, size_of=source.size)
    by_key = {(q.vhost, q.name): q for q in expanded.queues}
    manifest = dataclasses.replace(manifest, queues=[by_key.get((q.vhost, q.name), q) for q in manifest.queues])
    manifest.recompute_totals()
    for n in notes:
        log.warning("%s", n)
    if warnings is not None:
        warnings.extend(notes)
    return manifest


def resolve_restore(source: BackupSource, manifest: BackupManifest,
                    options: RestoreOptions) -> tuple[RestoreOptions, list[str]]:
    """Every mapping key and selection checked against the backup, the target URL's vhost applied:
    (the options to plan with, where each source vhost goes). The one step for every restore path
    (CLI engine, Spark driver); raises ``ConfigError`` (exit 2) before the broker is touched."""
    def_vhosts = definition_vhosts(source, manifest, options)
    check_selection(manifest, options, def_vhosts)
    options, targets = resolve_target_vhosts(manifest, options, def_vhosts)
    return options, targets.lines()


def check_before_publishing(source: BackupSource, manifest: BackupManifest, plans: list[QueuePlan],
                            options: RestoreOptions) -> None:
    """Validate's manifest checks, run before anything is published (or a dry run counts)."""
    problems = source.problems(manifest, (s for p in plans for s in p.segments), options.verify_checksums)
    if problems:
        more = f" (and {len(problems) - 3} more; run rbak validate)" if len(problems) > 3 else ""
        raise ManifestError(f"backup {options.backup_id!r} fails validation, nothing published: "
                            f"{'; '.join(problems[:3])}{more}")


def run_restore(storage: Storage, options: RestoreOptions, on_progress: Callable[[QueueResult], None] | None = None,
                manifest: BackupManifest | None = None,
                on_plan: Callable[[list[QueuePlan]], None] | None = None) -> RestoreSummary:
    """Definitions (if asked), then every selected queue; a failed definitions import stops here.

    ``on_plan`` gets the queue plans before any publish; ``on_progress`` each queue's result as its
    confirms grow and once more when it ended (its final status). ``storage`` is read and written
    through a ``BackupSource`` only (``source.py``)."""
    t0 = time.monotonic()
    source = BackupSource(storage, options.prefix, options.write_dir)
    dry = options.dry_run or options.definitions_dry_run  # a dry run of either part writes nothing anywhere
    summary = RestoreSummary(options.backup_id, dry)
    manifest = manifest or load_complete_manifest(source, options, summary.warnings)
    options = options.with_data_key(source, manifest)  # envelope: unwrap the data key before any publish
    options, summary.targets = resolve_restore(source, manifest, options)  # config errors before the broker
    plans = plan_restore(manifest, options)
    if on_plan is not None:
        on_plan(plans)
    if options.restore_messages:
        check_before_publishing(source, manifest, plans, options)
    for line in summary.targets:  # where it goes, before anything is imported or published
        log.info("restore plan: %s", line)
    if options.restore_messages:
        for p in plans:
            log.info("restore plan: %s/%s -> %s/%s", p.source_vhost, p.source_queue, p.target_vhost, p.target_queue)
    checks = TargetConnections(options.broker())
    try:
        return _checked_restore(source, manifest, plans, options, summary, checks, t0, on_progress)
    finally:
        checks.close()


def _checked_restore(source: BackupSource, manifest: BackupManifest, plans: list[QueuePlan], options: RestoreOptions,
                     summary: RestoreSummary, checks: TargetConnections, t0: float,
                     on_progress: Callable[[QueueResult], None] | None) -> RestoreSummary:
    """``run_restore`` from the target checks on: definitions, then every queue. ``checks`` holds the
    connections of the checks before the first publish, closed before the queues' runs open theirs."""
    dry = summary.dry_run
    chains = {(q.vhost, q.name): q.chain for q in manifest.queues if q.chain}
    if options.restore_messages or options.restore_definitions or options.definitions_dry_run:
        refuse_split_target(plans, options, checks)
    if options.restore_definitions or options.definitions_dry_run:
        checks.close()  # the import changes the target and can take long: the checks after it connect again
        if not dry:
            log.info("restore writes the target's definitions (a rollback snapshot) and a report beside backup %s, "
                     "or under %s when the storage refuses writes", options.backup_id, options.write_dir or "(nowhere)")

        summary.definitions = import_definitions(source, manifest, options)
        d = summary.definitions
        summary.written += [k for k in (d.rollback_key, d.report_key) if k]
    types = None
    if options.restore_messages:
        refuse_missing_vhosts(plans, options, summary.definitions)
        types = target_types(plans, options)
        if types is None and dry:
            log.warning("the target's management API did not list its queues: this dry run did not check that the "
                        "target queues exist and are of the type each is restored as")
        refuse_mismatched_taps(plans, types)
    if not options.restore_messages:
        summary.duration_secs = time.monotonic() - t0
        return summary
    if dry:
        for p in plans:
            r = QueueResult(p.source_vhost, p.source_queue, p.target_vhost, p.target_queue, p.queue_type, status="dry-run",
                            skipped_segments=p.skipped_segments, skipped_records=p.skipped_records,
                            chain=list(chains.get((p.source_vhost, p.source_queue), ())))
            r.selected = count_selected(source, p, options)
            r.skipped_records += p.candidate_records - r.selected
            missing = dry_run_missing(p, types, options)
            if missing is not None:  # the real run fails this queue so: the dry run says it too
                r.status, r.error = "failed", f"{RestoreError.prefix}: {missing}"
            summary.queues.append(r)
        summary.duration_secs = time.monotonic() - t0
        return summary
    cp = open_checkpoint(options.checkpoint_state, checkpoint_fingerprint(options))
    try:
        kept = [p for p in plans if skipped_by_definitions(p, summary.definitions) is None]
        refuse_lossy_targets(source, kept, options, lambda p: cp.load(p.source_vhost, p.source_queue), checks)
        size_checked = refuse_oversize(source, kept, options, lambda p: cp.load(p.source_vhost, p.source_queue),
                                       checks)
        checks.close()

        def work(p: QueuePlan) -> QueueResult:
            try:
                r = restore_queue_segments(source, p, options, cp, on_progress=on_progress, size_checked=size_checked)
                r.chain = list(chains.get((p.source_vhost, p.source_queue), ()))
                if on_progress is not None:
                    on_progress(r)
                return r
            except RbakError as e:
                metrics.errors().labels(error_type=metrics.error_type(e)).inc()
                log.error("%s", e)
                failed: QueueResult | None = getattr(e, "queue_result", None)
                if failed is None:
                    failed = QueueResult(p.source_vhost, p.source_queue, p.target_vhost, p.target_queue, p.queue_type)
                    failed.confirmed = cp.load(p.source_vhost, p.source_queue).confirmed
                r = failed
                r.status, r.error = "failed", str(e)
                if on_progress is not None:
                    on_progress(r)
                return r

        with ThreadPoolExecutor(max_workers=options.max_concurrent_queues, thread_name_prefix="rbak-restore") as ex:
            def skip_or_work(p: QueuePlan) -> QueueResult:
                r = skipped_by_definitions(p, summary.definitions)
                if r is None:
                    return work(p)
                if on_progress is not None:
                    on_progress(r)
                return r

            summary.queues = list(ex.map(skip_or_work, plans))
    finally:
        cp.close()
    summary.duration_secs = time.monotonic() - t0
    return summary


class TargetConnections:
    """The connections of a restore's checks before its first publish: one per target vhost, opened when
    first asked for and kept until ``close``, so the split-target, lossy-target and message-size checks
    share them (they opened one each). A vhost that cannot be connected is tried again on the next ask."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self._open: dict[str, TargetConnection] = {}

    def get(self, vhost: str) -> TargetConnection:
        """The connection to ``vhost``; raises the transport's ``RbakError`` when it cannot be opened."""
        conn = self._open.get(vhost)
        if conn is None:
            conn = self._open[vhost] = self.transport.connect(vhost)
        return conn

    def close(self) -> None:
        for conn in self._open.values():
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a close that fails leaves nothing behind
                pass
        self._open.clear()


def refuse_lossy_targets(source: BackupSource, plans: list[QueuePlan], options: RestoreOptions,
                         state_of: Callable[[QueuePlan], QueueState | None],
                         checks: TargetConnections | None = None) -> None:
    """Every target judged before the first publish of the whole restore (``target_limits``): one
    lossy target refuses the restore, naming each such queue and setting. ``state_of`` gives a queue's
    checkpoint (None: leave it to its own run). Each queue's run checks its target again. ``checks``:
    the restore's check connections (None: opened and closed here)."""
    if options.allow_lossy_target or not plans:
        return
    own = checks is None
    conns = TargetConnections(options.broker()) if checks is None else checks
    try:
        problems = _lossy_problems(source, plans, options, state_of, conns)
    finally:
        if own:
            conns.close()
    if problems:
        more = f" (and {len(problems) - 1} more target(s) like it)" if len(problems) > 1 else ""
        for msg in problems:
            log.error("%s", msg)
        raise RestoreError(problems[0] + more)


def _lossy_problems(source: BackupSource, plans: list[QueuePlan], options: RestoreOptions,
                    state_of: Callable[[QueuePlan], QueueState | None], checks: TargetConnections) -> list[str]:
    problems: list[str] = []
    by_vhost: dict[str, list[QueuePlan]] = {}
    for p in plans:
        by_vhost.setdefault(p.target_vhost, []).append(p)
    try:
        client = options.broker().management()
    except RbakError:
        return []  # each queue's run fails on it with its own clear error
    with client:
        for vhost, ps in by_vhost.items():
            try:
                conn = checks.get(vhost)
            except RbakError:
                continue  # a missing vhost, refused credentials, TLS: the queues' runs name it
            for p in ps:
                state = state_of(p)
                if state is None or state.done:
                    continue
                try:
                    reasons, _ = target_problems(conn, client, source, p, options, plan_codec(p, options), state)
                except RbakError:
                    continue  # the queue's run reports it
                if reasons:
                    problems.append(refusal(p.target_label, reasons))
    return problems


def refuse_missing_vhosts(plans: list[QueuePlan], options: RestoreOptions, definitions: Any) -> None:
    """One line naming a target vhost that does not exist, before anything is published (the broker
    would only say "access refused" for each queue). A dry run's definitions that would create it
    count; an unreachable management API leaves it to the queues' runs."""
    wanted = sorted({p.target_vhost for p in plans})
    if not wanted:
        return
    try:
        with options.broker().management() as client:
            known = set(client.vhosts())
    except RbakError:
        return
    created = set()
    if definitions is not None and definitions.dry_run:
        created = {v for v in definitions.changes.get("vhosts", {}).get("create", [])}
    missing = [v for v in wanted if v not in known and v not in created]
    if missing:
        srcs = sorted({p.source_vhost for p in plans if p.target_vhost in missing})
        archive = next((p.archive for p in plans if p.archive is not None), None)
        create = ("create it, restore with --definitions (restore.restore_definitions)" if archive is None else
                  f"create it and declare its streams there (archive {archive!r} stores no definitions to restore; "
                  "a definitions export taken by rbak backup or rbak definitions-export can be imported instead)")
        raise RestoreError(f"target vhost {', '.join(map(repr, missing))} does not exist on "
                           f"{options.target.management_url} (or user {options.target.mgmt_username!r} cannot see it); "
                           f"nothing was published: {create}, or map vhost {', '.join(map(repr, srcs))} elsewhere")


def refuse_oversize(source: BackupSource, plans: list[QueuePlan], options: RestoreOptions,
                    state_of: Callable[[QueuePlan], QueueState | None],
                    checks: TargetConnections | None = None) -> bool:
    """Before the first publish of the whole restore: a record over the target's max_message_size
    (``message_size``) refuses the restore, naming each such queue with the size, the limit and the
    setting. With ``allow_oversize_skip`` each queue's run skips and lists them instead. True when
    every queue with a state was checked here (its run need not read its segments again). ``checks``:
    the restore's check connections (None: one opened and closed here)."""
    if options.allow_oversize_skip or not plans:
        return False
    vhost = plans[0].target_vhost
    conns = TargetConnections(options.broker()) if checks is None else checks
    try:
        conn = conns.get(vhost)
        lim = target_limit(conns.transport, options.target, vhost, version_of(conn))
    except RbakError:
        return False  # the queues' runs name it
    finally:
        if checks is None:
            conns.close()
    if lim is None:
        return False
    problems: list[str] = []
    every = True
    for p in plans:
        state = state_of(p)
        if state is None or state.done:
            every = every and state is not None
            continue
        found = oversize_records(source, p, options, plan_codec(p, options), lim.limit, state.resume_point())
        if found:
            problems.append(oversize_refusal(p, found, lim))
    if problems:
        more = f" (and {len(problems) - 1} more queue(s) like it)" if len(problems) > 1 else ""
        for msg in problems:
            log.error("%s", msg)
        raise RestoreError(problems[0] + more)
    return every


def skipped_by_definitions(p: QueuePlan, definitions: Any) -> QueueResult | None:
    """The result of a queue the definitions import left out (a transient queue the target denies,
    with ``restore.transient_queues: skip``: its messages have nowhere to go), else None.

    The one decision for every restore path (CLI engine, Spark driver)."""
    skipped = getattr(definitions, "skipped_queues", None) or ()
    if (p.target_vhost, p.target_queue) not in {tuple(x) for x in skipped}:
        return None
    return QueueResult(p.source_vhost, p.source_queue, p.target_vhost, p.target_queue, p.queue_type, status="skipped",
                       error="transient queue not declared on this target (restore.transient_queues: skip)")


def refuse_split_target(plans: list[QueuePlan], options: RestoreOptions,
                        checks: TargetConnections | None = None) -> None:
    """One line when ``target.management_url`` answers for another cluster than ``target.amqp_url``:
    the lossy-target, vhost and definitions checks would read one broker while the messages go to
    another (management_url defaults to :15672 whatever the AMQP port, so a restore into a second
    broker on one host split this way, and a max-length target there dropped messages). Compared by
    cluster name: the AMQP handshake's and the management API's. Either one unreachable leaves it to
    the steps that need them, which name what failed. ``checks``: the restore's check connections
    (None: one opened and closed here)."""
    conns = TargetConnections(options.broker()) if checks is None else checks
    amqp_cluster = None
    try:
        for vhost in dict.fromkeys([*(p.target_vhost for p in plans), "/"]):  # the target vhost may not exist yet
            try:
                conn = conns.get(vhost)
            except RbakError:
                continue
            amqp_cluster = amqp_cluster_name(conn.server_properties)
            break
    finally:
        if checks is None:
            conns.close()
    if not amqp_cluster:
        return
    try:
        with options.broker().management() as client:
            mgmt_cluster = client.overview().get("cluster_name")
    except RbakError:
        return
    problem = split_cluster("target", options.target, amqp_cluster, mgmt_cluster, "--management-url")
    if problem:
        raise ConfigError(f"{problem}; nothing was restored")
