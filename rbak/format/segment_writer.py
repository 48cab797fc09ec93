"""Records streamed into segments: rotation on size and age (``SegmentWriter``) and the background
threads that store finished segments while the next ones are encoded (``SegmentPipeline``)."""

from __future__ import annotations

import struct
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

from ..storage.base import Spool
from .compression import Compression, check_level
from .manifest import SegmentMetadata
from .batch import encode_records
from .record import BackupRecord, encode_record
from .segment import FOOTER_SIZE, HEADER_SIZE, VERSION, SegmentHeader
from .segment_buffer import CAN_STREAM, SegmentBuffer, SegmentSink, SegmentStream, store_segment

DEFAULT_SEGMENT_MAX_BYTES = 128 * 1024 * 1024
DEFAULT_SEGMENT_MAX_INTERVAL_MS = 60_000


class SegmentPipeline:
    """Background threads that store finished segments while the caller encodes the next ones.

    The caller's thread decodes and encodes records (Python, holds the GIL);
    ``workers`` threads compress, hash and write finished segments (all
    GIL-free), so on two cores they overlap, and with two workers two
    segments compress at once. At most ``max_inflight`` segments wait or are
    being stored, which bounds memory to ``1 + max_inflight`` segment buffers;
    buffers come back for reuse. Results are collected in submission order
    (``on_done`` runs in the caller's thread, so per-queue metadata stays in
    sequence order), and an error of a thread is re-raised unchanged by the
    next ``submit`` or by ``close``. One pipeline serves any number of
    ``SegmentWriter``s (one per queue), so the end of a queue does not stall.
    """

    def __init__(self, workers: int = 1, max_inflight: int = 2, initializer: Callable[[], None] | None = None):
        if workers < 1 or max_inflight < workers:
            raise ValueError("need workers >= 1 and max_inflight >= workers")
        self._max_inflight = max_inflight
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rbak-segment", initializer=initializer)
        self._inflight: deque[tuple[Future, Callable[[Any], None] | None]] = deque()
        self._free: deque[SegmentBuffer] = deque()
        self._stream_pools: list[ThreadPoolExecutor] = []

    def stream_pools(self) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
        """The thread writing streamed segments' stretches and the one hashing them (``SegmentStream``)."""
        if not self._stream_pools:
            self._stream_pools = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rbak-segment-{what}")
                                  for what in ("stream", "stream-sha")]
        return self._stream_pools[0], self._stream_pools[1]

    def _shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for pool in self._stream_pools:
            pool.shutdown(wait=True, cancel_futures=True)

    def take_buffer(self, max_bytes: int) -> SegmentBuffer:
        """A recycled buffer (pages already mapped) or a new one."""
        limit = HEADER_SIZE + max_bytes + FOOTER_SIZE
        while self._free:
            try:
                seg = self._free.popleft()
            except IndexError:
                break
            if seg.limit == limit:
                return seg
        return SegmentBuffer(max_bytes)

    def submit(self, fn: Callable[..., Any], seg: SegmentBuffer, *args: Any,
               on_done: Callable[[Any], None] | None = None) -> None:
        """Run ``fn(seg, *args)`` in a thread; ``seg`` is reused once that returns."""
        self._inflight.append((self._pool.submit(self._run, fn, seg, args), on_done))
        self._collect(self._max_inflight)

    def _collect(self, keep: int) -> None:
        q = self._inflight
        while q and (len(q) > keep or q[0][0].done()):
            fut, on_done = q.popleft()
            result = fut.result()
            if on_done is not None:
                on_done(result)

    def _run(self, fn: Callable[..., Any], seg: SegmentBuffer, args: tuple) -> Any:
        result = fn(seg, *args)
        if seg.recycle() and len(self._free) < self._max_inflight:
            self._free.append(seg)
        return result

    def close(self) -> None:
        """Wait for every segment; raises the first error of a thread."""
        try:
            self._collect(0)
        finally:
            self._shutdown()
            self._free.clear()

    def abort(self) -> None:
        """Drop segments not started yet; returns once no thread writes any more (the caller cleans up)."""
        for fut, _ in self._inflight:
            fut.cancel()
        self._inflight.clear()
        self._shutdown()
        self._free.clear()


class SegmentWriter:
    """Streams records into segments, rotating on size and age.

    ``sink`` stores each finished segment and returns its key; the writer
    returns that segment's SegmentMetadata from the ``append``/``flush`` call
    that finished it, so a caller can checkpoint exactly what is durable.
    Memory is bounded by ``max_bytes`` (one uncompressed payload).

    With a ``pipeline``, finished segments are stored by its background
    thread instead: ``append``/``flush`` then return nothing, and ``written``
    is complete (in sequence order) once the pipeline is closed.
    """

    def __init__(
        self,
        sink: SegmentSink,
        compression: Compression = Compression.ZSTD,
        level: int | None = None,
        max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES,
        max_interval_ms: int = DEFAULT_SEGMENT_MAX_INTERVAL_MS,
        first_sequence: int = 1,
        clock: Callable[[], float] = time.monotonic,
        pipeline: SegmentPipeline | None = None,
        spool: Callable[[int], Spool | None] | None = None,
    ):
        if max_bytes <= 0:
            raise ValueError("segment_max_bytes must be positive")
        self._sink = sink
        self.compression = compression
        self.level = check_level(compression, level)
        self.max_bytes = max_bytes
        self.max_interval_ms = max_interval_ms
        self.next_sequence = first_sequence
        self._clock = clock
        self._pipeline = pipeline
        # Segments written to their files as they grow (``SegmentStream``): only uncompressed ones (a
        # compressed payload exists only once the segment is complete), through a pipeline, with the
        # C helper (it writes records without growing a reserved buffer).
        streamable = pipeline is not None and compression is Compression.NONE and CAN_STREAM
        self._spool = spool if streamable else None
        self._seg = pipeline.take_buffer(max_bytes) if pipeline is not None else SegmentBuffer(max_bytes)
        self._started = 0.0
        self.written: list[SegmentMetadata] = []

    @property
    def pending_records(self) -> int:
        return self._seg.count

    @property
    def pending_bytes(self) -> int:
        return self._seg.payload_bytes

    def append(self, record: BackupRecord) -> SegmentMetadata | None:
        return self.append_encoded(encode_record(record), record.backed_up_at, len(record.body))

    def append_many(self, records: Sequence[BackupRecord]) -> list[SegmentMetadata]:
        """Append a batch (encoded on the fast path); rotation is checked after
        every record exactly as with ``append``, so segment boundaries match."""
        done = []
        for r, data in zip(records, encode_records(records)):
            meta = self.append_encoded(data, r.backed_up_at, len(r.body))
            if meta is not None:
                done.append(meta)
        return done

    def append_from(self, records: Sequence[BackupRecord], start: int = 0, expect: int | None = None) -> int:
        """Append ``records[start:]`` until the segment is full (``SegmentBuffer.add_from``), then
        finish it; returns the index of the first record not appended. For writers without an age
        limit (offline imports): the age is checked per call, not per record. The same segments as
        ``append_many``, and the bodies are written without the GIL, so a thread of its own running
        this overlaps with the thread decoding the records. ``expect``: how many records the caller
        will append from ``records[start]`` on, all with its timestamp, if it knows (a hint: a
        segment that starts here and holds them all is then hashed as it is written)."""
        seg = self._seg
        fresh = seg.count == 0
        if fresh:
            self._started = self._clock()
            if self._spool is not None and seg.stream is None and expect is not None:
                self._start_stream(seg)  # for a source that knows its count (see ``_start_stream``)
        try:
            nxt = seg.add_from(records, start, self.max_bytes)
        except BufferError:
            if seg.stream is None:
                raise
            seg.stream.drain()  # a record past the reserved size: the buffer grows once no stretch is writing
            nxt = seg.add_from(records, start, self.max_bytes)
        if seg.stream is not None:
            if fresh and expect is not None:
                self._guess_header(seg, expect)
            seg.stream.feed(seg)
        if seg.payload_bytes >= self.max_bytes or self.interval_elapsed():
            self.flush()
        return nxt

    def _stream_room(self) -> int:
        return HEADER_SIZE + self.max_bytes + FOOTER_SIZE + (1 << 20)

    def warm(self) -> None:
        """Map the pages of the segment buffer a streamed segment will fill (zeroed, GIL-free), for a
        thread that would otherwise wait (the import's encoder while the first records are decoded):
        faulting in 128 MiB costs about as much as writing it. Nothing for a buffer already warm."""
        seg = self._seg
        if self._spool is not None and seg.count == 0 and seg.stream is None:  # a spool: the C helper (``streamable``)
            seg.warm(self._stream_room())

    def _start_stream(self, seg: SegmentBuffer) -> None:
        """Only for records whose source knows how many are left (a quorum queue after its replay,
        decoded before the first record): their segments are written and hashed beside the encoding.
        A source decoding as it yields (a stream, a classic queue) keeps the whole-segment store:
        measured on an idle machine, the writes and their writeback then compete with its decoding
        for the cores and the import came out slower (stream 0.82x of the floor against 0.91x)."""
        # Called only with a spool, which is kept only with a pipeline and the C helper (``streamable``).
        assert self._spool is not None and self._pipeline is not None
        spool = self._spool(self.next_sequence)
        if spool is None:
            return
        seg.reserve(self._stream_room())  # room for a full segment: the buffer never grows under a view
        seg.stream = SegmentStream(spool, *self._pipeline.stream_pools())

    def _guess_header(self, seg: SegmentBuffer, expect: int) -> None:
        """After a segment's first records: if the ``expect`` records left seem to fit in it (at the
        size per record so far), it will end the queue, all with one timestamp: its header is known."""
        n = seg.count
        if n <= 0 or expect < n:
            return
        if expect > n and (seg.payload_bytes >= self.max_bytes or seg.payload_bytes / n * expect > self.max_bytes):
            return  # more segments to come: hashing as written would be wasted
        assert seg.stream is not None  # called for a segment being streamed
        try:
            seg.stream.guess(SegmentHeader(VERSION, self.compression, expect, seg.first_ts, seg.first_ts).pack())
        except struct.error:  # out of the header's range: the real header says what is wrong
            pass

    def append_encoded(self, record_json: bytes, backed_up_at: int, body_len: int = -1) -> SegmentMetadata | None:
        seg = self._seg
        if seg.count == 0:
            self._started = self._clock()
        if seg.stream is not None:
            seg.stream.drain()  # ``add`` may grow the buffer
        if seg.add(record_json, backed_up_at, body_len) >= self.max_bytes or self.interval_elapsed():
            return self.flush()
        return None

    def interval_elapsed(self) -> bool:
        return self._seg.count > 0 and (self._clock() - self._started) * 1000 >= self.max_interval_ms

    def flush(self) -> SegmentMetadata | None:
        """Finish the current segment, if it holds any record."""
        seg = self._seg
        if seg.count == 0:
            return None
        seq = self.next_sequence
        self.next_sequence += 1
        if self._pipeline is not None:
            self._pipeline.submit(store_segment, seg, seq, self.compression, self.level, self._sink,
                                  on_done=self.written.append)
            self._seg = self._pipeline.take_buffer(self.max_bytes)
            return None
        meta = store_segment(seg, seq, self.compression, self.level, self._sink)
        if not seg.recycle():
            self._seg = SegmentBuffer(self.max_bytes)
        self.written.append(meta)
        return meta
