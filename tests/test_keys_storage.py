"""Key layout with hostile names, and the storage contract on every backend."""

from __future__ import annotations

import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbak.errors import ConfigError, NotFoundError, StorageError, UnsupportedStorageError
from rbak.format.compression import Compression
from rbak.format.layout import (
    HASHED_MARK, MAX_COMPONENT, BackupLayout, decode_name, decode_vhost, encode_name, encode_vhost, parse_segment_key,
)
from rbak.storage import FilesystemStorage, MemoryStorage, open_storage

HOSTILE = ["/", "_default", "..", ".", "a/b", "../../etc/passwd", "100%", "%2F", "sp ace", "ünï/cødé",
           "..%2F..", "q\nnewline", "~tilde", "_default/x", "segment-0001.zst", "a\\b", "%", "*?[]"]


def test_ordinary_names_match_the_rust_layout():
    lay = BackupLayout("prod-daily-2025-04-10", "backups")
    assert lay.segment("/", "orders", 1, Compression.ZSTD) == "backups/prod-daily-2025-04-10/queues/_default/orders/segment-0001.zst"
    assert lay.segment("production", "orders", 2, Compression.LZ4) == "backups/prod-daily-2025-04-10/queues/production/orders/segment-0002.lz4"
    assert lay.manifest == "backups/prod-daily-2025-04-10/manifest.json"
    assert lay.definitions(Compression.ZSTD) == "backups/prod-daily-2025-04-10/definitions/definitions.json.zst"
    assert lay.definitions(Compression.NONE) == "backups/prod-daily-2025-04-10/definitions/definitions.json"
    assert lay.offsets_db == "backups/prod-daily-2025-04-10/state/offsets.db"
    assert BackupLayout("b").manifest == "b/manifest.json"


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_one_safe_component_and_reversible(name):
    v, q = encode_vhost(name), encode_name(name)
    for comp in (v, q):
        assert "/" not in comp and comp not in (".", "..", "") and "\n" not in comp
    assert decode_vhost(v) == name and decode_name(q) == name
    key = BackupLayout("b", "p").segment(name, name, 3, Compression.ZSTD)
    assert key.startswith("p/b/queues/") and len(key.split("/")) == 6
    assert parse_segment_key(key) == ("b", name, name, "segment-0003.zst")


def test_default_vhost_and_literal_default_do_not_collide():
    assert encode_vhost("/") == "_default"
    assert encode_vhost("_default") != encode_vhost("/")


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1), st.text(min_size=1))
def test_encoding_is_injective(a, b):
    if a != b:
        assert encode_name(a) != encode_name(b) and encode_vhost(a) != encode_vhost(b)
    if HASHED_MARK not in encode_name(a):  # names too long for a component are hashed: the manifest maps them back
        assert decode_name(encode_name(a)) == a and decode_vhost(encode_vhost(a)) == a
    else:
        assert len(encode_name(a)) <= MAX_COMPONENT


@pytest.mark.parametrize("bad", ["", "..", "a/b", "../x", " spaces", "x" * 201, "-lead"])
def test_bad_backup_ids_are_refused(bad):
    with pytest.raises(ConfigError, match="backup_id"):
        BackupLayout(bad)


def test_prefix_cannot_climb():
    with pytest.raises(ConfigError, match="storage.prefix"):
        BackupLayout("b", "a/../..")


@pytest.fixture(params=["fs", "memory", "s3"])
def storage(request, tmp_path):
    if request.param == "fs":
        return open_storage(f"file://{tmp_path}/store")
    if request.param == "memory":
        return open_storage("memory://")
    return open_storage(request.getfixturevalue("s3_bucket"))


def test_storage_contract(storage):
    assert list(storage.list("b/")) == [] and storage.size("b/x") is None and not storage.exists("b/x")
    storage.put("b/queues/_default/q/segment-0001.zst", b"one")
    storage.put("b/manifest.json", b"{}")
    storage.put("c/manifest.json", b"{}")
    storage.put("b/queues/_default/q/segment-0001.zst", b"two!")  # atomic replace
    assert storage.get("b/queues/_default/q/segment-0001.zst") == b"two!"
    assert storage.get_range("b/queues/_default/q/segment-0001.zst", 1, 2) == b"wo"
    assert storage.get_range("b/queues/_default/q/segment-0001.zst", 2, 100) == b"o!"
    assert storage.size("b/manifest.json") == 2 and storage.exists("b/manifest.json")
    assert list(storage.list("b/")) == ["b/manifest.json", "b/queues/_default/q/segment-0001.zst"]
    assert storage.list_dirs("") == ["b", "c"]
    with pytest.raises(NotFoundError, match="b/missing"):
        storage.get("b/missing")
    storage.delete("b/missing")  # absent: not an error
    assert storage.delete_prefix("b/") == 2
    assert list(storage.list("b/")) == [] and storage.get("c/manifest.json") == b"{}"
    with pytest.raises(StorageError):
        storage.put("../escape", b"x")
    with pytest.raises(StorageError):
        storage.delete_prefix("c")


def test_s3_multipart_upload_is_used_for_large_objects(s3_bucket):
    from rbak.storage.s3 import S3Storage
    s = open_storage(s3_bucket)
    assert isinstance(s, S3Storage)
    s._transfer.multipart_threshold = 5 * 1024 * 1024
    data = os.urandom(12 * 1024 * 1024)
    s.put("b/big", data)
    assert s.get("b/big") == data
    head = s3_bucket.client().head_object(Bucket=s3_bucket.bucket, Key="backups/b/big")
    assert "-" in head["ETag"]  # multipart ETags carry the part count


def test_s3_missing_bucket_is_a_clear_error(moto_s3):
    from support.s3 import storage_url
    s = open_storage(storage_url(moto_s3, "no-such-bucket"))
    with pytest.raises(StorageError, match="no-such-bucket"):
        s.put("k", b"x")


def test_fs_never_leaves_a_half_written_file(tmp_path, monkeypatch):
    s = FilesystemStorage(tmp_path)
    s.put("a/k", b"old")
    real_write = os.fdopen

    def failing_fdopen(*a, **kw):
        f = real_write(*a, **kw)
        orig = f.write

        def write(data):
            orig(data[: len(data) // 2])
            raise OSError(28, "No space left on device")
        f.write = write
        return f
    monkeypatch.setattr(os, "fdopen", failing_fdopen)
    with pytest.raises(StorageError, match="a/k"):
        s.put("a/k", b"new contents")
    monkeypatch.undo()
    assert s.get("a/k") == b"old"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["k"]


def test_memory_named_is_shared_and_thread_safe():
    a, b = open_storage("memory://shared-x"), open_storage("memory://shared-x")
    assert a is b and isinstance(a, MemoryStorage)
    threads = [threading.Thread(target=lambda i=i: a.put(f"k/{i}", b"v")) for i in range(20)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(list(b.list("k/"))) == 20


@pytest.mark.parametrize("url,match", [
    ("azure://acct.blob.core.windows.net/c", "azure:// storage is not supported yet"),
    ("gcs://bucket", "gcs:// storage is not supported yet"),
    ("ftp://x", "unknown storage URL scheme 'ftp'"),
    ("s3://", "has no bucket"),
    ("s3://b?regoin=x", "unknown parameter"),
    ("file://host/path", "file:///absolute/path"),
    ("", "empty storage URL"),
])
def test_bad_urls(url, match):
    with pytest.raises(StorageError, match=match) as ei:
        open_storage(url)
    if "not supported" in match:
        assert isinstance(ei.value, UnsupportedStorageError) and url in str(ei.value)


def test_s3_url_parameters():
    s = open_storage("s3://bkt/some/prefix?region=eu-west-1&endpoint=http%3A%2F%2F127.0.0.1%3A9&path_style=true")
    assert (s.bucket, s.prefix) == ("bkt", "some/prefix")
    assert s._client.meta.region_name == "eu-west-1" and s._client.meta.endpoint_url == "http://127.0.0.1:9"
