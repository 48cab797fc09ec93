"""Encrypted backups end to end, on every broker, through moto's S3 server (real HTTP) and the CLI.

A user's keyring rotates: backups keep the key id they were written with, restores and validation
take a keyring with old and new keys, `list` and retention need none."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import orjson

from rbak.backup import BackupEngine
from rbak.repo.catalog import load_manifest
from rbak.config import Config
from rbak.sealing.crypto import MAGIC
from rbak.storage import open_storage

from support.backups import fast_publish
from support.restores import consume_all

K1, K2 = os.urandom(32), os.urandom(32)


def ring(**keys: bytes) -> str:
    return "".join(f"{k}: {base64.b64encode(v).decode()}\n" for k, v in keys.items())


def s3_config(broker, vhost, bucket, backup_id, state, key_id, keys_file, sse="AES256") -> Config:
    return Config.from_dict({
        "mode": "backup", "backup_id": backup_id,
        "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                   "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "s3", "bucket": bucket.bucket, "prefix": bucket.prefix, "endpoint": bucket.endpoint,
                    "path_style": True, "region": "us-east-1", "sse": sse},
        "backup": {"include_definitions": True, "segment_max_bytes": 4096},
        "offset_storage": {"path": str(state), "sync_interval_secs": 0},
        "encryption": {"enabled": True, "key_id": key_id, "keys_file": str(keys_file)},
    }, env={})


def rbak(*args: str, env_keys: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RBAK_ENCRYPTION_KEYS"}
    if env_keys is not None:
        env["RBAK_ENCRYPTION_KEYS"] = env_keys
    r = subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300, env=env)
    if check and r.returncode:
        raise AssertionError(f"rbak {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def test_encrypted_backup_rotate_restore_validate(broker, vhost, s3_bucket, tmp_path):
    bodies = [b"personal-data-%04d" % i + os.urandom(64) for i in range(300)]
    fast_publish(broker, vhost, "orders", bodies, declare={})
    keys = tmp_path / "keyring.yaml"
    keys.write_text(ring(k1=K1))
    summary = BackupEngine(s3_config(broker, vhost, s3_bucket, "enc-1", tmp_path / "s.db", "k1", keys)).run()
    assert summary.completed and summary.total_messages == 300
    assert broker.message_count(vhost, "orders") == 300  # nothing taken from the source

    # every object but the manifest is sealed; no body is readable in the bucket; S3 SSE was asked for
    client = s3_bucket.client()
    objs = [k for k in s3_bucket.keys() if "/enc-1/" in k]
    assert any("/queues/" in k for k in objs) and any("/definitions/" in k for k in objs)
    assert any(k.endswith("/state/offsets.db") for k in objs)
    for k in objs:
        data = s3_bucket.get(k)
        assert client.head_object(Bucket=s3_bucket.bucket, Key=k)["ServerSideEncryption"] == "AES256"
        if k.endswith("manifest.json"):
            m = orjson.loads(data)
            assert m["encryption"] == {"algorithm": "AES-256-GCM", "key_id": "k1"}
            continue
        assert data.startswith(MAGIC), k
        assert b"personal-data" not in data and b"orders" not in data
    storage = open_storage(s3_bucket.url_with_prefix(""))
    m = load_manifest(storage, "enc-1", "backups")
    seg = m.queues[0].segments[0]
    assert seg.size_bytes == len(storage.get(seg.key))  # the manifest describes the stored ciphertext

    # rotation: the next backup uses k2; the keyring keeps k1 for the old one
    keys.write_text(ring(k1=K1, k2=K2))
    BackupEngine(s3_config(broker, vhost, s3_bucket, "enc-2", tmp_path / "s.db", "k2", keys)).run()
    assert load_manifest(storage, "enc-2", "backups").encryption.key_id == "k2"

    url = s3_bucket.url_with_prefix("")
    listed = json.loads(rbak("list", "--path", url, "--prefix", "backups", "--format", "json").stdout)
    assert {b["backup_id"] for b in listed if b["status"] == "complete"} >= {"enc-1", "enc-2"}
    both = ring(k1=K1, k2=K2)
    for bid in ("enc-1", "enc-2"):
        v = rbak("validate", "--path", url, "--prefix", "backups", "--backup-id", bid, "--deep", env_keys=both)
        assert "is valid" in v.stdout and "note:" not in v.stderr
        v = rbak("validate", "--path", url, "--prefix", "backups", "--backup-id", bid, "--deep", check=False)
        # no key: sizes and checksums only, which proves nothing: unverified, exit 5, never "valid" (issue 45)
        assert v.returncode == 5 and "is valid" not in v.stdout, (v.returncode, v.stdout, v.stderr)
        assert f"backup {bid!r} is unverified: not decrypted (encrypted with key id " in v.stderr
        assert "which is not in the keyring" in v.stderr

    # restore: no key and a wrong key are refused naming the backup and key id; the right one restores
    target = vhost
    common = ["restore", "--path", url, "--prefix", "backups", "--backup-id", "enc-1",
              "--target-url", broker.server_url(), "--management-url", broker.management_url,
              "--publish-mode", "queue", "--json"]
    broker.drain_queue(target, "orders")
    r = rbak(*common, check=False)
    assert r.returncode != 0 and "backup 'enc-1' is encrypted with key id 'k1'" in r.stderr + r.stdout
    r = rbak(*common, env_keys=ring(k1=K2), check=False)
    assert r.returncode != 0 and "cannot decrypt with key id 'k1'" in r.stderr + r.stdout
    assert broker.message_count(target, "orders") == 0
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "k1").write_text(base64.b64encode(K1).decode())
    out = json.loads(rbak(*common, "--keys-file", str(secret)).stdout)
    assert out["confirmed"] == 300
    assert [d.body for d in consume_all(broker, target, "orders", 300)] == bodies


def test_validate_catches_tampered_ciphertext_with_and_without_the_key(broker, vhost, s3_bucket, tmp_path):
    fast_publish(broker, vhost, "q", [b"m-%d" % i for i in range(50)], declare={})
    keys = tmp_path / "k.yaml"
    keys.write_text(ring(k1=K1))
    BackupEngine(s3_config(broker, vhost, s3_bucket, "t1", tmp_path / "s.db", "k1", keys, sse="aws:kms")).run()
    storage = open_storage(s3_bucket.url_with_prefix(""))
    m = load_manifest(storage, "t1", "backups")
    seg = m.queues[0].segments[0]
    head = s3_bucket.client().head_object(Bucket=s3_bucket.bucket, Key=seg.key)
    assert head["ServerSideEncryption"] == "aws:kms"
    data = bytearray(storage.get(seg.key))
    data[-20] ^= 0x01  # one bit of the ciphertext
    storage.put(seg.key, bytes(data))
    url = s3_bucket.url_with_prefix("")
    v = rbak("validate", "--path", url, "--prefix", "backups", "--backup-id", "t1", "--deep", check=False)
    assert v.returncode == 1 and "SHA-256 mismatch" in v.stderr  # no key: the stored checksum catches it
    # an attacker who also fixed the manifest's checksum is caught by the key (GCM tag)
    import hashlib

    doc = orjson.loads(storage.get("backups/t1/manifest.json"))
    doc["queues"][0]["segments"][0]["checksum"] = hashlib.sha256(bytes(data)).hexdigest()
    storage.put("backups/t1/manifest.json", orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    v = rbak("validate", "--path", url, "--prefix", "backups", "--backup-id", "t1", "--deep", check=False)
    assert v.returncode == 5 and "unverified: not decrypted" in v.stderr, v.stderr  # without the key: no verdict
    v = rbak("validate", "--path", url, "--prefix", "backups", "--backup-id", "t1", "--deep", "--format", "json",
             env_keys=ring(k1=K1), check=False)
    rep = json.loads(v.stdout)
    assert v.returncode == 1 and rep["ok"] is False
    bad = [s for s in rep["segments"] if not s["ok"]]
    assert [s["key"] for s in bad] == [seg.key]
    assert "cannot decrypt with key id 'k1'" in bad[0]["problems"][0] and "'t1'" in bad[0]["problems"][0]


def test_backup_refuses_a_missing_key_and_a_resume_with_other_settings(broker, vhost, tmp_path, s3_bucket):
    import pytest

    from rbak.errors import ConfigError

    keys = tmp_path / "k.yaml"
    keys.write_text(ring(k1=K1))
    with pytest.raises(ConfigError, match="no key 'k9' in the keyring"):
        BackupEngine(s3_config(broker, vhost, s3_bucket, "x1", tmp_path / "s.db", "k9", keys))
    storage = open_storage(s3_bucket.url_with_prefix(""))
    from rbak.format.manifest import BackupManifest

    storage.put("backups/x1/manifest.json",
                BackupManifest(backup_id="x1", created_at=1).to_json())  # an unencrypted run left incomplete
    with pytest.raises(ConfigError, match="'x1' was started with no encryption, this configuration has key id 'k1'"):
        BackupEngine(s3_config(broker, vhost, s3_bucket, "x1", tmp_path / "s.db", "k1", keys)).run()
