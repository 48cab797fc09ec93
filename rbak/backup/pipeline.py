"""The stages a backed-up message passes, named: a read's intake, the record thread, the segment
writer and the segment store.

    queue_reader.read_queue / stream_reader.read_stream   (the delivery source: one broker connection)
      -> QueueIntake / StreamIntake    (counts, watches delivery counts, queues the delivery)
      -> record_thread.RecordThread    (builds and encodes records on an encoder thread)
      -> segments.AsyncSegmentWriter   (rotates segments, compresses, on its own thread)
      -> SegmentStore                  (seals with the run's codec and puts the object in storage)

Each stage is an object a reader can open; nothing is carried by closures.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from .. import metrics
from ..format.layout import BackupLayout
from ..storage.base import Storage
from . import cut_repair
from .convert import delivery_count

#: Metrics and progress events are updated every this many messages (a lock per message costs throughput).
STEP = 500


class SegmentStore:
    """The last stage: ``store(sequence, segment bytes)`` seals a finished segment with the run's codec,
    puts it under the queue's key and counts it. Called on the segment writer's thread; returns the
    key, or (key, stored bytes) when sealed (the manifest records the sealed object's size and hash)."""

    def __init__(self, storage: Storage, layout: BackupLayout, codec: Any, compression: Any, vhost: str, queue: str,
                 queue_type: str):
        self.storage, self.layout, self.codec, self.compression = storage, layout, codec, compression
        self.vhost, self.queue = vhost, queue
        self._segments = metrics.segments_written().labels(vhost=vhost, queue=queue, queue_type=queue_type)
        self._bytes = metrics.segment_bytes().labels(vhost=vhost, queue=queue, queue_type=queue_type)

    def __call__(self, sequence: int, data: memoryview) -> str | tuple[str, bytes | bytearray | memoryview]:
        key = self.layout.segment(self.vhost, self.queue, sequence, self.compression)
        stored = self.codec.put(self.storage, key, data)
        self._segments.inc()
        self._bytes.inc(len(stored))
        return (key, stored) if self.codec.encrypted else key


class ReadCounter:
    """A read's messages and bytes, reported to the metrics and as progress events every ``STEP``."""

    def __init__(self, progress: Callable[..., None], vhost: str, queue: str, queue_type: str, with_bytes: bool):
        self.progress, self.vhost, self.queue, self.with_bytes = progress, vhost, queue, with_bytes
        self._read = metrics.messages_read().labels(vhost=vhost, queue=queue, queue_type=queue_type)
        self._bytes = metrics.bytes_read().labels(vhost=vhost, queue=queue, queue_type=queue_type)
        self.count = 0
        self._pending_bytes = 0

    def add(self, nbytes: int) -> None:
        self.count += 1
        self._pending_bytes += nbytes
        if self.count % STEP == 0:
            self._report(STEP)

    def finish(self) -> None:
        """Report what the last step did not."""
        self._report(self.count % STEP)

    def _report(self, n: int) -> None:
        self._read.inc(n)
        self._bytes.inc(self._pending_bytes)
        extra = {"bytes": self._pending_bytes} if self.with_bytes else {}
        self.progress("advance", vhost=self.vhost, queue=self.queue, n=n, **extra)
        self._pending_bytes = 0


class QueueIntake:
    """Where a classic or quorum read's deliveries go (``read_queue``'s sink).

    Quorum deliveries are watched first: the highest ``x-delivery-count`` seen (and which message had
    it: the delivery guard records it) and the first ``cut_repair.PREFIX`` messages (what a cut's
    repair compares against). Then each delivery is queued for the record thread with the time it
    was taken."""

    def __init__(self, put: Callable[[tuple, Any, int], None], counter: ReadCounter, quorum: bool,
                 describe: Callable[[int, Any], str]):
        self.put, self.counter, self.quorum, self.describe = put, counter, quorum, describe
        self.taken = cut_repair.Taken()
        self.max_count = 0
        self.nearest = ""  # the message with the highest x-delivery-count
        self.stopped = 0  # 1: the read stopped at a message at its limit (taken, and given back)

    def __call__(self, method: Any, props: Any, body: bytes) -> None:
        n = self.counter.count
        if self.quorum:
            self.taken.see(n, method.delivery_tag, props, body)
            c = delivery_count(props)
            if c > self.max_count or not self.nearest:
                self.max_count, self.nearest = c, self.describe(n + 1, props)
        self.put((method, props, body, int(time.time() * 1000)), None, len(body))
        self.counter.add(len(body))


class StreamIntake:
    """Where a stream read's deliveries go (``read_stream``'s sink).

    The first delivery's offset is handed to ``on_first`` (a later one than asked means retention
    removed the ones between: a gap in the chain); the last is kept (the next backup's link); each
    is queued with its offset, which tags its segment: once the segment is stored, that offset is
    the checkpoint's position."""

    def __init__(self, put: Callable[[tuple, Any, int], None], counter: ReadCounter,
                 on_first: Callable[[int], None], throttle: Callable[[int], None] | None):
        self.put, self.counter, self.on_first, self.throttle = put, counter, on_first, throttle
        self.last: tuple[bytes, Any] | None = None

    def __call__(self, method: Any, props: Any, body: bytes, offset: int) -> None:
        if self.counter.count == 0:
            self.on_first(offset)
        self.put((method, props, body, int(time.time() * 1000), offset), offset, len(body))
        self.counter.add(len(body))
        self.last = (body, props)
        if self.throttle is not None:
            self.throttle(self.counter.count)
