"""rbak/sealing/envelope.py without a broker: data keys, keyring wraps, rewrap, tampering, the config and
manifest fields. Broker and moto (S3, KMS, Object Lock) tests: tests/engine/test_envelope.py."""

from __future__ import annotations

import base64
import os

import orjson
import pytest

from rbak.config import Config
from rbak.sealing.crypto import ObjectCodec, codec_for
from rbak.sealing.envelope import (KEYRING, Kek, KeySources, WrapRecord, data_key, fingerprint, new_data_key, rewrap,
                           with_data_key, write_wraps)
from rbak.errors import ConfigError, EncryptionError
from rbak.format.manifest import BackupManifest, EncryptionInfo
from rbak.format.layout import BackupLayout
from rbak.storage import open_storage

K1, K2, K3 = os.urandom(32), os.urandom(32), os.urandom(32)
SEG = "pfx/b1/queues/_default/orders/segment-0001.zst"


def sources(wrap_with=("k1",), **ring: bytes) -> KeySources:
    return KeySources(ring, wrap_with=tuple(Kek(KEYRING, k) for k in wrap_with))


def stored_backup(store, backup_id="b1", **ring):
    dek, info, wraps = new_data_key(backup_id, sources(**ring))
    write_wraps(store, BackupLayout(backup_id, "pfx"), wraps)
    blob = ObjectCodec(backup_id, info, dek).put(store, SEG.replace("b1", backup_id), b"RBAK payload")
    return dek, info, blob


def test_each_backup_has_its_own_data_key_stored_only_wrapped():
    store = open_storage("memory://")
    dek, info, blob = stored_backup(store, k1=K1)
    dek2, info2, _ = stored_backup(store, "b2", k1=K1)
    assert dek != dek2 and info.key_id != info2.key_id and info.key_id.startswith("dek-")
    assert info.dek_fingerprint == fingerprint(dek) and dek.hex() not in info.dek_fingerprint
    wrap = store.get("pfx/b1/keys/keyring-k1.wrap.json")
    doc = orjson.loads(wrap)
    assert doc["kek_source"] == "keyring" and doc["kek_id"] == "k1" and doc["algorithm"] == "AES-256-GCM"
    assert doc["backup_id"] == "b1" and dek not in base64.b64decode(doc["wrapped_key"]) and dek not in wrap
    # the segment is sealed exactly as a direct-key one, under the data key's id
    assert blob[7:7 + len(info.key_id)] == info.key_id.encode()
    ring = with_data_key(store, "pfx", "b1", info, {"k1": K1})
    assert codec_for("b1", info, ring).get(store, SEG) == b"RBAK payload"


def test_manifest_field_is_additive_direct_key_and_plain_manifests_keep_their_bytes():
    plain = BackupManifest(backup_id="p", created_at=1)
    assert b"encryption" not in plain.to_json()
    direct = BackupManifest(backup_id="d", created_at=1, encryption=EncryptionInfo("k1"))
    assert orjson.loads(direct.to_json())["encryption"] == {"algorithm": "AES-256-GCM", "key_id": "k1"}
    env = EncryptionInfo("dek-0123456789abcdef", dek_fingerprint="sha256:ab")
    m = BackupManifest(backup_id="e", created_at=1, encryption=env)
    assert orjson.loads(m.to_json())["encryption"]["envelope"] == {"dek_fingerprint": "sha256:ab"}
    assert BackupManifest.from_json(m.to_json()).encryption == env
    with pytest.raises(Exception, match="encryption.envelope"):
        BackupManifest.from_json(m.to_json().replace(b'"dek_fingerprint"', b'"x"'))


def test_rewrap_adds_one_object_then_only_the_new_key_opens_and_a_rerun_changes_nothing():
    store = open_storage("memory://")
    dek, info, _ = stored_backup(store, k1=K1)
    both = KeySources({"k1": K1, "k2": K2})
    before = {k: store.get(k) for k in store.list("pfx/")}
    r = rewrap(store, "pfx", "b1", info, Kek(KEYRING, "k2"), both)
    assert (r.outcome, r.key) == ("added", "pfx/b1/keys/keyring-k2.wrap.json"), r.detail
    new_keys = sorted(k for k in store.list("pfx/") if k not in before)
    assert new_keys == ["pfx/b1/keys/keyring-k2.wrap.json"]
    assert all(store.get(k) == v for k, v in before.items())  # nothing rewritten
    again = rewrap(store, "pfx", "b1", info, Kek(KEYRING, "k2"), both)
    assert again.outcome == "already" and "already wrapped for keyring 'k2'" in again.detail
    # k1 retired: only k2 in the keyring
    got, used = data_key(store, BackupLayout("b1", "pfx"), info, KeySources({"k2": K2}))
    assert got == dek and used.kek_id == "k2"


def test_no_key_names_the_backup_and_every_key_tried():
    store = open_storage("memory://")
    _, info, _ = stored_backup(store, k1=K1)
    rewrap(store, "pfx", "b1", info, Kek(KEYRING, "k2"), KeySources({"k1": K1, "k2": K2}))
    with pytest.raises(EncryptionError) as e:
        with_data_key(store, "pfx", "b1", info, {"k3": K3})
    msg = str(e.value)
    assert (f"backup 'b1': no key-encryption key could unwrap its data key {info.key_id!r}; tried: ") in msg
    assert "keyring 'k1' (not in the keyring)" in msg and "keyring 'k2' (not in the keyring)" in msg
    with pytest.raises(EncryptionError, match="keyring 'k1' .*cannot unwrap with keyring key 'k1': wrong key"):
        with_data_key(store, "pfx", "b1", info, {"k1": K3})
    assert with_data_key(store, "pfx", "b1", info, {}, required=False) == {}  # validate: sizes only


def test_a_tampered_or_moved_wrap_object_is_named():
    store = open_storage("memory://")
    _, info, _ = stored_backup(store, k1=K1)
    key = "pfx/b1/keys/keyring-k1.wrap.json"
    doc = orjson.loads(store.get(key))
    w = bytearray(base64.b64decode(doc["wrapped_key"]))
    w[-1] ^= 1
    doc["wrapped_key"] = base64.b64encode(bytes(w)).decode()
    store.put(key, orjson.dumps(doc))
    with pytest.raises(EncryptionError, match=f"{key}: cannot unwrap with keyring key 'k1': wrong key, or the object "
                                              "was altered"):
        with_data_key(store, "pfx", "b1", info, {"k1": K1})
    store.put(key, b"{not json")
    with pytest.raises(EncryptionError, match=f"{key}: not a wrapped data key"):
        with_data_key(store, "pfx", "b1", info, {"k1": K1})
    # a wrap copied from another backup does not open this one
    _, info2, _ = stored_backup(store, "b2", k1=K1)
    store.put(key, store.get("pfx/b2/keys/keyring-k1.wrap.json"))
    with pytest.raises(EncryptionError, match="wraps the data key of backup 'b2', not 'b1'"):
        with_data_key(store, "pfx", "b1", info, {"k1": K1})
    # a rewrap whose target exists but does not open is refused, never overwritten
    r = rewrap(store, "pfx", "b2", info2, Kek(KEYRING, "k2"), KeySources({"k1": K1, "k2": K2}))
    assert r.outcome == "added"
    k2 = "pfx/b2/keys/keyring-k2.wrap.json"
    doc = orjson.loads(store.get(k2))
    doc["dek_fingerprint"] = "sha256:00"
    store.put(k2, orjson.dumps(doc))
    r = rewrap(store, "pfx", "b2", info2, Kek(KEYRING, "k2"), KeySources({"k1": K1, "k2": K2}))
    assert r.outcome == "failed" and r.detail.startswith(f"{k2}: cannot unwrap with keyring key 'k2'")
    assert "not rewritten" in r.detail and orjson.loads(store.get(k2)) == doc


def test_rewrap_of_direct_key_and_plain_backups_is_skipped_with_the_reason():
    store = open_storage("memory://")
    r = rewrap(store, "pfx", "d1", EncryptionInfo("k1"), Kek(KEYRING, "k2"), KeySources({"k1": K1, "k2": K2}))
    assert r.outcome == "skipped" and "encrypted directly with keyring key 'k1'" in r.detail
    assert rewrap(store, "pfx", "p1", None, Kek(KEYRING, "k2"), KeySources()).outcome == "skipped"
    assert list(store.list("pfx/")) == []


def test_wrap_record_fields_are_checked_by_name():
    rec = WrapRecord("b1", "keyring", "k1", "AES-256-GCM", "sha256:x", b"w" * 40, 5)
    assert WrapRecord.from_json(rec.to_json(), "o") == rec
    bad = orjson.loads(rec.to_json())
    bad["kek_source"] = "vault"
    with pytest.raises(EncryptionError, match="o: field 'kek_source' is 'vault', not keyring or kms"):
        WrapRecord.from_json(orjson.dumps(bad), "o")
    with pytest.raises(ConfigError, match="--to: 'kms:' needs a KMS key id"):
        Kek.parse("kms:", "--to")
    assert Kek.parse("kms:arn:aws:kms:eu-west-1:1:key/x", "--to") == Kek("kms", "arn:aws:kms:eu-west-1:1:key/x")


def _cfg(enc: dict) -> Config:
    return Config.from_dict({"mode": "backup", "backup_id": "b", "source": {"amqp_url": "amqp://h/%2f"},
                             "storage": {"backend": "filesystem", "path": "/tmp/x"}, "encryption": enc}, env={})


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="encryption.kms_key_id: a KMS key only wraps data keys: set "
                                          "encryption.envelope: true"):
        _cfg({"enabled": True, "key_id": "k1", "kms_key_id": "alias/x"})
    with pytest.raises(ConfigError, match=r"encryption.key_id: required when encryption.enabled is true \(or "
                                          r"encryption.kms_key_id with envelope: true\)"):
        _cfg({"enabled": True, "envelope": True})
    with pytest.raises(ConfigError, match="encryption.kms_endpoint_url: 'moto:5000' is not an http"):
        _cfg({"enabled": True, "envelope": True, "kms_key_id": "alias/x", "kms_endpoint_url": "moto:5000"})
    cfg = _cfg({"enabled": True, "envelope": True, "kms_key_id": "alias/x"})
    assert [str(k) for k in cfg.encryption.key_sources().wrap_with] == ["kms 'alias/x'"]


def test_rewrap_cli_refuses_a_to_key_it_does_not_have_before_writing(tmp_path):
    import subprocess
    import sys

    store = open_storage(f"file://{tmp_path}")
    _, info, _ = stored_backup(store, k1=K1)
    store.put("pfx/b1/manifest.json", BackupManifest(backup_id="b1", created_at=1, completed_at=2,
                                                     encryption=info).to_json())
    env = {**os.environ, "RBAK_ENCRYPTION_KEYS": f"k1: {base64.b64encode(K1).decode()}"}
    before = sorted(store.list("pfx/"))
    r = subprocess.run([sys.executable, "-m", "rbak", "keys", "rewrap", "--path", f"file://{tmp_path}", "--prefix",
                        "pfx", "--all", "--to", "k9"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "--to: key 'k9' is not in the keyring" in r.stderr, r.stderr
    assert sorted(store.list("pfx/")) == before
    r = subprocess.run([sys.executable, "-m", "rbak", "keys", "rewrap", "--path", f"file://{tmp_path}", "--prefix",
                        "pfx", "--backup-id", "b1", "--to", "k1", "--from", "k1"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2 and "--from: names the same key as --to" in r.stderr, r.stderr
