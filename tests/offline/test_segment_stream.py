"""Segments written to their files while they are built (``SegmentStream`` + ``FileSpool``): the
same files and checksums as segments stored whole, whatever the count hint says, and a failing or
slow spool changes nothing but the time."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from rbak.repo.catalog import load_manifest
from rbak.errors import StorageError
from rbak.format import segment_buffer
from rbak.format.record import BackupRecord
from rbak.offline.writer import WriteOptions, write_backup
from rbak.storage.fs import FileSpool, FilesystemStorage
from rbak.repo.validate import validate_backup

pytestmark = pytest.mark.skipif(not segment_buffer.CAN_STREAM, reason="segments are streamed only with the C helper")


class WholePuts(FilesystemStorage):
    """Stores every object whole (a subclass that overrides put gets no spools)."""

    def put(self, key, data):
        super().put(key, data)


class Hinted:
    """Records with a length hint that may lie (the writer must not trust it)."""

    def __init__(self, recs, lie: int = 0):
        self._it, self._left, self._lie = iter(recs), len(recs), lie

    def __iter__(self):
        return self

    def __next__(self):
        r = next(self._it)
        self._left -= 1
        return r

    def __length_hint__(self):
        return max(self._left + self._lie, 0)


def records(n: int, same_ts: bool = True, big_every: int = 0) -> list[BackupRecord]:
    out = []
    for i in range(n):
        size = 2_500_000 if big_every and i % big_every == big_every - 1 else (i * 37) % 5000
        out.append(BackupRecord(body=os.urandom(size), delivery_tag=i + 1,
                                backed_up_at=7000 if same_ts else 7000 + i, source_queue="q", routing_key=f"k{i}"))
    return out


def files_under(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def stored(storage, backup_id):
    m = load_manifest(storage, backup_id)
    segs = [s for q in m.queues for s in q.segments]
    return [(s.key, s.record_count, s.checksum, storage.get(s.key)) for s in segs]


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(segment_buffer, "STREAM_CHUNK_BYTES", 16 * 1024)


@pytest.mark.parametrize("same_ts", [True, False])
@pytest.mark.parametrize("lie", [0, 1, -1, None])
@pytest.mark.parametrize("max_bytes", [256 * 1024, 3 << 20])  # a batch fills several segments / a segment has several
def test_streamed_segments_are_the_files_stored_whole(tmp_path, small_chunks, same_ts, lie, max_bytes, monkeypatch):
    early: dict[str, str | None] = {}  # segment key -> its hash if taken as it was written
    finish_hash = segment_buffer.SegmentStream.finish_hash

    def record(self, data):
        early[self.spool.key] = finish_hash(self, data)
        return early[self.spool.key]

    monkeypatch.setattr(segment_buffer.SegmentStream, "finish_hash", record)
    recs = records(1500, same_ts)
    source = list(recs) if lie is None else Hinted(recs, lie)  # None: a generator-like source, no hint
    if lie is None:
        source = (r for r in recs)
    streamed = FilesystemStorage(tmp_path / "a")
    whole = WholePuts(tmp_path / "b")
    for st, src in ((streamed, source), (whole, list(recs))):
        write_backup(st, "x", [("/", "q", "classic", src)], WriteOptions(compression="none", segment_max_bytes=max_bytes))
    a, b = stored(streamed, "x"), stored(whole, "x")
    assert len(a) > 3 and [x[:3] for x in a] == [x[:3] for x in b]
    assert [x[3] for x in a] == [x[3] for x in b]
    for _key, _n, checksum, data in a:
        assert hashlib.sha256(data).hexdigest() == checksum
    assert validate_backup(streamed, "x", deep=True).ok
    assert not [f for f in files_under(tmp_path) if ".rbak-tmp-" in f]
    # the last segment is hashed as it is written only when the hint and the timestamps tell its header
    if lie is None:  # a source that cannot tell its count: segments stored whole
        assert early == {}
        return
    # In segment order: two pipeline threads store them, so a short last segment may finish first.
    assert sorted(early) == sorted(key for key, *_ in a)
    hashed = [early[key] for key, *_ in a]
    # (a hint one short is clamped to 0 once the source is exhausted: right again by the last batch)
    assert (hashed[-1] is not None) == (lie in (0, -1) and same_ts)
    assert all(h is None for h in hashed[:-1]) or max_bytes > 1 << 20


def test_a_record_past_the_reserved_size_waits_for_the_stretches_being_written(tmp_path, small_chunks, monkeypatch):
    refused_once = threading.Event()
    original = FileSpool.write_at

    def write_at(self, data, offset):
        refused_once.wait(5)  # the first stretch stays in flight until the encoder has tried to grow
        original(self, data, offset)

    monkeypatch.setattr(FileSpool, "write_at", write_at)
    refused = []
    add_from = segment_buffer.SegmentBuffer.add_from

    def counting_add_from(self, *a):
        try:
            return add_from(self, *a)
        except BufferError:
            refused.append(self.end)
            refused_once.set()
            raise

    monkeypatch.setattr(segment_buffer.SegmentBuffer, "add_from", counting_add_from)
    # A first batch (512 records) streams its stretch, then a record whose JSON (~18 MB) is past the
    # 8 MiB segment's reserve arrives in the next batch: the buffer may grow only once that stretch is written.
    recs = [BackupRecord(body=os.urandom(1000), delivery_tag=i + 1, backed_up_at=7000) for i in range(512)]
    recs += [BackupRecord(body=os.urandom(5_000_000), delivery_tag=513, backed_up_at=7000)]
    recs += [BackupRecord(body=os.urandom(1000), delivery_tag=514 + i, backed_up_at=7000) for i in range(100)]
    write_backup(FilesystemStorage(tmp_path / "a"), "x", [("/", "q", "classic", Hinted(recs))], WriteOptions(compression="none", segment_max_bytes=8 << 20))
    write_backup(WholePuts(tmp_path / "b"), "x", [("/", "q", "classic", list(recs))], WriteOptions(compression="none", segment_max_bytes=8 << 20))
    assert len(refused) == 1  # the growth was refused once, then done after the drain
    a, b = stored(FilesystemStorage(tmp_path / "a"), "x"), stored(FilesystemStorage(tmp_path / "b"), "x")
    assert a == b and len(a) == 2


def test_a_failing_spool_write_reaches_the_caller_and_leaves_nothing(tmp_path, small_chunks, monkeypatch):
    original = FileSpool.write_at

    def write_at(self, data, offset):
        if self.key.endswith("/segment-0003"):
            raise StorageError(f"file://{tmp_path}: cannot write key {self.key!r}: injected disk full")
        original(self, data, offset)

    monkeypatch.setattr(FileSpool, "write_at", write_at)
    with pytest.raises(StorageError) as e:
        write_backup(FilesystemStorage(tmp_path), "flaky", [("/", "q", "classic", Hinted(records(600)))], WriteOptions(compression="none", segment_max_bytes=256 * 1024))
    assert e.value.args == (f"file://{tmp_path}: cannot write key 'flaky/queues/_default/q/segment-0003': "
                            "injected disk full",)
    assert files_under(tmp_path) == []  # no segment, no manifest, no temp file


def test_a_failure_while_decoding_discards_the_segment_being_streamed(tmp_path, small_chunks, monkeypatch):
    class Failing(Hinted):
        def __next__(self):
            if self._left == 50:
                assert opened, "the segment is being streamed when the source fails"
                raise StorageError("injected: the source went away")
            return super().__next__()

    opened = []
    open_spool = FilesystemStorage.open_spool
    monkeypatch.setattr(FilesystemStorage, "open_spool", lambda self, key: opened.append(key) or open_spool(self, key))
    with pytest.raises(StorageError, match="injected"):
        write_backup(FilesystemStorage(tmp_path), "broken", [("/", "q", "classic", Failing(records(1800)))], WriteOptions(compression="none", segment_max_bytes=64 * 1024 * 1024))
    assert opened and files_under(tmp_path) == []


def test_compressed_and_encrypted_segments_are_stored_whole(tmp_path, monkeypatch):
    opened = []
    monkeypatch.setattr(FilesystemStorage, "open_spool",
                        lambda self, key: opened.append(key))  # would return None: whole puts
    write_backup(FilesystemStorage(tmp_path), "z", [("/", "q", "classic", records(50))], WriteOptions(compression="zstd"))
    assert opened == []
