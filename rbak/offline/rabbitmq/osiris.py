"""Osiris stream logs: ``<stream dir>/<first offset, 20 digits>.segment`` (+ ``.index``).

Format as ``osiris_log.erl`` writes it (all integers big-endian):

- segment file: ``"OSIL"``, version u32, then chunks until EOF;
- chunk header (48 bytes): magic 5 (high nibble) and version (low nibble),
  chunk type u8 (0 user, 1 tracking delta, 2 tracking snapshot), entries
  u16, records u32, timestamp i64 (ms), epoch u64, chunk id u64 (= the first
  offset of the chunk), data CRC u32 (``erlang:crc32`` of the data section
  only), data length u32, trailer length u32, bloom size u8, 3 reserved;
  then the bloom filter, the data entries, the trailer;
- a data entry is simple (``0:1, Len:31``, body) or a sub-batch (``1:1,
  CompType:3, _:4, NumRecords:16, UncompressedLen:32, Len:32``, then ``Len``
  bytes that, once decompressed, are ``NumRecords`` simple entries). Every
  record takes one offset; tracking chunks take offsets too but hold
  writer/consumer tracking, not messages;
- index file: ``"OSII"``, version u32, then 29-byte records (chunk id u64,
  timestamp i64, epoch u64, file position u32, chunk type u8).

Recovery (``osiris_log:maybe_fix_corrupted_files``) keeps the last segment
only up to the last index record that points at a valid chunk, so a node
killed mid-write loses the chunk it was writing; the reader does the same
for the last segment and reports any other bad byte with file and offset.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Iterator

import lz4.frame
import zstandard

from .damage import ImportContext
from ...errors import ChunkError

LOG_MAGIC = b"OSIL"
IDX_MAGIC = b"OSII"
FILE_HEADER_SIZE = 8
CHUNK_HEADER = struct.Struct(">BBHIqQQIIIB3x")
CHUNK_HEADER_SIZE = CHUNK_HEADER.size  # 48
INDEX_RECORD = struct.Struct(">QqQIB")
INDEX_RECORD_SIZE = INDEX_RECORD.size  # 29
CHUNK_MAGIC = 5
CHNK_USER = 0
CHNK_TRK_DELTA = 1
CHNK_TRK_SNAPSHOT = 2
_SUBBATCH = struct.Struct(">BHII")  # type byte, records, uncompressed length, length
#: Sub-batch compression codes as the stream protocol assigns them.
COMPRESSION = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    pos: int  # file offset of the chunk
    version: int
    chunk_type: int
    num_entries: int
    num_records: int
    timestamp: int
    epoch: int
    chunk_id: int
    crc: int
    data_len: int
    trailer_len: int
    bloom_size: int

    @property
    def data_pos(self) -> int:
        return self.pos + CHUNK_HEADER_SIZE + self.bloom_size

    @property
    def end(self) -> int:
        return self.data_pos + self.data_len + self.trailer_len


@dataclass(frozen=True, slots=True)
class StreamRecord:
    offset: int
    timestamp: int  # the chunk's, ms
    data: bytes
    path: str
    pos: int  # file offset of the record's entry


def parse_chunk_header(data: bytes, pos: int) -> ChunkHeader:
    if len(data) - pos < CHUNK_HEADER_SIZE:
        raise ChunkError(f"chunk header cut short ({len(data) - pos} of {CHUNK_HEADER_SIZE} bytes)", pos)
    mv, ctype, ne, nr, ts, ep, cid, crc, dl, tl, bs = CHUNK_HEADER.unpack_from(data, pos)
    if mv >> 4 != CHUNK_MAGIC:
        raise ChunkError(f"no chunk magic (byte 0x{mv:02x}, expected 0x5_)", pos)
    if ctype not in (CHNK_USER, CHNK_TRK_DELTA, CHNK_TRK_SNAPSHOT):
        raise ChunkError(f"unknown chunk type {ctype}", pos + 1)
    h = ChunkHeader(pos, mv & 0xF, ctype, ne, nr, ts, ep, cid, crc, dl, tl, bs)
    if h.end > len(data):
        raise ChunkError(f"chunk {cid} runs past the end of the file ({h.end} > {len(data)} bytes)", pos)
    return h


def segment_files(stream_dir: str) -> list[str]:
    """The stream's segment files, oldest (lowest first offset) first."""
    names = [n for n in os.listdir(stream_dir) if n.endswith(".segment")]
    return [os.path.join(stream_dir, n) for n in sorted(names, key=lambda n: (len(n), n))]


def index_records(index_path: str, ctx: ImportContext) -> list[tuple[int, int]] | None:
    """(chunk id, file position) of every non-zero index record, in file order (None: no usable index)."""
    try:
        with open(index_path, "rb") as f:
            idx = f.read()
    except FileNotFoundError:
        return None
    if idx[:4] != IDX_MAGIC:
        if idx:
            ctx.damaged(index_path, 0, "not an Osiris index file (no OSII magic)")
        return None
    out = []
    for i in range((len(idx) - FILE_HEADER_SIZE) // INDEX_RECORD_SIZE):
        rec = idx[FILE_HEADER_SIZE + i * INDEX_RECORD_SIZE: FILE_HEADER_SIZE + (i + 1) * INDEX_RECORD_SIZE]
        if rec.strip(b"\0"):
            cid, _ts, _epoch, pos, _type = INDEX_RECORD.unpack(rec)
            out.append((cid, pos))
    return out


def iter_chunks(path: str, data: bytes, ctx: ImportContext, last_segment: bool,
                next_start: int | None = None) -> Iterator[ChunkHeader]:
    """Every valid chunk of one segment file (CRC checked), then what the segment lost.

    Osiris writes a chunk, then its index record, so a chunk the index records but the segment no
    longer holds whole was written once and is lost: reported with the offsets it held (at least),
    not dropped quietly. So are offsets between this segment's last chunk and ``next_start``, the
    next segment's first offset (its file name): retention removes whole segments, oldest first,
    never a middle. Bytes past the last index record are a write the node did not finish and are
    dropped, as Osiris's recovery drops them."""
    seen: list[ChunkHeader] = []
    indexed = index_records(path[: -len(".segment")] + ".index", ctx)
    yield from _chunks(path, data, ctx, last_segment, indexed, seen)
    found = {h.pos for h in seen}
    missing = [(cid, pos) for cid, pos in indexed or () if pos not in found and pos >= FILE_HEADER_SIZE]
    if missing:
        first, last = missing[0][0], missing[-1][0]
        ctx.damaged(path, missing[0][1], f"{len(missing)} chunk(s) its index records (chunk ids {first}-{last}) are "
                    f"not in the segment whole (a file cut short): offsets from {first} on (at least "
                    f"{last - first + 1}) are lost", then="exported the chunks before them")
    elif seen and next_start is not None and next_start > (end := seen[-1].chunk_id + seen[-1].num_records):
        ctx.damaged(path, len(data), f"the segment ends at offset {end - 1} but the next one starts at "
                    f"{next_start}: offsets {end}-{next_start - 1} ({next_start - end}) are lost (a segment cut "
                    "short)", then="exported the rest")


def _chunks(path: str, data: bytes, ctx: ImportContext, last_segment: bool, indexed: list[tuple[int, int]] | None,
            seen: list[ChunkHeader]) -> Iterator[ChunkHeader]:
    if data[:4] != LOG_MAGIC:
        ctx.damaged(path, 0, "not an Osiris segment (no OSIL magic)")
        return
    if len(data) < FILE_HEADER_SIZE:
        ctx.damaged(path, 0, "segment header cut short")
        return
    tail_limit = None
    if last_segment:
        tail_limit = indexed[-1][1] if indexed else None
    indexed_at = {pos for _, pos in indexed or ()}
    pos = FILE_HEADER_SIZE
    while pos < len(data):
        if last_segment and (tail_limit is None or pos > tail_limit):
            # Osiris recovery truncates the last segment after its last indexed valid chunk.
            if data[pos:].strip(b"\0"):
                ctx.note(f"{path}: {len(data) - pos} byte(s) from byte {pos} are past the last indexed chunk "
                         "(a write the node did not finish); dropped as Osiris recovery drops them")
            return
        try:
            h = parse_chunk_header(data, pos)
        except ChunkError as e:
            if pos in indexed_at:
                return  # an indexed chunk cut short: reported by iter_chunks with what it lost
            ctx.damaged(path, e.pos, str(e))
            return  # nothing after a bad header can be located
        seen.append(h)
        crc = zlib.crc32(memoryview(data)[h.data_pos: h.data_pos + h.data_len])
        if crc != h.crc:
            ctx.damaged(path, pos, f"chunk {h.chunk_id}: data CRC 0x{crc:08x} does not match the header's "
                        f"0x{h.crc:08x}", then="chunk skipped")
        else:
            yield h
        pos = h.end


def _decompress(comp: int, payload: bytes, uncompressed_len: int) -> bytes:
    if comp == 1:
        return gzip.decompress(payload)
    if comp == 4:
        return zstandard.ZstdDecompressor().decompress(payload, max_output_size=uncompressed_len)
    if comp == 3:
        return lz4.frame.decompress(payload)
    raise ValueError(f"sub-batch compression {COMPRESSION.get(comp, comp)} is not supported")


def _simple_entries(buf: bytes, count: int, base: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    p = 0
    for _ in range(count):
        if p + 4 > len(buf):
            raise ChunkError(f"sub-batch record {len(out)} header cut short", base + p)
        (n,) = struct.unpack_from(">I", buf, p)
        if n >> 31:
            raise ChunkError(f"sub-batch record {len(out)} is not a simple entry", base + p)
        if p + 4 + n > len(buf):
            raise ChunkError(f"sub-batch record {len(out)} runs past its sub-batch", base + p)
        out.append((base + p, buf[p + 4: p + 4 + n]))
        p += 4 + n
    if p != len(buf):
        raise ChunkError(f"{len(buf) - p} byte(s) after the sub-batch's {count} records", base + p)
    return out


def chunk_records(path: str, data: bytes, h: ChunkHeader) -> list[tuple[int, bytes]]:
    """(file position, record bytes) of every record of a user chunk, in offset order."""
    out: list[tuple[int, bytes]] = []
    p, end = h.data_pos, h.data_pos + h.data_len
    for _ in range(h.num_entries):
        if p + 4 > end:
            raise ChunkError(f"chunk {h.chunk_id}: entry header past the data section", p)
        first = data[p]
        if not first & 0x80:
            (n,) = struct.unpack_from(">I", data, p)
            if p + 4 + n > end:
                raise ChunkError(f"chunk {h.chunk_id}: entry of {n} bytes runs past the data section", p)
            out.append((p, data[p + 4: p + 4 + n]))
            p += 4 + n
            continue
        if p + 11 > end:
            raise ChunkError(f"chunk {h.chunk_id}: sub-batch header past the data section", p)
        tb, nrec, ulen, n = _SUBBATCH.unpack_from(data, p)
        comp = (tb >> 4) & 0x7
        if p + 11 + n > end:
            raise ChunkError(f"chunk {h.chunk_id}: sub-batch of {n} bytes runs past the data section", p)
        payload = data[p + 11: p + 11 + n]
        if comp:
            try:
                payload = _decompress(comp, payload, ulen)
            except Exception as e:  # noqa: BLE001 - every codec's own error type
                raise ChunkError(f"chunk {h.chunk_id}: {COMPRESSION.get(comp, comp)} sub-batch: {e}", p) from None
            if len(payload) != ulen:
                raise ChunkError(f"chunk {h.chunk_id}: sub-batch decompressed to {len(payload)} bytes, header "
                                 f"says {ulen}", p)
            recs = _simple_entries(payload, nrec, p)  # positions inside: the sub-batch's own
            out.extend((p, r) for _, r in recs)
        else:
            out.extend(_simple_entries(payload, nrec, p + 11))
        p += 11 + n
    if p != end:
        raise ChunkError(f"chunk {h.chunk_id}: {end - p} byte(s) left after its {h.num_entries} entries", p)
    if len(out) != h.num_records:
        raise ChunkError(f"chunk {h.chunk_id}: holds {len(out)} records, header says {h.num_records}", h.pos)
    return out


def iter_stream(stream_dir: str, ctx: ImportContext, from_offset: int | None = None) -> Iterator[StreamRecord]:
    """Every message record of a stream directory, from ``from_offset`` (default: the first present)."""
    files = segment_files(stream_dir)
    for i, path in enumerate(files):
        last = i == len(files) - 1
        nxt = os.path.basename(files[i + 1]).split(".")[0] if not last else ""
        if from_offset is not None and nxt.isdigit() and int(nxt) <= from_offset:
            continue  # every offset in this segment is below from_offset
        with open(path, "rb") as f:
            data = f.read()
        for h in iter_chunks(path, data, ctx, last, int(nxt) if nxt.isdigit() else None):
            if h.chunk_type != CHNK_USER:
                continue
            if from_offset is not None and h.chunk_id + h.num_records <= from_offset:
                continue
            try:
                recs = chunk_records(path, data, h)
            except ChunkError as e:
                ctx.damaged(path, e.pos, str(e), then="chunk skipped")
                continue
            for k, (pos, rec) in enumerate(recs):
                off = h.chunk_id + k
                if from_offset is None or off >= from_offset:
                    yield StreamRecord(off, h.timestamp, rec, path, pos)
