"""RBAK segment files: 32-byte header, compressed payload, 8-byte footer.

Layout and the reading/writing steps are those of ``segment-format.md``.
Every check the spec lists raises ``SegmentError`` naming the storage key,
so a damaged file is never a traceback and never a silent wrong answer.
"""

from __future__ import annotations

import hashlib
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ..errors import CompressionError, SegmentError, SerializationError
from .compression import Compression, check_level, compress, decompress
from .manifest import SegmentMetadata
from .batch import decode_records, encode_payload, encode_records
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


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------
# Writing.
# --------------------------------------------------------------------------


def frame_segment(
    payload: bytes, record_count: int, first_ts: int, last_ts: int,
    compression: Compression, level: int | None = None,
) -> bytes:
    """Steps 3-7 of 'Writing a Segment': compress, header, CRC32, end magic."""
    header = SegmentHeader(VERSION, compression, record_count, first_ts, last_ts).pack()
    body = header + compress(payload, compression, level)
    return body + _FOOTER.pack(zlib.crc32(body), END_MAGIC)


def encode_segment(
    records: Sequence[BackupRecord], compression: Compression = Compression.ZSTD, level: int | None = None
) -> bytes:
    """A whole segment from records in memory (batched fast path)."""
    records = list(records)
    payload = encode_payload(records)
    first = records[0].backed_up_at if records else 0
    last = records[-1].backed_up_at if records else 0
    return frame_segment(payload, len(records), first, last, compression, level)


SegmentSink = Callable[[int, bytes], str]
"""Stores a finished segment: (sequence, file bytes) -> storage key."""


class SegmentWriter:
    """Streams records into segments, rotating on size and age.

    ``sink`` stores each finished segment and returns its key; the writer
    returns that segment's SegmentMetadata from the ``append``/``flush`` call
    that finished it, so a caller can checkpoint exactly what is durable.
    Memory is bounded by ``max_bytes`` (one uncompressed payload).
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
        self._buf = bytearray()
        self._count = 0
        self._first_ts = 0
        self._last_ts = 0
        self._started = 0.0
        self.written: list[SegmentMetadata] = []

    @property
    def pending_records(self) -> int:
        return self._count

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)

    def append(self, record: BackupRecord) -> SegmentMetadata | None:
        return self.append_encoded(encode_record(record), record.backed_up_at)

    def append_many(self, records: Sequence[BackupRecord]) -> list[SegmentMetadata]:
        """Append a batch (encoded on the fast path); rotation is checked after
        every record exactly as with ``append``, so segment boundaries match."""
        done = []
        for r, data in zip(records, encode_records(records)):
            meta = self.append_encoded(data, r.backed_up_at)
            if meta is not None:
                done.append(meta)
        return done

    def append_encoded(self, record_json: bytes, backed_up_at: int) -> SegmentMetadata | None:
        if self._count == 0:
            self._first_ts = backed_up_at
            self._started = self._clock()
        self._buf += _LEN.pack(len(record_json))
        self._buf += record_json
        self._last_ts = backed_up_at
        self._count += 1
        if len(self._buf) >= self.max_bytes or self.interval_elapsed():
            return self.flush()
        return None

    def interval_elapsed(self) -> bool:
        return self._count > 0 and (self._clock() - self._started) * 1000 >= self.max_interval_ms

    def flush(self) -> SegmentMetadata | None:
        """Finish the current segment, if it holds any record."""
        if self._count == 0:
            return None
        payload = bytes(self._buf)
        data = frame_segment(payload, self._count, self._first_ts, self._last_ts, self.compression, self.level)
        seq = self.next_sequence
        key = self._sink(seq, data)
        meta = SegmentMetadata(
            key=key,
            sequence=seq,
            record_count=self._count,
            size_bytes=len(data),
            uncompressed_bytes=len(payload),
            first_timestamp=self._first_ts,
            last_timestamp=self._last_ts,
            checksum=sha256_hex(data),
        )
        self.next_sequence += 1
        self._buf = bytearray()
        self._count = 0
        self.written.append(meta)
        return meta
