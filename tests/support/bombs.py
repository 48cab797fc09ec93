"""Hostile segments: decompression bombs and frames whose headers lie, built in constant memory."""

from __future__ import annotations

import struct
import zlib

import lz4.frame
import zstandard

from rbak.format.compression import Compression
from rbak.format.manifest import BackupManifest
from rbak.format.segment import END_MAGIC, VERSION, SegmentHeader, sha256_hex
from rbak.format.layout import BackupLayout


GIB = 1024**3


def zstd_zeros(n: int) -> bytes:
    """A zstd frame of ``n`` zero bytes, written as a stream (no content size), built in constant memory."""
    c = zstandard.ZstdCompressor(level=1).compressobj()
    block = bytes(1 << 20)
    parts = [c.compress(block) for _ in range(n >> 20)]
    parts.append(c.flush())
    return b"".join(parts)


def lz4_zeros(n: int) -> bytes:
    c = lz4.frame.LZ4FrameCompressor()
    parts = [c.begin()]
    block = bytes(1 << 20)
    parts += [c.compress(block) for _ in range(n >> 20)]
    parts.append(c.flush())
    return b"".join(parts)


def zstd_declaring(content_size: int, data: bytes) -> bytes:
    """A single-segment zstd frame whose header declares ``content_size`` and holds one raw block."""
    fhd = 0b1110_0000  # FCS field 8 bytes, single segment, no checksum, no dictionary
    block = struct.pack("<I", (len(data) << 3) | 1)[:3]  # last block, raw
    return struct.pack("<IB", 0xFD2FB528, fhd) + struct.pack("<Q", content_size) + block + data


def frame(payload: bytes, compression: Compression, count: int, first: int, last: int) -> bytes:
    header = SegmentHeader(VERSION, compression, count, first, last).pack()
    crc = zlib.crc32(payload, zlib.crc32(header))
    return header + payload + struct.pack("<I4s", crc, END_MAGIC)


def replace_segment(storage, backup_id: str, data: bytes, queue: int = 0, index: int = 0,
                    uncompressed: int | None = None, prefix: str = "") -> str:
    """Put ``data`` in place of a segment and make the manifest agree (size, SHA-256, totals)."""
    layout = BackupLayout(backup_id, prefix)
    m = BackupManifest.from_json(storage.get(layout.manifest))
    seg = m.queues[queue].segments[index]
    m.total_bytes += len(data) - seg.size_bytes
    seg.size_bytes, seg.checksum = len(data), sha256_hex(data)
    if uncompressed is not None:
        seg.uncompressed_bytes = uncompressed
    storage.put(seg.key, data)
    storage.put(layout.manifest, m.to_json())
    return seg.key
