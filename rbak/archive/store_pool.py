"""Segments of every followed stream stored by one small pool of threads, each stream's in order.

A backup's ``AsyncSegmentWriter`` gives each queue a thread of its own and keeps its used buffers
warm for the next segment; an archive follows its streams for days, so with 200 streams that was
200 threads and up to three warm buffers each, sized by the busiest moment each stream ever had.
Here a ``StreamSegments`` per stream builds its open segment (the same ``SegmentBuffer`` rules:
a segment rolls at ``segment_max_bytes`` or when the archiver's tick flushes it) and hands finished
ones to a ``StorePool`` shared by every stream; a stored buffer is dropped, not kept. Per stream at
most ``max_inflight`` segments wait or are being stored (the stream's reader waits, which is TCP
back-pressure on the broker), and ``on_durable`` is called in sequence order whatever order the
pool's threads finish in, so a stream's durable position never passes a segment not yet stored.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

from ..format.compression import Compression, check_level
from ..format.manifest import SegmentMetadata
from ..format.record import BackupRecord
from ..format.segment_buffer import SegmentBuffer, SegmentSink, store_segment

#: Threads storing segments for the whole archive: compression, hashing and uploads release the GIL,
#: so a few overlap uploads without a thread per stream.
STORE_THREADS = 8


class StorePool:
    """The archive's storing threads (``STORE_THREADS``), shared by every stream's ``StreamSegments``."""

    def __init__(self, workers: int = STORE_THREADS):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rbak-archive-store")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class StreamSegments:
    """One stream's segments: what ``backup.record_thread.RecordThread`` writes to (``append_records``,
    ``append_encoded``, ``flush``, ``close``, ``abort``, ``next_sequence``), stored by a shared ``StorePool``."""

    def __init__(self, pool: StorePool, sink: SegmentSink, compression: Compression, level: int | None,
                 max_bytes: int, first_sequence: int = 1,
                 on_durable: Callable[[SegmentMetadata, Any], None] | None = None, max_inflight: int = 2):
        self._pool = pool
        self._sink = sink
        self.compression = compression
        self.level = check_level(compression, level)
        self.max_bytes = max_bytes
        self.next_sequence = first_sequence
        self._on_durable = on_durable
        self._max_inflight = max_inflight
        self._inflight: deque[Future] = deque()
        self._lock = threading.Lock()
        self._stored: dict[int, tuple[SegmentMetadata, Any]] = {}  # finished out of order, not yet reported
        self._next_report = first_sequence
        self.written: list[SegmentMetadata] = []
        self._seg = SegmentBuffer(max_bytes)
        self._tag: Any = None

    def append_encoded(self, data: bytes, backed_up_at: int, tag: Any = None, body_len: int = -1) -> None:
        self._tag = tag
        if self._seg.add(data, backed_up_at, body_len) >= self.max_bytes:
            self._submit()

    def append_records(self, records: Sequence[BackupRecord], arrivals: Sequence[float],
                       tags: Sequence[Any]) -> None:
        """The records, in order; a segment rolls at ``max_bytes`` (its bodies written by C, GIL released)."""
        n, i = len(records), 0
        crc = self.compression is Compression.NONE  # a compressed segment's CRC is taken after compression
        while i < n:
            nxt = self._seg.add_from(records, i, self.max_bytes, crc)
            self._tag = tags[nxt - 1]
            if self._seg.payload_bytes >= self.max_bytes:
                self._submit()
            i = nxt

    def flush(self) -> None:
        """Close the open segment now (a tick); raises a storing error met so far."""
        self._submit()
        self._collect(self._max_inflight)

    def _submit(self) -> None:
        seg = self._seg
        if seg.count == 0:
            return
        self._inflight.append(self._pool.submit(self._store, seg, self.next_sequence, self._tag))
        self.next_sequence += 1
        self._seg = SegmentBuffer(self.max_bytes)
        self._collect(self._max_inflight)

    def _store(self, seg: SegmentBuffer, seq: int, tag: Any) -> SegmentMetadata:
        meta = store_segment(seg, seq, self.compression, self.level, self._sink)
        with self._lock:  # report in sequence order: a later segment waits for the earlier ones
            self._stored[seq] = (meta, tag)
            while self._next_report in self._stored:
                m, t = self._stored.pop(self._next_report)
                self._next_report += 1
                if self._on_durable is not None:
                    self._on_durable(m, t)
        return meta

    def _collect(self, keep: int) -> None:
        q = self._inflight
        while q and (len(q) > keep or q[0].done()):
            self.written.append(q.popleft().result())

    def close(self) -> list[SegmentMetadata]:
        """Store the last segment and wait for every one; raises the first storing error."""
        try:
            self._submit()
            self._collect(0)
        except BaseException:
            self.abort()
            raise
        return self.written

    def abort(self) -> None:
        """Drop what is not stored yet; returns once none of this stream's segments is being stored."""
        for fut in self._inflight:
            fut.cancel()
        for fut in self._inflight:
            if not fut.cancelled():
                try:
                    fut.result()
                except BaseException:  # noqa: BLE001 - the caller already fails
                    pass
        self._inflight.clear()
