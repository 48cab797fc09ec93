"""Segment writing off the reading thread: compress + store in a background thread.

The reader thread only encodes records (Python); zstd/lz4 compression and the
storage ``put`` (fsync, S3 upload) release the GIL, so on two cores they run
beside the AMQP read instead of after it. At most ``max_inflight`` finished
segments wait for the writer, so memory stays bounded by
``(1 + max_inflight) * segment_max_bytes``. The frame is the core's
``frame_segment``; rotation rules are ``SegmentWriter``'s (size and age).
"""

from __future__ import annotations

import struct
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from ..format.compression import Compression, check_level
from ..format.manifest import SegmentMetadata
from ..format.segment import frame_segment, sha256_hex

_LEN = struct.Struct("<I")


def _lower_priority() -> None:
    """Compression yields the CPU to the AMQP read (and a broker on the same host): the read is
    what holds the source's messages, so it goes first; ``max_inflight`` stops the writer from
    falling behind by more than two segments."""
    try:
        import os
        import threading

        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # Linux: per-thread nice
    except (AttributeError, OSError):
        pass


class AsyncSegmentWriter:
    def __init__(self, sink: Callable[[int, bytes], str], compression: Compression, level: int | None,
                 max_bytes: int, max_interval_ms: int, first_sequence: int = 1,
                 on_durable: Callable[[SegmentMetadata, Any], None] | None = None, max_inflight: int = 2):
        self._sink = sink
        self.compression = compression
        self.level = check_level(compression, level)
        self.max_bytes = max_bytes
        self.max_interval_ms = max_interval_ms
        self.next_sequence = first_sequence
        self._on_durable = on_durable
        self._max_inflight = max_inflight
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rbak-segment", initializer=_lower_priority)
        self._inflight: deque[Future] = deque()
        self.written: list[SegmentMetadata] = []
        self._buf = bytearray()
        self._count = 0
        self._first = self._last = 0
        self._started = 0.0
        self._tag: Any = None

    def append_encoded(self, data: bytes, backed_up_at: int, tag: Any = None) -> None:
        """Add one record's JSON; ``tag`` (e.g. a stream offset) of a segment's last record reaches on_durable."""
        if self._count == 0:
            self._first = backed_up_at
            self._started = time.monotonic()
        self._buf += _LEN.pack(len(data))
        self._buf += data
        self._last = backed_up_at
        self._count += 1
        self._tag = tag
        if len(self._buf) >= self.max_bytes or (time.monotonic() - self._started) * 1000 >= self.max_interval_ms:
            self._submit()

    def _submit(self) -> None:
        if self._count == 0:
            return
        args = (bytes(self._buf), self._count, self._first, self._last, self.next_sequence, self._tag)
        self.next_sequence += 1
        self._buf = bytearray()
        self._count = 0
        self._inflight.append(self._pool.submit(self._finish, *args))
        while len(self._inflight) > self._max_inflight:
            self.written.append(self._inflight.popleft().result())
        while self._inflight and self._inflight[0].done():
            self.written.append(self._inflight.popleft().result())

    def _finish(self, payload: bytes, count: int, first: int, last: int, seq: int, tag: Any) -> SegmentMetadata:
        data = frame_segment(payload, count, first, last, self.compression, self.level)
        key = self._sink(seq, data)
        meta = SegmentMetadata(key=key, sequence=seq, record_count=count, size_bytes=len(data),
                               uncompressed_bytes=len(payload), first_timestamp=first, last_timestamp=last,
                               checksum=sha256_hex(data))
        if self._on_durable is not None:
            self._on_durable(meta, tag)
        return meta

    def close(self) -> list[SegmentMetadata]:
        """Write the last segment, wait for all; every segment's metadata in sequence order."""
        try:
            self._submit()
            while self._inflight:
                self.written.append(self._inflight.popleft().result())
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        return self.written

    def abort(self) -> None:
        """Drop what is not written yet (the caller failed); waits for the segment being written."""
        for f in self._inflight:
            f.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
