"""RBAK segment files: 32-byte header, compressed payload, 8-byte footer.

Layout and the reading/writing steps are those of ``segment-format.md``.
Every check the spec lists raises ``SegmentError`` naming the storage key,
so a damaged file is never a traceback and never a silent wrong answer.
"""

from __future__ import annotations

import hashlib
import struct
import sys
import threading
import time
import zlib
from collections import deque
from itertools import islice
from operator import attrgetter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from ..errors import CompressionError, SegmentError, SerializationError
from ..storage.base import Spool
from .compression import Compression, check_level, compress, decompress
from .manifest import SegmentMetadata
from .backend import speedups as _speedups
from .batch import decode_payload_records, decode_records, encode_payload, encode_records
from .record import BackupRecord, encode_record

MAGIC = b"RBAK"
END_MAGIC = b"KABR"
VERSION = 1
HEADER_SIZE = 32
FOOTER_SIZE = 8
MIN_SEGMENT_SIZE = HEADER_SIZE + FOOTER_SIZE

_HEADER = struct.Struct("<4sBBxxQqq")
_FOOTER = struct.Struct("<I4s")
_LEN = struct.Struct("<I")
_BODY = attrgetter("body")
_append_payload = getattr(_speedups, "append_payload", None)  # None: pure Python (RBAK_SPEEDUPS=0, no C helper)
_crc32_combine = getattr(_speedups, "crc32_combine", None)
if _crc32_combine is None:
    _append_payload = None  # an older helper: the running CRC needs both
_reserve = getattr(_speedups, "reserve", None) if _append_payload is not None else None

DEFAULT_SEGMENT_MAX_BYTES = 128 * 1024 * 1024
DEFAULT_SEGMENT_MAX_INTERVAL_MS = 60_000


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    version: int
    compression: Compression
    record_count: int
    first_timestamp: int
    last_timestamp: int

    def pack(self) -> bytes:
        return _HEADER.pack(
            MAGIC, self.version, int(self.compression), self.record_count,
            self.first_timestamp, self.last_timestamp,
        )

    def overlaps(self, start_ms: int | None, end_ms: int | None) -> bool:
        """Whether any record of this segment can fall in [start, end] (PITR)."""
        if self.record_count == 0:
            return False
        if start_ms is not None and self.last_timestamp < start_ms:
            return False
        if end_ms is not None and self.first_timestamp > end_ms:
            return False
        return True


def segment_file_name(sequence: int, compression: Compression) -> str:
    """``segment-0001.zst``: four digits at least (more past 9999, as Rust's ``{:04}``)."""
    if sequence < 1:
        raise ValueError(f"segment sequence numbers start at 1, got {sequence}")
    return f"segment-{sequence:04d}{compression.extension}"


# --------------------------------------------------------------------------
# Reading.
# --------------------------------------------------------------------------


def read_header(data: bytes | memoryview, key: str = "<segment>") -> SegmentHeader:
    """Parse the header only (works on the first 32 bytes alone; no decompression)."""
    if len(data) < HEADER_SIZE:
        raise SegmentError(key, f"too short for a header: {len(data)} bytes, need {HEADER_SIZE}")
    magic, version, comp, count, first, last = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise SegmentError(key, f"bad start magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise SegmentError(key, f"unknown format version {version} (this rbak reads version {VERSION})")
    try:
        compression = Compression(comp)
    except ValueError:
        raise SegmentError(key, f"unknown compression type {comp}") from None
    return SegmentHeader(version, compression, count, first, last)


def verify_frame(data: bytes | memoryview, key: str = "<segment>") -> SegmentHeader:
    """Steps 2-6 of the spec: size, both magics, CRC32, header."""
    n = len(data)
    if n < MIN_SEGMENT_SIZE:
        raise SegmentError(key, f"too short: {n} bytes, a segment has at least {MIN_SEGMENT_SIZE}")
    if data[:4] != MAGIC:
        raise SegmentError(key, f"bad start magic {bytes(data[:4])!r}, expected {MAGIC!r}")
    stored_crc, end_magic = _FOOTER.unpack_from(data, n - FOOTER_SIZE)
    if end_magic != END_MAGIC:
        raise SegmentError(key, f"bad end magic {bytes(end_magic)!r}, expected {END_MAGIC!r} (truncated?)")
    actual_crc = zlib.crc32(memoryview(data)[: n - FOOTER_SIZE])
    if actual_crc != stored_crc:
        raise SegmentError(key, f"CRC32 mismatch: stored {stored_crc:#010x}, computed {actual_crc:#010x}")
    return read_header(data, key)


def iter_payload(payload: bytes | memoryview, key: str = "<segment>") -> Iterator[memoryview]:
    """Yield each record's JSON bytes from a decompressed payload."""
    mv = memoryview(payload)
    n = len(mv)
    pos = 0
    unpack = _LEN.unpack_from
    while pos < n:
        if pos + 4 > n:
            raise SegmentError(key, f"truncated record length at byte {pos} of the payload")
        (length,) = unpack(mv, pos)
        start = pos + 4
        end = start + length
        if end > n:
            raise SegmentError(
                key, f"truncated record at byte {pos} of the payload: needs {length} bytes, {n - start} left"
            )
        yield mv[start:end]
        pos = end


def decode_payload(payload: bytes | memoryview, key: str = "<segment>") -> list[BackupRecord]:
    """Records of a decompressed payload (batched fast path, see ``batch``)."""
    try:
        records = decode_payload_records(payload)
        if records is not None:
            return records
        return decode_records(list(iter_payload(payload, key)))
    except SerializationError as e:
        raise SegmentError(key, f"does not decode: {e.args[0]}") from None


@dataclass(slots=True)
class Segment:
    header: SegmentHeader
    records: list[BackupRecord]
    uncompressed_bytes: int


def decode_segment(data: bytes | memoryview, key: str = "<segment>") -> Segment:
    """Every step of the spec's 'Reading a Segment'."""
    header = verify_frame(data, key)
    payload = memoryview(data)[HEADER_SIZE : len(data) - FOOTER_SIZE]
    try:
        raw = decompress(payload, header.compression)
    except CompressionError as e:
        raise SegmentError(key, e.args[0]) from None
    records = decode_payload(raw, key)
    if len(records) != header.record_count:
        raise SegmentError(
            key, f"record count mismatch: header says {header.record_count}, payload holds {len(records)}"
        )
    return Segment(header, records, len(raw))


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------
# Writing.
# --------------------------------------------------------------------------


def frame_segment(
    payload: bytes | memoryview, record_count: int, first_ts: int, last_ts: int,
    compression: Compression, level: int | None = None,
) -> bytes:
    """Steps 3-7 of 'Writing a Segment': compress, header, CRC32, end magic.

    One copy of the (compressed) payload: the CRC is chained over the parts.
    ``SegmentWriter`` frames in place instead (``SegmentBuffer.frame``).
    """
    header = SegmentHeader(VERSION, compression, record_count, first_ts, last_ts).pack()
    body = payload if compression is Compression.NONE else compress(payload, compression, level)
    crc = zlib.crc32(body, zlib.crc32(header))
    return b"".join((header, body, _FOOTER.pack(crc, END_MAGIC)))


def encode_segment(
    records: Sequence[BackupRecord], compression: Compression = Compression.ZSTD, level: int | None = None
) -> bytes:
    """A whole segment from records in memory (batched fast path)."""
    records = list(records)
    payload = encode_payload(records)
    first = records[0].backed_up_at if records else 0
    last = records[-1].backed_up_at if records else 0
    return frame_segment(payload, len(records), first, last, compression, level)


SegmentSink = Callable[[int, memoryview], "str | tuple[str, bytes | bytearray | memoryview]"]
"""Stores a finished segment: (sequence, file bytes) -> storage key, or (key, bytes stored) when the
sink stored something else (an encrypted backup's sealed object: the manifest describes what is stored).

``data`` is a read-only-by-convention memoryview of the writer's buffer. A sink
may keep it (the buffer is then never reused), but one that stores it for long
should copy it (``bytes(data)``) so the whole buffer is not kept alive.
"""


class SegmentBuffer:
    """One segment being built in a single ``bytearray``.

    Records are copied in once, after 32 bytes left free for the header;
    ``frame`` compresses into the same buffer, writes header and footer in
    place and returns a view of the finished file. So an uncompressed segment
    costs one copy per record and none per segment (the old path made four
    full copies, and the fresh memory each needed cost as much as the copy).
    ``recycle`` reuses the buffer for the next segment, which keeps its pages
    warm, but only when nobody kept a view of it: a sink that holds on to its
    ``data`` never sees it change.
    """

    __slots__ = ("_buf", "end", "count", "first_ts", "last_ts", "_limit", "_payload_crc", "stream", "max_body")

    def __init__(self, max_bytes: int):
        self._limit = HEADER_SIZE + max_bytes + FOOTER_SIZE
        self._buf = bytearray(HEADER_SIZE)  # grows as records arrive; its length is the high-water mark
        self.end = HEADER_SIZE  # one past the last payload byte
        self.count = 0
        self.first_ts = 0
        self.last_ts = 0
        self._payload_crc: int | None = 0  # CRC-32 of the payload so far when only add_from wrote it
        self.stream: SegmentStream | None = None  # the file this segment is written to as it grows
        self.max_body = 0  # the largest record body so far (the manifest's max_body_bytes); -1: not known

    @property
    def payload_bytes(self) -> int:
        return self.end - HEADER_SIZE

    def add(self, record_json: bytes | memoryview, backed_up_at: int, body_len: int = -1) -> int:
        """Append one record ([u32 LE length][JSON]); returns the payload size so far. ``body_len``: its
        body's length (-1: not told, and the segment's largest body is then not known)."""
        pos = self.end
        start = pos + 4
        end = start + len(record_json)
        buf = self._buf
        # Within the high-water mark a plain memcpy into warm pages; past it the
        # bytearray grows by itself (amortised, no zero-filling first).
        buf[pos:start] = _LEN.pack(len(record_json))
        buf[start:end] = record_json
        self.end = end
        self._payload_crc = None  # frame() computes it
        if body_len < 0 or self.max_body < 0:
            self.max_body = -1
        elif body_len > self.max_body:
            self.max_body = body_len
        if self.count == 0:
            self.first_ts = backed_up_at
        self.last_ts = backed_up_at
        self.count += 1
        return end - HEADER_SIZE

    def add_from(self, records: Sequence[BackupRecord], start: int, max_bytes: int, crc: bool = True) -> int:
        """Append ``records[start:]`` until the payload reaches ``max_bytes`` (the record that gets
        it there included, as with ``add``); returns the index of the first record not appended
        (at least one is). The C helper writes them straight into the buffer, the bodies with the
        GIL released; without it, or for a record only orjson encodes, one record via ``add``.
        Same bytes either way. ``crc`` False: a segment that will be compressed, whose CRC covers
        the compressed bytes, so the payload's running CRC (~1 GB/s, as long as the writing) is skipped."""
        if _append_payload is not None:
            if not crc:
                self._payload_crc = None  # frame() checksums what it writes
            pcrc = self._payload_crc
            nxt, end, pcrc = _append_payload(self._buf, self.end, records, start, HEADER_SIZE + max_bytes,
                                             pcrc or 0, pcrc is not None)
            if nxt > start:
                if self.max_body >= 0:
                    self.max_body = max(self.max_body, max(map(len, map(_BODY, islice(records, start, nxt)))))
                if self._payload_crc is not None:
                    self._payload_crc = pcrc  # written and checksummed in the same GIL-free pass
                if self.count == 0:
                    self.first_ts = records[start].backed_up_at
                self.last_ts = records[nxt - 1].backed_up_at
                self.count += nxt - start
                self.end = end
                return nxt
        r = records[start]
        self.add(encode_records([r])[0], r.backed_up_at, len(r.body))
        return start + 1

    def frame(self, compression: Compression, level: int | None = None) -> memoryview:
        """Finish the file in place (header, compressed payload, CRC32, end magic); a view of it."""
        n = self.end
        if compression is not Compression.NONE:
            with memoryview(self._buf) as mv:
                with mv[HEADER_SIZE:n] as payload:
                    packed = compress(payload, compression, level)
            n = HEADER_SIZE + len(packed)
            self._buf[HEADER_SIZE:n] = packed  # grows the buffer if the payload did not compress
            del packed
        buf = self._buf
        _HEADER.pack_into(buf, 0, MAGIC, VERSION, int(compression), self.count, self.first_ts, self.last_ts)
        if compression is Compression.NONE and self._payload_crc is not None:
            # the payload's CRC was taken as add_from wrote it: join the header's to it
            assert _crc32_combine is not None  # only the C helper's add_from keeps the payload's CRC
            crc = _crc32_combine(zlib.crc32(buf[:HEADER_SIZE]), self._payload_crc, n - HEADER_SIZE)
        else:
            with memoryview(buf) as mv, mv[:n] as body:
                crc = zlib.crc32(body)
        buf[n : n + FOOTER_SIZE] = _FOOTER.pack(crc, END_MAGIC)  # no view alive: may grow
        with memoryview(buf) as mv:
            return mv[: n + FOOTER_SIZE]

    def recycle(self) -> bool:
        """Empty the buffer for the next segment, if no view of it is alive anywhere.

        False when someone kept the framed view (or the buffer): then this
        buffer must not be written again, and the caller takes a new one.
        """
        buf = self._buf
        if len(buf) > 2 * self._limit or sys.getrefcount(buf) > 3:  # self._buf, buf, the argument
            return False
        try:
            del buf[-1:]  # any live export (a kept memoryview) refuses a resize
        except BufferError:
            return False
        buf.append(0)  # back to the same size: no reallocation (minor resizes keep the block)
        self.end = HEADER_SIZE
        self.count = 0
        self._payload_crc = 0
        self.stream = None
        self.max_body = 0
        return True


#: A streamed segment hands its new bytes to its file once this many have gathered.
STREAM_CHUNK_BYTES = 8 << 20


def _write_chunk(spool: Spool, view: memoryview, offset: int) -> None:
    try:
        spool.write_at(view, offset)
    finally:
        view.release()  # the buffer may grow again once no chunk holds a view of it


def _hash_chunk(sha: Any, view: memoryview) -> None:
    try:
        sha.update(view)  # in order: one thread hashes every stretch
    finally:
        view.release()


class SegmentStream:
    """A segment written to its file while it is still being built (``Storage.open_spool``).

    The writer's thread hands each new stretch of the payload to one background thread, which
    writes it at its place in the file (GIL-free), so the write, and the disk's writeback the
    spool starts, overlap with the encoding of the records after it; finishing the segment
    leaves only the header, the last stretch and the footer to write. The buffer must not grow
    while a stretch is being written (a bytearray with a live view cannot be resized), so the
    writer reserves the segment's size first and ``drain``s before any growth past it. The
    file's bytes are the buffer's, so the segment is the same as one stored whole.

    The SHA-256 of the file starts with its header, known only once the segment is complete. When
    the writer can tell what the header will be (``guess``: the rest of a queue whose importer
    knows its count, one timestamp, and the rest seems to fit), the stretches are hashed as they
    are written (by a second thread, beside the write); ``finish_hash`` uses that hash only if
    the real header is the guessed one, else the segment is hashed whole as any other (``None``)."""

    __slots__ = ("spool", "done", "_pool", "_hash_pool", "_jobs", "_guess", "_sha")

    def __init__(self, spool: Spool, pool: ThreadPoolExecutor, hash_pool: ThreadPoolExecutor):
        self.spool = spool
        self.done = HEADER_SIZE  # payload bytes [HEADER_SIZE, done) handed to the spool
        self._pool, self._hash_pool = pool, hash_pool  # one thread each: stretches stay in order
        self._jobs: deque[Future] = deque()
        self._guess: bytes | None = None  # the header this segment is expected to get
        self._sha: Any = None

    def guess(self, header: bytes) -> None:
        """Hash the stretches as they are written, on the guess that the file starts with ``header``
        (before the first stretch is handed over)."""
        if self.done == HEADER_SIZE:
            self._guess, self._sha = header, hashlib.sha256(header)

    def feed(self, seg: "SegmentBuffer") -> None:
        """Hand the payload written since the last call to the file, once ``STREAM_CHUNK_BYTES`` have gathered."""
        if seg.end - self.done < STREAM_CHUNK_BYTES:
            return
        with memoryview(seg._buf) as mv:  # noqa: SLF001 - SegmentBuffer's own buffer, in its own module
            self._jobs.append(self._pool.submit(_write_chunk, self.spool, mv[self.done: seg.end], self.done))
            if self._sha is not None:  # hashed beside the write, on another core
                self._jobs.append(self._hash_pool.submit(_hash_chunk, self._sha, mv[self.done: seg.end]))
        self.done = seg.end
        while self._jobs and self._jobs[0].done():
            self._jobs.popleft().result()

    def drain(self) -> None:
        """Wait for every stretch handed over; raises the first write's error unchanged."""
        while self._jobs:
            self._jobs.popleft().result()

    def finish_hash(self, data: memoryview) -> str | None:
        """SHA-256 of the finished file ``data`` from the stretches' running hash, or None when its
        header is not the guessed one (after ``drain``)."""
        if self._sha is None or data[:HEADER_SIZE] != self._guess:
            return None
        sha, self._sha = self._sha, None
        sha.update(data[self.done:])
        return sha.hexdigest()

    def commit(self, sequence: int, data: memoryview) -> str:
        """The sink of the finished segment (``data``, the whole file): store what is not written yet."""
        self.drain()
        self.spool.commit(data, (HEADER_SIZE, self.done))
        return self.spool.key


#: Segments at least this big are hashed in a helper thread while the sink stores them (both release
#: the GIL); an encrypted backup's sink stores other bytes, which are then hashed after it.
PARALLEL_HASH_BYTES = 4 << 20


def _sha256_into(out: list[str], data: memoryview) -> None:
    out.append(sha256_hex(data))


def store_segment(
    seg: SegmentBuffer, sequence: int, compression: Compression, level: int | None, sink: SegmentSink,
) -> SegmentMetadata:
    """Frame ``seg``, hand it to ``sink``, hash it: the finished segment's metadata.

    Everything slow here (compression, CRC32, SHA-256, file writes) releases
    the GIL, so this may run in a background thread (``SegmentPipeline``).
    """
    uncompressed = seg.payload_bytes
    stream = seg.stream
    if stream is not None:
        stream.drain()  # framing may grow the buffer: no stretch may still be writing from it
        sink = stream.commit
    data = seg.frame(compression, level)
    hashed: list[str] = []
    helper = None
    if stream is not None and (early := stream.finish_hash(data)) is not None:
        hashed.append(early)  # hashed as it was written: only the last stretch was left
    elif len(data) >= PARALLEL_HASH_BYTES:  # SHA-256 on another core while the sink writes the same bytes
        helper = threading.Thread(target=_sha256_into, args=(hashed, data), name="rbak-segment-sha")
        helper.start()
    try:
        try:
            key = sink(sequence, data)
        finally:
            if helper is not None:
                helper.join()
        stored: bytes | bytearray | memoryview = data
        if not isinstance(key, str):  # (key, the bytes actually stored): an encrypted backup's sealed object
            key, stored = key
        checksum = hashed[0] if hashed and stored is data else sha256_hex(stored)
        return SegmentMetadata(
            key=key,
            sequence=sequence,
            record_count=seg.count,
            size_bytes=len(stored),
            uncompressed_bytes=uncompressed,
            first_timestamp=seg.first_ts,
            last_timestamp=seg.last_ts,
            checksum=checksum,
            max_body_bytes=seg.max_body if seg.max_body >= 0 else None,
        )
    finally:
        del data  # never release(): the sink may have kept this very view; recycle() checks


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
            if seg._limit == limit:  # noqa: SLF001 - SegmentBuffer's own limit, in its own module
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
        streamable = pipeline is not None and compression is Compression.NONE and _reserve is not None
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
        if self._spool is not None and seg.count == 0 and seg.stream is None and len(seg._buf) < self._stream_room():  # noqa: SLF001 - SegmentBuffer's own buffer, in its own module
            assert _reserve is not None  # a spool is kept only with the C helper (``streamable``)
            _reserve(seg._buf, self._stream_room(), True)  # noqa: SLF001 - SegmentBuffer's own buffer, in its own module

    def _start_stream(self, seg: SegmentBuffer) -> None:
        """Only for records whose source knows how many are left (a quorum queue after its replay,
        decoded before the first record): their segments are written and hashed beside the encoding.
        A source decoding as it yields (a stream, a classic queue) keeps the whole-segment store:
        measured on an idle machine, the writes and their writeback then compete with its decoding
        for the cores and the import came out slower (stream 0.82x of the floor against 0.91x)."""
        # Called only with a spool, which is kept only with a pipeline and the C helper (``streamable``).
        assert self._spool is not None and self._pipeline is not None and _reserve is not None
        spool = self._spool(self.next_sequence)
        if spool is None:
            return
        # Room for a full segment (pages untouched until written): the buffer never grows under a view.
        _reserve(seg._buf, self._stream_room())  # noqa: SLF001 - SegmentBuffer's own buffer, in its own module
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
            seg.stream.guess(_HEADER.pack(MAGIC, VERSION, int(self.compression), expect, seg.first_ts, seg.first_ts))
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
