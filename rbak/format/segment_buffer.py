"""One segment built in a single buffer, framed in place and stored: ``SegmentBuffer``, the
``SegmentStream`` that writes it to its file as it grows, and ``store_segment``."""

from __future__ import annotations

import hashlib
import sys
import threading
import zlib
from collections import deque
from itertools import islice
from operator import attrgetter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

from ..storage.base import Spool
from .compression import Compression, compress
from .manifest import SegmentMetadata
from .backend import speedups as _speedups
from .batch import encode_records
from .record import BackupRecord
from .segment import END_MAGIC, FOOTER, FOOTER_SIZE, HEADER_SIZE, RECORD_LENGTH, VERSION, SegmentHeader, sha256_hex

_BODY = attrgetter("body")
_append_payload = getattr(_speedups, "append_payload", None)  # None: pure Python (RBAK_SPEEDUPS=0, no C helper)
_crc32_combine = getattr(_speedups, "crc32_combine", None)
if _crc32_combine is None:
    _append_payload = None  # an older helper: the running CRC needs both
_reserve = getattr(_speedups, "reserve", None) if _append_payload is not None else None
CAN_STREAM = _reserve is not None
"""Whether a ``SegmentBuffer`` can ``reserve`` room (the C helper): a ``SegmentStream`` needs it."""


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

    @property
    def limit(self) -> int:
        """The file size of a full segment of this buffer (header, ``max_bytes`` payload, footer)."""
        return self._limit

    def reserve(self, size: int) -> None:
        """Room for ``size`` bytes without growing (pages untouched until written), so the buffer never
        grows under a ``SegmentStream``'s view. Only with the C helper (``CAN_STREAM``)."""
        assert _reserve is not None
        _reserve(self._buf, size)

    def warm(self, size: int) -> None:
        """Map the pages of the first ``size`` bytes now (zeroed, GIL-free), unless already that big.
        Only with the C helper (``CAN_STREAM``)."""
        assert _reserve is not None
        if len(self._buf) < size:
            _reserve(self._buf, size, True)

    def add(self, record_json: bytes | memoryview, backed_up_at: int, body_len: int = -1) -> int:
        """Append one record ([u32 LE length][JSON]); returns the payload size so far. ``body_len``: its
        body's length (-1: not told, and the segment's largest body is then not known)."""
        pos = self.end
        start = pos + 4
        end = start + len(record_json)
        buf = self._buf
        # Within the high-water mark a plain memcpy into warm pages; past it the
        # bytearray grows by itself (amortised, no zero-filling first).
        buf[pos:start] = RECORD_LENGTH.pack(len(record_json))
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
        SegmentHeader(VERSION, compression, self.count, self.first_ts, self.last_ts).pack_into(buf)
        if compression is Compression.NONE and self._payload_crc is not None:
            # the payload's CRC was taken as add_from wrote it: join the header's to it
            assert _crc32_combine is not None  # only the C helper's add_from keeps the payload's CRC
            crc = _crc32_combine(zlib.crc32(buf[:HEADER_SIZE]), self._payload_crc, n - HEADER_SIZE)
        else:
            with memoryview(buf) as mv, mv[:n] as body:
                crc = zlib.crc32(body)
        buf[n : n + FOOTER_SIZE] = FOOTER.pack(crc, END_MAGIC)  # no view alive: may grow
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
