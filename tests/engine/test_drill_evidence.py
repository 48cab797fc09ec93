"""Signed drill evidence: real drills on each broker sign their report with an Ed25519 key from a
file (``drill.signing_key_file``); ``rbak drill verify`` proves it, and refuses a changed field (named),
a changed signed payload, an unsigned report and the wrong key, exiting non-zero."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from support.s3 import storage_url

from rbak.format.layout import BackupLayout
from rbak.storage import open_storage

QUEUES = {"orders": "classic", "payments": "quorum", "events": "stream"}


def rbak(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300,
                          check=False)


def write_key(path: Path, key) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def write_public(path: Path, key) -> Path:
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def fingerprint(key) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "SHA256:" + hashlib.sha256(raw).hexdigest()


def config(broker, vhost: str, store: Path, **drill) -> dict:
    cfg = {"mode": "backup", "backup_id": "ev1",
           "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                      "queues": {"vhosts": [vhost]}},
           "storage": {"backend": "filesystem", "path": str(store)},
           "backup": {"include_definitions": False},
           "offset_storage": {"path": str(store) + "-state/offsets.db", "sync_interval_secs": 0}}
    if drill:
        cfg["drill"] = drill
    return cfg


def write_config(tmp_path: Path, cfg: dict, name: str) -> str:
    import yaml

    (tmp_path / name).write_text(yaml.safe_dump(cfg))
    return str(tmp_path / name)


@pytest.fixture
def signed_drill(broker, vhost, tmp_path):
    """A real backup of three queues (classic, quorum, stream) and a signed drill of it."""
    import pika

    for q, qtype in QUEUES.items():
        props = pika.BasicProperties(delivery_mode=2, content_type="text/plain", message_id=f"{q}-id")
        broker.publish(vhost, q, [f"{q}-{i}".encode() for i in range(12)], properties=props,
                       declare={"x-queue-type": qtype})
    store = tmp_path / "store"
    key = ed25519.Ed25519PrivateKey.generate()
    key_file = write_key(tmp_path / "drill-signing.pem", key)
    backup_cfg = write_config(tmp_path, config(broker, vhost, store), "backup.yaml")
    p = rbak("backup", "--config", backup_cfg)
    assert p.returncode == 0, p.stderr
    drill_cfg = write_config(tmp_path, config(broker, vhost, store, signing_key_file=str(key_file)), "drill.yaml")
    p = rbak("drill", "--config", drill_cfg, "--backup-id", "ev1", "--json")
    assert p.returncode == 0, p.stderr
    printed = json.loads(p.stdout)
    st = open_storage(str(store))
    keys = sorted(st.list(BackupLayout("ev1").drills_dir))
    assert keys == [printed["report_key"]]
    report_file = store / keys[0]
    return {"key": key, "public": write_public(tmp_path / "drill-signing.pub.pem", key), "store": store,
            "report_file": report_file, "report": orjson.loads(report_file.read_bytes()), "printed": printed}


def test_a_signed_drill_report_holds_the_evidence_and_verifies(broker, signed_drill):
    rep, key = signed_drill["report"], signed_drill["key"]
    assert rep == signed_drill["printed"]  # what the drill printed is what it stored
    manifest = (signed_drill["store"] / "ev1" / "manifest.json").read_bytes()
    assert rep["manifest_sha256"] == hashlib.sha256(manifest).hexdigest()
    assert rep["broker_version"] == broker.api("GET", "/api/overview")["rabbitmq_version"]
    assert rep["started_at"] <= rep["finished_at"] and rep["passed"] is True
    assert {q["queue"]: (q["expected_count"], q["actual_count"]) for q in rep["queues"]} == {
        q: (12, 12) for q in QUEUES}
    sig = rep["signature"]
    assert sig["algorithm"] == "Ed25519" and sig["key_fingerprint"] == fingerprint(key)
    # The documented canonical form is what was signed.
    visible = {k: v for k, v in rep.items() if k != "signature"}
    payload = json.dumps(visible, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert base64.b64decode(sig["payload"]) == payload
    key.public_key().verify(base64.b64decode(sig["value"]), payload)

    p = rbak("drill", "verify", str(signed_drill["report_file"]), "--public-key", str(signed_drill["public"]))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"valid Ed25519 signature by key {fingerprint(key)}\n" in out
    assert f"drill {rep['drill_id']} of backup ev1: Passed" in out
    assert f"backup manifest SHA-256: {rep['manifest_sha256']}" in out
    assert f"(RabbitMQ {rep['broker_version']})" in out
    for q in rep["queues"]:
        assert (f"  {q['vhost']}/{q['queue']} ({q['queue_type']}): expected 12, restored and read back 12, "
                f"record hash {q['actual_hash']} (match)") in out
    assert "proves: backup ev1" in out and "restored into a scratch vhost and read back" in out
    # Without --public-key: integrity against the embedded key only, and it says so.
    p = rbak("drill", "verify", str(signed_drill["report_file"]), "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["signer"] == fingerprint(key) and got["authenticated"] is False and got["report"] == visible


def tampered(signed_drill, tmp_path, change) -> str:
    rep = json.loads(json.dumps(signed_drill["report"]))
    change(rep)
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(rep, indent=2))
    return str(path)


CHANGES = [
    (lambda r: r["queues"][1].update(actual_count=r["queues"][1]["actual_count"] - 1), "queues[1].actual_count"),
    (lambda r: r.update(backup_id="other"), "backup_id"),
    (lambda r: r.update(manifest_sha256="0" * 64), "manifest_sha256"),
    (lambda r: r.update(passed=1), "passed"),  # the same truth value, not the signed JSON
    (lambda r: r["queues"].pop(), "queues[2]"),
    (lambda r: r.pop("broker_version"), "broker_version"),
]


def test_a_changed_field_is_refused_and_named(signed_drill, tmp_path):
    for change, field in CHANGES:
        path = tampered(signed_drill, tmp_path, change)
        p = rbak("drill", "verify", path, "--public-key", str(signed_drill["public"]))
        assert p.returncode == 1 and p.stdout == "", field
        assert f"field {field} was changed after signing" in p.stderr, p.stderr


def test_a_changed_payload_a_wrong_key_and_an_unsigned_report_are_refused(signed_drill, tmp_path):
    def forge(r):  # change the signed copy too: the signature no longer covers it
        body = json.loads(base64.b64decode(r["signature"]["payload"]))
        body["passed"] = r["passed"] = False
        r["signature"]["payload"] = base64.b64encode(json.dumps(body).encode()).decode()

    p = rbak("drill", "verify", tampered(signed_drill, tmp_path, forge), "--public-key", str(signed_drill["public"]))
    assert p.returncode == 1 and "signature.value does not verify" in p.stderr, p.stderr

    other = ed25519.Ed25519PrivateKey.generate()
    p = rbak("drill", "verify", str(signed_drill["report_file"]), "--public-key",
             str(write_public(tmp_path / "other.pem", other)))
    assert p.returncode == 1
    assert (f"signed by key {fingerprint(signed_drill['key'])}, not by the given public key {fingerprint(other)}"
            in p.stderr), p.stderr

    # Re-signed by another key (embedded with its public key): valid on its own, refused against the real key.
    from rbak.repo.evidence import sign

    def resign(r):
        r["passed"] = False
        r["signature"] = sign({k: v for k, v in r.items() if k != "signature"}, other)

    path = tampered(signed_drill, tmp_path, resign)
    assert rbak("drill", "verify", path).returncode == 0
    p = rbak("drill", "verify", path, "--public-key", str(signed_drill["public"]))
    assert p.returncode == 1 and f"not by the given public key {fingerprint(signed_drill['key'])}" in p.stderr

    p = rbak("drill", "verify", tampered(signed_drill, tmp_path, lambda r: r.pop("signature")))
    assert p.returncode == 1 and "not signed (no 'signature' member)" in p.stderr


def test_verify_reads_the_report_from_s3(signed_drill, s3_bucket):
    key = f"{s3_bucket.prefix}/ev1/drills/{signed_drill['report_file'].name}"
    s3_bucket.client().put_object(Bucket=s3_bucket.bucket, Key=key, Body=signed_drill["report_file"].read_bytes())
    url = storage_url(s3_bucket.endpoint, s3_bucket.bucket, key)
    p = rbak("drill", "verify", url, "--public-key", str(signed_drill["public"]))
    assert p.returncode == 0, p.stderr
    assert "proves: backup ev1" in p.stdout
    p = rbak("drill", "verify", storage_url(s3_bucket.endpoint, s3_bucket.bucket, key + ".missing"))
    assert p.returncode != 0 and ".missing" in p.stderr


def test_a_bad_signing_key_file_is_named_before_any_drill(tmp_path):
    ec_key = write_key(tmp_path / "ec.pem", ec.generate_private_key(ec.SECP256R1()))
    (tmp_path / "junk.pem").write_text("not a key")
    cases = [(str(tmp_path / "missing.pem"), "drill.signing_key_file: "),
             (str(ec_key), "drill.signing_key_file: " + str(ec_key) + " holds a"),
             (str(tmp_path / "junk.pem"), "is not an unencrypted PEM private key")]
    for path, needle in cases:
        cfg = {"mode": "drill", "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
               "target": {"amqp_url": "amqp://guest:guest@127.0.0.1:1/%2f", "management_url": "http://127.0.0.1:1"},
               "drill": {"signing_key_file": path}}
        p = rbak("drill", "--config", write_config(tmp_path, cfg, "c.yaml"))
        assert p.returncode != 0 and needle in p.stderr and "Ed25519" not in p.stdout, (path, p.stderr)


def test_the_report_names_the_target_without_its_credentials():
    from rbak.drill.backup import without_credentials

    assert without_credentials("http://admin:s3cret@rabbit:15672/api") == "http://rabbit:15672/api"
    assert without_credentials("https://rabbit:15671") == "https://rabbit:15671"


def test_a_drill_signs_with_a_key_from_an_environment_variable(rmq310, vhost_factory, tmp_path):
    """How the operator passes the key from a Secret: drill.signing_key_env names the variable."""
    import os

    import pika

    vhost = vhost_factory(rmq310)
    rmq310.publish(vhost, "orders", [b"a", b"b", b"c"], properties=pika.BasicProperties(delivery_mode=2),
                   declare={"x-queue-type": "classic"})
    store = tmp_path / "store"
    assert rbak("backup", "--config", write_config(tmp_path, config(rmq310, vhost, store), "b.yaml")).returncode == 0
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    cfg = write_config(tmp_path, config(rmq310, vhost, store, signing_key_env="DRILL_KEY"), "d.yaml")
    p = subprocess.run([sys.executable, "-m", "rbak", "drill", "--config", cfg, "--json"], capture_output=True,
                       text=True, timeout=300, check=False, env={**os.environ, "DRILL_KEY": pem})
    assert p.returncode == 0, p.stderr
    report_file = store / json.loads(p.stdout)["report_key"]
    v = rbak("drill", "verify", str(report_file), "--public-key", str(write_public(tmp_path / "pub.pem", key)))
    assert v.returncode == 0 and f"valid Ed25519 signature by key {fingerprint(key)}" in v.stdout, v.stderr
    # without the variable: refused before any drill, naming it; both ways at once: a config error
    p = rbak("drill", "--config", cfg)
    assert p.returncode != 0 and "drill.signing_key_env: environment variable DRILL_KEY is not set" in p.stderr
    both = config(rmq310, vhost, store, signing_key_env="DRILL_KEY", signing_key_file=str(tmp_path / "pub.pem"))
    p = rbak("drill", "--config", write_config(tmp_path, both, "both.yaml"))
    assert p.returncode == 2 and "drill.signing_key_env: give either it or drill.signing_key_file" in p.stderr
