"""Envelope encryption: each backup has its own random data key (DEK), stored only wrapped.

Why: a backup sealed directly with a keyring key can only leave that key by being re-encrypted,
which Object Lock forbids. Here segments are sealed with the backup's DEK (the same cipher and
object layout as ``rbak.sealing.crypto``; the sealed header names ``dek-<fingerprint>``), and the DEK is
wrapped by one or more key-encryption keys (KEKs): keyring keys (AES-256-GCM) or AWS KMS keys
(``kms.encrypt``/``decrypt`` through boto3, with an encryption context naming the backup). Each
wrap is its own object, ``<backup>/keys/<source>-<kek id>.wrap.json``, written once; rotating to
a new KEK adds one (``rbak keys rewrap``) and touches neither segments nor the manifest.

The manifest records only the DEK's fingerprint (a hash of the key, domain-separated), so a
reader can tell an unwrapped key is this backup's. Reading tries every wrap whose KEK it has:
keyring wraps first (no network call), then KMS; a wrap for a retired key is simply unused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import orjson
from cryptography.exceptions import InvalidTag

from ..errors import ConfigError, EncryptionError, NotFoundError, RbakError
from ..format.layout import WRAP_SUFFIX, BackupLayout
from ..format.manifest import EncryptionInfo
from .crypto import ObjectCodec, aead
from .crypto import writer_codec as direct_codec

KEYRING = "keyring"
KMS = "kms"
SOURCES = (KEYRING, KMS)
WRAP_FORMAT = "rbak-wrapped-data-key"
WRAP_VERSION = 1
ALG_KEYRING = "AES-256-GCM"
ALG_KMS = "AWS-KMS"
DEK_SIZE = 32
NONCE_SIZE = 12
DEK_ID_PREFIX = "dek-"


def fingerprint(dek: bytes) -> str:
    """``sha256:<hex>`` of the data key, domain-separated (a 256-bit random key cannot be guessed from it)."""
    return "sha256:" + hashlib.sha256(b"rbak-data-key-fingerprint\x00" + dek).hexdigest()


def dek_id(fp: str) -> str:
    """The key id sealed objects name: ``dek-`` and 16 hex digits of the fingerprint."""
    return DEK_ID_PREFIX + fp.split(":", 1)[-1][:16]


@dataclass(frozen=True)
class KmsSettings:
    """How to reach AWS KMS: ``region`` (else the wrap's, else boto3's default) and ``endpoint_url``
    (else boto3's: ``AWS_ENDPOINT_URL_KMS``/``AWS_ENDPOINT_URL``, then AWS)."""

    region: str | None = None
    endpoint_url: str | None = None

    def client(self, region: str | None = None):
        import boto3  # noqa: PLC0415 - boto3 takes ~1 s to import; only KMS users pay it

        return boto3.session.Session().client("kms", region_name=self.region or region,
                                              endpoint_url=self.endpoint_url)


@dataclass(frozen=True)
class Kek:
    """One key-encryption key: a keyring key id, or a KMS key (id, ARN or alias)."""

    source: str
    key_id: str

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ConfigError(f"key-encryption key source {self.source!r}: must be keyring or kms")
        if not self.key_id:
            raise ConfigError(f"key-encryption key: an empty {self.source} key id")

    @classmethod
    def parse(cls, text: str, where: str) -> "Kek":
        """``KEYID`` (a keyring key) or ``kms:KEY`` (a KMS key id, ARN or alias)."""
        if text.startswith("kms:"):
            if not text[4:]:
                raise ConfigError(f"{where}: 'kms:' needs a KMS key id, ARN or alias after it")
            return cls(KMS, text[4:])
        if not text:
            raise ConfigError(f"{where}: an empty key id")
        return cls(KEYRING, text)

    def __str__(self) -> str:
        return f"{self.source} {self.key_id!r}"


@dataclass(frozen=True)
class WrapRecord:
    """One ``keys/*.wrap.json`` object: the backup's data key wrapped by one KEK."""

    backup_id: str
    kek_source: str
    kek_id: str
    algorithm: str
    dek_fingerprint: str
    wrapped_key: bytes
    created_at: int
    region: str | None = None  # KMS only: where the key lives

    @property
    def kek(self) -> Kek:
        return Kek(self.kek_source, self.kek_id)

    def to_json(self) -> bytes:
        d: dict[str, Any] = {
            "format": WRAP_FORMAT, "version": WRAP_VERSION, "backup_id": self.backup_id,
            "kek_source": self.kek_source, "kek_id": self.kek_id, "algorithm": self.algorithm,
            "dek_fingerprint": self.dek_fingerprint,
            "wrapped_key": base64.b64encode(self.wrapped_key).decode("ascii"), "created_at": self.created_at,
        }
        if self.region:
            d["region"] = self.region
        return orjson.dumps(d, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "WrapRecord":
        try:
            d = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise EncryptionError(f"{where}: not a wrapped data key (invalid JSON: {e})") from None
        if not isinstance(d, dict) or d.get("format") != WRAP_FORMAT:
            raise EncryptionError(f"{where}: not a wrapped data key (format is not {WRAP_FORMAT!r})")
        if d.get("version") != WRAP_VERSION:
            raise EncryptionError(f"{where}: wrapped data key version {d.get('version')!r} is not supported")
        for name in ("backup_id", "kek_source", "kek_id", "algorithm", "dek_fingerprint", "wrapped_key"):
            if not isinstance(d.get(name), str) or not d[name]:
                raise EncryptionError(f"{where}: field {name!r} must be a non-empty string")
        if d["kek_source"] not in SOURCES:
            raise EncryptionError(f"{where}: field 'kek_source' is {d['kek_source']!r}, not keyring or kms")
        try:
            wrapped = base64.b64decode(d["wrapped_key"], validate=True)
        except (binascii.Error, ValueError):
            raise EncryptionError(f"{where}: field 'wrapped_key' is not base64") from None
        created = d.get("created_at")
        return cls(d["backup_id"], d["kek_source"], d["kek_id"], d["algorithm"], d["dek_fingerprint"], wrapped,
                   created if isinstance(created, int) else 0,
                   d.get("region") if isinstance(d.get("region"), str) else None)


@dataclass(frozen=True)
class KeySources:
    """Every KEK a process can use: the keyring's keys and, when configured, KMS. ``wrap_with``: the
    KEKs a new backup's data key is wrapped by (the config's ``key_id`` and ``kms_key_id``)."""

    keyring: Mapping[str, bytes] = field(default_factory=dict)
    kms: KmsSettings = field(default_factory=KmsSettings)
    wrap_with: tuple[Kek, ...] = ()


# -- wrapping ------------------------------------------------------------------------------

def _aad(backup_id: str, kek_id: str, fp: str) -> bytes:
    return b"rbak-data-key\x00" + "\x00".join((backup_id, kek_id, fp)).encode("utf-8")


def _kms_context(backup_id: str, fp: str) -> dict[str, str]:
    return {"rbak:backup_id": backup_id, "rbak:dek_fingerprint": fp}


def _arn_region(key_id: str) -> str | None:
    parts = key_id.split(":")
    return parts[3] if len(parts) > 4 and parts[0] == "arn" and parts[2] == "kms" and parts[3] else None


def wrap(backup_id: str, dek: bytes, kek: Kek, sources: KeySources) -> WrapRecord:
    """The data key wrapped by ``kek``; ConfigError naming the key when it is not available."""
    fp = fingerprint(dek)
    now = int(time.time() * 1000)
    if kek.source == KEYRING:
        key = sources.keyring.get(kek.key_id)
        if key is None:
            raise ConfigError(f"key-encryption key {kek}: not in the keyring (encryption.keys_file, "
                              "encryption.keys_env or RBAK_ENCRYPTION_KEYS)")

        nonce = os.urandom(NONCE_SIZE)
        wrapped = nonce + aead(key).encrypt(nonce, dek, _aad(backup_id, kek.key_id, fp))
        return WrapRecord(backup_id, KEYRING, kek.key_id, ALG_KEYRING, fp, wrapped, now)
    region = _arn_region(kek.key_id) or sources.kms.region
    try:
        client = sources.kms.client(region)
        resp = client.encrypt(KeyId=kek.key_id, Plaintext=dek, EncryptionContext=_kms_context(backup_id, fp))
    except Exception as e:  # noqa: BLE001 - botocore's ClientError/EndpointConnectionError/NoRegionError: one line naming the key
        raise EncryptionError(f"key-encryption key {kek}: KMS encrypt failed: {e}") from None
    return WrapRecord(backup_id, KMS, kek.key_id, ALG_KMS, fp, resp["CiphertextBlob"], now,
                      region or client.meta.region_name)


def unwrap(rec: WrapRecord, sources: KeySources, where: str) -> bytes:
    """The data key of one wrap; EncryptionError naming ``where`` (the object) when it cannot be."""
    if rec.kek_source == KEYRING:
        key = sources.keyring.get(rec.kek_id)
        if key is None:
            raise EncryptionError(f"{where}: key {rec.kek_id!r} is not in the keyring")
        if rec.algorithm != ALG_KEYRING or len(rec.wrapped_key) <= NONCE_SIZE:
            raise EncryptionError(f"{where}: unsupported or truncated keyring wrap ({rec.algorithm})")

        try:
            dek = aead(key).decrypt(rec.wrapped_key[:NONCE_SIZE], rec.wrapped_key[NONCE_SIZE:],
                                     _aad(rec.backup_id, rec.kek_id, rec.dek_fingerprint))
        except InvalidTag:
            raise EncryptionError(f"{where}: cannot unwrap with keyring key {rec.kek_id!r}: wrong key, or the "
                                  "object was altered") from None
    else:
        if rec.algorithm != ALG_KMS:
            raise EncryptionError(f"{where}: unsupported KMS wrap algorithm {rec.algorithm!r}")
        try:
            resp = sources.kms.client(rec.region).decrypt(
                KeyId=rec.kek_id, CiphertextBlob=rec.wrapped_key,
                EncryptionContext=_kms_context(rec.backup_id, rec.dek_fingerprint))
        except Exception as e:  # noqa: BLE001 - any botocore or KMS failure, named in one line
            raise EncryptionError(f"{where}: KMS key {rec.kek_id!r} did not unwrap it: {e}") from None
        dek = resp["Plaintext"]
    if len(dek) != DEK_SIZE or fingerprint(dek) != rec.dek_fingerprint:
        raise EncryptionError(f"{where}: unwraps to a key that is not the data key it names (altered)")
    return dek


def new_data_key(backup_id: str, sources: KeySources) -> tuple[bytes, EncryptionInfo, list[WrapRecord]]:
    """A fresh data key, the manifest's ``encryption`` for it, and one wrap per configured KEK (every
    KEK is used now, so a missing key or an unreachable KMS stops the backup before it writes)."""
    if not sources.wrap_with:
        raise ConfigError("encryption.envelope: needs encryption.key_id or encryption.kms_key_id (the key-encryption "
                          "keys that wrap each backup's data key)")
    dek = os.urandom(DEK_SIZE)
    fp = fingerprint(dek)
    wraps = [wrap(backup_id, dek, k, sources) for k in sources.wrap_with]
    return dek, EncryptionInfo(dek_id(fp), dek_fingerprint=fp), wraps


def writer_codec(backup_id: str, enc):
    """How a new backup's objects are stored (``enc``: the config's ``encryption`` section): with
    ``envelope``, sealed with a new data key whose wraps the codec carries until they are stored."""
    if not (enc.enabled and enc.envelope):
        return direct_codec(backup_id, enc)
    dek, info, wraps = new_data_key(backup_id, enc.key_sources())
    return ObjectCodec(backup_id, info, dek, wraps)


def write_wraps(storage, layout: BackupLayout, wraps: Iterable[WrapRecord]) -> list[str]:
    keys = []
    for w in wraps:
        key = layout.wrap(w.kek_source, w.kek_id)
        storage.put(key, w.to_json())
        keys.append(key)
    return keys


def read_wraps(storage, layout: BackupLayout) -> list[tuple[str, WrapRecord | EncryptionError]]:
    """(object key, record or the error reading it) of every wrap object of a backup, by key."""
    out: list[tuple[str, WrapRecord | EncryptionError]] = []
    for key in sorted(storage.list(layout.keys_dir)):
        if not key.endswith(WRAP_SUFFIX):
            continue
        try:
            rec = WrapRecord.from_json(storage.get(key), key)
            if rec.backup_id != layout.backup_id:
                raise EncryptionError(f"{key}: wraps the data key of backup {rec.backup_id!r}, not "
                                      f"{layout.backup_id!r} (moved or altered)")
            out.append((key, rec))
        except EncryptionError as e:
            out.append((key, e))
        except NotFoundError:
            continue
    return out


def _order(item: tuple[str, WrapRecord | EncryptionError], sources: KeySources) -> tuple[int, str]:
    _key, rec = item
    if isinstance(rec, EncryptionError):
        return (3, _key)
    if rec.kek_source == KEYRING:
        return (0 if rec.kek_id in sources.keyring else 2, _key)
    return (1, _key)


def data_key(storage, layout: BackupLayout, info: EncryptionInfo, sources: KeySources,
             only: Kek | None = None) -> tuple[bytes, WrapRecord]:
    """The backup's data key and the wrap that gave it: keyring wraps whose key is present first, then
    KMS. No wrap opens: one EncryptionError naming the backup and every key tried, and why."""
    bid = layout.backup_id
    tried: list[str] = []
    wraps = read_wraps(storage, layout)
    for key, rec in sorted(wraps, key=lambda it: _order(it, sources)):
        if isinstance(rec, EncryptionError):
            tried.append(rec.args[0])
            continue
        if only is not None and rec.kek != only:
            continue
        if rec.dek_fingerprint != info.dek_fingerprint:
            tried.append(f"{rec.kek} ({key}: wraps another data key than the manifest names)")
            continue
        if rec.kek_source == KEYRING and rec.kek_id not in sources.keyring:
            tried.append(f"{rec.kek} (not in the keyring)")
            continue
        try:
            return unwrap(rec, sources, key), rec
        except EncryptionError as e:
            tried.append(f"{rec.kek} ({e.args[0]})")
    if only is not None and not any(isinstance(r, WrapRecord) and r.kek == only for _, r in wraps):
        tried.append(f"{only} (no wrap object for it)")
    if not wraps:
        tried.append(f"no wrap object under {layout.keys_dir}")
    raise EncryptionError(f"backup {bid!r}: no key-encryption key could unwrap its data key {info.key_id!r}; "
                          f"tried: {'; '.join(tried)}")


def with_data_key(storage, prefix: str | None, backup_id: str, info: EncryptionInfo | None,
                  keyring: Mapping[str, bytes] | None, kms: KmsSettings | None = None,
                  required: bool = True) -> dict[str, bytes]:
    """``keyring`` plus the backup's data key (under its ``dek-`` id) when it uses an envelope: what
    ``rbak.sealing.crypto.codec_for`` then opens it with. ``required=False``: a data key no KEK opens is left
    out (validate checks sizes and checksums without it) instead of raising."""
    ring = dict(keyring or {})
    if info is None or not info.envelope or info.key_id in ring:
        return ring
    try:
        dek, _ = data_key(storage, BackupLayout(backup_id, prefix), info,
                          KeySources(ring, kms or KmsSettings()))
    except EncryptionError:
        if required:
            raise
        return ring
    ring[info.key_id] = dek
    return ring


# -- rewrap --------------------------------------------------------------------------------

@dataclass
class RewrapResult:
    backup_id: str
    outcome: str  # added | already | skipped | failed
    detail: str
    key: str | None = None  # the wrap object for the new KEK

    def to_json_obj(self) -> dict[str, Any]:
        return {"backup_id": self.backup_id, "outcome": self.outcome, "detail": self.detail, "key": self.key}


def rewrap(storage, prefix: str | None, backup_id: str, info: EncryptionInfo | None, to: Kek,
           sources: KeySources, from_: Kek | None = None) -> RewrapResult:
    """Add a wrap of the backup's data key for ``to``. Writes one new object and nothing else (no
    segment, no manifest), so it works under Object Lock; an existing wrap for ``to`` that opens
    to the same key means there is nothing to do."""
    if info is None:
        return RewrapResult(backup_id, "skipped", "not encrypted")
    if not info.envelope:
        return RewrapResult(backup_id, "skipped", f"encrypted directly with keyring key {info.key_id!r} (written "
                            "before envelope encryption): it has no data key to wrap")
    layout = BackupLayout(backup_id, prefix)
    target = layout.wrap(to.source, to.key_id)
    try:
        dek, used = data_key(storage, layout, info, sources, only=from_)
    except EncryptionError as e:
        return RewrapResult(backup_id, "failed", e.args[0])
    try:
        existing = storage.get(target)
    except NotFoundError:
        existing = None
    if existing is not None:
        try:
            if unwrap(WrapRecord.from_json(existing, target), sources, target) == dek:
                return RewrapResult(backup_id, "already", f"already wrapped for {to}", target)
        except EncryptionError as e:
            return RewrapResult(backup_id, "failed", f"{e.args[0]}; the object is not rewritten (remove it if the storage "
                                "allows, then rerun)", target)
    try:
        rec = wrap(backup_id, dek, to, sources)
        storage.put(target, rec.to_json())
    except RbakError as e:
        return RewrapResult(backup_id, "failed", str(e), target)
    return RewrapResult(backup_id, "added", f"wrapped for {to} (unwrapped with {used.kek})", target)
