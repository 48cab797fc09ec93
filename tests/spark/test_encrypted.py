"""Spark validation and the data source on an encrypted backup: executors open segments with the
RBAK_ENCRYPTION_KEYS they are given; without it validation checks stored sizes and checksums only."""

from __future__ import annotations

import base64
import os

from rbak.repo.catalog import load_manifest
from rbak.sealing.crypto import EncryptionInfo, ObjectCodec
from rbak.format.segment import sha256_hex
from rbak.storage import open_storage
from rbak.repo.validate import validate_backup
from rbak_spark.synthetic import QueueSpec, write_backup
from rbak_spark.validate_job import run_validate

KEY = os.urandom(32)
RING = f"k1: {base64.b64encode(KEY).decode()}"


def encrypted_backup(url: str, backup_id: str):
    """A synthetic backup, then every segment sealed as rbak's backup writes them (manifest describing
    the stored ciphertext, key id recorded)."""
    storage = open_storage(url)
    m = write_backup(storage, backup_id, [QueueSpec("/", "orders", 80, 200), QueueSpec("prod", "q", 40, 100)],
                     segment_max_bytes=6000)
    codec = ObjectCodec(backup_id, EncryptionInfo("k1"), KEY)
    for q in m.queues:
        for s in q.segments:
            stored = codec.put(storage, s.key, storage.get(s.key))
            s.size_bytes, s.checksum = len(stored), sha256_hex(stored)
    m.encryption = codec.info
    m.recompute_totals()
    storage.put(f"{backup_id}/manifest.json", m.to_json())
    return storage, load_manifest(storage, backup_id)


def with_executor_keys(spark, value):
    env = spark.sparkContext.environment
    if value is None:
        env.pop("RBAK_ENCRYPTION_KEYS", None)
    else:
        env["RBAK_ENCRYPTION_KEYS"] = value


def assert_unverified(out: dict, n: int, why: str) -> None:
    """Issue 45: a deep check that decrypted nothing is not a pass: ok false, its own result and reason."""
    assert (out["ok"], out["result"], out["all_problems"]) == (False, "unverified", []), out
    assert out["unverified"] == f"{n} of {n} segment(s) not decrypted: {why}"
    assert out["summary"]["records"] == 0 and not any(s["contents_checked"] for s in out["segments"])


def test_spark_validate_and_read_an_encrypted_backup(spark, tmp_path, capsys):
    from rbak_spark.validate_job import main

    url = f"file://{tmp_path}"
    storage, m = encrypted_backup(url, "enc")
    assert m.total_segments >= 4
    try:
        with_executor_keys(spark, None)
        out = run_validate(spark, url, "enc")  # no key: stored sizes and SHA-256 only, proving nothing
        assert_unverified(out, m.total_segments, "key id 'k1' is not in the executors' keyring (RBAK_ENCRYPTION_KEYS)")
        from rbak.repo.catalog import latest_complete, latest_validation

        assert latest_validation(storage, "enc")[1]["result"] == "unverified"
        assert latest_complete(storage).backup_id == "enc"  # not failed either: as if never validated
        capsys.readouterr()
        assert main(["--path", url, "--backup-id", "enc", "--no-report"]) == 5
        printed = capsys.readouterr().out
        assert ": UNVERIFIED" in printed and "unverified: not decrypted (" in printed
        with_executor_keys(spark, RING)
        out = run_validate(spark, url, "enc", write_report=False)
        assert out["ok"] is True and out["result"] == "valid" and out["summary"]["records"] == m.total_messages == 120
        assert all(s["contents_checked"] for s in out["segments"])
        from rbak_spark.datasource import register

        register(spark)
        rows = spark.read.format("rbak").option("backup_id", "enc").load(url).count()
        assert rows == 120
        # damage a segment's ciphertext and forge the manifest's checksum: only the key can tell
        seg = m.queues[0].segments[1]
        data = bytearray(storage.get(seg.key))
        data[-30] ^= 1
        storage.put(seg.key, bytes(data))
        seg.checksum = sha256_hex(bytes(data))
        storage.put("enc/manifest.json", m.to_json())
        out = run_validate(spark, url, "enc", write_report=False)
        bad = [s for s in out["segments"] if not s["ok"]]
        assert [s["key"] for s in bad] == [seg.key]
        assert "cannot decrypt with key id 'k1'" in bad[0]["problems"][0]
        single = validate_backup(storage, "enc", deep=True, keyring={"k1": KEY})
        assert single.all_problems() == out["all_problems"]
    finally:
        with_executor_keys(spark, None)


def test_spark_validate_and_read_an_envelope_backup(spark, tmp_path):
    """Executors unwrap the data key with their own RBAK_ENCRYPTION_KEYS (once per worker); a key
    rotated in with a new wrap is enough on its own."""
    from rbak.sealing.envelope import KEYRING, Kek, KeySources, new_data_key, rewrap, write_wraps
    from rbak.format.layout import BackupLayout

    url = f"file://{tmp_path}"
    storage = open_storage(url)
    m = write_backup(storage, "env", [QueueSpec("/", "orders", 80, 200)], segment_max_bytes=6000,
                     random_bodies=True)
    from rbak.format.reader import read_segment

    plain = [r.body for s in m.queues[0].segments for _, r in read_segment(storage, s)]
    dek, info, wraps = new_data_key("env", KeySources({"k1": KEY}, wrap_with=(Kek(KEYRING, "k1"),)))
    write_wraps(storage, BackupLayout("env", ""), wraps)
    codec = ObjectCodec("env", info, dek)
    for q in m.queues:
        for s in q.segments:
            stored = codec.put(storage, s.key, storage.get(s.key))
            s.size_bytes, s.checksum = len(stored), sha256_hex(stored)
    m.encryption = info
    m.recompute_totals()
    storage.put("env/manifest.json", m.to_json())
    k2 = os.urandom(32)
    assert rewrap(storage, "", "env", info, Kek(KEYRING, "k2"), KeySources({"k1": KEY, "k2": k2})).outcome == "added"
    try:
        n = m.total_segments
        why = f"data key {info.key_id!r} could not be unwrapped with the executors' keyring (RBAK_ENCRYPTION_KEYS) or KMS"
        with_executor_keys(spark, None)
        assert_unverified(run_validate(spark, url, "env", write_report=False), n, why)  # no key
        with_executor_keys(spark, f"k3: {base64.b64encode(os.urandom(32)).decode()}")  # a key no wrap names
        assert_unverified(run_validate(spark, url, "env", write_report=False), n, why)
        with_executor_keys(spark, f"k2: {base64.b64encode(k2).decode()}")
        out = run_validate(spark, url, "env", write_report=False)
        assert out["ok"] is True and out["summary"]["records"] == 80
        from rbak_spark.datasource import register

        register(spark)
        bodies = [r.body for r in spark.read.format("rbak").option("backup_id", "env").load(url).collect()]
        assert sorted(bodies) == sorted(plain) and len(plain) == 80
    finally:
        with_executor_keys(spark, None)
