"""Client-side encryption of a backup's objects (rbak's own extension of the format).

Why AES-256-GCM from ``cryptography``: an authenticated cipher (tampering is
an error, never garbage), in a library maintained by the PyCA with wheels for
every platform the image targets, and symmetric keys that fit how operators
already hand secrets to pods (an env var, a file, a Kubernetes Secret). age
recipients (``pyrage``) would add public-key wrapping that nothing here needs
and a less widely packaged binding.

A sealed object is::

    b"RBKE" | version u8 (1) | algorithm u8 (1 = AES-256-GCM) | key id length u8 | key id (UTF-8)
    | nonce (12 bytes) | ciphertext | GCM tag (16 bytes)

The header (everything before the ciphertext) and the object's name inside
its backup (``{backup_id}/queues/.../segment-0001.zst``) are the associated
data, so an object cannot be swapped for another one or moved to another
backup without the tag failing. Each object has a fresh random nonce.

What is sealed: segments, definitions (and rollback snapshots) and
``state/offsets.db``. The manifest stays plaintext (``list``, retention and
size/checksum validation need no key) and names the key id in its
``encryption`` field; the manifest's ``size_bytes``/``checksum`` describe the
stored (sealed) bytes.
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
from typing import Mapping

import yaml
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import ConfigError, EncryptionError
from ..format.manifest import EncryptionInfo  # the manifest field; rbak.sealing.crypto.EncryptionInfo still imports

MAGIC = b"RBKE"
VERSION = 1
ALG_AES_256_GCM = 1
NONCE_SIZE = 12
TAG_SIZE = 16
KEY_SIZE = 32
DEFAULT_KEYS_ENV = "RBAK_ENCRYPTION_KEYS"
OBJECT_DIRS = ("queues", "definitions", "state")


# -- the cipher ---------------------------------------------------------------

def _header(key_id: str, nonce: bytes) -> bytes:
    kid = key_id.encode("utf-8")
    if not 0 < len(kid) < 256:
        raise ConfigError(f"encryption key id {key_id!r}: must be 1-255 bytes")
    return MAGIC + struct.pack("BBB", VERSION, ALG_AES_256_GCM, len(kid)) + kid + nonce


def aead(key: bytes):
    """The AES-256-GCM cipher of a 32-byte key."""
    if len(key) != KEY_SIZE:
        raise ConfigError(f"an AES-256-GCM key is {KEY_SIZE} bytes, got {len(key)}")
    return AESGCM(key)


def seal(key_id: str, key: bytes, plaintext: bytes | bytearray | memoryview, aad: bytes) -> bytes:
    """The sealed form of ``plaintext`` (see the module docstring)."""
    nonce = os.urandom(NONCE_SIZE)
    header = _header(key_id, nonce)
    return header + aead(key).encrypt(nonce, bytes(plaintext), header + aad)


def parse_header(blob: bytes | memoryview, where: str) -> tuple[str, bytes, int]:
    """(key id, nonce, header length) of a sealed object; EncryptionError when it is not one."""
    if len(blob) < 7 or bytes(blob[:4]) != MAGIC:
        raise EncryptionError(f"{where}: not an encrypted rbak object (no {MAGIC!r} header)")
    version, alg, n = struct.unpack_from("BBB", blob, 4)
    if version != VERSION or alg != ALG_AES_256_GCM:
        raise EncryptionError(f"{where}: unsupported encryption header (version {version}, algorithm {alg})")
    end = 7 + n + NONCE_SIZE
    if len(blob) < end + TAG_SIZE:
        raise EncryptionError(f"{where}: encrypted object is truncated ({len(blob)} bytes)")
    try:
        key_id = bytes(blob[7:7 + n]).decode("utf-8")
    except UnicodeDecodeError:
        raise EncryptionError(f"{where}: encryption header has a key id that is not UTF-8") from None
    return key_id, bytes(blob[7 + n:end]), end


def open_(key_id: str, key: bytes, blob: bytes | memoryview, aad: bytes, where: str = "object") -> bytes:
    """The plaintext of a sealed object; EncryptionError naming ``where`` and the key id otherwise."""
    found, nonce, end = parse_header(blob, where)
    if found != key_id:
        raise EncryptionError(f"{where}: sealed with key id {found!r}, expected {key_id!r}")
    try:
        return aead(key).decrypt(nonce, bytes(blob[end:]), bytes(blob[:end]) + aad)
    except InvalidTag:
        raise EncryptionError(f"{where}: cannot decrypt with key id {key_id!r}: wrong key, or the object was "
                              "altered or moved") from None


def object_name(storage_key: str, backup_id: str) -> str:
    """``{backup_id}/...``: the key without the storage prefix (sealed objects stay valid when a backup moves)."""
    parts = storage_key.split("/")
    for i in range(len(parts) - 2):
        if parts[i] == backup_id and parts[i + 1] in OBJECT_DIRS:
            return "/".join(parts[i:])
    raise EncryptionError(f"{storage_key}: not an object of backup {backup_id!r}")


def aad_for(storage_key: str, backup_id: str) -> bytes:
    return b"rbak-object\x00" + object_name(storage_key, backup_id).encode("utf-8")


# -- keys -------------------------------------------------------------------------

def parse_key(text: str | bytes, where: str) -> bytes:
    """A key as written in a keyring: base64 (standard or URL-safe) of 32 bytes, or 32 raw bytes from a file."""
    if isinstance(text, bytes):
        if len(text) == KEY_SIZE and not _looks_base64(text):
            return text
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise ConfigError(f"{where}: not a base64 key nor {KEY_SIZE} raw bytes") from None
    s = text.strip()
    try:
        raw = base64.b64decode(s + "=" * (-len(s) % 4), altchars=b"-_" if ("-" in s or "_" in s) else None,
                               validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: not a base64-encoded key") from None
    if len(raw) != KEY_SIZE:
        raise ConfigError(f"{where}: an AES-256 key is {KEY_SIZE} bytes, this one decodes to {len(raw)}")
    return raw


def _looks_base64(b: bytes) -> bool:
    return all(c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_\n\r " for c in b)


def parse_keyring_text(text: str, where: str, default_id: str | None = None) -> dict[str, bytes]:
    """``{id: base64 key}`` as YAML or JSON; a bare key belongs to ``default_id``."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: keyring is neither a key nor a YAML/JSON mapping: {e}") from None
    if isinstance(doc, str):
        if not default_id:
            raise ConfigError(f"{where}: holds a single key but no key id is configured (encryption.key_id); "
                              "write it as `<key id>: <base64 key>`")
        return {default_id: parse_key(doc, where)}
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(f"{where}: keyring must be a mapping of key id to base64 key")
    return {str(k): parse_key(str(v), f"{where}: key id {k!r}") for k, v in doc.items()}


def load_keyring_dir(path: str, where: str) -> dict[str, bytes]:
    """One file per key id (a mounted Kubernetes Secret: file name = key id, content = the key)."""
    out: dict[str, bytes] = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.startswith(".") or not os.path.isfile(full):
            continue  # a Secret volume's ..data / ..<timestamp> entries
        with open(full, "rb") as f:  # unstripped: 32 raw key bytes may begin or end with a whitespace byte
            out[name] = parse_key(f.read(), f"{where}/{name}")
    if not out:
        raise ConfigError(f"{where}: keyring directory holds no key file")
    return out


def load_keyring(file: str | None = None, env_var: str | None = None, default_id: str | None = None,
                 environ: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """Every key found: ``env_var`` (default ``RBAK_ENCRYPTION_KEYS``) and ``file`` (a keyring file or a
    directory with one file per key id). Later sources win on a duplicate id. Empty when none is set."""
    environ = os.environ if environ is None else environ
    ring: dict[str, bytes] = {}
    var = env_var or DEFAULT_KEYS_ENV
    text = environ.get(var)
    if text and text.strip():
        ring.update(parse_keyring_text(text, f"environment variable {var}", default_id))
    elif env_var:
        raise ConfigError(f"encryption.keys_env: environment variable {env_var} is not set")
    if file:
        if os.path.isdir(file):
            ring.update(load_keyring_dir(file, file))
        else:
            try:
                with open(file, encoding="utf-8") as f:
                    ring.update(parse_keyring_text(f.read(), file, default_id))
            except OSError as e:
                raise ConfigError(f"encryption.keys_file: cannot read {file}: {e.strerror}") from None
    return ring


def generate_key() -> str:
    """A new random key, base64 (what a keyring holds)."""
    return base64.b64encode(os.urandom(KEY_SIZE)).decode("ascii")


# -- objects of one backup ----------------------------------------------------------

class ObjectCodec:
    """Stores and reads one backup's segment/definition/state objects: sealed when the backup is encrypted,
    untouched otherwise (unencrypted backups stay byte-identical to the RBAK format)."""

    def __init__(self, backup_id: str, info: EncryptionInfo | None = None, key: bytes | None = None,
                 wraps: list | None = None):
        self.backup_id = backup_id
        self.info = info
        self.key = key
        self.wraps = wraps or []  # envelope: the data key's wraps (rbak.sealing.envelope.WrapRecord), to store first

    @property
    def encrypted(self) -> bool:
        return self.info is not None

    @property
    def can_open(self) -> bool:
        return self.info is None or self.key is not None

    def seal(self, storage_key: str, data: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
        if self.info is None:
            return data
        assert self.key is not None
        return seal(self.info.key_id, self.key, data, aad_for(storage_key, self.backup_id))

    def open(self, storage_key: str, data: bytes) -> bytes:
        if self.info is None:
            return data
        if self.key is None:
            raise missing_key_error(self.backup_id, self.info.key_id)
        return open_(self.info.key_id, self.key, data, aad_for(storage_key, self.backup_id),
                     f"backup {self.backup_id!r}: {storage_key}")

    def put(self, storage, key: str, data: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
        """Store ``data`` (sealed when encrypted); returns the bytes stored, which the manifest describes."""
        stored = self.seal(key, data)
        storage.put(key, stored)
        return stored

    def get(self, storage, key: str) -> bytes:
        return self.open(key, storage.get(key))



def writer_codec(backup_id: str, enc) -> ObjectCodec:
    """How a new backup's objects are stored: sealed with ``enc.key_id`` when ``enc.enabled``
    (``enc``: the config's ``encryption`` section; ``rbak.sealing.envelope.writer_codec`` adds envelopes)."""
    if not enc.enabled:
        return ObjectCodec(backup_id)
    return sealing_codec(backup_id, enc.key_id, enc.keyring())


def sealing_codec(backup_id: str, key_id: str, keyring: Mapping[str, bytes]) -> ObjectCodec:
    """The codec sealing with ``key_id`` from ``keyring`` (the keys are handed in: this module reads no config)."""
    key = keyring.get(key_id)
    if key is None:
        raise ConfigError(f"encryption.key_id: no key {key_id!r} in the keyring (encryption.keys_file, "
                          f"encryption.keys_env or {DEFAULT_KEYS_ENV}); backup {backup_id!r} was not started")
    return ObjectCodec(backup_id, EncryptionInfo(key_id), key)


def missing_key_error(backup_id: str, key_id: str) -> EncryptionError:
    if key_id.startswith("dek-"):
        return EncryptionError(f"backup {backup_id!r} uses envelope encryption and no key-encryption key available "
                               f"here unwraps its data key {key_id!r} (keyring keys: {DEFAULT_KEYS_ENV} or "
                               "encryption.keys_file; KMS keys: this process's AWS credentials)")
    return EncryptionError(f"backup {backup_id!r} is encrypted with key id {key_id!r}, which is not in the keyring "
                           f"(set {DEFAULT_KEYS_ENV} or encryption.keys_file / keys_env)")


class ChainCodec(ObjectCodec):
    """Opens the segments of an incremental stream's whole chain. Each link's objects were sealed for
    their own backup (its id is in every object's AAD; an envelope link has its own data key, and a
    link may be plaintext while a later one is encrypted), so each is opened by its link's codec,
    found by storage key; the restored backup's own segments by ``own``. Reading only."""

    def __init__(self, own: ObjectCodec, links: Mapping[str, ObjectCodec], link_of: Mapping[str, str]):
        super().__init__(own.backup_id, own.info, own.key)
        self.own = own
        self.links = dict(links)
        self.link_of = dict(link_of)

    def _for(self, storage_key: str) -> ObjectCodec:
        bid = self.link_of.get(storage_key)
        return self.own if bid is None else self.links[bid]

    @property
    def encrypted(self) -> bool:
        return self.own.encrypted or any(c.encrypted for c in self.links.values())

    @property
    def can_open(self) -> bool:
        return self.own.can_open and all(c.can_open for c in self.links.values())

    def seal(self, storage_key: str, data: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
        raise EncryptionError(f"{storage_key}: a chain's codec only reads")

    def open(self, storage_key: str, data: bytes) -> bytes:
        return self._for(storage_key).open(storage_key, data)


def codec_for(backup_id: str, info: EncryptionInfo | None, keyring: Mapping[str, bytes] | None,
              required: bool = True) -> ObjectCodec:
    """The codec reading an existing backup. ``required``: a missing key is an error now (restore);
    otherwise the codec can only check sizes/checksums (validate without the key)."""
    if info is None:
        return ObjectCodec(backup_id)
    key = (keyring or {}).get(info.key_id)
    if key is None and required:
        raise missing_key_error(backup_id, info.key_id)
    return ObjectCodec(backup_id, info, key)
