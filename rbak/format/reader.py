"""Reading one stored segment, bounded: the one path restore, validate and Spark use.

``read_segment(storage, seg)`` fetches the file the manifest names, checks its
size and SHA-256 against the manifest and its frame (magics, CRC32, header),
then decompresses it as a stream and yields its records a chunk at a time.
Nothing is trusted to be small: the decoder stops as soon as the payload
expands past what the manifest (``uncompressed_bytes``) and the header (record
count) declare, a record may not claim more bytes than are left, and memory
holds the compressed file (or, past ``IN_MEMORY_LIMIT``, a window of it read by
ranges) plus one chunk of records; never a whole decoded segment. Every
failure is a ``SegmentError`` naming the key.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import lz4.frame
import zstandard

from ..errors import SegmentError, SerializationError
from .batch import decode_payload_records, decode_records
from .compression import Compression
from .manifest import SegmentMetadata
from .record import BackupRecord
from .segment import (
    FOOTER, FOOTER_SIZE, HEADER_SIZE, MIN_SEGMENT_SIZE, RECORD_LENGTH, SegmentHeader, read_header, verify_frame,
)

IN_MEMORY_LIMIT = 192 * 1024 * 1024
"""Compressed files up to this size are fetched in one request; larger ones by ranges, twice."""
RANGE_BYTES = 8 * 1024 * 1024
READ_BYTES = 1024 * 1024
MAX_RECORD_BYTES = 256 * 1024 * 1024
"""No record may claim more (RabbitMQ's own limit is 512 MiB on 3.x, 16-128 MiB by default)."""
CHUNK_RECORDS = 1024
CHUNK_BYTES = 8 * 1024 * 1024


class _Readable(Protocol):
    def get(self, key: str) -> bytes: ...
    def get_range(self, key: str, start: int, length: int) -> bytes: ...
    def size(self, key: str) -> int | None: ...


@dataclass(slots=True)
class SegmentStats:
    """What a full read found (filled as records are yielded; complete once the iterator ends)."""

    header: SegmentHeader | None = None
    size_bytes: int = 0
    records: int = 0
    uncompressed_bytes: int = 0
    first_timestamp: int | None = None
    last_timestamp: int | None = None
    problems: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------
# Sources of the compressed payload.
# --------------------------------------------------------------------------


class _ViewReader:
    """A file-like ``read`` over a memoryview (copies only what is read)."""

    def __init__(self, mv: memoryview):
        self._mv, self._pos = mv, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._mv) if n is None or n < 0 else min(len(self._mv), self._pos + n)
        out = bytes(self._mv[self._pos:end])
        self._pos = end
        return out


class _RangeReader:
    """A file-like ``read`` over ``[start, end)`` of a stored object, ``RANGE_BYTES`` per request."""

    def __init__(self, storage: _Readable, key: str, start: int, end: int):
        self._s, self._key, self._pos, self._end = storage, key, start, end
        self._buf = b""

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._end - self._pos + len(self._buf)
        while len(self._buf) < n and self._pos < self._end:
            want = min(RANGE_BYTES, self._end - self._pos)
            got = self._s.get_range(self._key, self._pos, want)
            if len(got) != want:
                raise SegmentError(self._key, f"changed while being read: {len(got)} bytes at {self._pos}, expected {want}")
            self._pos += want
            self._buf = self._buf + got if self._buf else got
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


def _check_whole_by_ranges(storage: _Readable, key: str, size: int) -> tuple[SegmentHeader, str]:
    """CRC32, end magic and SHA-256 of a large file, streamed (first pass)."""
    head = storage.get_range(key, 0, HEADER_SIZE)
    header = read_header(head, key)
    sha, crc, pos = hashlib.sha256(), 0, 0
    body_end = size - FOOTER_SIZE
    while pos < size:
        got = storage.get_range(key, pos, min(RANGE_BYTES, size - pos))
        if not got:
            raise SegmentError(key, f"changed while being read: nothing at byte {pos} of {size}")
        sha.update(got)
        crc = zlib.crc32(got[: max(0, body_end - pos)], crc)
        pos += len(got)
    stored_crc, end_magic = FOOTER.unpack(storage.get_range(key, body_end, FOOTER_SIZE))
    if end_magic != b"KABR":
        raise SegmentError(key, f"bad end magic {end_magic!r}, expected b'KABR' (truncated?)")
    if crc != stored_crc:
        raise SegmentError(key, f"CRC32 mismatch: stored {stored_crc:#010x}, computed {crc:#010x}")
    return header, sha.hexdigest()


# --------------------------------------------------------------------------
# Fetch and check.
# --------------------------------------------------------------------------


@dataclass(slots=True)
class FetchedSegment:
    """A segment whose frame checked out; ``payload()`` opens its compressed payload."""

    key: str
    header: SegmentHeader
    size: int
    sha256: str
    _data: bytes | None
    _storage: Any

    def payload(self) -> Any:
        if self._data is not None:
            return _ViewReader(memoryview(self._data)[HEADER_SIZE: self.size - FOOTER_SIZE])
        return _RangeReader(self._storage, self.key, HEADER_SIZE, self.size - FOOTER_SIZE)


def fetch_segment(storage: _Readable, seg: SegmentMetadata, verify_checksum: bool = True,
                  problems: list[str] | None = None, codec: Any = None) -> FetchedSegment:
    """Fetch, then check size and SHA-256 against the manifest and the frame (magics, CRC32, header).

    With ``problems`` given, size and SHA-256 mismatches are appended there
    (so validate reports them all) instead of raised; frame errors always raise.
    ``codec`` (``rbak.sealing.crypto.ObjectCodec``) opens an encrypted backup's objects: size and
    SHA-256 describe the stored (sealed) bytes, the frame the opened ones.
    """
    sealed = codec is not None and codec.encrypted
    key = seg.key

    def fail(msg: str) -> None:
        if problems is None:
            raise SegmentError(key, msg)
        problems.append(msg)

    size = storage.size(key)
    if size is None:
        storage.get(key)  # raises NotFoundError naming the key
        raise SegmentError(key, "missing from storage")
    if seg.size_bytes and size != seg.size_bytes:
        fail(f"size {size} bytes, manifest says {seg.size_bytes}")
    if size < MIN_SEGMENT_SIZE:
        raise SegmentError(key, f"too short: {size} bytes, a segment has at least {MIN_SEGMENT_SIZE}")
    check_sha = verify_checksum or problems is not None

    def compare(digest: str) -> None:
        if not check_sha:
            return
        if not seg.checksum:
            if problems is not None:
                problems.append("manifest has no checksum for this segment")
        elif digest != seg.checksum.lower():
            fail(f"SHA-256 mismatch: manifest {seg.checksum}, computed {digest}")

    if size <= IN_MEMORY_LIMIT or sealed:  # a sealed object opens whole (its GCM tag covers all of it)
        data = storage.get(key)
        size = len(data)
        digest = hashlib.sha256(data).hexdigest() if check_sha else ""
        compare(digest)  # before the frame: a flipped byte is reported as both
        if sealed:
            data = codec.open(key, data)  # an error naming the backup and key id
            size = len(data)
        header = verify_frame(data, key)
    else:
        data = None
        header, digest = _check_whole_by_ranges(storage, key, size)  # raises on a bad frame
        compare(digest)
    return FetchedSegment(key, header, size, digest, data, storage)


# --------------------------------------------------------------------------
# Bounded decompression.
# --------------------------------------------------------------------------


def output_limit(seg: SegmentMetadata, header: SegmentHeader) -> tuple[int, str]:
    """(bytes the payload may expand to, what declares it)."""
    if seg.uncompressed_bytes:
        return seg.uncompressed_bytes, f"the {seg.uncompressed_bytes} bytes the manifest declares"
    n = header.record_count * (MAX_RECORD_BYTES + 4)
    return n, f"{header.record_count} record(s) of at most {MAX_RECORD_BYTES} bytes"


def _decompressed(fetched: FetchedSegment) -> Any:
    """A file-like reader of the decompressed payload."""
    src = fetched.payload()
    comp = fetched.header.compression
    if comp is Compression.ZSTD:
        return zstandard.ZstdDecompressor().stream_reader(src, read_size=READ_BYTES, read_across_frames=True)
    if comp is Compression.LZ4:
        return lz4.frame.LZ4FrameFile(src, mode="rb")
    return src


class _Bounded:
    """Reads the decompressed payload, refusing to produce more than ``limit`` bytes."""

    def __init__(self, key: str, reader: Any, limit: int, why: str, comp: Compression):
        self.key, self._r, self.limit, self._why, self._comp = key, reader, limit, why, comp
        self.total = 0

    def read(self, n: int) -> bytes:
        try:
            out = self._r.read(min(n, self.limit - self.total + 1))
        except (zstandard.ZstdError, RuntimeError, ValueError, EOFError, OSError) as e:
            raise SegmentError(self.key, f"{self._comp.config_name} payload does not decompress: {e}") from None
        self.total += len(out)
        if self.total > self.limit:
            raise SegmentError(self.key, f"payload expands past {self._why}; refusing to decompress further")
        return out


def iter_record_chunks(fetched: FetchedSegment, seg: SegmentMetadata, start: int = 0,
                       stats: SegmentStats | None = None) -> Iterator[tuple[int, list[BackupRecord]]]:
    """(index of the first record, records) chunks of a fetched segment, from record ``start``.

    Checks as it goes (expansion past the declared size, more records than
    the header declares, a record longer than what is left) and at the end
    (record counts of header, manifest and payload; uncompressed size).
    """
    key, header = fetched.key, fetched.header
    limit, why = output_limit(seg, header)
    src = _Bounded(key, _decompressed(fetched), limit, why, header.compression)
    st = stats if stats is not None else SegmentStats()
    st.header, st.size_bytes = header, fetched.size
    buf = bytearray()
    pos = 0  # next unparsed byte of buf
    chunk_start = 0  # first byte of the pending chunk in buf
    chunk_first = start
    index = 0  # records walked
    eof = False

    def fill(need: int) -> bool:
        nonlocal eof
        while len(buf) - pos < need and not eof:
            got = src.read(max(READ_BYTES, need - (len(buf) - pos)))
            if not got:
                eof = True
            buf.extend(got)
        return len(buf) - pos >= need

    def take() -> list[BackupRecord]:
        with memoryview(buf) as mv, mv[chunk_start:pos] as part:
            return _decode_chunk(part, key, chunk_first)

    while True:
        if not fill(1):
            break
        if not fill(4):
            raise SegmentError(key, f"truncated record length at byte {src.total - (len(buf) - pos)} of the payload")
        (length,) = RECORD_LENGTH.unpack_from(buf, pos)
        offset = src.total - (len(buf) - pos)
        if length > MAX_RECORD_BYTES or offset + 4 + length > limit:
            raise SegmentError(key, f"record {index} at byte {offset} of the payload claims {length} bytes, "
                                    f"more than {why} allow")
        if index >= header.record_count:
            raise SegmentError(key, f"payload holds more records than the {header.record_count} the header declares")
        if not fill(4 + length):
            raise SegmentError(key, f"truncated record at byte {offset} of the payload: needs {length} bytes, "
                                    f"{len(buf) - pos - 4} left")
        if index < start:
            pos += 4 + length
            chunk_start = pos
            chunk_first = index + 1
        else:
            pos += 4 + length
        index += 1
        if index > start and (index - chunk_first >= CHUNK_RECORDS or pos - chunk_start >= CHUNK_BYTES):
            records = take()
            _note(st, records)
            yield chunk_first, records
            chunk_first = index
            chunk_start = pos
        if chunk_start > READ_BYTES and chunk_start == pos:
            del buf[:pos]
            pos = chunk_start = 0
    if pos > chunk_start:
        records = take()
        _note(st, records)
        yield chunk_first, records
    st.records, st.uncompressed_bytes = index, src.total
    if index != header.record_count:
        raise SegmentError(key, f"record count mismatch: header says {header.record_count}, payload holds {index}")
    if index != seg.record_count:
        raise SegmentError(key, f"record count mismatch: manifest says {seg.record_count}, payload holds {index}")
    if seg.uncompressed_bytes and src.total != seg.uncompressed_bytes:
        raise SegmentError(key, f"uncompressed size {src.total}, manifest says {seg.uncompressed_bytes}")


def _note(st: SegmentStats, records: list[BackupRecord]) -> None:
    if records:
        if st.first_timestamp is None:
            st.first_timestamp = records[0].backed_up_at
        st.last_timestamp = records[-1].backed_up_at


def _decode_chunk(part: memoryview, key: str, first: int) -> list[BackupRecord]:
    try:
        records = decode_payload_records(part)
        if records is not None:
            return records
        raws = []
        mv, pos = part, 0
        while pos < len(mv):
            (n,) = RECORD_LENGTH.unpack_from(mv, pos)
            raws.append(mv[pos + 4: pos + 4 + n])
            pos += 4 + n
        return decode_records(raws)
    except SerializationError as e:
        raise SegmentError(key, f"records from {first} do not decode: {e.args[0]}") from None


def read_segment(storage: _Readable, seg: SegmentMetadata, verify_checksum: bool = True, start: int = 0,
                 stats: SegmentStats | None = None, codec: Any = None) -> Iterator[tuple[int, BackupRecord]]:
    """(index, record) of one stored segment from record ``start``, every check made, memory bounded
    (``codec``: an encrypted backup's, see ``fetch_segment``)."""
    fetched = fetch_segment(storage, seg, verify_checksum, codec=codec)
    for first, records in iter_record_chunks(fetched, seg, start, stats):
        yield from enumerate(records, first)
