"""Signed restore-drill evidence: an Ed25519 signature over a drill report, and its verification.

What is signed (the *payload*): the report's JSON object without its ``signature`` member, serialised
canonically: UTF-8 JSON, object keys sorted, no whitespace between tokens, non-ASCII characters as
themselves (``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` gives the
same bytes for the values a report holds). The report stores, under ``signature``:

- ``format``: ``rbak-drill-evidence/1``; ``algorithm``: ``Ed25519``
- ``key_fingerprint``: ``SHA256:`` + hex SHA-256 of the raw 32-byte public key
- ``public_key``: the public key (PEM, SubjectPublicKeyInfo)
- ``payload``: base64 of the signed bytes, so a verifier compares what was signed with what the
  report shows field by field and names the field that was changed
- ``value``: base64 of the 64-byte signature over ``payload``

The embedded public key proves integrity only: who signed is proven by verifying with a public key
obtained out of band (``rbak drill verify --public-key``).
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from ..errors import EvidenceError

FORMAT = "rbak-drill-evidence/1"
FIELD = "signature"


def load_signing_key(path: str, field: str = "drill.signing_key_file") -> Ed25519PrivateKey:
    """The Ed25519 private key of a PEM file (PKCS#8, unencrypted), errors naming the file."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise EvidenceError(f"{field}: cannot read {path}: {e.strerror or e}") from None
    return signing_key_from_pem(data, f"{field}: {path}")


def signing_key_from_env(name: str, env: Any = None, field: str = "drill.signing_key_env") -> Ed25519PrivateKey:
    """The Ed25519 private key whose PEM is in an environment variable (the operator's Secret)."""
    data = (os.environ if env is None else env).get(name)
    if not data:
        raise EvidenceError(f"{field}: environment variable {name} is not set (or empty)")
    return signing_key_from_pem(data.encode(), f"{field}: ${name}")


def signing_key_from_pem(data: bytes, where: str) -> Ed25519PrivateKey:
    """An Ed25519 private key from PEM bytes; ``where`` (field and file or variable) starts each error."""
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise EvidenceError(f"{where} is not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise EvidenceError(f"{where} holds a {type(key).__name__.lstrip('_')}, not an Ed25519 key")
    return key


def load_public_key(path: str, field: str = "--public-key") -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file (a public key, or a private key whose public half is used)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise EvidenceError(f"{field}: cannot read {path}: {e.strerror or e}") from None
    try:
        key: Any = serialization.load_pem_public_key(data)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError) as e:
            raise EvidenceError(f"{field}: {path} is not a PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise EvidenceError(f"{field}: {path} is not an Ed25519 public key")
    return key


def fingerprint(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "SHA256:" + hashlib.sha256(raw).hexdigest()


def canonical(report: dict[str, Any]) -> bytes:
    """The bytes that are signed: the report without its signature, keys sorted, compact."""
    return orjson.dumps({k: v for k, v in report.items() if k != FIELD}, option=orjson.OPT_SORT_KEYS)


def sign(report: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """The ``signature`` member for a report (the report itself is not changed)."""
    payload = canonical(report)
    pub = key.public_key()
    return {"format": FORMAT, "algorithm": "Ed25519", "key_fingerprint": fingerprint(pub),
            "public_key": pub.public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode(),
            "payload": base64.b64encode(payload).decode(), "value": base64.b64encode(key.sign(payload)).decode()}


def scratch_words(vhost: str | None, removed: bool | None) -> str:
    """How a report's scratch vhost is shown: a drill stopped before its PUT created none, so none was removed."""
    if vhost is None:
        return "no scratch vhost (none was created)"
    return f"scratch vhost {vhost!r} ({'removed' if removed else 'NOT removed'})"


@dataclass(frozen=True)
class Verified:
    """A report whose signature holds and whose visible fields are the signed ones."""

    fingerprint: str
    authenticated: bool  # verified with a key given out of band, not only the one embedded
    report: dict[str, Any]

    def lines(self) -> list[str]:
        r = self.report
        queues = r.get("queues") or []
        out = [f"signature: valid Ed25519 signature by key {self.fingerprint}"
               + ("" if self.authenticated else
                  " (the key embedded in the report: pass --public-key to prove who signed it)"),
               f"drill {r.get('drill_id')} of backup {r.get('backup_id')}: {r.get('result')}"
               + (f" ({r.get('reason')})" if r.get("reason") else ""),
               f"backup manifest SHA-256: {r.get('manifest_sha256') or '-'}",
               (f"target: {r.get('target')} (RabbitMQ {r.get('broker_version') or '?'}), "
                + (f"scratch vhost {r.get('scratch_vhost')!r} "
                   f"{'removed' if r.get('scratch_vhost_removed') else 'NOT removed'}" if r.get("scratch_vhost")
                   else scratch_words(None, None))),
               f"time: {r.get('started_at')} .. {r.get('finished_at') or '?'} ({r.get('duration_secs')} s)"]
        a = r.get("archive")
        if isinstance(a, dict):  # a drill of a continuous archive (rbak.drill.archive)
            return out[:2] + out[3:] + self._archive_lines(a)
        for q in queues:
            out.append(f"  {q.get('vhost')}/{q.get('queue')} ({q.get('queue_type')}): expected "
                       f"{q.get('expected_count')}, restored and read back {q.get('actual_count')}, record hash "
                       f"{q.get('actual_hash') or '-'} ({'match' if q.get('hash_match') else 'MISMATCH'})")
        what = ("restored into a scratch vhost and read back with the backup's message counts and record hashes"
                if r.get("passed") else "did NOT restore as the backup holds it")
        out.append(f"proves: backup {r.get('backup_id')} (manifest {str(r.get('manifest_sha256'))[:16]}...) {what}, "
                   f"as reported by the holder of key {self.fingerprint}")
        return out


    def _archive_lines(self, a: dict[str, Any]) -> list[str]:
        r = self.report
        out = [f"archive {a.get('name')}, generation {a.get('generation')}: recovery point achieved "
               f"{a.get('recovery_point_secs')} s (recoverable until {a.get('recoverable_until_utc')} at the drill); "
               + (f"restored up to {a.get('restore_point_utc')} in {a.get('restore_secs')} s (RTO)"
                  if a.get("restore_secs") is not None else f"nothing restored (restore point {a.get('restore_point_utc')})")]
        for s in a.get("streams") or []:
            out.append(f"  {s.get('vhost')}/{s.get('stream')}: offsets {s.get('first_offset')}..{s.get('last_offset')}"
                       f", {s.get('restored_count')} restored, {s.get('live_count')} live, record hash "
                       f"{s.get('restored_hash') or '-'} ({'match' if s.get('passed') else 'MISMATCH'})")
        what = ("restored into a scratch vhost and matched the live streams record by record" if r.get("passed")
                else "did NOT match the live streams" if a.get("streams")
                else "was NOT compared with the live streams (the drill failed before it)")
        out.append(f"proves: archive {a.get('name')} up to {a.get('restore_point_utc')} {what}, as reported by the "
                   f"holder of key {self.fingerprint}")
        return out


def verify(report: Any, public_key: Ed25519PublicKey | None = None, where: str = "report") -> Verified:
    """Check a report's signature and that every visible field is the signed one; raise naming the problem."""
    if not isinstance(report, dict):
        raise EvidenceError(f"{where}: not a JSON object")
    sig = report.get(FIELD)
    if not isinstance(sig, dict):
        raise EvidenceError(f"{where}: not signed (no {FIELD!r} member); set drill.signing_key_file to sign drills")
    if sig.get("format") != FORMAT or sig.get("algorithm") != "Ed25519":
        raise EvidenceError(f"{where}: signature.format/algorithm {sig.get('format')!r}/{sig.get('algorithm')!r} "
                            f"unknown (expected {FORMAT!r}/'Ed25519')")
    try:
        payload = base64.b64decode(sig.get("payload") or "", validate=True)
        value = base64.b64decode(sig.get("value") or "", validate=True)
    except (ValueError, TypeError) as e:
        raise EvidenceError(f"{where}: signature.payload/value is not base64 ({e})") from None
    stated = sig.get("key_fingerprint")
    if public_key is None:
        try:
            key = serialization.load_pem_public_key(str(sig.get("public_key") or "").encode())
        except (ValueError, TypeError, UnsupportedAlgorithm) as e:
            raise EvidenceError(f"{where}: signature.public_key is not a PEM public key ({e})") from None
        if not isinstance(key, Ed25519PublicKey) or fingerprint(key) != stated:
            raise EvidenceError(f"{where}: signature.public_key does not match signature.key_fingerprint {stated}")
    else:
        key = public_key
        if fingerprint(key) != stated:
            raise EvidenceError(f"{where}: signed by key {stated}, not by the given public key {fingerprint(key)}")
    try:
        key.verify(value, payload)
    except InvalidSignature:
        raise EvidenceError(f"{where}: signature.value does not verify: the signed payload was altered, or "
                            f"key {fingerprint(key)} did not sign it") from None
    try:
        signed = orjson.loads(payload)
    except orjson.JSONDecodeError as e:
        raise EvidenceError(f"{where}: signature.payload is not JSON ({e})") from None
    visible = {k: v for k, v in report.items() if k != FIELD}
    diff = first_difference(signed, visible)
    if diff is not None:
        path, was, now = diff
        raise EvidenceError(f"{where}: field {path} was changed after signing: signed {_show(was)}, "
                            f"the report shows {_show(now)}")
    return Verified(fingerprint(key), public_key is not None, visible)


_MISSING = object()


def _show(v: Any) -> str:
    return "nothing (absent)" if v is _MISSING else orjson.dumps(v).decode()[:200]


def first_difference(signed: Any, shown: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """(field path, signed value, shown value) of the first field that differs, or None."""
    if isinstance(signed, dict) and isinstance(shown, dict):
        for k in sorted(set(signed) | set(shown)):
            d = first_difference(signed.get(k, _MISSING), shown.get(k, _MISSING), f"{path}.{k}" if path else k)
            if d is not None:
                return d
        return None
    if isinstance(signed, list) and isinstance(shown, list):
        for i in range(max(len(signed), len(shown))):
            d = first_difference(signed[i] if i < len(signed) else _MISSING,
                                 shown[i] if i < len(shown) else _MISSING, f"{path}[{i}]")
            if d is not None:
                return d
        return None
    same = type(signed) is type(shown) and signed == shown
    return None if same else (path or "(report)", signed, shown)
