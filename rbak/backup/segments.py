"""Segment writing off the reading thread: compress + store in a background thread.

The reader thread only encodes records (Python); zstd/lz4 compression and the
storage ``put`` (fsync, S3 upload) release the GIL, so on two cores they run
beside the AMQP read instead of after it. At most ``max_inflight`` finished
segments wait for the writer, so memory stays bounded by
``(1 + max_inflight) * segment_max_bytes``. Segments are built and framed in
place by the core's ``SegmentBuffer``/``store_segment`` and stored through its
``SegmentPipeline`` (ordered results, errors re-raised, buffers reused);
rotation rules are ``SegmentWriter``'s (size and age).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from typing import Any, Sequence

from ..format.compression import Compression, check_level
from ..format.manifest import SegmentMetadata
from ..format.record import BackupRecord
from ..format.segment_buffer import SegmentBuffer, SegmentSink, store_segment
from ..format.segment_writer import SegmentPipeline
from .stages import OnDurable


def _lower_priority() -> None:
    """Compression yields the CPU to the AMQP read (and a broker on the same host): the read is
    what holds the source's messages, so it goes first; ``max_inflight`` stops the writer from
    falling behind by more than two segments."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # Linux: per-thread nice
    except (AttributeError, OSError):
        pass


class AsyncSegmentWriter:
    """``SegmentWriter``'s rotation with one ``SegmentPipeline`` thread behind it, plus
    ``on_durable(meta, tag)`` called in that thread as soon as a segment is stored."""

    def __init__(self, sink: SegmentSink, compression: Compression, level: int | None,
                 max_bytes: int, max_interval_ms: int, first_sequence: int = 1,
                 on_durable: OnDurable | None = None, max_inflight: int = 2):
        self._sink = sink
        self.compression = compression
        self.level = check_level(compression, level)
        self.max_bytes = max_bytes
        self.max_interval_ms = max_interval_ms
        self.next_sequence = first_sequence
        self._on_durable = on_durable
        self._pipeline = SegmentPipeline(workers=1, max_inflight=max_inflight, initializer=_lower_priority)
        self.written: list[SegmentMetadata] = []
        self._seg = self._pipeline.take_buffer(max_bytes)
        self._started = 0.0
        self._tag: Any = None
        self._submitted = False  # a segment went to the pipeline's thread

    def append_encoded(self, data: bytes, backed_up_at: int, tag: Any = None, body_len: int = -1) -> None:
        """Add one record's JSON; ``tag`` (e.g. a stream offset) of a segment's last record reaches on_durable."""
        seg = self._seg
        if seg.count == 0:
            self._started = time.monotonic()
        self._tag = tag
        if seg.add(data, backed_up_at, body_len) >= self.max_bytes or (time.monotonic() - self._started) * 1000 >= self.max_interval_ms:
            self._submit()

    def append_records(self, records: Sequence[BackupRecord], arrivals: Sequence[float],
                       tags: Sequence[Any]) -> None:
        """``append_encoded`` for a batch of records: the same segments, the bodies written by C with
        the GIL released (``SegmentBuffer.add_from``). ``arrivals[i]``: ``time.monotonic()`` when record
        i was taken, which the age rule uses as ``append_encoded`` used the time of its call (the
        record that brings the segment to its age or size is its last one)."""
        n = len(records)
        i = 0
        crc = self.compression is Compression.NONE  # a compressed segment's CRC is taken after compression
        while i < n:
            seg = self._seg
            if seg.count == 0:
                self._started = arrivals[i]
            started = self._started
            # the first record old enough to end the segment (arrivals only grow): records after it
            # belong to the next segment
            cut = n
            if (arrivals[n - 1] - started) * 1000 >= self.max_interval_ms:
                cut = bisect.bisect_left(arrivals, True, i, n,
                                         key=lambda a: (a - started) * 1000 >= self.max_interval_ms) + 1
            nxt = seg.add_from(records if cut == n else records[:cut], i, self.max_bytes, crc)
            self._tag = tags[nxt - 1]
            if seg.payload_bytes >= self.max_bytes or (arrivals[nxt - 1] - started) * 1000 >= self.max_interval_ms:
                self._submit()
            i = nxt

    def flush(self) -> None:
        """Close the open segment now, whatever its age or size (``rbak archive``'s tick); on the thread
        that appends."""
        self._submit()

    def _submit(self) -> None:
        seg = self._seg
        if seg.count == 0:
            return
        self._submitted = True
        self._pipeline.submit(self._finish, seg, self.next_sequence, self._tag, on_done=self.written.append)
        self.next_sequence += 1
        self._seg = self._pipeline.take_buffer(self.max_bytes)

    def _finish(self, seg: SegmentBuffer, seq: int, tag: Any) -> SegmentMetadata:
        meta = store_segment(seg, seq, self.compression, self.level, self._sink)
        if self._on_durable is not None:
            self._on_durable(meta, tag)
        return meta

    def close(self) -> list[SegmentMetadata]:
        """Write the last segment, wait for all; every segment's metadata in sequence order.

        A queue whose records all fit in one segment (most queues of a many-queue backup) never
        handed one to the pipeline: its only segment is stored here, on the caller's thread, which
        would only have waited for it, so no thread is started for it (a thread start and join, and
        the GIL hand-overs between them, were ~0.3 ms of CPU per queue; issue 20)."""
        try:
            if not self._submitted and self._seg.count:
                self.written.append(self._finish(self._seg, self.next_sequence, self._tag))
                self.next_sequence += 1
                self._seg = self._pipeline.take_buffer(self.max_bytes)
            else:
                self._submit()
        except BaseException:
            self._pipeline.abort()
            raise
        self._pipeline.close()
        return self.written

    def abort(self) -> None:
        """Drop what is not written yet (the caller failed); waits for the segment being written."""
        self._pipeline.abort()
