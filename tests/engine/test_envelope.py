"""Envelope encryption end to end: real brokers, moto's S3, KMS and Object Lock over HTTP, the CLI.

A backup's data key is wrapped by keyring keys and/or a KMS key; `rbak keys rewrap` adds a wrap for
a new key without touching segments or the manifest; a retired key is simply not needed any more."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import boto3
import orjson

from rbak.backup import BackupEngine
from rbak.repo.catalog import load_manifest
from rbak.config import Config
from rbak.sealing.crypto import MAGIC
from rbak.storage import open_storage

from support.backups import fast_publish
from support.restores import consume_all

K1, K2, K3 = os.urandom(32), os.urandom(32), os.urandom(32)


def ring(**keys: bytes) -> str:
    return "".join(f"{k}: {base64.b64encode(v).decode()}\n" for k, v in keys.items())


def config(broker, vhost, bucket, backup_id, state, enc: dict, prefix="backups", lock: str | None = None) -> Config:
    storage = {"backend": "s3", "bucket": bucket.bucket, "prefix": prefix, "endpoint": bucket.endpoint,
               "path_style": True, "region": "us-east-1"}
    if lock:
        storage.update(object_lock_mode=lock, object_lock_retain_days=1)
    return Config.from_dict({
        "mode": "backup", "backup_id": backup_id,
        "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                   "queues": {"vhosts": [vhost]}},
        "storage": storage,
        "backup": {"include_definitions": True, "segment_max_bytes": 4096},
        "offset_storage": {"path": str(state), "sync_interval_secs": 0},
        "encryption": {"enabled": True, **enc},
    }, env={})


def rbak(*args: str, env_keys: str | None = None, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("RBAK_ENCRYPTION_KEYS", "AWS_ENDPOINT_URL_KMS")}
    if env_keys is not None:
        e["RBAK_ENCRYPTION_KEYS"] = env_keys
    e.update(env)
    r = subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300, env=e)
    if check and r.returncode:
        raise AssertionError(f"rbak {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def restore_args(url, broker, backup_id, prefix="backups"):
    return ["restore", "--path", url, "--prefix", prefix, "--backup-id", backup_id, "--target-url",
            broker.server_url(), "--management-url", broker.management_url, "--publish-mode", "queue", "--json"]


def test_envelope_backup_rewrap_then_restore_with_only_the_new_key(broker, vhost, s3_bucket, tmp_path):
    bodies = [b"personal-%04d-" % i + os.urandom(48) for i in range(250)]
    fast_publish(broker, vhost, "orders", bodies, declare={})
    keys = tmp_path / "keyring.yaml"
    keys.write_text(ring(k1=K1))
    s = BackupEngine(config(broker, vhost, s3_bucket, "env-1", tmp_path / "s.db",
                            {"envelope": True, "key_id": "k1", "keys_file": str(keys)})).run()
    assert s.completed and s.total_messages == 250 and broker.message_count(vhost, "orders") == 250
    # a backup of the same keyring written the old way (sealed directly with k1), next to it
    BackupEngine(config(broker, vhost, s3_bucket, "direct-1", tmp_path / "s.db",
                        {"key_id": "k1", "keys_file": str(keys)})).run()

    storage = open_storage(s3_bucket.url_with_prefix(""))
    m = load_manifest(storage, "env-1", "backups")
    enc = orjson.loads(storage.get("backups/env-1/manifest.json"))["encryption"]
    assert enc["key_id"].startswith("dek-") and enc["envelope"]["dek_fingerprint"].startswith("sha256:")
    assert orjson.loads(storage.get("backups/direct-1/manifest.json"))["encryption"] == {
        "algorithm": "AES-256-GCM", "key_id": "k1"}
    objs = sorted(k for k in s3_bucket.keys() if "/env-1/" in k)
    assert [k for k in objs if "/keys/" in k] == ["backups/env-1/keys/keyring-k1.wrap.json"]
    for k in objs:
        if "/queues/" in k or "/definitions/" in k:
            data = storage.get(k)
            assert data.startswith(MAGIC) and data[7:7 + len(m.encryption.key_id)] == m.encryption.key_id.encode()
            assert b"personal-" not in data

    url = s3_bucket.url_with_prefix("")
    before = {k: storage.get(k) for k in s3_bucket.keys()}
    both = ring(k1=K1, k2=K2)
    out = json.loads(rbak("keys", "rewrap", "--path", url, "--prefix", "backups", "--all", "--to", "k2",
                          "--format", "json", env_keys=both).stdout)
    res = {r["backup_id"]: r for r in out["results"]}
    assert out["ok"] and res["env-1"]["outcome"] == "added" and res["env-1"]["key"] == (
        "backups/env-1/keys/keyring-k2.wrap.json")
    assert res["direct-1"]["outcome"] == "skipped" and "encrypted directly with keyring key 'k1'" in res["direct-1"][
        "detail"]
    after = {k: storage.get(k) for k in s3_bucket.keys()}
    assert set(after) - set(before) == {"backups/env-1/keys/keyring-k2.wrap.json"}
    assert all(after[k] == v for k, v in before.items())  # no segment, manifest or wrap rewritten
    again = rbak("keys", "rewrap", "--path", url, "--prefix", "backups", "--backup-id", "env-1", "--to", "k2",
                 env_keys=both)
    assert "env-1: already: already wrapped for keyring 'k2'" in again.stdout
    assert "0 wrap(s) added, 1 already in place" in again.stdout
    assert set(s3_bucket.keys()) == set(after)

    d = json.loads(rbak("describe", "--path", url, "--prefix", "backups", "--backup-id", "env-1",
                        "--format", "json").stdout)
    assert [w["kek"] for w in d["key_wraps"]] == ["keyring 'k1'", "keyring 'k2'"]

    # k1 retired: a keyring with a stranger key names the backup and every key it tried; nothing is published
    target = vhost
    broker.drain_queue(target, "orders")
    r = rbak(*restore_args(url, broker, "env-1"), env_keys=ring(k3=K3), check=False)
    assert r.returncode != 0
    assert (f"backup 'env-1': no key-encryption key could unwrap its data key {m.encryption.key_id!r}; tried: "
            "keyring 'k1' (not in the keyring); keyring 'k2' (not in the keyring)") in r.stderr
    assert broker.message_count(target, "orders") == 0
    v = rbak("validate", "--path", url, "--prefix", "backups", "--backup-id", "env-1", "--deep",
             env_keys=ring(k2=K2))
    assert "is valid" in v.stdout and "note:" not in v.stderr
    out = json.loads(rbak(*restore_args(url, broker, "env-1"), env_keys=ring(k2=K2)).stdout)
    assert out["confirmed"] == 250
    assert [d.body for d in consume_all(broker, target, "orders", 250)] == bodies
    # the direct-key backup still restores with k1
    out = json.loads(rbak(*restore_args(url, broker, "direct-1"), env_keys=ring(k1=K1)).stdout)
    assert out["confirmed"] == 250
    assert [d.body for d in consume_all(broker, target, "orders", 250)] == bodies


def kms_key(endpoint: str) -> str:
    kms = boto3.session.Session().client("kms", region_name="us-east-1", endpoint_url=endpoint)
    return kms.create_key(Description="rbak test KEK")["KeyMetadata"]["Arn"]


def test_kms_wrapped_backup_restores_through_moto_kms(rmq43, vhost_factory, s3_bucket, moto_s3, tmp_path):
    vhost = vhost_factory(rmq43)
    bodies = [b"kms-%d" % i for i in range(120)]
    fast_publish(rmq43, vhost, "q", bodies, declare={})
    arn = kms_key(moto_s3)
    cfg = config(rmq43, vhost, s3_bucket, "kms-1", tmp_path / "s.db",
                 {"envelope": True, "kms_key_id": arn, "kms_endpoint_url": moto_s3})
    assert BackupEngine(cfg).run().total_messages == 120
    storage = open_storage(s3_bucket.url_with_prefix(""))
    wraps = [k for k in s3_bucket.keys() if "/kms-1/keys/" in k]
    assert len(wraps) == 1 and wraps[0].startswith("backups/kms-1/keys/kms-arn%3Aaws%3Akms%3Aus-east-1%3A")
    w = orjson.loads(storage.get(wraps[0]))
    assert (w["kek_source"], w["kek_id"], w["algorithm"], w["region"]) == ("kms", arn, "AWS-KMS", "us-east-1")

    url = s3_bucket.url_with_prefix("")
    rmq43.drain_queue(vhost, "q")  # the restore recreates the source's vhost/queue
    # no KMS to ask (the endpoint refuses connections): the error names the backup and the KMS key
    r = rbak(*restore_args(url, rmq43, "kms-1"), env_keys="", check=False,
             AWS_ENDPOINT_URL_KMS="http://127.0.0.1:9")
    assert r.returncode != 0 and "backup 'kms-1': no key-encryption key could unwrap" in r.stderr
    assert f"kms '{arn}' (" in r.stderr
    assert rmq43.message_count(vhost, "q") == 0  # nothing published
    out = json.loads(rbak(*restore_args(url, rmq43, "kms-1"), env_keys="", AWS_ENDPOINT_URL_KMS=moto_s3).stdout)
    assert out["confirmed"] == 120
    assert [d.body for d in consume_all(rmq43, vhost, "q", 120)] == bodies

    # rotate off KMS onto a keyring key: restore then needs no KMS at all
    r = rbak("keys", "rewrap", "--path", url, "--prefix", "backups", "--backup-id", "kms-1", "--to", "k1",
             "--from", f"kms:{arn}", "--kms-endpoint-url", moto_s3, env_keys=ring(k1=K1))
    assert f"kms-1: added: wrapped for keyring 'k1' (unwrapped with kms '{arn}')" in r.stdout
    out = json.loads(rbak(*restore_args(url, rmq43, "kms-1"), env_keys=ring(k1=K1),
                          AWS_ENDPOINT_URL_KMS="http://127.0.0.1:9").stdout)
    assert out["confirmed"] == 120
    assert [d.body for d in consume_all(rmq43, vhost, "q", 120)] == bodies


def versions(bucket, prefix: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for page in bucket.client().get_paginator("list_object_versions").paginate(Bucket=bucket.bucket, Prefix=prefix):
        for v in page.get("Versions", []):
            out.setdefault(v["Key"], []).append(v["VersionId"])
        assert not page.get("DeleteMarkers")
    return out


def test_rewrap_under_object_lock_adds_a_locked_wrap_and_changes_no_version(rmq43, vhost_factory, lock_bucket,
                                                                             tmp_path):
    vhost = vhost_factory(rmq43)
    fast_publish(rmq43, vhost, "q", [b"locked-%d" % i for i in range(60)], declare={})
    keys = tmp_path / "k.yaml"
    keys.write_text(ring(k1=K1))
    BackupEngine(config(rmq43, vhost, lock_bucket, "lk-1", tmp_path / "s.db",
                        {"envelope": True, "key_id": "k1", "keys_file": str(keys)}, prefix="locked",
                        lock="COMPLIANCE")).run()
    before = versions(lock_bucket, "locked/")
    assert "locked/lk-1/keys/keyring-k1.wrap.json" in before and all(len(v) == 1 for v in before.values())
    url = lock_bucket.url_with_prefix("") + "&object_lock_mode=COMPLIANCE&object_lock_retain_days=1"
    r = rbak("keys", "rewrap", "--path", url, "--prefix", "locked", "--backup-id", "lk-1", "--to", "k2",
             env_keys=ring(k1=K1, k2=K2))
    assert "1 wrap(s) added" in r.stdout
    after = versions(lock_bucket, "locked/")
    assert {k: v for k, v in after.items() if k in before} == before  # segments, manifest, first wrap: same versions
    assert set(after) - set(before) == {"locked/lk-1/keys/keyring-k2.wrap.json"}
    head = lock_bucket.client().head_object(Bucket=lock_bucket.bucket, Key="locked/lk-1/keys/keyring-k2.wrap.json")
    assert head["ObjectLockMode"] == "COMPLIANCE"
    r = rbak("keys", "rewrap", "--path", url, "--prefix", "locked", "--backup-id", "lk-1", "--to", "k2",
             env_keys=ring(k1=K1, k2=K2))
    assert "0 wrap(s) added, 1 already in place" in r.stdout and versions(lock_bucket, "locked/") == after
    v = rbak("validate", "--path", url, "--prefix", "locked", "--backup-id", "lk-1", "--deep", env_keys=ring(k2=K2))
    assert "is valid" in v.stdout and "note:" not in v.stderr


def test_resumed_envelope_backup_keeps_its_data_key_and_a_drill_opens_it(rmq43, vhost_factory, tmp_path):
    """A run left incomplete is finished with ITS data key (unwrapped, no new wrap); a config that
    would seal it differently is refused naming both; `rbak drill` opens envelope backups."""
    import pytest
    import yaml

    from rbak.sealing.envelope import KEYRING, Kek, KeySources, new_data_key, write_wraps
    from rbak.errors import ConfigError
    from rbak.format.manifest import BackupManifest
    from rbak.format.layout import BackupLayout

    vhost = vhost_factory(rmq43)
    fast_publish(rmq43, vhost, "orders", [b"r-%d" % i for i in range(80)], declare={})
    keys = tmp_path / "k.yaml"
    keys.write_text(ring(k1=K1))
    store = tmp_path / "store"
    storage = open_storage(f"file://{store}")
    _, info, wraps = new_data_key("res-1", KeySources({"k1": K1}, wrap_with=(Kek(KEYRING, "k1"),)))
    write_wraps(storage, BackupLayout("res-1", ""), wraps)  # what the first run stored before it stopped
    storage.put("res-1/manifest.json", BackupManifest(backup_id="res-1", created_at=1, encryption=info).to_json())
    cfg = {"mode": "backup", "backup_id": "res-1",
           "source": {"amqp_url": rmq43.amqp_url(vhost), "management_url": rmq43.management_url,
                      "queues": {"vhosts": [vhost]}},
           "storage": {"backend": "filesystem", "path": str(store)},
           "offset_storage": {"path": str(tmp_path / "s.db"), "sync_interval_secs": 0},
           "encryption": {"enabled": True, "key_id": "k1", "keys_file": str(keys)}}
    with pytest.raises(ConfigError, match="'res-1' was started with envelope encryption, this configuration has "
                                          "key id 'k1'"):
        BackupEngine(Config.from_dict(cfg, env={})).run()
    cfg["encryption"]["envelope"] = True
    s = BackupEngine(Config.from_dict(cfg, env={})).run()
    assert s.completed and s.total_messages == 80
    m = load_manifest(storage, "res-1", "")
    assert m.is_complete and m.encryption == info  # the first run's data key, not a new one
    assert sorted(storage.list("res-1/keys/")) == ["res-1/keys/keyring-k1.wrap.json"]

    # a partial backup written with a direct key is not retried under an envelope (nor the reverse)
    from rbak.format.manifest import EncryptionInfo, QueueStatus

    storage.put("part-1/manifest.json", BackupManifest(
        backup_id="part-1", created_at=0, completed_at=2, encryption=EncryptionInfo("k1"),
        queue_status=[QueueStatus(vhost, "orders", "failed", "connection lost")]).to_json())
    with pytest.raises(ConfigError, match="the partial backup 'part-1' was started with key id 'k1', this "
                                          "configuration has envelope encryption"):
        BackupEngine(Config.from_dict({**cfg, "backup_id": "part-1"}, env={})).run()
    assert sorted(storage.list("part-1/")) == ["part-1/manifest.json"]  # nothing written

    del cfg["backup_id"]
    cfg["drill"] = {"target": {"amqp_url": rmq43.amqp_url("/"), "management_url": rmq43.management_url}}
    path = tmp_path / "drill.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k != "RBAK_ENCRYPTION_KEYS"}
    p = subprocess.run([sys.executable, "-m", "rbak", "drill", "--config", str(path), "--json"], capture_output=True,
                       text=True, timeout=300, env=env)
    rep = json.loads(p.stdout)
    assert p.returncode == 0 and rep["passed"] and rep["queues"][0]["actual_count"] == 80, p.stderr
    keys.write_text(ring(k2=K2))
    p = subprocess.run([sys.executable, "-m", "rbak", "drill", "--config", str(path), "--json"], capture_output=True,
                       text=True, timeout=300, env=env)
    rep = json.loads(p.stdout)
    assert p.returncode == 1 and "backup 'res-1': no key-encryption key could unwrap" in rep["reason"], rep
    assert "keyring 'k1' (not in the keyring)" in rep["reason"] and not rmq43.vhost_exists(rep["scratch_vhost"])
