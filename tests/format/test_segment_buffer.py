"""The in-place segment writer: same bytes as the reference framing, buffers reused
only when no sink kept a view, and the background pipeline's order and errors."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from rbak.errors import StorageError
from rbak.format.compression import Compression
from rbak.format.record import BackupRecord, encode_record
from rbak.format.segment import decode_segment, encode_segment, frame_segment
from rbak.format.segment_buffer import SegmentBuffer
from rbak.format.segment_writer import SegmentPipeline, SegmentWriter


def recs(n: int, size: int = 300, start: int = 0) -> list[BackupRecord]:
    sizes = [0, 1, size, 3 * size, 70_000]  # empty body, growth past the first capacity
    return [BackupRecord(body=os.urandom(sizes[i % len(sizes)]), delivery_tag=i, backed_up_at=1000 + i,
                         source_queue="q") for i in range(start, start + n)]


def split_by(metas, records):
    out, i = [], 0
    for m in metas:
        out.append(records[i:i + m.record_count])
        i += m.record_count
    assert i == len(records)
    return out


@pytest.mark.parametrize("comp", list(Compression))
def test_in_place_frames_equal_the_reference_framing(comp):
    """Every segment (the first in a new buffer, later ones in a reused one) is byte for byte
    ``encode_segment`` of its records, and its metadata describes exactly those bytes."""
    files = {}
    w = SegmentWriter(lambda s, d: files.setdefault(s, bytes(d)) and f"k{s}", comp,
                      max_bytes=100_000, max_interval_ms=10**9)
    rs = recs(120)
    metas = w.append_many(rs[:70]) + [m for r in rs[70:] if (m := w.append(r))]
    metas += [m for m in [w.flush()] if m]
    assert len(metas) > 4
    for m, part in zip(metas, split_by(metas, rs)):
        data = files[m.sequence]
        assert data == encode_segment(part, comp)
        assert m.checksum == hashlib.sha256(data).hexdigest() and m.size_bytes == len(data)
        assert m.uncompressed_bytes == sum(4 + len(encode_record(r)) for r in part)


@pytest.mark.parametrize("comp", list(Compression))
def test_tiny_limit_grows_for_big_records_and_incompressible_frames(comp):
    """max_bytes below one record, and frames larger than their payload (lz4/zstd of a few bytes)."""
    files = {}
    w = SegmentWriter(lambda s, d: files.setdefault(s, bytes(d)) and f"k{s}", comp, max_bytes=8,
                      max_interval_ms=10**9)
    rs = [BackupRecord(body=b"x" * n, backed_up_at=n) for n in (0, 1, 5000, 2, 100_000, 3)]
    metas = [m for r in rs if (m := w.append(r))]
    assert len(metas) == len(rs) and w.flush() is None
    for m, r in zip(metas, rs):
        assert files[m.sequence] == encode_segment([r], comp)
        assert decode_segment(files[m.sequence]).records == [r]


def test_frame_segment_matches_a_direct_concatenation():
    payload = b"\x05\x00\x00\x00hello"
    header = frame_segment(payload, 1, 7, 9, Compression.NONE)[:32]
    import struct
    import zlib
    body = header + payload
    assert frame_segment(payload, 1, 7, 9, Compression.NONE) == body + struct.pack("<I", zlib.crc32(body)) + b"KABR"


KEEPERS = {
    "the view itself": (lambda d: d, lambda k: k),
    "a slice of it": (lambda d: (d[:1], d[0:]), lambda k: k[1]),
    "a numpy array on it": (lambda d: np.frombuffer(d, np.uint8), lambda k: k.tobytes()),
    "its bytearray": (lambda d: (d.obj, len(d)), lambda k: bytes(k[0][:k[1]])),
}


@pytest.mark.parametrize("comp", [Compression.NONE, Compression.ZSTD])
@pytest.mark.parametrize("how", list(KEEPERS))
def test_a_sink_that_keeps_its_data_never_sees_it_change(comp, how):
    keep, read = KEEPERS[how]
    kept = {}
    w = SegmentWriter(lambda s, d: kept.setdefault(s, keep(d)) is not None and f"k{s}", comp,
                      max_bytes=20_000, max_interval_ms=10**9)
    rs = recs(60)
    metas = w.append_many(rs) + [m for m in [w.flush()] if m]
    assert len(metas) > 5
    for m, part in zip(metas, split_by(metas, rs)):
        data = read(kept[m.sequence])
        assert hashlib.sha256(data).hexdigest() == m.checksum
        assert decode_segment(data).records == part


def test_buffer_is_reused_only_when_unshared():
    seg = SegmentBuffer(1 << 20)
    for _ in range(3):
        seg.add(b'{"body":null}', 1)
        view = seg.frame(Compression.NONE)
        assert bytes(view[:4]) == b"RBAK" and bytes(view[-4:]) == b"KABR"
        del view
        assert seg.recycle() and seg.count == 0 and seg.payload_bytes == 0
    seg.add(b"{}", 2)
    kept = seg.frame(Compression.ZSTD)[5:]
    assert not seg.recycle()  # a view is alive: this buffer must not be written again
    before = bytes(kept)
    with pytest.raises(BufferError):
        seg._buf.append(0)
    assert bytes(kept) == before


@pytest.mark.parametrize("workers,inflight", [(1, 1), (2, 3)])
def test_pipeline_writes_the_same_segments_in_order(workers, inflight):
    """Several writers share one pipeline; each writer's metadata is in sequence order and the
    files equal the synchronous writer's."""
    sync_files, pipe_files = {}, {}
    queues = {f"q{i}": recs(50, start=i * 100) for i in range(3)}
    for q, rs in queues.items():
        w = SegmentWriter(lambda s, d, q=q: sync_files.setdefault((q, s), bytes(d)) and f"{q}/{s}",
                          Compression.ZSTD, max_bytes=30_000, max_interval_ms=10**9)
        w.append_many(rs)
        w.flush()
    pipe = SegmentPipeline(workers=workers, max_inflight=inflight)
    writers = []
    for q, rs in queues.items():
        w = SegmentWriter(lambda s, d, q=q: pipe_files.setdefault((q, s), bytes(d)) and f"{q}/{s}",
                          Compression.ZSTD, max_bytes=30_000, max_interval_ms=10**9, pipeline=pipe)
        assert w.append_many(rs) == [] and w.flush() is None  # results come with close()
        writers.append(w)
    pipe.close()
    assert pipe_files == sync_files
    for w, (q, rs) in zip(writers, queues.items()):
        assert [m.sequence for m in w.written] == list(range(1, len(w.written) + 1))
        assert [m.key for m in w.written] == [f"{q}/{m.sequence}" for m in w.written]
        assert sum(m.record_count for m in w.written) == len(rs)


def test_pipeline_error_surfaces_unchanged_and_stops_nothing_half_done():
    stored = []

    def sink(seq, data):
        if seq == 3:
            raise StorageError(f"segment {seq}: injected failure")
        stored.append(seq)
        return f"k{seq}"

    pipe = SegmentPipeline(workers=2, max_inflight=3)
    w = SegmentWriter(sink, Compression.NONE, max_bytes=10_000, max_interval_ms=10**9, pipeline=pipe)
    with pytest.raises(StorageError, match="segment 3: injected failure") as e:
        for r in recs(400):
            w.append(r)
        w.flush()
        pipe.close()
    pipe.abort()
    assert e.value.args == ("segment 3: injected failure",)  # the thread's exception itself
    assert 3 not in stored and len(w.written) <= 2


@pytest.mark.parametrize("sealed", [False, True])
def test_big_segments_hashed_beside_the_sink_describe_the_stored_bytes(sealed):
    """Segments past PARALLEL_HASH_BYTES are hashed in a helper thread while the sink stores them;
    the checksum is still that of the bytes stored (the sealed ones when the sink seals), and the
    buffer is reused afterwards (the helper kept no view)."""
    from rbak.format.segment_buffer import PARALLEL_HASH_BYTES, store_segment

    stored = {}

    def sink(seq, data):
        blob = b"sealed:" + bytes(data) if sealed else bytes(data)
        stored[seq] = blob
        return (f"k{seq}", blob) if sealed else f"k{seq}"

    seg = SegmentBuffer(64 << 20)
    records = recs(PARALLEL_HASH_BYTES // 70_000 * 5 + 10)
    for r in records:
        seg.add(encode_record(r), r.backed_up_at)
    meta = store_segment(seg, 1, Compression.NONE, None, sink)
    assert len(stored[1]) >= PARALLEL_HASH_BYTES
    assert meta.checksum == hashlib.sha256(stored[1]).hexdigest()
    assert meta.size_bytes == len(stored[1])
    assert [r.delivery_tag for r in decode_segment(stored[1][7:] if sealed else stored[1], "k1").records] \
        == [r.delivery_tag for r in records]
    assert seg.recycle()


@pytest.mark.parametrize("limit", [1, 5_000, 200_000, 10 << 20])
def test_append_from_writes_the_segments_append_many_writes(limit):
    """``append_from`` (the importer's encoder thread: C writes straight into the buffer) gives the
    same files and metadata as ``append_many``, rotation included, with records only orjson
    encodes (a Double header, a Table) in between, which it hands to the Python path."""
    from rbak.format.record import Double, LongString, Table

    records = recs(40)
    for i in (3, 17, 18, 39):
        records[i].headers = (("d", Double(1.5)), ("t", Table((("k", LongString("v")),))))

    def run(use_from: bool):
        files = {}
        w = SegmentWriter(lambda s, d: files.setdefault(s, bytes(d)) and f"k{s}", Compression.NONE,
                          max_bytes=limit, max_interval_ms=2**62)
        for chunk in (records[:7], records[7:30], records[30:]):
            if use_from:
                i = 0
                while i < len(chunk):
                    i = w.append_from(chunk, i)
            else:
                w.append_many(chunk)
        w.flush()
        return files, w.written

    files_from, metas_from = run(True)
    files_many, metas_many = run(False)
    assert files_from == files_many and metas_from == metas_many
    assert sum(m.record_count for m in metas_from) == len(records)


def test_the_c_helpers_crc32_is_zlibs_at_every_length_offset_and_seed():
    """The segment CRC the C helper takes as it writes (carry-less multiplication folding where the
    CPU has it, tables elsewhere) must be zlib.crc32's: short, odd, unaligned and long inputs."""
    import random
    import zlib

    from rbak.format.backend import speedups

    if speedups is None or not hasattr(speedups, "crc32"):
        pytest.skip("no C helper (RBAK_SPEEDUPS=0 or not built)")
    rnd = random.Random(18)
    blob = os.urandom(1 << 20)
    cases = [(0, n) for n in range(0, 200)] + [(rnd.randint(0, 31), rnd.randint(0, 70_000)) for _ in range(400)]
    cases += [(3, len(blob) - 3), (0, len(blob))]
    for off, n in cases:
        view = memoryview(blob)[off: off + n]
        for seed in (0, 0xFFFFFFFF, rnd.getrandbits(32)):
            assert speedups.crc32(view, seed) == zlib.crc32(view, seed), (off, n, seed)


def test_each_segment_records_its_largest_body_on_every_path():
    """Issue 45: ``max_body_bytes`` (an rbak manifest extension) is each segment's largest body, the
    same through append, append_many and append_from (C or Python); a record appended as bare JSON
    leaves it unknown (None), which is never written, so a reader scans instead."""
    from rbak.format.manifest import SegmentMetadata

    records = recs(60, size=900)
    expected = None
    for path in ("append", "many", "from"):
        w = SegmentWriter(lambda s, d: f"k{s}", Compression.ZSTD, max_bytes=150_000, max_interval_ms=2**62)
        if path == "append":
            for r in records:
                w.append(r)
        elif path == "many":
            w.append_many(records)
        else:
            i = 0
            while i < len(records):
                i = w.append_from(records, i)
        w.flush()
        got = [m.max_body_bytes for m in w.written]
        want = [max(len(r.body) for r in part) for part in split_by(w.written, records)]
        assert got == want and len(got) > 2 and max(got) == 70_000, (path, got)
        assert expected is None or got == expected
        expected = got
    w = SegmentWriter(lambda s, d: f"k{s}", Compression.NONE, max_bytes=150_000, max_interval_ms=2**62)
    w.append_encoded(encode_record(records[0]), 1000)
    meta = w.flush()
    assert meta is not None and meta.max_body_bytes is None and "max_body_bytes" not in meta.to_json_obj()
    obj = dict(meta.to_json_obj(), max_body_bytes=7)
    assert SegmentMetadata.from_json_obj(obj).max_body_bytes == 7 and list(obj)[-1] == "max_body_bytes"
