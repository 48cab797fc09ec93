"""Hostile segments: decompression bombs with valid CRC and SHA-256, absurd frame headers.

Each case runs ``rbak validate --deep`` (and ``restore`` where it concerns a
broker) as a real process and asserts a one-line error naming the segment's
key, a non-zero exit, and peak RSS under the fixed bound whatever the input.
"""

from __future__ import annotations

import json
import struct

import pytest
import zstandard

from rbak.repo.catalog import load_manifest
from rbak.format.compression import Compression
from rbak.format.reader import read_segment
from rbak.errors import SegmentError
from rbak.storage import open_storage
from support.bombs import GIB, frame, lz4_zeros, replace_segment, zstd_declaring, zstd_zeros
from support.rss import BOUND_MIB, rbak_measured

from rbak_spark.synthetic import QueueSpec, write_backup


@pytest.fixture
def store(tmp_path):
    url = f"file://{tmp_path}/backups"
    s = open_storage(url)
    m = write_backup(s, "b1", [QueueSpec("/", "orders", 50, 100)], segment_max_bytes=1 << 20)
    return url, s, m


def deep_validate(url: str):
    return rbak_measured("validate", "--path", url, "--backup-id", "b1", "--deep", "--format", "json")


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_bomb_with_valid_crc_and_sha256_is_named_and_memory_stays_bounded(store, codec):
    url, s, m = store
    seg = m.queues[0].segments[0]
    packed = zstd_zeros(GIB) if codec == "zstd" else lz4_zeros(GIB)
    comp = Compression.ZSTD if codec == "zstd" else Compression.LZ4
    key = replace_segment(s, "b1", frame(packed, comp, seg.record_count, seg.first_timestamp, seg.last_timestamp))
    r, peak = deep_validate(url)
    assert r.returncode == 1, r.stderr
    bad = {c["key"]: " ".join(c["problems"]) for c in json.loads(r.stdout)["segments"] if not c["ok"]}
    assert list(bad) == [key]
    assert "expands past the" in bad[key] and "manifest declares" in bad[key]
    assert "Traceback" not in r.stderr
    assert peak < BOUND_MIB, f"validate --deep peaked at {peak:.0f} MiB"


def test_a_bomb_without_a_declared_size_is_bounded_by_the_header(store):
    url, s, m = store
    seg = m.queues[0].segments[0]
    key = replace_segment(s, "b1", frame(zstd_zeros(GIB), Compression.ZSTD, seg.record_count, seg.first_timestamp,
                                         seg.last_timestamp), uncompressed=0)
    r, peak = deep_validate(url)
    assert r.returncode == 1 and key in r.stdout and "Traceback" not in r.stderr
    assert peak < BOUND_MIB


def test_a_record_claiming_more_than_is_left_is_refused_before_it_is_read(store):
    url, s, m = store
    seg = m.queues[0].segments[0]
    payload = struct.pack("<I", 0xFFFF_FFF0) + bytes(64)
    key = replace_segment(s, "b1", frame(zstandard.ZstdCompressor().compress(payload), Compression.ZSTD,
                                         seg.record_count, seg.first_timestamp, seg.last_timestamp))
    r, peak = deep_validate(url)
    report = {c["key"]: " ".join(c["problems"]) for c in json.loads(r.stdout)["segments"]}
    assert r.returncode == 1 and "claims 4294967280 bytes" in report[key]
    assert peak < BOUND_MIB


def test_a_frame_declaring_a_terabyte_is_a_segment_error_not_a_memory_error(store):
    url, s, m = store
    seg = m.queues[0].segments[0]
    key = replace_segment(s, "b1", frame(zstd_declaring(1 << 40, b"\x00" * 10), Compression.ZSTD,
                                         seg.record_count, seg.first_timestamp, seg.last_timestamp))
    r, peak = deep_validate(url)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "MemoryError" not in r.stderr
    assert key in {c["key"] for c in json.loads(r.stdout)["segments"] if not c["ok"]}
    with pytest.raises(SegmentError) as e:
        list(read_segment(s, load_manifest(s, "b1").queues[0].segments[0]))
    assert e.value.key == key
    assert peak < BOUND_MIB


def test_more_records_than_the_header_declares_is_an_error(store):
    url, s, m = store
    seg = m.queues[0].segments[0]
    raw = zstandard.ZstdDecompressor().stream_reader(s.get(seg.key)[32:-8]).read()
    key = replace_segment(s, "b1", frame(zstandard.ZstdCompressor().compress(raw + raw), Compression.ZSTD,
                                         seg.record_count, seg.first_timestamp, seg.last_timestamp),
                          uncompressed=0)
    with pytest.raises(SegmentError, match="more records than the 50 the header declares"):
        list(read_segment(s, load_manifest(s, "b1").queues[0].segments[0]))
    r, _ = deep_validate(url)
    assert r.returncode == 1 and key in r.stdout


def test_reader_streams_large_files_by_ranges(tmp_path, monkeypatch):
    """Past IN_MEMORY_LIMIT the file is checked and decoded through ranged reads: same records, same errors."""
    import rbak.format.reader as reader

    s = open_storage(f"file://{tmp_path}/b")
    m = write_backup(s, "b1", [QueueSpec("/", "q", 3000, 200)], segment_max_bytes=4 << 20, compression=Compression.LZ4)
    seg = m.queues[0].segments[0]
    expected = [r.message_id for _, r in ((i, r.properties) for i, r in read_segment(s, seg))]
    monkeypatch.setattr(reader, "IN_MEMORY_LIMIT", 1024)
    monkeypatch.setattr(reader, "RANGE_BYTES", 4096)
    got = [r.properties.message_id for _, r in read_segment(s, seg)]
    assert got == expected and len(got) == 3000
    assert [i for i, _ in read_segment(s, seg, start=2990)] == list(range(2990, 3000))
    data = bytearray(s.get(seg.key))
    data[100] ^= 1
    s.put(seg.key, bytes(data))
    with pytest.raises(SegmentError, match="CRC32 mismatch"):
        list(read_segment(s, seg))
