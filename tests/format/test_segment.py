"""Segments: byte layout of the spec, every check of 'Reading a Segment', rotation."""

from __future__ import annotations

import hashlib
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbak.errors import SegmentError
from rbak.format.compression import Compression
from rbak.format.record import BackupRecord, encode_record
from rbak.format.segment import decode_segment, encode_segment, read_header, segment_file_name
from rbak.format.segment_writer import SegmentWriter

from .strategies import records as record_strategy

TS = 0x018ED2A704CB  # the timestamp of the spec's byte-level example


def recs(n: int, start_ts: int = 1000, body: bytes = b"payload") -> list[BackupRecord]:
    return [BackupRecord(body=body + str(i).encode(), delivery_tag=i, backed_up_at=start_ts + i,
                         source_queue="q") for i in range(n)]


def test_spec_byte_level_example():
    data = encode_segment([BackupRecord(body=b"x", backed_up_at=TS)], Compression.ZSTD)
    assert data[:32] == bytes.fromhex(
        "52 42 41 4B 01 01 00 00 01 00 00 00 00 00 00 00"
        "CB 04 A7 D2 8E 01 00 00 CB 04 A7 D2 8E 01 00 00")
    assert data[32:36] == bytes.fromhex("28 B5 2F FD")  # zstd frame magic
    assert data[-4:] == b"KABR"
    assert struct.unpack("<I", data[-8:-4])[0] == zlib.crc32(data[:-8])


@pytest.mark.parametrize("comp,ext,magic", [(Compression.NONE, "", b"\x04\x00\x00\x00" ), (Compression.ZSTD, ".zst", b"\x28\xb5\x2f\xfd"),
                                            (Compression.LZ4, ".lz4", b"\x04\x22\x4d\x18")])
def test_every_compression_round_trips(comp, ext, magic):
    rs = recs(50) + [BackupRecord(body=b"", backed_up_at=2000), BackupRecord(body=bytes(range(256)) * 64, backed_up_at=2001)]
    data = encode_segment(rs, comp)
    assert data[5] == int(comp) and comp.extension == ext
    if comp is not Compression.NONE:
        assert data[32:36] == magic
    seg = decode_segment(data, "k")
    assert seg.records == rs
    assert (seg.header.record_count, seg.header.first_timestamp, seg.header.last_timestamp) == (52, 1000, 2001)
    assert read_header(data[:32], "k") == seg.header  # header alone, no payload needed


def test_uncompressed_payload_is_length_prefixed_json():
    rs = recs(3)
    data = encode_segment(rs, Compression.NONE)
    payload = data[32:-8]
    pos, out = 0, []
    while pos < len(payload):
        (n,) = struct.unpack_from("<I", payload, pos)
        out.append(payload[pos + 4 : pos + 4 + n])
        pos += 4 + n
    assert out == [encode_record(r) for r in rs]


def test_empty_segment_has_zero_timestamps():
    data = encode_segment([], Compression.ZSTD)
    h = read_header(data)
    assert (h.record_count, h.first_timestamp, h.last_timestamp) == (0, 0, 0)
    assert decode_segment(data).records == []


def test_zstd_level_bounds_and_levels_decode():
    for level in (1, 19, 22):
        assert decode_segment(encode_segment(recs(5), Compression.ZSTD, level)).records == recs(5)
    from rbak.errors import ConfigError
    for bad in (0, 23):
        with pytest.raises(ConfigError, match="1 to 22"):
            encode_segment(recs(1), Compression.ZSTD, bad)


def test_reads_zstd_frames_without_content_size():
    import zstandard
    rs = recs(10)
    payload = b"".join(struct.pack("<I", len(e)) + e for e in map(encode_record, rs))
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    comp = cobj.compress(payload) + cobj.flush()
    header = struct.pack("<4sBBxxQqq", b"RBAK", 1, 1, 10, rs[0].backed_up_at, rs[-1].backed_up_at)
    data = header + comp
    data += struct.pack("<I", zlib.crc32(data)) + b"KABR"
    assert decode_segment(data, "k").records == rs


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d[:39], "too short"),
    (lambda d: b"XBAK" + d[4:], "bad start magic"),
    (lambda d: d[:-4] + b"KABX", "bad end magic"),
    (lambda d: d[:40] + bytes([d[40] ^ 1]) + d[41:], "CRC32 mismatch: stored 0x"),
])
def test_each_damage_is_named(mutate, message):
    data = encode_segment(recs(20), Compression.ZSTD)
    with pytest.raises(SegmentError, match=message) as ei:
        decode_segment(mutate(data), "bk/queues/_default/q/segment-0001.zst")
    assert "bk/queues/_default/q/segment-0001.zst" in str(ei.value)


def _reframe(header: bytes, body: bytes) -> bytes:
    data = header + body
    return data + struct.pack("<I", zlib.crc32(data)) + b"KABR"


def test_unknown_version_compression_count_and_truncated_record():
    rs = recs(3)
    payload = b"".join(struct.pack("<I", len(e)) + e for e in map(encode_record, rs))
    hdr = lambda ver, comp, n: struct.pack("<4sBBxxQqq", b"RBAK", ver, comp, n, 0, 0)  # noqa: E731
    with pytest.raises(SegmentError, match="unknown format version 2"):
        decode_segment(_reframe(hdr(2, 0, 3), payload), "k")
    with pytest.raises(SegmentError, match="unknown compression type 7"):
        decode_segment(_reframe(hdr(1, 7, 3), payload), "k")
    with pytest.raises(SegmentError, match="record count mismatch: header says 4, payload holds 3"):
        decode_segment(_reframe(hdr(1, 0, 4), payload), "k")
    with pytest.raises(SegmentError, match=r"truncated record at byte \d+"):
        decode_segment(_reframe(hdr(1, 0, 3), payload[:-5]), "k")
    with pytest.raises(SegmentError, match="does not decompress"):
        decode_segment(_reframe(hdr(1, 1, 3), payload), "k")


SEGMENT = encode_segment(recs(30, body=b"\x00\xff body"), Compression.ZSTD)
SEGMENT_LZ4 = encode_segment(recs(30), Compression.LZ4)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([SEGMENT, SEGMENT_LZ4]), st.data())
def test_any_flipped_byte_is_detected(seg, data):
    i = data.draw(st.integers(0, len(seg) - 1))
    bit = data.draw(st.integers(0, 7))
    damaged = seg[:i] + bytes([seg[i] ^ (1 << bit)]) + seg[i + 1:]
    if 6 <= i < 8:  # reserved bytes: readers ignore them, but the CRC still covers them
        pass
    with pytest.raises(SegmentError):
        decode_segment(damaged, "k")


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([SEGMENT, SEGMENT_LZ4]), st.data())
def test_any_truncation_is_detected(seg, data):
    n = data.draw(st.integers(0, len(seg) - 1))
    with pytest.raises(SegmentError):
        decode_segment(seg[:n], "k")


@settings(max_examples=60, deadline=None)
@given(st.lists(record_strategy, max_size=8), st.sampled_from(list(Compression)))
def test_property_round_trip(rs, comp):
    seg = decode_segment(encode_segment(rs, comp))
    assert [encode_record(r) for r in seg.records] == [encode_record(r) for r in rs]


class Sink:
    def __init__(self):
        self.files: dict[int, bytes] = {}

    def __call__(self, seq: int, data: bytes) -> str:
        self.files[seq] = data
        return f"b/queues/_default/q/{segment_file_name(seq, Compression.ZSTD)}"


def test_writer_rotates_on_size_and_reports_metadata():
    sink = Sink()
    w = SegmentWriter(sink, Compression.ZSTD, max_bytes=2000, max_interval_ms=10**9)
    rs = recs(100, body=b"x" * 100)
    metas = [m for m in (w.append(r) for r in rs) if m]
    last = w.flush()
    metas.append(last)
    assert [m.sequence for m in metas] == list(range(1, len(metas) + 1)) and len(metas) > 3
    got = []
    for m in metas:
        data = sink.files[m.sequence]
        seg = decode_segment(data, m.key)
        got += seg.records
        assert m.checksum == hashlib.sha256(data).hexdigest() and m.size_bytes == len(data)
        assert m.record_count == len(seg.records) and m.uncompressed_bytes == seg.uncompressed_bytes
        assert (m.first_timestamp, m.last_timestamp) == (seg.records[0].backed_up_at, seg.records[-1].backed_up_at)
        if m is not last:
            assert m.uncompressed_bytes >= 2000  # rotated only once the size was reached
    assert got == rs
    assert metas[0].key.endswith("segment-0001.zst")


def test_append_many_matches_append():
    a, b = Sink(), Sink()
    rs = recs(500, body=b"y" * 50)
    wa = SegmentWriter(a, max_bytes=5000, max_interval_ms=10**9)
    for r in rs:
        wa.append(r)
    wa.flush()
    wb = SegmentWriter(b, max_bytes=5000, max_interval_ms=10**9)
    wb.append_many(rs)
    wb.flush()
    assert a.files == b.files


def test_writer_rotates_on_interval():
    now = [0.0]
    sink = Sink()
    w = SegmentWriter(sink, max_bytes=10**9, max_interval_ms=1000, clock=lambda: now[0])
    assert w.append(recs(1)[0]) is None
    now[0] = 0.5
    assert w.append(recs(2)[1]) is None
    now[0] = 1.0
    m = w.append(recs(3)[2])
    assert m is not None and m.record_count == 3
    assert w.flush() is None  # nothing pending


def test_file_names():
    assert segment_file_name(1, Compression.ZSTD) == "segment-0001.zst"
    assert segment_file_name(42, Compression.LZ4) == "segment-0042.lz4"
    assert segment_file_name(7, Compression.NONE) == "segment-0007"
    assert segment_file_name(12345, Compression.ZSTD) == "segment-12345.zst"
    with pytest.raises(ValueError):
        segment_file_name(0, Compression.ZSTD)
