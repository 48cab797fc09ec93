"""One stream followed without end: the backup's read, record and segment stages, flushed on each tick.

A follower reads its stream by offset (``broker.stream_reader.read_stream`` with ``on_idle``, on
its own connection and thread), hands each delivery to the backup's ``RecordThread`` and
``AsyncSegmentWriter`` (the same records, the same segments, stored by the same ``SegmentStore``),
and closes its open segment whenever the archiver asks (a tick). What it reports is only what the
storage holds: ``on_durable`` moves its durable position, never the read.

Each record's ``backed_up_at`` is when the follower read it, as in a backup (non-decreasing; over
AMQP 0-9-1 none of 3.10.8, 4.0.5 and 4.3.6 sends ``x-stream-chunk-timestamp``, measured; a broker
that does gives the chunk's time instead). A caught-up follower reads a record milliseconds after
it is committed, so a point-in-time restore selects records by about when they were published; one
catching up stamps them late, never early.

When the follower has had no delivery for a moment and the archiver asks, it probes the stream's
committed end over the stream protocol (``broker.stream_end``): an end it has already made
durable proves the stream complete up to the instant of the probe, so an idle stream's
recovery point advances with no data written.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..backup.convert import BROKER_HEADERS, to_record
from ..backup.record_thread import RecordThread
from ..backup.segments import AsyncSegmentWriter
from ..backup.stream_chain import NON_MESSAGE_SLACK, ChainDecision
from ..broker.connect import connect
from ..broker.stream_end import probe_end
from ..broker.stream_reader import chunk_timestamp, read_stream
from ..config import ConnectionConfig
from ..errors import AmqpError
from ..format.manifest import SegmentMetadata, StreamGap, StreamInfo

log = logging.getLogger(__name__)

IDLE_SECS = 0.2  # how often a quiet read looks at the archiver's requests
QUIET_SECS = 0.5  # no delivery for this long: the stream's end is probed before a tick
UNSETTLED_MARGIN_MS = 500  # a probe that cannot rule out a chunk in flight proves a little less


class _Stop(Exception):
    """The archiver is stopping: leave the read (what was read is flushed)."""


@dataclass(slots=True)
class Durable:
    """What the storage holds of the stream (the segments not yet named by a tick are in ``segments``)."""

    last_offset: int | None
    last_sha256: str | None
    last_chunk_timestamp: int | None
    last_ts: int | None  # the last durable record's backed_up_at
    next_sequence: int = 1


@dataclass(slots=True)
class FlushAnswer:
    """A follower's answer to flush request ``seq``: everything read up to ``target`` was handed to
    the segment writer; ``probe``: (instant ms, committed end or None, margin ms) when it was quiet."""

    seq: int
    target: int | None
    probe: tuple[int, int | None, int] | None


class StreamFollower:
    def __init__(self, source: ConnectionConfig, vhost: str, name: str, decision: ChainDecision, durable: Durable,
                 writer: Callable[[str, str, int, Callable[[SegmentMetadata, Any], None]], AsyncSegmentWriter],
                 prefetch: int, conn_name: str, on_bytes: Callable[[int, int], None] | None = None):
        self.source, self.vhost, self.name = source, vhost, name
        self.decision = decision
        self.durable = durable
        self._writer = writer
        self.prefetch = prefetch
        self.conn_name = conn_name
        self.on_bytes = on_bytes
        self.lock = threading.Lock()
        self.new_segments: list[SegmentMetadata] = []
        self.received: int | None = durable.last_offset
        self.last_delivery = 0.0
        self._last_ts = durable.last_ts or 0
        self._first = True
        self.flush_request = 0
        self.answer: FlushAnswer | None = None
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.done = threading.Event()
        self._thread: threading.Thread | None = None
        self._rt: RecordThread | None = None
        self._conn: Any = None
        self.records = 0

    @property
    def where(self) -> str:
        return f"stream {self.name!r} in vhost {self.vhost!r}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"rbak-archive {self.vhost}/{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def pending(self) -> bool:
        """Records read but not yet named by a tick (or segments durable but not taken)."""
        with self.lock:
            return bool(self.new_segments) or self.received != self.durable.last_offset

    def take(self) -> tuple[list[SegmentMetadata], Durable]:
        """The segments made durable since the last take, and the durable position they end at."""
        with self.lock:
            segs, self.new_segments = self.new_segments, []
            return segs, replace(self.durable)

    # -- the follower's thread ----------------------------------------------------------------
    def _run(self) -> None:
        rt = None
        error: BaseException | None = None
        try:
            self._conn = connect(self.source, self.vhost, name=self.conn_name)
            rt = self._rt = RecordThread(self._writer(self.vhost, self.name, self.durable.next_sequence,
                                                      self._on_durable), self._build)
            read_stream(self._conn, self.vhost, self.name, self.decision.start, self._sink, prefetch=self.prefetch,
                        idle_secs=IDLE_SECS, on_idle=self._idle)
            if not self.stopping.is_set():
                error = AmqpError(f"{self.where}: the broker cancelled the archive's consumer (the stream was "
                                  "deleted, or its leader moved)")
        except _Stop:
            pass
        except BaseException as e:  # noqa: BLE001 - reported to the archiver, which starts again from storage
            error = e
        try:
            if rt is not None:
                rt.close()  # what was read is good whatever ended the read: stored before the thread ends
        except BaseException as e:  # noqa: BLE001
            error = error or e
            rt.abort()  # type: ignore[union-attr]
        try:
            self.error = error
        finally:
            if self._conn is not None:
                try:
                    self._conn.close()
                except Exception:  # noqa: BLE001
                    pass
            self.done.set()

    def _build(self, d: tuple) -> Any:
        return to_record(d[0], d[1], d[2], self.vhost, self.name, d[3], BROKER_HEADERS, stream_offset=d[4])

    def _sink(self, method: Any, props: Any, body: bytes, offset: int) -> None:
        chunk_ts = chunk_timestamp(props)
        ts = max(chunk_ts if chunk_ts is not None else int(time.time() * 1000), self._last_ts)
        if self._first:
            self._first = False
            self._first_record(offset, ts)
        self._last_ts = ts
        assert self._rt is not None
        self._rt.put((method, props, body, ts, offset), (offset, ts, body, chunk_ts), len(body))
        self.received = offset
        self.records += 1
        self.last_delivery = time.monotonic()
        if self.on_bytes is not None:
            self.on_bytes(1, len(body))
        self._serve(quiet=False)

    def _first_record(self, offset: int, ts: int) -> None:
        """A later first offset than asked: the stream's retention removed the ones between (a gap)."""
        d, start = self.decision, self.decision.start
        if d.first_offset is None and offset >= 0:
            d.first_offset = offset
        if isinstance(start, int) and offset - start > NON_MESSAGE_SLACK:
            gap = StreamGap(start, offset - 1, self.durable.last_ts, ts)
            with self.lock:
                d.gaps.append(gap)
            log.warning("%s: offsets %d..%d (at most %d message(s)) were removed by the stream's retention before "
                        "the archive read them; recorded as a gap", self.where, start, offset - 1, gap.count)

    def _idle(self) -> bool:
        self._serve(quiet=time.monotonic() - self.last_delivery >= QUIET_SECS)
        return True

    def _serve(self, quiet: bool) -> None:
        """Answer the archiver's flush request, if a new one came; leave when it stops."""
        if self.stopping.is_set():
            raise _Stop()
        seq = self.flush_request
        if self.answer is not None and self.answer.seq >= seq:
            return
        assert self._rt is not None
        target = self.received
        self._rt.flush()
        probe = None
        if quiet:
            at = int(time.time() * 1000)
            end = probe_end(self.source, self._conn, self.vhost, self.name, settled=True)
            margin = 0
            if end is None:  # a chunk may be in flight (or 3.10, which cannot say): the unsettled end
                end = probe_end(self.source, self._conn, self.vhost, self.name)
                margin = UNSETTLED_MARGIN_MS
            probe = (at, end, margin)
        self.answer = FlushAnswer(seq, target, probe)

    def _on_durable(self, meta: SegmentMetadata, tag: Any) -> None:
        """On the segment thread, once a segment is stored: the durable position moves."""
        offset, ts, body, chunk_ts = tag
        sha = hashlib.sha256(body).hexdigest()
        with self.lock:
            self.new_segments.append(meta)
            self.durable = Durable(offset, sha, chunk_ts, ts, meta.sequence + 1)

    def stream_info(self, durable: Durable) -> StreamInfo:
        """The manifest's ``stream`` record for what is durable (the chain decision's link, gaps so far)."""
        return stream_info(self.decision, durable, self.lock)


def stream_info(d: ChainDecision, durable: Durable, lock: threading.Lock | None = None) -> StreamInfo:
    """A stream's ``stream`` record: its chain decision (link, gaps) and what is durable of it."""
    if lock is not None:
        with lock:
            gaps = list(d.gaps)
    else:
        gaps = list(d.gaps)
    stored = durable.next_sequence > 1  # a segment of this generation is durable
    return StreamInfo(first_offset=d.first_offset if stored else None, last_offset=durable.last_offset,
                      previous_backup=d.previous_backup, previous_last_offset=d.previous_last_offset,
                      last_record_sha256=durable.last_sha256, last_chunk_timestamp=durable.last_chunk_timestamp,
                      recreated=d.recreated, gaps=gaps)
