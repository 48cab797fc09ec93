"""One classic or quorum queue into segments, without costing the source a message.

Before a single message is taken: skip what cannot or should not be read
(exclusive queues, queues with consumers when configured), resolve the quorum
settings the broker applies (``preflight``), choose how messages go back
(``basic.nack`` where the broker counts no delivery for it, else channel close),
refuse a queue whose delayed retries would hold returned messages back, and
refuse one whose delivery guard says one more read could push a message past
its limit. After the read, the guard is recorded locally and beside the
backups (``guard_store``), whatever happened during the read.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..broker.connect import connect
from ..errors import (AmqpConnectionError, QueueLocked, QueueNotFound, QueueRefused, QueueSkipped, ReadCut,
                      ShortRead)
from ..format.manifest import QueueBackup
from .checkpoint import Checkpoint, Guard, QueueProgress
from . import cut_repair
from .convert import to_record
from ..broker.declare import passive_declare
from ..broker.wire import Connection
from .guard_store import merge
from .limits import budget_ceiling, may_take, refuse_delayed_retry, version_tuple
from .management import QueueInfo
from .preflight import (live_priorities, quorum_settings, single_active_reason, skip_reason)
from ..errors import DeliveryLimitError
from .queue_reader import CLOSE, NACK, QUORUM_PREFETCH, describe_message, read_queue
from .pipeline import QueueIntake, ReadCounter
from .record_thread import RecordThread

if TYPE_CHECKING:
    from .services import QueueServices

log = logging.getLogger(__name__)


def passive_info(conn: Connection, vhost: str, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) right now, exactly; a queue deleted meanwhile, or an exclusive queue
    of another connection, is skipped."""
    try:
        return passive_declare(conn, vhost, queue)
    except QueueLocked:
        raise QueueSkipped(f"queue {queue!r} in vhost {vhost!r}: exclusive queue: only its owning connection "
                           f"can read it") from None
    except QueueNotFound:
        raise QueueSkipped(f"queue {queue!r} in vhost {vhost!r}: deleted before the backup read it") from None


def clear_previous(eng: "QueueServices", ckpt: Checkpoint, vhost: str, name: str, prog: QueueProgress | None) -> None:
    """An interrupted earlier read of this queue is dropped (its messages went back): read from the head."""
    if prog is not None or eng.storage.exists(eng.layout.segment(vhost, name, 1, eng.compression)):
        eng.storage.delete_prefix(eng.layout.queue_dir(vhost, name) + "/")
        ckpt.reset(vhost, name)


def backup_queue(eng: "QueueServices", q: QueueInfo, ckpt: Checkpoint, conn, cluster: str, version: str | None,
                 prog: QueueProgress | None) -> QueueBackup:
    """Classic / quorum: all or nothing per run (an interrupted read is redone from the head)."""
    vhost, name, qtype = q.vhost, q.name, q.queue_type
    where = f"queue {name!r} in vhost {vhost!r}"
    clear_previous(eng, ckpt, vhost, name, prog)
    reason = skip_reason(q, None, False)  # exclusive (the listing said so)
    if reason:
        raise QueueSkipped(f"{where}: {reason}")
    started = time.monotonic()  # the depth below is what the read must reach: measured now
    depth, consumers = passive_info(conn, vhost, name)
    reason = skip_reason(q, consumers, eng.cfg.backup.skip_queues_with_consumers) or \
        single_active_reason(q, consumers, eng.client)
    sel = eng.source.queues
    if not reason and sel.too_few(qtype, depth):  # exact here; the listing's figure can be seconds old
        reason = f"held {depth} message(s), fewer than source.queues.min_messages ({sel.min_messages})"
    if reason:
        raise QueueSkipped(f"{where}: {reason}")
    quorum = qtype == "quorum"
    limit, mode, single = quorum_preflight(eng, q, conn, version, consumers, depth) if quorum else (None, CLOSE, False)
    guard_now = _guard(eng, ckpt, cluster, vhost, name) if quorum else None
    if quorum and depth == 0:
        _set_guard(eng, ckpt, cluster, vhost, name, Guard(0, limit, ""))  # seen empty: no count of ours remains
    elif quorum and limit is not None and mode == CLOSE:
        _check_guard(eng, guard_now, where, limit, version)
    # an auto-delete queue is deleted when its last consumer goes: read it without one
    use_get = q.auto_delete and not quorum
    eng.progress("start", vhost=vhost, queue=name, total=depth)
    # the pipeline (pipeline.py): the read's intake -> records encoded on their own thread -> segments -> storage
    writer = RecordThread(eng.segment_writer(vhost, name, qtype, 1),
                          lambda d: to_record(d[0], d[1], d[2], vhost, name, d[3]))
    counter = ReadCounter(eng.progress, vhost, name, qtype, with_bytes=True)
    intake = QueueIntake(writer.put, counter, quorum, describe_message)
    try:
        res = read_queue(conn, vhost, name, qtype, depth, intake, delivery_limit=limit,
                         margin=eng.cfg.backup.delivery_limit_margin, return_mode=mode, single_consumer=single,
                         use_get=use_get, read_timeout=eng.cfg.backup.read_timeout_secs,
                         deadline=eng.deadline(), throttle=eng.throttle)
    except BaseException as e:
        writer.abort()
        if quorum and isinstance(e, DeliveryLimitError):
            intake.stopped = 1  # the message at its limit was taken too, and went back
            intake.max_count = max(intake.max_count, e.count)
            intake.nearest = intake.nearest or e.message_name
        if isinstance(e, ReadCut):
            fixed = cut_repair.repair(lambda: connect(eng.source, vhost), lambda c: passive_info(c, vhost, name),
                                      vhost, name, depth, intake.taken, delivery_limit=limit,
                                      margin=eng.cfg.backup.delivery_limit_margin, return_mode=mode,
                                      read_timeout=eng.cfg.backup.read_timeout_secs,
                                      returned=lambda ready: cut_repair.returned_ready(
                                          eng.client, vhost, name, ready, reported=version_tuple(version) >= (4, 0),
                                          taken=counter.count))
            # its reads saw the counts the cut left; the guard below adds their own return
            intake.max_count = max(intake.max_count, fixed.max_count)
            if fixed.repaired:
                raise AmqpConnectionError(f"{e.lost}{e.context}; {fixed.why}") from None
            raise ReadCut(f"{e}; {fixed.why}", e.lost, e.context) from None
        raise
    finally:
        if quorum and counter.count + intake.stopped:
            # close: every message taken went back with one more delivery on its count;
            # nack (4.3+): with none (only a lost connection counts one)
            left = intake.max_count + (1 if mode == CLOSE else 0)
            _set_guard(eng, ckpt, cluster, vhost, name, Guard(left, limit, intake.nearest))
    segments = writer.close()
    counter.finish()
    qb = QueueBackup(vhost, name, qtype, expected_messages=depth)
    for s in segments:
        qb.add_segment(s)
    if qb.message_count < depth:
        raise ShortRead(qb, res.short or f"read {qb.message_count} of the {depth} messages the queue held when the "
                        "read started")
    risk = eng.lease_risk(vhost, started)
    if risk:  # recorded partial and read again by a rerun (no completed progress is kept)
        raise ShortRead(qb, risk)
    ckpt.save(QueueProgress(vhost, name, qtype, depth, qb.message_count, writer.next_sequence, segments, True))
    return qb


def quorum_preflight(eng: "QueueServices", q: QueueInfo, conn, version: str | None, consumers: int,
                     depth: int) -> tuple[int | None, str, bool]:
    """(delivery limit, how messages go back, single active consumer) of a quorum queue, or
    ``QueueRefused`` before anything is taken: delayed retries a return would trigger, priorities a
    return would reorder for live consumers, or a single-active-consumer queue deeper than one
    consumer can hold (its second consumer would wait behind the first and receive nothing)."""
    where = f"queue {q.name!r} in vhost {q.vhost!r}"
    settings = quorum_settings(q, eng.client, eng.policies, version)
    limit = settings.delivery_limit.value if settings.delivery_limit else None
    mode = NACK if eng.nack.supported(conn, q.vhost) else CLOSE
    why = refuse_delayed_retry(settings.delayed_retry, mode == NACK)
    if why:
        raise QueueRefused(f"{where}: refused before reading: {why}. Back it up when delayed retries are "
                           f"off for it, or exclude it (source.queues.exclude)")
    live_priorities(q, eng.client, version, consumers, depth)
    if settings.single_active and depth > QUORUM_PREFETCH:
        raise QueueRefused(f"{where}: refused before reading: single active consumer queue "
                           f"(x-single-active-consumer) holding {depth} messages: the broker delivers to one "
                           f"consumer at a time, and one consumer can hold at most {QUORUM_PREFETCH}")
    return limit, mode, settings.single_active


def _guard(eng: "QueueServices", ckpt: Checkpoint, cluster: str, vhost: str, name: str) -> Guard | None:
    """The local guard merged with the one beside the backups (newest wins)."""
    return merge(ckpt.guard(cluster, vhost, name), eng.guards.load(vhost, name))


def _set_guard(eng: "QueueServices", ckpt: Checkpoint, cluster: str, vhost: str, name: str, g: Guard) -> None:
    g = ckpt.set_guard(cluster, vhost, name, g)
    eng.guards.save(vhost, name, g, eng.backup_id)


def _check_guard(eng: "QueueServices", g: Guard | None, where: str, limit: int, version: str | None) -> None:
    """Refuse before reading when one more backup would leave a message at ``limit - margin`` or more.

    Without a guard the lowest count a message can have (0) is checked: a limit within the
    margin of 1 is refused before any message is taken, because the very first return would
    already use up the application's budget."""
    margin = eng.cfg.backup.delivery_limit_margin
    ceiling = budget_ceiling(limit, margin)
    count = g.max_count if g is not None else 0
    if may_take(count, ceiling):
        return
    why = (f"an earlier backup left {g.message or 'a message'} at x-delivery-count {count}" if g is not None
           else "even a message never delivered before")
    raise DeliveryLimitError(
        f"{where}: refused before reading: its delivery limit is {limit} and backup.delivery_limit_margin is "
        f"{margin}, so a backup never leaves a message at x-delivery-count {ceiling} or more; {why} would go "
        f"back at {count + 1} (on RabbitMQ {version or 'this version'} every return of a quorum message counts "
        f"as a delivery; one at {limit + 1} is dropped or dead-lettered). Consume or move those messages, raise "
        f"the limit (policy delivery-limit / x-delivery-limit), or lower the margin; rbak forgets this once it "
        f"sees the queue empty")
