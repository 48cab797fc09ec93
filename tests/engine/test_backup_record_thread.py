"""The backup's encoder thread: the same segments, bytes and checkpoint tags as encoding each
delivery in the reading thread (``append_encoded``), bounded, and its errors reach the reader."""

from __future__ import annotations

import os
import threading

import pytest

from rbak.backup import record_thread
from rbak.backup.record_thread import RecordThread
from rbak.backup.segments import AsyncSegmentWriter
from rbak.format.compression import Compression
from rbak.format.record import BackupRecord, Double, Table, encode_record
from rbak.format.segment import decode_segment


def make_records(n: int) -> list[BackupRecord]:
    sizes = [0, 1, 300, 1024, 5000]
    return [BackupRecord(body=os.urandom(sizes[i % len(sizes)]), delivery_tag=i, backed_up_at=1_000 + i,
                         source_queue="q", source_vhost="/") for i in range(n)]


class Store:
    def __init__(self):
        self.files: dict[int, bytes] = {}
        self.tags: list = []

    def sink(self, seq, data):
        self.files[seq] = bytes(data)
        return f"seg-{seq}"

    def durable(self, meta, tag):
        self.tags.append((meta.sequence, tag))


def writer(store: Store, max_bytes: int, interval_ms: int = 60_000,
           comp: Compression = Compression.ZSTD) -> AsyncSegmentWriter:
    return AsyncSegmentWriter(store.sink, comp, None, max_bytes, interval_ms, 1, store.durable)


def reference(records, max_bytes, comp=Compression.ZSTD):
    store = Store()
    w = writer(store, max_bytes, comp=comp)
    for r in records:
        w.append_encoded(encode_record(r), r.backed_up_at, r.delivery_tag)
    metas = w.close()
    return store, metas


@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize("comp", list(Compression))
@pytest.mark.parametrize("batch", [1, 7, 256])
def test_same_segments_bytes_and_tags_as_encoding_in_the_reader(batch, comp, threaded):
    """Compressed or not (the payload's running CRC is only taken for uncompressed segments), on the
    encoder thread or batch by batch on the reading thread (``threaded=False``)."""
    records = make_records(700)
    ref_store, ref_metas = reference(records, 64 * 1024, comp)
    store = Store()
    rt = RecordThread(writer(store, 64 * 1024, comp=comp), lambda item: item[0], batch=batch, max_batches=2,
                      threaded=threaded)
    for r in records:
        rt.put((r,), r.delivery_tag)
    metas = rt.close()
    assert len(metas) > 3  # rotated on size several times
    assert store.files == ref_store.files
    assert [(m.sequence, m.record_count, m.checksum) for m in metas] == \
           [(m.sequence, m.record_count, m.checksum) for m in ref_metas]
    assert store.tags == ref_store.tags  # each segment's last delivery tag reaches the checkpoint
    got = [r for seq in sorted(store.files) for r in decode_segment(store.files[seq]).records]
    assert got == records


def test_age_rotation_uses_the_time_the_reader_took_each_record():
    """Records taken 10 ms apart with a 25 ms age limit: segments end at the record that reached the
    age, as append_encoded's clock would have it, whatever the batching."""
    records = make_records(10)
    store = Store()
    w = writer(store, 1 << 30, interval_ms=25)
    w.append_records(records, [i * 0.010 for i in range(10)], [r.delivery_tag for r in records])
    metas = w.close()
    # starts at 0 ms: 0,10,20,30 (30 - 0 >= 25 ends it); then 40..70; then 80, 90 (closed)
    assert [m.record_count for m in metas] == [4, 4, 2]
    assert store.tags == [(1, 3), (2, 7), (3, 9)]


def test_a_short_queue_starts_no_thread():
    records = make_records(5)
    store = Store()
    before = {t.name for t in threading.enumerate()}
    rt = RecordThread(writer(store, 1 << 20), lambda item: item[0])
    for r in records:
        rt.put((r,), None)
    assert "rbak-encode" not in {t.name for t in threading.enumerate()} - before
    metas = rt.close()
    assert sum(m.record_count for m in metas) == 5
    assert decode_segment(store.files[1]).records == records


def test_an_encoding_error_reaches_the_reader_and_nothing_is_written():
    records = make_records(50)

    def build(item):
        if item[0].delivery_tag == 20:
            raise ValueError("cannot build record 20")
        return item[0]

    store = Store()
    rt = RecordThread(writer(store, 1 << 20), build, batch=4, max_batches=1)
    with pytest.raises(ValueError, match="record 20"):
        for r in records:
            rt.put((r,), None)
        rt.close()
    rt.abort()
    assert store.files == {}  # the segment being built is dropped: nothing half-written
    assert not any(t.name == "rbak-encode" for t in threading.enumerate())


def test_a_failed_read_aborts_without_waiting_for_queued_batches():
    store = Store()
    rt = RecordThread(writer(store, 1 << 20), lambda item: item[0], batch=2, max_batches=1)
    for r in make_records(9):
        rt.put((r,), None)
    rt.abort()
    assert store.files == {}
    assert not any(t.name == "rbak-encode" for t in threading.enumerate())


def test_memory_is_bounded_by_the_queue(monkeypatch):
    """The reader waits while max_batches batches are queued: never more deliveries in flight."""
    gate = threading.Event()
    seen: list[int] = []
    store = Store()
    rt = RecordThread(writer(store, 1 << 20), lambda item: (gate.wait(), item[0])[1], batch=3, max_batches=2)
    done = threading.Event()

    def reader():
        for r in make_records(30):
            rt.put((r,), None)
            seen.append(r.delivery_tag)
        done.set()

    t = threading.Thread(target=reader)
    t.start()
    assert not done.wait(0.3)
    # one batch being built, two queued, one filling: at most 4 batches' deliveries taken
    assert len(seen) <= 4 * 3
    gate.set()
    t.join(5)
    assert done.is_set()
    assert sum(m.record_count for m in rt.close()) == 30


def test_headers_records_through_the_thread_match():
    """A record whose headers the C codec hands to orjson still lands in order, same bytes."""
    records = make_records(20)
    records[7].headers = (("x-float", Double(1.5)), ("x-t", Table((("a", Double(2.5)),))))
    ref_store, _ = reference(records, 1 << 20)
    store = Store()
    rt = RecordThread(writer(store, 1 << 20), lambda item: item[0], batch=3)
    for r in records:
        rt.put((r,), r.delivery_tag)
    rt.close()
    assert store.files == ref_store.files


def test_defaults_bound_memory():
    assert record_thread.BATCH * record_thread.MAX_BATCHES <= 4096


def test_large_bodies_hand_off_by_bytes():
    """Batches are bounded by their bodies' bytes too, so big messages cannot pile up BATCH deep."""
    store = Store()
    rt = RecordThread(writer(store, 1 << 30), lambda item: item[0], batch=1000, max_batches=1, batch_bytes=10_000)
    records = [BackupRecord(body=os.urandom(6_000), delivery_tag=i, backed_up_at=i) for i in range(3)]
    rt.put((records[0],), None, 6_000)
    assert rt._thread is None and len(rt._items) == 1
    rt.put((records[1],), None, 6_000)  # 12,000 bytes >= 10,000: handed to the thread
    assert rt._thread is not None and rt._items == []
    rt.put((records[2],), None, 6_000)
    metas = rt.close()
    assert decode_segment(store.files[1]).records == records and metas[0].record_count == 3
