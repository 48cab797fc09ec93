"""Orchestration of ``rbak restore``: definitions first, then each queue's records in order.

Queues are restored concurrently by a bounded pool (``max_concurrent_queues``,
one AMQP connection per running queue); within a queue records are published
in backup order on one channel, so they are enqueued in that order.
:func:`restore_queue_segments` is the unit of work and is public: the Spark
restore job calls it per queue (or per ordered run of segments) on executors.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

import pika
import pika.exceptions

from ..catalog import load_manifest
from ..crypto import ObjectCodec, codec_for
from ..errors import AmqpError, CheckpointError, ManifestError, RbakError, SerializationError
from ..format.manifest import BackupManifest, SegmentMetadata
from ..format.reader import read_segment
from ..format.record import BackupRecord
from ..format.amqp091 import encode_basic_properties
from ..storage.base import Storage
from . import metrics
from .chain import expand_chains
from .checkpoint import NullCheckpoint, RestoreCheckpoint, open_checkpoint
from .options import RestoreOptions
from .plan import QueuePlan, plan_restore, record_in_window, segment_fully_inside
from .publisher import ConfirmingPublisher, connect

log = logging.getLogger(__name__)


class RestoreError(RbakError):
    prefix = "Restore error"


@dataclass
class QueueResult:
    source_vhost: str
    source_queue: str
    target_vhost: str
    target_queue: str
    queue_type: str = "classic"
    status: str = "pending"  # restored | dry-run | skipped | already-done | failed
    planned: int = 0  # records in the segments to read (an upper bound of ``selected``)
    selected: int = 0  # records inside the window (dry run: would be published)
    published: int = 0
    confirmed: int = 0
    failed: int = 0
    skipped_segments: int = 0
    skipped_records: int = 0  # outside the PITR window
    resumed_from: tuple[int, int] | None = None
    chain: list[str] = field(default_factory=list)  # backups whose segments are published, oldest first
    reconciled: int = 0  # in-flight records found already enqueued on resume
    bytes: int = 0
    error: str | None = None


@dataclass
class RestoreSummary:
    backup_id: str
    dry_run: bool
    queues: list[QueueResult] = field(default_factory=list)
    definitions: Any = None  # definitions.DefinitionsResult
    duration_secs: float = 0.0
    warnings: list[str] = field(default_factory=list)  # said before anything was published

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
            "queues": [asdict(q) for q in self.queues],
        }


# --------------------------------------------------------------------------
# Reading segments.
# --------------------------------------------------------------------------


def load_segment_records(storage: Storage, seg: SegmentMetadata, verify_checksum: bool = True,
                         codec: ObjectCodec | None = None):
    """Every record of one segment (CRC always checked; SHA-256 against the manifest when asked)."""
    return [r for _, r in read_segment(storage, seg, verify_checksum, codec=codec)]


def iter_segment_records(storage: Storage, seg: SegmentMetadata, verify_checksum: bool = True, start: int = 0,
                         chunk: int = 1024, codec: ObjectCodec | None = None) -> Iterator[tuple[int, BackupRecord]]:
    """(index, record) of one segment from ``start``: ``rbak.format.reader.read_segment``
    (``codec`` opens an encrypted backup's segments).

    Peak memory is the compressed file plus one chunk of decoded records; the
    payload is decompressed as a stream bounded by what the manifest and the
    header declare. ``chunk`` is kept for callers; the reader chunks by itself.
    """
    return read_segment(storage, seg, verify_checksum, start, codec=codec)


def plan_codec(plan: QueuePlan, options: RestoreOptions) -> ObjectCodec | None:
    """How a plan's segments are opened: None for a plaintext backup; a missing key is an error."""
    if plan.encryption is None:
        return None
    return codec_for(options.backup_id, plan.encryption, options.keyring())


def count_selected(storage: Storage, plan: QueuePlan, options: RestoreOptions) -> int:
    """Records of a plan inside the window; reads only the segments that straddle an edge."""
    n = 0
    s, e = options.window_start_ms, options.window_end_ms
    codec = plan_codec(plan, options)
    for seg in plan.segments:
        if segment_fully_inside(seg.first_timestamp, seg.last_timestamp, s, e):
            n += seg.record_count
        else:
            n += sum(1 for _, r in read_segment(storage, seg, options.verify_checksums, codec=codec)
                     if record_in_window(r.backed_up_at, s, e))
    return n


# --------------------------------------------------------------------------
# One queue.
# --------------------------------------------------------------------------


def queue_depth(conn: pika.BlockingConnection, queue: str) -> int | None:
    """Messages in ``queue`` (passive declare on a throwaway channel); None when it does not exist."""
    ch = conn.channel()
    try:
        return ch.queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker as e:
        if e.reply_code == 404:
            return None
        raise AmqpError(f"cannot inspect queue {queue!r}: {e.reply_code} {e.reply_text}") from None
    finally:
        if ch.is_open:
            ch.close()


def stable_depth(conn: pika.BlockingConnection, queue: str, settle_secs: float = 0.3, attempts: int = 20) -> int | None:
    """Depth once two reads ``settle_secs`` apart agree (a killed publisher's last messages may still be landing)."""
    last = queue_depth(conn, queue)
    for _ in range(attempts):
        conn.sleep(settle_secs)
        now = queue_depth(conn, queue)
        if now == last:
            return now
        last = now
    return last


def reconcile_in_flight(plan: QueuePlan, options: RestoreOptions, initial_depth: int | None, confirmed: int,
                        depth_now: int | None) -> int:
    """How many records after the checkpoint are already in the target queue.

    A SIGKILL leaves up to ``produce_batch_size`` messages that the broker
    may have enqueued without the checkpoint knowing. In ``queue`` mode every
    message of this restore lands in the target queue, so
    ``depth_now - (initial_depth + confirmed)`` is exactly that number, as long
    as nothing else consumed from or published to the queue meanwhile. Outside
    that case (exchange mode, an unknown depth) it returns 0 and the in-flight
    tail may be published twice (at-least-once), which is logged.
    """
    if options.publish_mode != "queue" or initial_depth is None or depth_now is None:
        log.warning("%s: resuming from the checkpoint; up to %d in-flight message(s) may be duplicated "
                    "(exactly-once resume needs publish_mode: queue)", plan.label, options.produce_batch_size)
        return 0
    extra = depth_now - (initial_depth + confirmed)
    if extra < 0:
        log.warning("%s: target queue %r holds %d fewer messages than restored so far; something consumed from it. "
                    "Resuming from the checkpoint.", plan.label, plan.target_queue, -extra)
        return 0
    # in flight (<= batch) + confirmed since the last commit (about a batch) + generous slack
    limit = 4 * options.produce_batch_size + 1024
    if extra > limit:
        raise CheckpointError(
            f"{plan.label}: target queue {plan.target_queue!r} in vhost {plan.target_vhost!r} holds {extra} more "
            f"messages than the checkpoint accounts for (at most {limit} can be in flight); another publisher wrote "
            f"to it, so resuming could not be exact. Empty the queue and restart with a fresh checkpoint_state."
        )
    return extra


def restore_queue_segments(
    storage: Storage,
    plan: QueuePlan,
    options: RestoreOptions,
    checkpoint: RestoreCheckpoint | NullCheckpoint | None = None,
    connection: pika.BlockingConnection | None = None,
    on_progress: Callable[[QueueResult], None] | None = None,
) -> QueueResult:
    """Publish one queue's segments, in order, into its target; return what happened.

    ``plan`` names the source queue, the target vhost/queue and the segments to
    publish in sequence order (a Spark job may pass a ``QueuePlan`` holding a
    contiguous run of one queue's segments). ``options`` supplies the window,
    publish mode, batch (in-flight window) size, checks and the target broker;
    ``checkpoint`` (``open_checkpoint(...)`` or ``None``) makes the call
    resumable: progress is committed after each batch of confirms and a rerun
    skips what was confirmed (and, in queue mode, what was enqueued but not yet
    checkpointed). ``connection`` is an open connection to the target vhost,
    or ``None`` to open (and close) one here.

    Refuses a non-empty target queue unless ``allow_non_empty`` (or skips it
    with ``skip_existing``). Raises ``RbakError`` subclasses naming the queue;
    records confirmed before a failure stay checkpointed.
    """
    cp = checkpoint or NullCheckpoint()
    codec = plan_codec(plan, options)  # before any publish: a missing key names the backup and key id
    res = QueueResult(plan.source_vhost, plan.source_queue, plan.target_vhost, plan.target_queue, plan.queue_type,
                      planned=plan.candidate_records, skipped_segments=plan.skipped_segments,
                      skipped_records=plan.skipped_records)
    state = cp.load(plan.source_vhost, plan.source_queue)
    if state.done:
        res.status = "already-done"
        res.confirmed = state.confirmed
        return res
    own = connection is None
    conn = connect(options.target, plan.target_vhost) if own else connection
    labels = {"vhost": plan.target_vhost, "queue": plan.target_queue}
    m_pub, m_conf, m_fail = (metrics.published().labels(**labels), metrics.confirmed().labels(**labels),
                             metrics.failed().labels(**labels))
    target = f"queue {plan.target_queue!r} in vhost {plan.target_vhost!r}"
    try:
        fresh = state.initial_depth is None and not state.segments
        skip_extra = 0
        if fresh:
            depth = queue_depth(conn, plan.target_queue)
            if depth is None and options.publish_mode == "queue":
                raise RestoreError(f"{target} does not exist (restore the definitions first, or create it); "
                                   f"it is the target of {plan.label}")
            if depth:
                if options.skip_existing:
                    res.status = "skipped"
                    res.error = f"{target} already holds {depth} message(s)"
                    return res
                if not options.allow_non_empty:
                    raise RestoreError(f"{target} already holds {depth} message(s); refusing to publish into a "
                                       f"non-empty queue (set restore.allow_non_empty: true to add to it)")
            cp.start_queue(plan.source_vhost, plan.source_queue, plan.target_vhost, plan.target_queue, depth or 0)
            initial_depth = depth or 0
        else:
            initial_depth = state.initial_depth
            depth_now = stable_depth(conn, plan.target_queue) if options.publish_mode == "queue" else None
            skip_extra = reconcile_in_flight(plan, options, initial_depth, state.confirmed, depth_now)
            res.reconciled = skip_extra
        resume_seq, resume_idx = state.resume_point()
        if not fresh:
            res.resumed_from = (resume_seq, resume_idx)
        confirmed_base = state.confirmed
        pub = ConfirmingPublisher(conn, f"{plan.label} -> {target}", options.produce_batch_size,
                                  options.publisher_confirms)
        s, e = options.window_start_ms, options.window_end_ms
        last_commit = time.monotonic()
        last_token: tuple[int, int] | None = None
        counted_pub = counted_conf = committed_at = 0

        def commit(force: bool = False) -> None:
            nonlocal last_commit, last_token, counted_pub, counted_conf, committed_at
            adv, token = pub.take_progress()
            if adv:
                last_token = token
            now = time.monotonic()
            if last_token is not None and (force or (adv and (now - last_commit >= 0.25
                                                                 or pub.confirmed - committed_at >= options.produce_batch_size))):
                seq, idx, seg_len = last_token
                cp.record(plan.source_vhost, plan.source_queue, seq, idx, idx >= seg_len,
                          confirmed_base + pub.confirmed + skip_done)
                last_commit = now
                committed_at = pub.confirmed
            m_pub.inc(pub.published - counted_pub)
            m_conf.inc(pub.confirmed - counted_conf)
            counted_pub, counted_conf = pub.published, pub.confirmed
            res.published, res.confirmed, res.failed = pub.published, confirmed_base + pub.confirmed + skip_done, pub.failed
            if on_progress is not None:
                on_progress(res)

        skip_done = 0
        queue_mode = options.publish_mode == "queue"
        prop_cache: dict[tuple, bytes] = {}  # consecutive records often share properties and headers
        try:
            for seg in plan.segments:
                if seg.sequence < resume_seq:
                    continue
                start = resume_idx if seg.sequence == resume_seq else 0
                whole = segment_fully_inside(seg.first_timestamp, seg.last_timestamp, s, e)
                n = seg.record_count
                for i, r in iter_segment_records(storage, seg, options.verify_checksums, start, codec=codec):
                    if not whole and not record_in_window(r.backed_up_at, s, e):
                        res.skipped_records += 1
                        continue
                    res.selected += 1
                    if skip_extra:
                        # already enqueued by the killed run (see reconcile_in_flight): count it as restored
                        skip_extra -= 1
                        skip_done += 1
                        pub._last_done_token = (seg.sequence, i + 1, n)  # noqa: SLF001
                        pub._advanced = True  # noqa: SLF001
                        continue
                    exchange, rk = (("", plan.target_queue) if queue_mode or not r.exchange
                                    else (r.exchange, r.routing_key))  # plan.publish_address, inlined
                    p = r.properties
                    key = (p.content_type, p.content_encoding, p.delivery_mode, p.priority, p.correlation_id,
                           p.reply_to, p.expiration, p.message_id, p.timestamp, p.type_field, p.user_id,
                           p.app_id, p.cluster_id, r.headers)
                    props = prop_cache.get(key)
                    if props is None:
                        try:
                            props = encode_basic_properties(p, r.headers, "record")
                        except SerializationError as err:
                            raise SerializationError(f"{plan.label}, record {i} of {seg.key}: {err.args[0]}") from None
                        if len(prop_cache) >= 4096:
                            prop_cache.clear()
                        prop_cache[key] = props
                    pub.publish(exchange, rk, props, r.body, (seg.sequence, i + 1, n))
                    res.bytes += len(r.body)
                    if pub.published % 256 == 0:
                        commit()
                commit()
            pub.drain()
            commit(force=True)
        except RbakError as err:
            try:
                pub.drain(timeout=5)
            except RbakError:
                pass
            commit(force=True)
            m_fail.inc(pub.failed)
            err.queue_result = res  # what the broker confirmed before the failure, for the summary
            raise
        finally:
            pub.close()
        cp.finish_queue(plan.source_vhost, plan.source_queue)
        res.status = "restored"
        return res
    finally:
        if own:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass


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


def load_complete_manifest(storage: Storage, options: RestoreOptions,
                           warnings: list[str] | None = None) -> BackupManifest:
    """The chosen backup's manifest, its incremental streams expanded to their whole chain (unless
    ``increment_only``); every link is checked here, before anything is published. Warnings (a partial
    backup, retention gaps, an increment restored alone) are logged and appended to ``warnings``."""
    manifest = load_manifest(storage, options.backup_id, options.prefix)
    if not manifest.is_complete:
        raise ManifestError(f"backup {options.backup_id!r} is incomplete (completed_at is null): refusing to restore "
                            f"from it; rerun the backup to finish it")
    sel = dataclasses.replace(manifest, queues=[q for q in manifest.queues
                                                if options.queues.matches(q.vhost, q.name, q.queue_type)])
    expanded, notes = expand_chains(sel, lambda bid: load_manifest(storage, bid, options.prefix),
                                    follow=not options.increment_only, size_of=storage.size)
    by_key = {(q.vhost, q.name): q for q in expanded.queues}
    manifest = dataclasses.replace(manifest, queues=[by_key.get((q.vhost, q.name), q) for q in manifest.queues])
    manifest.recompute_totals()
    for n in notes:
        log.warning("%s", n)
    if warnings is not None:
        warnings.extend(notes)
    return manifest


def check_before_publishing(storage: Storage, manifest: BackupManifest, plans: list[QueuePlan],
                            options: RestoreOptions) -> None:
    """Validate's manifest checks, run before anything is published (or a dry run counts)."""
    from ..validate import preflight_problems

    problems = preflight_problems(storage, manifest, (s for p in plans for s in p.segments), options.verify_checksums)
    if problems:
        more = f" (and {len(problems) - 3} more; run rbak validate)" if len(problems) > 3 else ""
        raise ManifestError(f"backup {options.backup_id!r} fails validation, nothing published: "
                            f"{'; '.join(problems[:3])}{more}")


def run_restore(storage: Storage, options: RestoreOptions, on_progress: Callable[[QueueResult], None] | None = None,
                manifest: BackupManifest | None = None,
                on_plan: Callable[[list[QueuePlan]], None] | None = None) -> RestoreSummary:
    """Definitions (if asked), then every selected queue; a failed definitions import stops here.

    ``on_plan`` gets the queue plans before any publish; ``on_progress`` each queue's result as its
    confirms grow and once more when it ended (its final status)."""
    t0 = time.monotonic()
    dry = options.dry_run or options.definitions_dry_run  # a dry run of either part writes nothing anywhere
    summary = RestoreSummary(options.backup_id, dry)
    manifest = manifest or load_complete_manifest(storage, options, summary.warnings)
    plans = plan_restore(manifest, options)  # config errors before touching the broker
    if on_plan is not None:
        on_plan(plans)
    chains = {(q.vhost, q.name): q.chain for q in manifest.queues if q.chain}
    if options.restore_messages:
        check_before_publishing(storage, manifest, plans, options)
    if options.restore_definitions or options.definitions_dry_run:
        from .definitions import import_definitions

        summary.definitions = import_definitions(storage, manifest, options)
    if not options.restore_messages:
        summary.duration_secs = time.monotonic() - t0
        return summary
    if dry:
        for p in plans:
            r = QueueResult(p.source_vhost, p.source_queue, p.target_vhost, p.target_queue, p.queue_type, status="dry-run",
                            skipped_segments=p.skipped_segments, skipped_records=p.skipped_records,
                            chain=list(chains.get((p.source_vhost, p.source_queue), ())))
            r.selected = count_selected(storage, p, options)
            r.skipped_records += p.candidate_records - r.selected
            summary.queues.append(r)
        summary.duration_secs = time.monotonic() - t0
        return summary
    cp = open_checkpoint(options.checkpoint_state, checkpoint_fingerprint(options))
    try:
        def work(p: QueuePlan) -> QueueResult:
            try:
                r = restore_queue_segments(storage, p, options, cp, on_progress=on_progress)
                r.chain = list(chains.get((p.source_vhost, p.source_queue), ()))
                if on_progress is not None:
                    on_progress(r)
                return r
            except RbakError as e:
                metrics.errors().labels(error_type=_error_type(e)).inc()
                log.error("%s", e)
                r = getattr(e, "queue_result", None)
                if r is None:
                    r = QueueResult(p.source_vhost, p.source_queue, p.target_vhost, p.target_queue, p.queue_type)
                    r.confirmed = cp.load(p.source_vhost, p.source_queue).confirmed
                r.status, r.error = "failed", str(e)
                if on_progress is not None:
                    on_progress(r)
                return r

        skipped = set(summary.definitions.skipped_queues) if summary.definitions is not None else set()
        with ThreadPoolExecutor(max_workers=options.max_concurrent_queues, thread_name_prefix="rbak-restore") as ex:
            def skip(p: QueuePlan) -> QueueResult:
                r = _skipped_transient(p)
                if on_progress is not None:
                    on_progress(r)
                return r

            summary.queues = list(ex.map(lambda p: skip(p) if (p.target_vhost, p.target_queue) in skipped
                                         else work(p), plans))
    finally:
        cp.close()
    summary.duration_secs = time.monotonic() - t0
    return summary


def _skipped_transient(p: QueuePlan) -> QueueResult:
    return QueueResult(p.source_vhost, p.source_queue, p.target_vhost, p.target_queue, p.queue_type, status="skipped",
                       error="transient queue not declared on this target (restore.transient_queues: skip)")


def _error_type(e: Exception) -> str:
    """The ``error_type`` label, classified like the backup's (one vocabulary for both)."""
    try:
        from ..backup.metrics import error_type
    except ImportError:  # pragma: no cover - restore-only installs
        return "amqp" if isinstance(e, AmqpError) else "other"
    return error_type(e)
