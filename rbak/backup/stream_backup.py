"""Backing up one stream (the ``BackupEngine``'s stream part, kept apart for size).

Streams are read by offset and never modified; the run is resumable per
durable segment. An incremental backup first proves it continues the
previous backup of the stream in this storage (``stream_chain``) and records
the link, any retention gap and a recreated stream in the manifest's
``stream`` field.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Callable

from ..config import Config, ConnectionConfig
from ..errors import RbakError
from ..format.manifest import QueueBackup, SegmentMetadata, StreamInfo
from ..format.reader import read_segment
from ..format.layout import BackupLayout
from ..storage.base import Storage
from .checkpoint import Checkpoint, QueueProgress
from .convert import BROKER_HEADERS, to_record
from .management import QueueInfo
from .pipeline import ReadCounter, StreamIntake
from .record_thread import RecordThread
from .segments import AsyncSegmentWriter
from .stream_chain import ChainDecision, StreamBase, decide
from ..broker.stream_end import probe_end
from ..broker.stream_reader import chunk_timestamp, probe_offset, read_stream

log = logging.getLogger(__name__)


class StreamBackup:
    """Mixed into ``BackupEngine``: uses its cfg, source, layout, storage, progress, throttle, _bases, segment_writer,
    deadline."""

    # What ``BackupEngine`` provides (declared for the type checker only: no values here).
    cfg: Config
    source: ConnectionConfig  # cfg.source, checked
    layout: BackupLayout
    storage: Storage
    progress: Callable[..., None]
    throttle: Callable[[int], None] | None
    _bases: dict[tuple[str, str], StreamBase]
    segment_writer: Callable[..., AsyncSegmentWriter]
    deadline: Callable[[], float | None]

    def _stream(self, q: QueueInfo, ckpt: Checkpoint, conn, cluster: str, prog: QueueProgress | None) -> QueueBackup:
        """Streams: resumable per segment; an incremental backup proves it continues the previous one."""
        vhost, name = q.vhost, q.name
        layout, storage = self.layout, self.storage
        saved = ckpt.chain(vhost, name) if prog is not None else None
        if prog is not None and saved is not None:
            decision = ChainDecision.from_json_obj(saved)
            keep = {s.key for s in prog.segments}
            for key in list(storage.list(layout.queue_dir(vhost, name) + "/")):
                if key not in keep:  # written after the last checkpoint: will be read again
                    storage.delete(key)
            start: int | str = (prog.stream_last_offset + 1 if prog.stream_last_offset is not None
                                else decision.start)
        else:
            for key in list(storage.list(layout.queue_dir(vhost, name) + "/")):
                storage.delete(key)
            ckpt.reset(vhost, name)
            prog = QueueProgress(vhost, name, "stream")
            decision = self._decide_stream(conn, vhost, name)
            if decision.warning:
                log.warning("%s", decision.warning)
            ckpt.save_chain(vhost, name, decision.to_json_obj())
            start = decision.start
        self.progress("start", vhost=vhost, queue=name, total=None)

        def durable(meta: SegmentMetadata, last_offset: int) -> None:
            """Runs in the segment thread once the segment is stored: checkpoint it."""
            prog.segments.append(meta)
            prog.records += meta.record_count
            prog.next_sequence = meta.sequence + 1
            prog.stream_last_offset = last_offset
            ckpt.save(prog)

        # the pipeline (pipeline.py): the read's intake -> records encoded on their own thread -> segments
        # -> storage; a segment's tag is its last offset
        writer = RecordThread(self.segment_writer(vhost, name, "stream", prog.next_sequence, durable),
                              lambda d: to_record(d[0], d[1], d[2], vhost, name, d[3], BROKER_HEADERS,
                                                  stream_offset=d[4]))
        counter = ReadCounter(self.progress, vhost, name, "stream", with_bytes=False)
        intake = StreamIntake(writer.put, counter,
                              lambda offset: self._first_record(ckpt, vhost, name, decision, start, offset),
                              self.throttle)
        try:
            read_stream(conn, vhost, name, start, intake, prefetch=self.cfg.backup.prefetch_count,
                        deadline=self.deadline(), end_offset=probe_end(self.source, conn, vhost, name))
        except BaseException:
            writer.abort()
            raise
        writer.close()
        counter.finish()
        prog.completed = True
        if prog.stream_last_offset is None and isinstance(start, int):
            prog.stream_last_offset = start - 1  # nothing new: keep the previous position
        ckpt.save(prog)
        qb = QueueBackup(vhost, name, "stream")
        for s in prog.segments:
            qb.add_segment(s)
        qb.stream = self._stream_info(ckpt, vhost, name, prog, intake.last)
        return qb

    def _first_record(self, ckpt: Checkpoint, vhost: str, name: str, decision: ChainDecision, start: int | str,
                      offset: int) -> None:
        """The run's first record: a later offset than asked means retention removed the ones between."""
        changed = False
        if decision.first_offset is None and offset >= 0:
            decision.first_offset, changed = offset, True
        if isinstance(start, int) and offset > start and decision.add_gap(start, offset - 1):
            log.warning("stream %r in vhost %r: offsets %d..%d (at most %d message(s)) were removed by the stream's "
                        "retention before this backup read them; recorded as a gap", name, vhost, start, offset - 1,
                        offset - start)
            changed = True
        if changed:
            ckpt.save_chain(vhost, name, decision.to_json_obj())

    def _decide_stream(self, conn, vhost: str, name: str) -> ChainDecision:
        if not self.cfg.backup.stream_incremental:
            return ChainDecision("first")
        base = self._bases.get((vhost, name))
        if base is None or base.info.last_offset is None:
            return ChainDecision("first")
        return decide(name, vhost, base, probe_offset(conn, vhost, name, base.info.last_offset))

    def _stream_info(self, ckpt: Checkpoint, vhost: str, name: str, prog: QueueProgress,
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
                records = [r for _, r in read_segment(self.storage, prog.segments[-1])]
                if records:
                    info.last_record_sha256 = hashlib.sha256(records[-1].body).hexdigest()
            except RbakError as e:
                log.warning("cannot read back %s to identify the stream's last record: %s", prog.segments[-1].key, e)
        else:
            info.last_record_sha256, info.last_chunk_timestamp = d.previous_sha256, d.previous_chunk_timestamp
        return info
