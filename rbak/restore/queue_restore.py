"""Restoring one queue: check the target, publish its records in order with confirms, checkpoint
the confirmed prefix, and after a kill find what the broker already took.

:func:`restore_queue_segments` is the unit of work of every restore: the CLI
engine runs it per queue in a pool, the Spark restore job on executors (per
queue or per ordered run of segments).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, cast

from .. import metrics
from ..broker.declare import queue_counts
from ..broker.transport import ManagementApi, TargetConnection
from ..sealing.crypto import ChainCodec, ObjectCodec, codec_for
from ..errors import CheckpointError, ManifestError, RbakError, RestoreError, SerializationError
from ..format.amqp091 import encode_basic_properties
from ..format.record import BackupRecord, properties_key
from .checkpoint import NullCheckpoint, QueueCheckpoint, QueueState
from .options import RestoreOptions
from .plan import QueuePlan, record_in_window, segment_fully_inside
from .message_size import oversize_records, refusal as oversize_refusal, target_limit
from .record_publisher import RecordPublisher, version_of
from .source import BackupSource
from .stream_resume import LandedTail, check_landed, landed_tail, stream_next_offset
from .target_limits import TargetLimits, lossy_reasons, read_limits, refusal

log = logging.getLogger(__name__)


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
    protocol: str = ""  # amqp091 | amqp10 | amqp10+amqp091 (switched for a record 1.0 cannot carry exactly)
    initial_depth: int | None = None  # what the target held before this restore published (queue mode)
    lossy_settings: list[str] = field(default_factory=list)  # accepted with allow_lossy_target (see target_limits)
    expected_depth: int | None = None  # the target's depth the confirms account for, checked after publishing
    found_depth: int | None = None  # what it held then (None: not checked: consumers, a stream, exchange mode)
    depth_check: str = ""  # why the depth was not checked, when it was not
    with_expiration: int = 0  # published records carrying a per-message TTL (properties.expiration)
    # records over the target's max_message_size skipped with allow_oversize_skip: segment, index, bytes
    oversize_skipped: list[dict[str, Any]] = field(default_factory=list)




def plan_codec(plan: QueuePlan, options: RestoreOptions) -> ObjectCodec | None:
    """How a plan's segments are opened: None for a plaintext backup; a missing key is an error.
    An incremental stream's earlier links are opened each with its own backup's codec."""
    if plan.encryption is None and not any(plan.link_encryption.values()):
        return None
    ring = options.keyring()
    own = codec_for(options.backup_id, plan.encryption, ring)
    if not plan.link_of:
        return own
    links = {bid: codec_for(bid, info, ring) for bid, info in plan.link_encryption.items()}
    return ChainCodec(own, links, plan.link_of)


def count_selected(source: BackupSource, plan: QueuePlan, options: RestoreOptions) -> int:
    """Records of a plan inside the window (a dry run's count). Every segment is opened as a restore
    would open it (key id, decryption, checksum, decoding) and at least its first record read, so a dry
    run fails with the error the real restore would; only segments that straddle an edge are read whole."""
    n = 0
    s, e = options.window_start_ms, options.window_end_ms
    codec = plan_codec(plan, options)
    for seg in plan.segments:
        if segment_fully_inside(seg.first_timestamp, seg.last_timestamp, s, e):
            first = next(iter(source.records(seg, options.verify_checksums, codec=codec)), None)
            if first is None and seg.record_count:
                raise ManifestError(f"segment {seg.key!r} of {plan.label} holds no record, its manifest says "
                                    f"{seg.record_count}")
            n += seg.record_count
        else:
            n += sum(1 for _, r in source.records(seg, options.verify_checksums, codec=codec)
                     if record_in_window(r.backed_up_at, s, e))
    return n


# --------------------------------------------------------------------------
# One queue.
# --------------------------------------------------------------------------


def queue_depth(conn: TargetConnection, vhost: str, queue: str) -> int | None:
    """Messages ready in ``queue`` (a passive declare); None when it does not exist."""
    counts = queue_counts(conn, vhost, queue)
    return None if counts is None else counts.messages


def stable_depth(conn: TargetConnection, vhost: str, queue: str, settle_secs: float = 0.3,
                 attempts: int = 20) -> int | None:
    """Depth once two reads ``settle_secs`` apart agree (a killed publisher's last messages may still be landing)."""
    last = queue_depth(conn, vhost, queue)
    for _ in range(attempts):
        conn.sleep(settle_secs)
        now = queue_depth(conn, vhost, queue)
        if now == last:
            return now
        last = now
    return last


def in_flight_limit(options: RestoreOptions) -> int:
    """Most records a killed run can leave past its checkpoint: in flight (<= batch), confirmed
    since the last commit (about a batch), and generous slack."""
    return 4 * options.produce_batch_size + 1024


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
    limit = in_flight_limit(options)
    if extra > limit:
        raise CheckpointError(
            f"{plan.label}: target queue {plan.target_queue!r} in vhost {plan.target_vhost!r} holds {extra} more "
            f"messages than the checkpoint accounts for (at most {limit} can be in flight); another publisher wrote "
            f"to it, so resuming could not be exact. Empty the queue and restart with a fresh checkpoint_state."
        )
    return extra


def record_body_at(source: BackupSource, plan: QueuePlan, sequence: int, index: int, options: RestoreOptions,
                   codec: ObjectCodec | None) -> bytes | None:
    """The body of one record of a plan's segments (None when the plan has no such record)."""
    for seg in plan.segments:
        if seg.sequence == sequence:
            for _i, r in source.records(seg, options.verify_checksums, index, codec=codec):
                return r.body
    return None


def target_contents(conn: TargetConnection, plan: QueuePlan,
                    options: RestoreOptions) -> tuple[int | None, int | None]:
    """(messages in the target, and for a stream target its next offset); depth None: no such queue.

    A stream's count is not asked of the broker: its declare-ok figure is sampled metrics kept
    by queue name, so right after a delete and re-declare it can still be the deleted stream's
    (seen on 4.0.5). The stream's next offset is exact, and 0 means empty.
    """
    depth = queue_depth(conn, plan.target_vhost, plan.target_queue)
    if depth is None or plan.queue_type != "stream" or options.publish_mode != "queue":
        return depth, None
    return 0, stream_next_offset(conn, plan.target_vhost, plan.target_queue, target=options.target)


def held_description(depth: int | None, next_offset: int | None) -> str | None:
    """What a non-empty target holds, for the refusal; None when it is empty."""
    if depth:
        return f"{depth} message(s)"
    return f"messages (its next offset is {next_offset})" if next_offset else None


def missing_target_advice(plan: QueuePlan) -> str:
    """What to do about a target queue that does not exist: an archive has no definitions to restore first."""
    if plan.archive is None:
        return "restore the definitions first, or create it"
    declare = "declare it (x-queue-type: stream, with the source stream's retention arguments)"
    if plan.tap_of is not None and plan.queue_type != "stream":  # a tap goes into a queue of the type it recorded
        declare = (f"declare {plan.queue_type} queue {plan.target_queue!r}, as tap {plan.source_queue!r} recorded "
                   f"queue {plan.tap_of[0]!r}")
    return (f"archive {plan.archive!r} stores no definitions: {declare}, or import a definitions export taken by "
            "rbak backup or rbak definitions-export, then restore again")


def missing_target_error(plan: QueuePlan) -> str:
    return f"{plan.target_label} does not exist ({missing_target_advice(plan)}); it is the target of {plan.label}"


def prepare_target(conn: TargetConnection, plan: QueuePlan, options: RestoreOptions,
                   cp: QueueCheckpoint, state: QueueState, res: QueueResult,
                   body_at: Callable[[int, int], bytes | None]) -> tuple[int, LandedTail | None] | None:
    """Check the target before the first publish, or find what a killed run left in it.

    Returns (records already in the target past the checkpoint, and for a stream the digests
    they must match), or None when ``skip_existing`` skips a non-empty target.
    """
    target = plan.target_label
    stream = plan.queue_type == "stream" and options.publish_mode == "queue"
    if state.initial_depth is None and not state.segments:  # fresh
        depth, next_offset = target_contents(conn, plan, options)
        if depth is None and options.publish_mode == "queue":
            raise RestoreError(missing_target_error(plan))
        held = held_description(depth, next_offset)
        if held:
            if options.skip_existing:
                res.status = "skipped"
                res.error = f"{target} already holds {held}"
                return None
            if not options.allow_non_empty:
                raise RestoreError(f"{target} already holds {held}; refusing to publish into a "
                                   f"non-empty queue (set restore.allow_non_empty: true to add to it)")
        cp.start_queue(plan.source_vhost, plan.source_queue, plan.target_vhost, plan.target_queue, depth or 0,
                       next_offset)
        res.initial_depth = depth or 0
        return 0, None
    res.initial_depth = state.initial_depth
    if stream and state.initial_offset is not None:
        seq, idx = state.resume_point()
        last_confirmed = body_at(seq, idx - 1) if state.confirmed and idx > 0 else None
        landed = landed_tail(conn, plan.target_vhost, plan.target_queue, state.initial_offset, state.confirmed,
                             in_flight_limit(options), last_confirmed, target=options.target)
        res.reconciled = len(landed)
        return len(landed), landed
    depth_now = stable_depth(conn, plan.target_vhost, plan.target_queue) if options.publish_mode == "queue" else None
    res.reconciled = reconcile_in_flight(plan, options, state.initial_depth, state.confirmed, depth_now)
    return res.reconciled, None


def _incoming_body_bytes(source: BackupSource, plan: QueuePlan, options: RestoreOptions, codec: ObjectCodec | None,
                         resume: tuple[int, int], skip: int) -> int:
    """Body bytes of the records still to publish (after ``resume`` and the ``skip`` already landed), in the window."""
    total = 0
    s, e = options.window_start_ms, options.window_end_ms
    for seg in plan.segments:
        if seg.sequence < resume[0]:
            continue
        start = resume[1] if seg.sequence == resume[0] else 0
        for _i, r in source.records(seg, options.verify_checksums, start, codec=codec):
            if record_in_window(r.backed_up_at, s, e):
                if skip:
                    skip -= 1
                    continue
                total += len(r.body)
    return total


def target_problems(conn: TargetConnection, client: ManagementApi, source: BackupSource, plan: QueuePlan,
                    options: RestoreOptions, codec: ObjectCodec | None, state: QueueState,
                    skip_extra: int = 0) -> tuple[list[str], TargetLimits | None]:
    """(why the target may drop, expire or dead-letter what is still to publish, its limits); both
    empty when it does not exist yet or is a stream. Reads the management API (``target_limits``)."""
    fresh = state.initial_depth is None and not state.segments
    depth = queue_depth(conn, plan.target_vhost, plan.target_queue)
    if depth is None or plan.queue_type == "stream" or (fresh and depth and options.skip_existing):
        return [], None
    try:
        found = read_limits(client, plan.target_vhost, plan.target_queue, plan.queue_type)
    except RbakError as e:
        raise RestoreError(f"{plan.target_label}: cannot read its arguments and policies, so whether it keeps "
                           f"restored messages cannot be told ({e}); set restore.allow_lossy_target: true to "
                           f"restore without this check") from None
    if found is None:
        return [], None
    limits, info = found
    incoming = max(0, plan.candidate_records - state.confirmed - skip_extra)
    resume = state.resume_point()

    def exact() -> int:
        if fresh:
            return count_selected(source, plan, options)
        return incoming

    depth_bytes = 0 if depth == 0 else (info.get("message_bytes") if isinstance(info.get("message_bytes"), int) else None)
    reasons = lossy_reasons(limits, depth, incoming, depth_bytes,
                            lambda: _incoming_body_bytes(source, plan, options, codec, resume, skip_extra), exact)
    return reasons, limits


def check_target_limits(conn: TargetConnection, source: BackupSource, plan: QueuePlan, options: RestoreOptions,
                        codec: ObjectCodec | None, state: QueueState, res: QueueResult, skip_extra: int) -> TargetLimits | None:
    """Refuse a lossy target before publishing (unless ``allow_lossy_target``: then say so and go on)."""
    try:
        with options.broker().management() as client:
            reasons, limits = target_problems(conn, client, source, plan, options, codec, state, skip_extra)
    except RestoreError as e:
        if not options.allow_lossy_target:
            raise
        log.warning("%s", e)
        res.lossy_settings = [f"not checked: {e}"]
        return None
    if reasons and not options.allow_lossy_target:
        raise RestoreError(refusal(plan.target_label, reasons))
    if reasons:
        log.warning("%s may drop, expire or dead-letter restored messages (restore.allow_lossy_target: true): %s",
                    plan.target_label, "; ".join(reasons))
        res.lossy_settings = reasons
    return limits


def verify_target_depth(conn: TargetConnection, plan: QueuePlan, options: RestoreOptions, res: QueueResult,
                        limits: TargetLimits | None) -> None:
    """After the last confirm: the target must hold what it held before plus every confirmed record.

    Only where that is knowable: queue mode (every record goes to this queue), not a stream, no consumer
    attached (the count comes with the passive declare). A message TTL below 5 s is waited out first, so
    a queue that expires what it was given is seen empty, not full. Raises ``RestoreError`` naming the
    queue, the expected and the found depth."""
    initial_depth = res.initial_depth
    if (not options.verify_target_depth or options.publish_mode != "queue" or plan.queue_type == "stream"
            or initial_depth is None):
        res.depth_check = "not checked: " + ("exchange mode" if options.publish_mode != "queue" else
                                             "a stream" if plan.queue_type == "stream" else
                                             "the depth before the restore is unknown" if initial_depth is None
                                             else "a run of a split queue")
        return
    expected = initial_depth + res.confirmed
    res.expected_depth = expected
    ttl = limits.get("message-ttl") if limits is not None else None
    if ttl is not None and 0 <= ttl.value < 5000:
        conn.sleep(ttl.value / 1000 + 0.5)
    found, consumers = _depth_and_consumers(conn, plan.target_vhost, plan.target_queue)
    if found is not None and found != expected and not consumers:
        found = stable_depth(conn, plan.target_vhost, plan.target_queue)  # drops (TTL, overflow) may still be landing
        found, consumers = _depth_and_consumers(conn, plan.target_vhost, plan.target_queue) if found is not None else (None, 0)
    if consumers:
        res.depth_check = f"not checked: {consumers} consumer(s) attached to the target"
        return
    res.found_depth = found
    ttl_note = (f"; {res.with_expiration} of the published records carry a per-message expiration "
                f"(properties.expiration), which the broker counts from when they are published"
                if res.with_expiration else "")
    if found == expected:
        if res.with_expiration:
            res.depth_check = (f"{res.with_expiration} record(s) carry a per-message expiration: the broker may "
                               f"still drop them (a classic queue drops an expired message when it reaches the head)")
        return
    if found is None:
        held, why = "is gone", "the queue was deleted with every restored message (an expires, or a delete)"
    elif found < expected:
        held = f"holds {found} message(s)"
        why = f"{expected - found} restored message(s) are missing: the queue dropped, expired or dead-lettered them"
    else:
        held = f"holds {found} message(s)"
        why = (f"{found - expected} more than the restore accounts for: something else published to it, so the "
               f"restore cannot be verified")
    lossy = f" (settings: {'; '.join(res.lossy_settings)})" if res.lossy_settings else ""
    raise RestoreError(f"{plan.target_label} {held} after the restore, expected {expected} "
                       f"({initial_depth} before + {res.confirmed} confirmed): {why}{lossy}{ttl_note}")


def _depth_and_consumers(conn: TargetConnection, vhost: str, queue: str) -> tuple[int | None, int]:
    counts = queue_counts(conn, vhost, queue)
    return (None, 0) if counts is None else counts


def restore_queue_segments(
    source: BackupSource,
    plan: QueuePlan,
    options: RestoreOptions,
    checkpoint: QueueCheckpoint | None = None,
    connection: TargetConnection | None = None,
    on_progress: Callable[[QueueResult], None] | None = None,
    size_checked: bool = False,
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
    or ``None`` to open (and close) one here. ``size_checked``: the caller already refused records over
    the target's max_message_size for the whole restore (``engine.refuse_oversize``).

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
    conn = options.broker().connect(plan.target_vhost) if connection is None else connection
    try:
        prepared = prepare_target(conn, plan, options, cp, state, res,
                                  lambda seq, idx: record_body_at(source, plan, seq, idx, options, codec))
        if prepared is None:
            return res  # skipped: the target already holds messages
        skip_extra, landed = prepared
        limits = check_target_limits(conn, source, plan, options, codec, state, res, skip_extra)
        resume = state.resume_point()
        max_body = check_message_sizes(conn, source, plan, options, codec, resume, size_checked)
        if state.initial_depth is not None or state.segments:
            res.resumed_from = resume
        pub = RecordPublisher(conn, plan, options, f"{plan.label} -> {plan.target_label}",
                              _PropertiesCache(plan.label))
        progress = _Progress(plan, options, cp, res, pub, state.confirmed, on_progress)
        try:
            _publish(source, plan, options, codec, pub, progress, resume, skip_extra, landed, max_body)
            if res.oversize_skipped:
                log.warning("%s: %d record(s) over the target's max_message_size %d skipped "
                            "(restore.allow_oversize_skip: true), the largest %d bytes; each is listed in the summary",
                            plan.label, len(res.oversize_skipped), max_body,
                            max(o["bytes"] for o in res.oversize_skipped))
            pub.drain()
            progress.commit(force=True)
            verify_target_depth(conn, plan, options, res, limits)
        except RbakError as err:
            try:
                pub.drain(timeout=5)
            except RbakError:
                pass
            progress.commit(force=True)
            progress.failed()
            err.queue_result = res  # what the broker confirmed before the failure, for the summary
            raise
        finally:
            res.protocol = pub.protocol
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


class _Progress:
    """The confirmed prefix of one queue's run: into the checkpoint (at most every 0.25 s or batch),
    the metrics and the caller's ``on_progress``."""

    def __init__(self, plan: QueuePlan, options: RestoreOptions, cp: QueueCheckpoint,
                 res: QueueResult, pub: RecordPublisher, confirmed_base: int,
                 on_progress: Callable[[QueueResult], None] | None):
        self.plan, self.options, self.cp, self.res, self.pub = plan, options, cp, res, pub
        self.confirmed_base = confirmed_base
        self.on_progress = on_progress
        self.landed = 0  # records a killed run had enqueued, counted as restored
        self._last_commit = time.monotonic()
        self._last_token: tuple[int, int, int] | None = None
        self._counted_pub = self._counted_conf = self._committed_at = 0
        labels = {"vhost": plan.target_vhost, "queue": plan.target_queue}
        self._m_pub, self._m_conf, self._m_fail = (metrics.published().labels(**labels),
                                                   metrics.confirmed().labels(**labels),
                                                   metrics.failed().labels(**labels))

    def count_landed(self, token: tuple[int, int, int]) -> None:
        self.landed += 1
        self.pub.mark_landed(token)

    def commit(self, force: bool = False) -> None:
        pub, plan = self.pub, self.plan
        adv, token = pub.take_progress()
        if adv:
            self._last_token = cast("tuple[int, int, int]", token)  # (seq, idx, segment length): _publish's tokens
        now = time.monotonic()
        confirmed = self.confirmed_base + pub.confirmed + self.landed
        due = now - self._last_commit >= 0.25 or pub.confirmed - self._committed_at >= self.options.produce_batch_size
        if self._last_token is not None and (force or (adv and due)):
            seq, idx, seg_len = self._last_token
            self.cp.record(plan.source_vhost, plan.source_queue, seq, idx, idx >= seg_len, confirmed)
            self._last_commit = now
            self._committed_at = pub.confirmed
        self._m_pub.inc(pub.published - self._counted_pub)
        self._m_conf.inc(pub.confirmed - self._counted_conf)
        self._counted_pub, self._counted_conf = pub.published, pub.confirmed
        self.res.published, self.res.confirmed, self.res.failed = pub.published, confirmed, pub.failed
        if self.on_progress is not None:
            self.on_progress(self.res)

    def failed(self) -> None:
        self._m_fail.inc(self.pub.failed)


def check_message_sizes(conn: TargetConnection, source: BackupSource, plan: QueuePlan, options: RestoreOptions,
                        codec: ObjectCodec | None, resume: tuple[int, int], checked: bool) -> int | None:
    """Refuse the queue before its first publish when a record still to publish is over the target's
    max_message_size (``message_size``), unless ``checked`` (the whole restore's preflight did, so an
    older backup's segments are not scanned twice). With ``allow_oversize_skip``: the limit, above which
    ``_publish`` skips and lists records as they come (no scan). None: nothing to skip, or no limit known."""
    lim = target_limit(options.broker(), options.target, plan.target_vhost, version_of(conn),
                       options.allow_oversize_skip)
    if lim is None:
        return None
    if options.allow_oversize_skip:
        return lim.limit
    if not checked and (found := oversize_records(source, plan, options, codec, lim.limit, resume)):
        raise RestoreError(oversize_refusal(plan, found, lim))
    return None


def _publish(source: BackupSource, plan: QueuePlan, options: RestoreOptions, codec: ObjectCodec | None,
             pub: RecordPublisher, progress: _Progress, resume: tuple[int, int], skip_extra: int,
             landed: LandedTail | None, max_body: int | None = None) -> None:
    """Every record of the plan after ``resume`` inside the window, in order; the first ``skip_extra``
    of them were enqueued by a killed run (for a stream, ``landed`` holds their digests to check).
    A body over ``max_body`` is skipped and listed (``allow_oversize_skip``)."""
    res = progress.res
    resume_seq, resume_idx = resume
    s, e = options.window_start_ms, options.window_end_ms
    queue_mode = options.publish_mode == "queue"
    for seg in plan.segments:
        if seg.sequence < resume_seq:
            continue
        start = resume_idx if seg.sequence == resume_seq else 0
        whole = segment_fully_inside(seg.first_timestamp, seg.last_timestamp, s, e)
        n = seg.record_count
        for i, r in source.records(seg, options.verify_checksums, start, codec=codec):
            if not whole and not record_in_window(r.backed_up_at, s, e):
                res.skipped_records += 1
                continue
            res.selected += 1
            if max_body is not None and len(r.body) > max_body:  # never published, so never landed either
                res.oversize_skipped.append({"segment": seg.key, "index": i, "bytes": len(r.body)})
                continue
            if skip_extra:  # already enqueued by the killed run (see reconcile_in_flight): count it as restored
                if landed is not None:
                    check_landed(landed, r.body, plan.target_label, f"record {i} of {seg.key}")
                skip_extra -= 1
                progress.count_landed((seg.sequence, i + 1, n))
                continue
            exchange, rk = (("", plan.target_queue) if queue_mode or not r.exchange
                            else (r.exchange, r.routing_key))  # plan.publish_address, inlined
            pub.publish(exchange, rk, r, i, seg.key, (seg.sequence, i + 1, n))
            res.bytes += len(r.body)
            if r.properties.expiration is not None:
                res.with_expiration += 1
            if pub.published % 256 == 0:
                progress.commit()
        progress.commit()


class _PropertiesCache:
    """Encoded basic properties by value: consecutive records often share properties and headers."""

    def __init__(self, label: str):
        self.label = label
        self._cache: dict[tuple, bytes] = {}

    def __call__(self, r: BackupRecord, index: int, segment_key: str) -> bytes:
        p = r.properties
        key = properties_key(p, r.headers)
        props = self._cache.get(key)
        if props is None:
            try:
                props = encode_basic_properties(p, r.headers, "record")
            except SerializationError as err:
                raise SerializationError(f"{self.label}, record {index} of {segment_key}: {err.args[0]}") from None
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[key] = props
        return props
