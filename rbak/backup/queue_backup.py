"""One classic or quorum queue into segments, without costing the source a message (``QueueJob``).

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
from ..broker.declare import passive_declare
from ..broker.wire import Connection
from ..errors import (AmqpConnectionError, DeliveryLimitError, QueueLocked, QueueNotFound, QueueRefused,
                      QueueSkipped, RbakError, ReadCut, ShortRead)
from ..format.manifest import QueueBackup
from ..format.record import BackupRecord
from . import cut_repair
from .checkpoint import Checkpoint, Guard, QueueProgress
from .convert import to_record
from .guard_store import merge
from .jobs import Job
from .limits import budget_ceiling, may_take, refuse_delayed_retry, version_tuple
from .management import QueueInfo
from .pipeline import QueueIntake, ReadCounter
from .preflight import live_priorities, quorum_settings, single_active_reason, skip_reason
from .queue_reader import CLOSE, NACK, QUORUM_PREFETCH, ReadOptions, read_queue
from .record_thread import RecordThread
from .stages import QueuedDelivery

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


def clear_previous(eng: QueueServices, ckpt: Checkpoint, vhost: str, name: str, prog: QueueProgress | None) -> None:
    """An interrupted earlier read of this queue is dropped (its messages went back): read from the head."""
    if prog is not None or eng.storage.exists(eng.layout.segment(vhost, name, 1, eng.compression)):
        eng.storage.delete_prefix(eng.layout.queue_dir(vhost, name) + "/")
        ckpt.reset(vhost, name)


class QueueRecords:
    """Builds a classic or quorum queue's records on the encoder thread: ``build`` is the record
    thread's ``stages.RecordBuilder`` (a bound method costs what a closure did; ``__call__`` more)."""

    __slots__ = ("vhost", "name")

    def __init__(self, vhost: str, name: str):
        self.vhost, self.name = vhost, name

    def build(self, item: QueuedDelivery) -> BackupRecord:
        method, props, body, backed_up_at = item
        return to_record(method, props, body, self.vhost, self.name, backed_up_at)


class CutSource:
    """The broker side of a cut read's repair (``cut_repair.RepairSource``): the run's source,
    passive declares, and the management API's count of returned messages."""

    def __init__(self, svc: QueueServices, vhost: str, name: str, version: str | None, counter: ReadCounter):
        self.svc, self.vhost, self.name, self.version, self.counter = svc, vhost, name, version, counter

    def connect(self) -> Connection:
        return connect(self.svc.source, self.vhost)

    def counts(self, conn: Connection) -> tuple[int, int]:
        return passive_info(conn, self.vhost, self.name)

    def returned(self, ready: int) -> int | None:
        return cut_repair.returned_ready(self.svc.client, self.vhost, self.name, ready,
                                         reported=version_tuple(self.version) >= (4, 0), taken=self.counter.count)


class QueueJob(Job):
    """Classic / quorum: all or nothing per run (an interrupted read is redone from the head)."""

    def run(self, conn: Connection) -> QueueBackup:
        svc, ckpt, q, vhost, name, where = self.svc, self.ckpt, self.q, self.vhost, self.name, self.where
        clear_previous(svc, ckpt, vhost, name, self.prog)
        started = time.monotonic()  # the depth below is what the read must reach: measured now
        depth, consumers = self._depth(conn)
        quorum = q.queue_type == "quorum"
        limit, mode, single = quorum_preflight(svc, q, conn, self.version, consumers, depth) if quorum \
            else (None, CLOSE, False)
        guard_now = _guard(svc, ckpt, self.cluster, vhost, name) if quorum else None
        if quorum and depth == 0:
            self._set_guard(Guard(0, limit, ""))  # seen empty: no count of ours remains
        elif quorum and limit is not None and mode == CLOSE:
            _check_guard(svc, guard_now, where, limit, self.version)
        b = svc.cfg.backup
        # an auto-delete queue is deleted when its last consumer goes: read it without one
        opts = ReadOptions(limit, b.delivery_limit_margin, mode, single, use_get=q.auto_delete and not quorum,
                           read_timeout=b.read_timeout_secs, deadline=svc.deadline(), throttle=svc.throttle)
        svc.progress("start", vhost=vhost, queue=name, total=depth)
        # the pipeline (pipeline.py): the read's intake -> records encoded on their own thread -> segments -> storage
        writer = RecordThread(svc.segment_writer(vhost, name, q.queue_type, 1), QueueRecords(vhost, name).build)
        counter = ReadCounter(svc.progress, vhost, name, q.queue_type, with_bytes=True)
        intake = QueueIntake(writer, counter, quorum)
        try:
            res = read_queue(conn, vhost, name, q.queue_type, depth, intake, opts)
        except BaseException as e:
            writer.abort()
            if quorum and isinstance(e, DeliveryLimitError):
                intake.stopped = 1  # the message at its limit was taken too, and went back
                intake.max_count = max(intake.max_count, e.count)
                intake.nearest = intake.nearest or e.message_name
            if isinstance(e, ReadCut):
                raise self._repaired(e, depth, intake, counter, opts) from None
            raise
        finally:
            if quorum and counter.count + intake.stopped:
                # close: every message taken went back with one more delivery on its count;
                # nack (4.3+): with none (only a lost connection counts one)
                self._set_guard(Guard(intake.max_count + (1 if mode == CLOSE else 0), limit, intake.nearest))
        segments = writer.close()
        counter.finish()
        qb = QueueBackup(vhost, name, q.queue_type, expected_messages=depth)
        for s in segments:
            qb.add_segment(s)
        if qb.message_count < depth:
            raise ShortRead(qb, res.short or f"read {qb.message_count} of the {depth} messages the queue held when "
                            "the read started")
        risk = svc.lease_risk(vhost, started)
        if risk:  # recorded partial and read again by a rerun (no completed progress is kept)
            raise ShortRead(qb, risk)
        ckpt.save(QueueProgress(vhost, name, q.queue_type, depth, qb.message_count, writer.next_sequence, segments,
                                True))
        return qb

    def _depth(self, conn: Connection) -> tuple[int, int]:
        """(depth, consumers) by passive declare, or ``QueueSkipped`` for a queue this run does not read."""
        svc, q = self.svc, self.q
        reason = skip_reason(q, None, False)  # exclusive (the listing said so)
        if reason:
            raise QueueSkipped(f"{self.where}: {reason}")
        depth, consumers = passive_info(conn, q.vhost, q.name)
        reason = skip_reason(q, consumers, svc.cfg.backup.skip_queues_with_consumers) or \
            single_active_reason(q, consumers, svc.client)
        sel = svc.source.queues
        if not reason and sel.too_few(q.queue_type, depth):  # exact here; the listing's figure can be seconds old
            reason = f"held {depth} message(s), fewer than source.queues.min_messages ({sel.min_messages})"
        if reason:
            raise QueueSkipped(f"{self.where}: {reason}")
        return depth, consumers

    def _repaired(self, e: ReadCut, depth: int, intake: QueueIntake, counter: ReadCounter,
                  opts: ReadOptions) -> RbakError:
        """The error of a cut read, once ``cut_repair`` tried to put the queue back in order."""
        bounds = ReadOptions(opts.delivery_limit, opts.margin, opts.return_mode, read_timeout=opts.read_timeout)
        fixed = cut_repair.repair(CutSource(self.svc, self.vhost, self.name, self.version, counter), self.vhost,
                                  self.name, depth, intake.taken, bounds)
        # its reads saw the counts the cut left; the guard adds their own return
        intake.max_count = max(intake.max_count, fixed.max_count)
        if fixed.repaired:
            return AmqpConnectionError(f"{e.lost}{e.context}; {fixed.why}")
        return ReadCut(f"{e}; {fixed.why}", e.lost, e.context)

    def _set_guard(self, g: Guard) -> None:
        _set_guard(self.svc, self.ckpt, self.cluster, self.vhost, self.name, g)


def quorum_preflight(eng: QueueServices, q: QueueInfo, conn: Connection, version: str | None, consumers: int,
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


def _guard(eng: QueueServices, ckpt: Checkpoint, cluster: str, vhost: str, name: str) -> Guard | None:
    """The local guard merged with the one beside the backups (newest wins)."""
    return merge(ckpt.guard(cluster, vhost, name), eng.guards.load(vhost, name))


def _set_guard(eng: QueueServices, ckpt: Checkpoint, cluster: str, vhost: str, name: str, g: Guard) -> None:
    g = ckpt.set_guard(cluster, vhost, name, g)
    eng.guards.save(vhost, name, g, eng.backup_id)


def _check_guard(eng: QueueServices, g: Guard | None, where: str, limit: int, version: str | None) -> None:
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
