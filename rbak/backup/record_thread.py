"""Building and encoding a backup's records off the thread that runs pika (issue 20).

pika's frame decoding holds the GIL for about 22-25 us per 1 KiB message; rbak's
own work per message (the record, its JSON, the copy into fresh segment memory)
was another ~10 us on that same thread, which the bare readers the benchmarks
compare with do not pay. Here the reading thread only hands each delivery
(already taken, its delivery-limit checks done) to a bounded queue, in batches;
one encoder thread builds the records and appends them with
``SegmentBuffer.add_from``, whose C code writes the bodies' JSON (most of the
bytes) and touches the new segment memory with the GIL released, so it runs on
the other core while pika decodes the next frames.

Nothing about what is written changes: the records are built by the same
``build`` in the same order, ``add_from`` writes the same bytes as
``encode_record`` + ``add`` (the format tests check that), and segments rotate on
the same rules (size after each record, age measured when the reading thread
took the record). At most ``max_batches`` batches of ``batch`` deliveries (or
``batch_bytes`` of bodies) wait, so memory stays bounded; a full queue makes the reader wait, which is TCP
back-pressure on the broker, not a loss. A short queue (fewer than ``batch``
messages) never starts the thread: it is encoded at ``close`` on the caller's
thread, so a many-queue backup pays no thread per queue.

An error of the encoder thread (a record that cannot be encoded, a storage
failure of the segment thread behind it) is raised unchanged by the reading
thread's next ``put`` or by ``close``, so the read fails and every message goes
back, as when the encoding ran in the sink.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from ..format.manifest import SegmentMetadata
from .segments import AsyncSegmentWriter
from .stages import RecordBuilder

#: Deliveries per hand-off: ~50 ms of pika's work, so the encoder thread needs the GIL a few times
#: per batch, not per message. Every time it takes the GIL, the reading thread, which gives the GIL
#: up at each socket read, has to get it back, and on a loaded machine each such hand-over waits for
#: the scheduler too (256 per batch was measurably slower than reading and encoding on one thread for
#: streams on 3.10.8 at load 4-5, 16:16 UTC).
BATCH = 2048
#: ... or fewer when their bodies reach this many bytes (large messages).
BATCH_BYTES = 4 << 20
#: Batches that may wait for the encoder thread. Memory bound: MAX_BATCHES + 2 batches (those queued,
#: the one being encoded, the one filling) of at most BATCH deliveries or BATCH_BYTES (+ one message).
MAX_BATCHES = 2
#: Encode on a thread of its own (False: the same batches, encoded on the reading thread).
THREADED = True

_STOP = None
_FLUSH = ("flush",)  # a marker batch: close the open segment (``flush``)


class RecordThread:
    """``put(item, backed_up_at, tag)`` on the reading thread; records built by ``build(item)`` reach
    ``writer`` in order on one encoder thread. ``tag`` of a segment's last record reaches
    ``on_durable`` as with ``AsyncSegmentWriter.append_encoded``."""

    def __init__(self, writer: AsyncSegmentWriter, build: RecordBuilder, batch: int = BATCH,
                 max_batches: int = MAX_BATCHES, batch_bytes: int = BATCH_BYTES, threaded: bool | None = None):
        self.writer = writer
        self._build = build
        self._batch_size = max(1, batch)
        self._batch_bytes = batch_bytes
        self._bytes = 0
        self._items: list[tuple] = []
        self._arrivals: list[float] = []
        self._tags: list[Any] = []
        self._queue: queue.Queue = queue.Queue(max(1, max_batches))
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._dropping = False  # abort(): batches still queued are thrown away
        self._threaded = THREADED if threaded is None else threaded

    @property
    def next_sequence(self) -> int:
        return self.writer.next_sequence

    def put(self, item: tuple, tag: Any = None, size: int = 0) -> None:
        """Queue one delivery of ``size`` body bytes (the reading thread). Raises the encoder thread's
        error, if any."""
        self._items.append(item)
        self._arrivals.append(time.monotonic())
        self._tags.append(tag)
        self._bytes += size
        if len(self._items) >= self._batch_size or self._bytes >= self._batch_bytes:
            self._hand_off()

    def _hand_off(self) -> None:
        if self._error is not None:
            raise self._error
        batch = (self._items, self._arrivals, self._tags)
        self._items, self._arrivals, self._tags = [], [], []
        self._bytes = 0
        if not self._threaded:
            self._encode(batch)  # on the reading thread, a batch at a time
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rbak-encode", daemon=True)
            self._thread.start()
        self._queue.put(batch)

    def _run(self) -> None:
        get = self._queue.get
        while True:
            batch = get()
            if batch is _STOP:
                return
            if self._error is not None or self._dropping:
                continue  # keep draining: the reading thread must never wait on a dead consumer
            try:
                if batch is _FLUSH:
                    self.writer.flush()
                    continue
                self._encode(batch)
            except BaseException as e:  # noqa: BLE001 - re-raised on the reading thread
                self._error = e

    def _encode(self, batch: tuple[list, list, list]) -> None:
        items, arrivals, tags = batch
        build = self._build
        self.writer.append_records([build(it) for it in items], arrivals, tags)

    def flush(self) -> None:
        """Encode what is queued and close the open segment now, in order (a continuous read's tick:
        ``rbak archive``); the segment is stored behind, and reaches ``on_durable`` as any other.
        Raises the encoder thread's error, if any."""
        if self._error is not None:
            raise self._error
        if self._items:
            self._hand_off()
        if self._thread is None:
            self.writer.flush()
        else:
            self._queue.put(_FLUSH)

    def close(self) -> list[SegmentMetadata]:
        """Encode what is left, wait for the encoder thread, then close the writer: every segment's
        metadata in sequence order. Raises the first error of either thread."""
        try:
            if self._thread is None:
                if self._items:  # a short queue: encoded here, no thread started
                    batch = (self._items, self._arrivals, self._tags)
                    self._items, self._arrivals, self._tags = [], [], []
                    self._encode(batch)
            else:
                if self._items:
                    self._hand_off()
                self._join()
                if self._error is not None:
                    raise self._error
        except BaseException:
            self.abort()
            raise
        return self.writer.close()

    def _join(self) -> None:
        t = self._thread
        if t is not None:
            self._queue.put(_STOP)
            t.join()
            self._thread = None

    def abort(self) -> None:
        """Stop encoding (the read failed): queued batches are dropped, then the writer aborts."""
        self._dropping = True
        self._items, self._arrivals, self._tags = [], [], []
        try:
            self._join()
        finally:
            self.writer.abort()
