"""``offline.write_backup`` with segments stored by background threads: the guarantees of a
sequential writer (order, manifest last, cleanup, refusal, unchanged errors) still hold."""

from __future__ import annotations

import os

import pytest

from rbak.repo.catalog import load_manifest
from rbak.errors import ConfigError, ImportFormatError, StorageError
from rbak.format.record import BackupRecord
from rbak.format.segment import decode_segment
from rbak.offline.writer import write_backup
from rbak.storage import open_storage
from rbak.storage.fs import FilesystemStorage
from rbak.repo.validate import validate_backup


def records(n: int, tag: str) -> list[BackupRecord]:
    return [BackupRecord(body=os.urandom(i % 3000), delivery_tag=i + 1, backed_up_at=5000 + i,
                         source_queue=tag, routing_key=f"{tag}.{i}") for i in range(n)]


def files_under(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_queues_of_many_segments_keep_order(tmp_path, compression):
    queues = {("/", "a"): records(700, "a"), ("v2", "b"): records(30, "b"), ("v2", "c"): records(900, "c")}
    url = f"file://{tmp_path}"
    m = write_backup(url, "many", [(v, q, "classic", rs) for (v, q), rs in queues.items()],
                     compression=compression, segment_max_bytes=64 * 1024)
    storage = open_storage(url)
    assert load_manifest(storage, "many").to_json() == m.to_json() and m.completed_at is not None
    assert [(q.vhost, q.name) for q in m.queues] == list(queues)
    assert validate_backup(storage, "many", deep=True).ok
    for q, rs in zip(m.queues, queues.values()):
        assert [s.sequence for s in q.segments] == list(range(1, len(q.segments) + 1))
        got = [r for s in q.segments for r in decode_segment(storage.get(s.key), s.key).records]
        assert got == rs and q.message_count == len(rs)
    assert len(m.queues[0].segments) > 5 and len(m.queues[2].segments) > 5


def test_decode_error_midway_deletes_stored_segments_and_keeps_the_message(tmp_path):
    def failing():
        yield from records(2000, "x")  # several segments already handed to the threads
        raise ImportFormatError("queue x: file 7.idx at offset 4096: injected damage")

    with pytest.raises(ImportFormatError) as e:
        write_backup(f"file://{tmp_path}", "broken", [("/", "ok", "classic", records(500, "ok")),
                                                       ("/", "x", "classic", failing())],
                     compression="zstd", segment_max_bytes=32 * 1024)
    assert e.value.args == ("queue x: file 7.idx at offset 4096: injected damage",)
    assert files_under(tmp_path) == []  # no segment, no manifest, no temp file


def test_storage_error_in_a_writer_thread_reaches_the_caller_unchanged(tmp_path):
    class Flaky(FilesystemStorage):
        def put(self, key, data):
            if key.endswith("/segment-0004"):
                raise StorageError(f"{self.url}: cannot write key {key!r}: injected disk full")
            super().put(key, data)

    store = Flaky(tmp_path)
    with pytest.raises(StorageError) as e:
        write_backup(store, "flaky", [("/", "q", "classic", records(3000, "q"))], compression="none",
                     segment_max_bytes=32 * 1024)
    assert e.value.args == (f"file://{tmp_path}: cannot write key 'flaky/queues/_default/q/segment-0004': "
                            "injected disk full",)
    assert files_under(tmp_path) == []


def test_existing_backup_id_is_refused_and_left_alone(tmp_path):
    url = f"file://{tmp_path}"
    write_backup(url, "b1", [("/", "q", "classic", records(10, "q"))])
    before = {p: (tmp_path / p).read_bytes() for p in files_under(tmp_path)}
    with pytest.raises(ConfigError, match="backup_id: a backup 'b1' already exists"):
        write_backup(url, "b1", [("/", "q", "classic", records(20, "q"))])
    assert {p: (tmp_path / p).read_bytes() for p in files_under(tmp_path)} == before
