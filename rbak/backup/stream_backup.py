"""Backing up one stream: a ``jobs.Job`` of the run, on its ``QueueServices``.

Streams are read by offset and never modified; the run is resumable per
durable segment. An incremental backup first proves it continues the
previous backup of the stream in this storage (``stream_chain``) and records
the link, any retention gap and a recreated stream in the manifest's
``stream`` field.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

from ..broker.stream_end import probe_end
from ..broker.stream_reader import chunk_timestamp, probe_offset, read_stream
from ..broker.wire import Connection
from ..errors import RbakError
from ..format.manifest import QueueBackup, SegmentMetadata, StreamInfo
from ..format.reader import read_segment
from ..format.record import BackupRecord
from ..storage.base import Storage
from .checkpoint import Checkpoint, QueueProgress
from .convert import BROKER_HEADERS, to_record
from .jobs import Job
from .management import QueueInfo
from .pipeline import ReadCounter, StreamIntake
from .record_thread import RecordThread
from .stages import QueuedDelivery
from .stream_chain import ChainDecision, decide

if TYPE_CHECKING:
    from .services import QueueServices

log = logging.getLogger(__name__)


class StreamRecords:
    """Builds a stream's records (``build``: the record thread's ``stages.RecordBuilder``): broker
    headers dropped, the offset kept."""

    __slots__ = ("vhost", "name")

    def __init__(self, vhost: str, name: str):
        self.vhost, self.name = vhost, name

    def build(self, item: QueuedDelivery) -> BackupRecord:
        method, props, body, backed_up_at, offset = item
        return to_record(method, props, body, self.vhost, self.name, backed_up_at, BROKER_HEADERS,
                         stream_offset=offset)


class StreamJob(Job):
    """Streams: resumable per segment; an incremental backup proves it continues the previous one."""

    def __init__(self, svc: QueueServices, q: QueueInfo, ckpt: Checkpoint, cluster: str, version: str | None,
                 prog: QueueProgress | None):
        super().__init__(svc, q, ckpt, cluster, version, prog)
        self.resumed = self.prog is not None
        self.decision = ChainDecision("first")
        self.start: int | str = "first"

    def run(self, conn: Connection) -> QueueBackup:
        svc, ckpt, vhost, name = self.svc, self.ckpt, self.vhost, self.name
        prog = self._position(conn)
        svc.progress("start", vhost=vhost, queue=name, total=None)
        # the pipeline (pipeline.py): the read's intake -> records encoded on their own thread -> segments
        # -> storage; a segment's tag is its last offset, checkpointed once the segment is stored (durable)
        writer = RecordThread(svc.segment_writer(vhost, name, "stream", prog.next_sequence, self.durable),
                              StreamRecords(vhost, name).build)
        counter = ReadCounter(svc.progress, vhost, name, "stream", with_bytes=False)
        intake = StreamIntake(writer, counter, self, svc.throttle)
        try:
            read_stream(conn, vhost, name, self.start, intake, prefetch=svc.cfg.backup.prefetch_count,
                        deadline=svc.deadline(), end_offset=probe_end(svc.source, conn, vhost, name))
        except BaseException:
            writer.abort()
            raise
        writer.close()
        counter.finish()
        prog.completed = True
        if prog.stream_last_offset is None and isinstance(self.start, int):
            prog.stream_last_offset = self.start - 1  # nothing new: keep the previous position
        ckpt.save(prog)
        qb = QueueBackup(vhost, name, "stream")
        for s in prog.segments:
            qb.add_segment(s)
        qb.stream = stream_info(svc.storage, ckpt, vhost, name, prog, intake.last)
        return qb

    def _position(self, conn: Connection) -> QueueProgress:
        """Where the read starts: after the last durable segment of a resumed read, else where the chain
        decision says (this storage's earlier segments of the stream are dropped first)."""
        svc, ckpt, vhost, name, prog = self.svc, self.ckpt, self.vhost, self.name, self.prog
        layout, storage = svc.layout, svc.storage
        saved = ckpt.chain(vhost, name) if prog is not None else None
        if prog is not None and saved is not None:
            self.decision = ChainDecision.from_json_obj(saved)
            keep = {s.key for s in prog.segments}
            for key in list(storage.list(layout.queue_dir(vhost, name) + "/")):
                if key not in keep:  # written after the last checkpoint: will be read again
                    storage.delete(key)
            self.start = (prog.stream_last_offset + 1 if prog.stream_last_offset is not None
                          else self.decision.start)
            self.prog = prog
            return prog
        for key in list(storage.list(layout.queue_dir(vhost, name) + "/")):
            storage.delete(key)
        ckpt.reset(vhost, name)
        self.prog = prog = QueueProgress(vhost, name, "stream")
        self.decision = self._decide(conn)
        if self.decision.warning:
            log.warning("%s", self.decision.warning)
        ckpt.save_chain(vhost, name, self.decision.to_json_obj())
        self.start = self.decision.start
        return prog

    def durable(self, meta: SegmentMetadata, last_offset: int) -> None:
        """Runs in the segment thread once the segment is stored (``stages.OnDurable``): checkpoint it."""
        prog = self.prog
        assert prog is not None  # set by _position before the read
        prog.segments.append(meta)
        prog.records += meta.record_count
        prog.next_sequence = meta.sequence + 1
        prog.stream_last_offset = last_offset
        self.ckpt.save(prog)

    def first_offset(self, offset: int) -> None:
        """The run's first record (``stages.FirstOffset``): a later offset than asked means retention
        removed the ones between."""
        decision, start, vhost, name = self.decision, self.start, self.vhost, self.name
        changed = False
        if decision.first_offset is None and offset >= 0:
            decision.first_offset, changed = offset, True
        if isinstance(start, int) and offset > start and decision.add_gap(start, offset - 1):
            log.warning("stream %r in vhost %r: offsets %d..%d (at most %d message(s)) were removed by the stream's "
                        "retention before this backup read them; recorded as a gap", name, vhost, start, offset - 1,
                        offset - start)
            changed = True
        if changed:
            self.ckpt.save_chain(vhost, name, decision.to_json_obj())

    def _decide(self, conn: Connection) -> ChainDecision:
        if not self.svc.cfg.backup.stream_incremental:
            return ChainDecision("first")
        base = self.svc.stream_base(self.vhost, self.name)
        if base is None or base.info.last_offset is None:
            return ChainDecision("first")
        return decide(self.name, self.vhost, base, probe_offset(conn, self.vhost, self.name, base.info.last_offset))


def stream_info(storage: Storage, ckpt: Checkpoint, vhost: str, name: str, prog: QueueProgress,
                last: tuple[bytes, Any] | None) -> StreamInfo:
    """The manifest's ``stream`` record: the link to the previous backup, gaps, and the last record's identity."""
    saved = ckpt.chain(vhost, name)
    d = ChainDecision.from_json_obj(saved) if saved else ChainDecision("first")
    info = StreamInfo(first_offset=d.first_offset, last_offset=prog.stream_last_offset,
                      previous_backup=d.previous_backup, previous_last_offset=d.previous_last_offset,
                      recreated=d.recreated, gaps=list(d.gaps))
    if last is not None:
        info.last_record_sha256 = hashlib.sha256(last[0]).hexdigest()
        info.last_chunk_timestamp = chunk_timestamp(last[1])
    elif prog.segments:  # resumed with nothing new after the kept segments: read the last one back
        try:
            records = [r for _, r in read_segment(storage, prog.segments[-1])]
            if records:
                info.last_record_sha256 = hashlib.sha256(records[-1].body).hexdigest()
        except RbakError as e:
            log.warning("cannot read back %s to identify the stream's last record: %s", prog.segments[-1].key, e)
    else:
        info.last_record_sha256, info.last_chunk_timestamp = d.previous_sha256, d.previous_chunk_timestamp
    return info
