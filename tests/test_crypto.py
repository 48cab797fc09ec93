"""rbak/sealing/crypto.py: sealed objects, keyrings, the manifest's encryption field; S3 SSE arguments."""

from __future__ import annotations

import base64
import os

import pytest

from rbak.sealing.crypto import (MAGIC, EncryptionInfo, ObjectCodec, aad_for, codec_for, generate_key, load_keyring, open_, parse_header, seal)
from rbak.errors import ConfigError, EncryptionError, StorageError
from rbak.format.manifest import BackupManifest
from rbak.storage import open_storage
from rbak.storage.s3 import sse_args

K1, K2 = os.urandom(32), os.urandom(32)
SEG = "prod/b1/queues/_default/orders/segment-0001.zst"


def b64(k: bytes) -> str:
    return base64.b64encode(k).decode()


def test_seal_and_open_round_trip_with_the_key_id_in_the_header():
    plain = b"RBAK" + os.urandom(1000)
    blob = seal("k1", K1, plain, aad_for(SEG, "b1"))
    assert blob.startswith(MAGIC) and plain not in blob
    assert parse_header(blob, "x")[0] == "k1"
    assert len(blob) == len(plain) + 4 + 3 + 2 + 12 + 16
    assert open_("k1", K1, blob, aad_for(SEG, "b1")) == plain
    assert seal("k1", K1, plain, b"") != seal("k1", K1, plain, b"")  # fresh nonce per object


def test_wrong_key_tampering_and_moving_are_errors_naming_the_key_id():
    blob = seal("k1", K1, b"payload" * 100, aad_for(SEG, "b1"))
    with pytest.raises(EncryptionError, match="key id 'k1'.*wrong key"):
        open_("k1", K2, blob, aad_for(SEG, "b1"), "b1 segment")
    bad = bytearray(blob)
    bad[40] ^= 1
    with pytest.raises(EncryptionError, match="altered"):
        open_("k1", K1, bytes(bad), aad_for(SEG, "b1"))
    other = SEG.replace("segment-0001", "segment-0002")
    with pytest.raises(EncryptionError, match="moved"):
        open_("k1", K1, blob, aad_for(other, "b1"))
    with pytest.raises(EncryptionError, match="sealed with key id 'k1', expected 'k2'"):
        open_("k2", K2, blob, aad_for(SEG, "b1"))
    with pytest.raises(EncryptionError, match="not an encrypted rbak object"):
        open_("k1", K1, b"RBAK\x01....", b"")
    with pytest.raises(EncryptionError, match="truncated"):
        open_("k1", K1, blob[:20], b"")


def test_object_names_ignore_the_storage_prefix_so_a_moved_backup_still_opens():
    assert aad_for("a/b/b1/state/offsets.db", "b1") == aad_for("b1/state/offsets.db", "b1")
    with pytest.raises(EncryptionError, match="not an object of backup 'b2'"):
        aad_for(SEG, "b2")


def test_codec_is_a_no_op_for_plain_backups_and_names_backup_and_key_when_the_key_is_missing():
    store = open_storage("memory://")
    plain = ObjectCodec("b1")
    assert plain.put(store, SEG, b"abc") == b"abc" and store.get(SEG) == b"abc"
    info = EncryptionInfo("2026-11")
    with pytest.raises(EncryptionError, match=r"backup 'b1' is encrypted with key id '2026-11', which is not in the keyring"):
        codec_for("b1", info, {"old": K1})
    lenient = codec_for("b1", info, {}, required=False)
    assert lenient.encrypted and not lenient.can_open
    enc = codec_for("b1", info, {"2026-11": K1})
    stored = enc.put(store, SEG, b"secret")
    assert store.get(SEG) == stored and b"secret" not in stored
    assert enc.get(store, SEG) == b"secret"
    wrong = codec_for("b1", info, {"2026-11": K2})
    with pytest.raises(EncryptionError, match=r"backup 'b1': .*segment-0001.zst: cannot decrypt with key id '2026-11'"):
        wrong.get(store, SEG)


def test_keyrings_from_env_file_and_a_mounted_secret_directory(tmp_path):
    env = {"RBAK_ENCRYPTION_KEYS": f"k1: {b64(K1)}\nk2: {b64(K2)}\n"}
    assert load_keyring(environ=env) == {"k1": K1, "k2": K2}
    assert load_keyring(environ={"MY_KEY": b64(K1)}, env_var="MY_KEY", default_id="k1") == {"k1": K1}
    assert load_keyring(environ={"RBAK_ENCRYPTION_KEYS": '{"k1": "%s"}' % base64.urlsafe_b64encode(K1).decode()}) == {"k1": K1}
    assert load_keyring(environ={}) == {}
    f = tmp_path / "keyring.yaml"
    f.write_text(f"old: {b64(K1)}\n")
    assert load_keyring(str(f), environ=env) == {"k1": K1, "k2": K2, "old": K1}
    # a Kubernetes Secret volume: one file per key, plus the ..data machinery
    d = tmp_path / "secret"
    (d / "..2026_11_24").mkdir(parents=True)
    (d / "k1").write_text(b64(K1) + "\n")
    (d / "raw").write_bytes(K2)
    os.symlink("..2026_11_24", d / "..data")
    assert load_keyring(str(d), environ={}) == {"k1": K1, "raw": K2}
    edgy = b"\n" + bytes(range(128, 158)) + b" "  # raw key bytes that a strip() would cut
    (d / "raw").write_bytes(edgy)
    assert load_keyring(str(d), environ={}) == {"k1": K1, "raw": edgy}
    with pytest.raises(ConfigError, match="keys_env: environment variable NOPE is not set"):
        load_keyring(environ={}, env_var="NOPE")
    with pytest.raises(ConfigError, match="key id 'k1'.*32 bytes, this one decodes to 16"):
        load_keyring(environ={"RBAK_ENCRYPTION_KEYS": f"k1: {b64(os.urandom(16))}"})
    with pytest.raises(ConfigError, match="single key but no key id"):
        load_keyring(environ={"RBAK_ENCRYPTION_KEYS": generate_key()})


def test_the_manifest_names_the_key_id_and_plain_manifests_have_no_encryption_field():
    m = BackupManifest(backup_id="b1", created_at=1, completed_at=2)
    assert b"encryption" not in m.to_json()
    m.encryption = EncryptionInfo("k1")
    back = BackupManifest.from_json(m.to_json())
    assert back.encryption == EncryptionInfo("k1") and back.to_json() == m.to_json()
    assert b'"encryption": {\n    "algorithm": "AES-256-GCM",\n    "key_id": "k1"\n  }\n}' in m.to_json()


def test_sse_arguments_for_boto3():
    assert sse_args(None, None) == {}
    assert sse_args("AES256", None) == {"ServerSideEncryption": "AES256"}
    assert sse_args("aws:kms", "arn:k") == {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "arn:k"}
    with pytest.raises(StorageError, match="sse_kms_key_id needs sse=aws:kms"):
        sse_args("AES256", "arn:k")
    with pytest.raises(StorageError, match="must be one of AES256, aws:kms"):
        sse_args("DES", None)
