"""The storage layout of a backup: one place for every key rbak reads or writes.

``{prefix}/{backup_id}/manifest.json``, ``.../definitions/definitions.json<ext>``,
``.../state/offsets.db``, ``.../queues/{vhost}/{queue}/segment-NNNN<ext>``.

Name encoding (reversible, never escapes the backup's prefix, never collides):
a vhost or queue name becomes one path component by percent-encoding every
byte of its UTF-8 form outside ``A-Z a-z 0-9 - . _ ~`` (so ``/``, ``%``,
spaces and non-ASCII are ``%XX``). Two components need more, because they
would otherwise mean something else: the vhost ``/`` is ``_default`` as the
spec says, so a vhost literally named ``_default`` is ``%5Fdefault``; and the
names ``.`` and ``..`` become ``%2E`` and ``%2E%2E``. Ordinary names
(``orders``, ``production``) are unchanged, so keys match the Rust tool's.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote, unquote

from ..errors import ConfigError
from .compression import Compression
from .segment import segment_file_name

DEFAULT_VHOST = "/"
DEFAULT_VHOST_DIR = "_default"
MANIFEST_NAME = "manifest.json"
DEFINITIONS_DIR = "definitions"
STATE_DIR = "state"
QUEUES_DIR = "queues"
OFFSETS_DB = "offsets.db"
VALIDATION_DIR = "validation"
RESTORE_DIR = "restore"
DRILLS_DIR = "drills"
KEYS_DIR = "keys"  # an envelope-encrypted backup's wrapped data keys, one object per key-encryption key
WRAP_SUFFIX = ".wrap.json"
GUARDS_DIR = "_guards"  # beside the backups; never a backup id (ids start with a letter or digit)
PROGRESS_DIR = "_progress"  # live progress records of running jobs; beside the backups, never backup content
PROGRESS_KINDS = ("backup", "restore", "import", "validate")

_SAFE = "-._~"  # quote() keeps ASCII letters and digits, plus these
BACKUP_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


MAX_COMPONENT = 200
"""Longest encoded component kept as is (file systems allow 255 bytes; S3 keys 1024 in all)."""
HASHED_MARK = "%~"  # never produced by percent-encoding ('%' is always followed by two hex digits)


def encode_name(name: str) -> str:
    """One path component for a queue name (see module docstring).

    A name whose encoding is longer than ``MAX_COMPONENT`` (a 127 x 'é'
    queue name is 762 characters encoded) becomes a readable head of its
    encoding, ``%~`` and the SHA-256 of the name: bounded, still injective
    (the mark never occurs in an ordinary encoding) and never a path
    separator. Such a key cannot be decoded; readers take the name from the
    manifest, which records it next to its keys.
    """
    if name == "":
        raise ValueError("an empty name cannot be stored")
    if name == ".":
        return "%2E"
    if name == "..":
        return "%2E%2E"
    enc = quote(name, safe=_SAFE, encoding="utf-8", errors="strict")
    if len(enc) <= MAX_COMPONENT:
        return enc
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    head = enc[: MAX_COMPONENT - len(HASHED_MARK) - len(digest)]
    cut = head.rfind("%", len(head) - 2)  # never cut a %XX escape in two
    if cut >= 0:
        head = head[:cut]
    return f"{head}{HASHED_MARK}{digest}"


def decode_name(component: str) -> str:
    """The name of an encoded component; a hashed (too long) one has no decoding: use the manifest."""
    if HASHED_MARK in component:
        raise ValueError(f"{component!r} is a hashed long name; its full name is in the manifest")
    return unquote(component, encoding="utf-8", errors="strict")


def encode_vhost(vhost: str) -> str:
    if vhost == DEFAULT_VHOST:
        return DEFAULT_VHOST_DIR
    if vhost == DEFAULT_VHOST_DIR:
        return "%5Fdefault"
    return encode_name(vhost)


def decode_vhost(component: str) -> str:
    if component == DEFAULT_VHOST_DIR:
        return DEFAULT_VHOST
    return decode_name(component)


def check_backup_id(backup_id: str, where: str = "backup_id") -> str:
    if not isinstance(backup_id, str) or not BACKUP_ID_RE.match(backup_id) or ".." in backup_id:
        raise ConfigError(
            f"{where}: {backup_id!r} is not a valid backup id (1-200 characters of "
            "letters, digits, '.', '_' and '-', starting with a letter or digit, no '..')"
        )
    return backup_id


def normalize_prefix(prefix: str | None) -> str:
    """Strip slashes; refuse components that would climb out of the bucket/root."""
    if not prefix:
        return ""
    parts = [p for p in prefix.strip("/").split("/") if p]
    for p in parts:
        if p in (".", ".."):
            raise ConfigError(f"storage.prefix: {prefix!r} may not contain '.' or '..' components")
    return "/".join(parts)


def guard_key(prefix: str | None, source_cluster: str, vhost: str, queue: str) -> str:
    """``{prefix}/_guards/{cluster}/{vhost}/{queue}.json``: a quorum queue's delivery guard, shared by
    every backup of that source whatever its backup id."""
    p = normalize_prefix(prefix)
    key = f"{GUARDS_DIR}/{encode_name(source_cluster)}/{encode_vhost(vhost)}/{encode_name(queue)}.json"
    return f"{p}/{key}" if p else key


def progress_prefix(prefix: str | None, kind: str, run_id: str) -> str:
    """``{prefix}/_progress/{kind}/{run_id}/``: where one run's progress records go (one new key per
    update, so write-once storage is never asked to rewrite one). Outside every backup's folder, so
    list, retention and validate never see them."""
    if kind not in PROGRESS_KINDS:
        raise ConfigError(f"progress kind: {kind!r} is not one of {', '.join(PROGRESS_KINDS)}")
    check_backup_id(run_id, "progress run id")
    p = normalize_prefix(prefix)
    key = f"{PROGRESS_DIR}/{kind}/{run_id}/"
    return f"{p}/{key}" if p else key


def progress_key(prefix: str | None, kind: str, run_id: str, time_ms: int, seq: int) -> str:
    """One progress record: named by time then sequence, so the newest sorts last (reruns included)."""
    return f"{progress_prefix(prefix, kind, run_id)}{time_ms:013d}-{seq:06d}.json"


class BackupLayout:
    """Keys of one backup under a storage prefix."""

    def __init__(self, backup_id: str, prefix: str | None = ""):
        self.backup_id = check_backup_id(backup_id)
        self.prefix = normalize_prefix(prefix)
        self.root = f"{self.prefix}/{backup_id}" if self.prefix else backup_id

    @property
    def manifest(self) -> str:
        return f"{self.root}/{MANIFEST_NAME}"

    @property
    def offsets_db(self) -> str:
        return f"{self.root}/{STATE_DIR}/{OFFSETS_DB}"

    def definitions(self, compression: Compression) -> str:
        return f"{self.root}/{DEFINITIONS_DIR}/definitions.json{compression.extension}"

    def rollback_definitions(self, timestamp: str, compression: Compression) -> str:
        return f"{self.root}/{DEFINITIONS_DIR}/rollback-before-import-{timestamp}{compression.extension}"

    def queue_dir(self, vhost: str, queue: str) -> str:
        return f"{self.root}/{QUEUES_DIR}/{encode_vhost(vhost)}/{encode_name(queue)}"

    def segment(self, vhost: str, queue: str, sequence: int, compression: Compression) -> str:
        return f"{self.queue_dir(vhost, queue)}/{segment_file_name(sequence, compression)}"

    def state(self, name: str) -> str:
        return f"{self.root}/{STATE_DIR}/{name}"

    def validation_report(self, timestamp: str) -> str:
        """``validation/report-<ts>.json``: a validate run's findings, next to the backup."""
        return f"{self.root}/{VALIDATION_DIR}/report-{timestamp}.json"

    def restore_report(self, timestamp: str) -> str:
        """``restore/report-<ts>.json``: what a restore changed to fit the target, and its outcome."""
        return f"{self.root}/{RESTORE_DIR}/report-{timestamp}.json"

    @property
    def keys_dir(self) -> str:
        return f"{self.root}/{KEYS_DIR}/"

    def wrap(self, source: str, kek_id: str) -> str:
        """``keys/<source>-<kek id>.wrap.json``: the data key wrapped by one key-encryption key. One new
        object per key (never rewritten), so adding a key works under Object Lock."""
        return f"{self.root}/{KEYS_DIR}/{source}-{encode_name(kek_id)}{WRAP_SUFFIX}"

    @property
    def drills_dir(self) -> str:
        return f"{self.root}/{DRILLS_DIR}/"

    def drill_report(self, timestamp: str, drill_id: str) -> str:
        """``drills/<ts>-<drill id>.json``: one restore drill's report, a new key per drill (write-once)."""
        return f"{self.root}/{DRILLS_DIR}/{timestamp}-{check_backup_id(drill_id, 'drill id')}.json"


def rebase_key(key: str, layout: "BackupLayout") -> str:
    """A key recorded in a manifest, as seen from where the manifest was found.

    Manifests record keys from the storage root they were written to,
    ``storage.prefix`` included (``pfx/<id>/queues/...``). The same backup
    may be read through a URL that already holds the prefix
    (``s3://bucket/pfx``, ``file:///dir/pfx``) or under another prefix: the
    one rule is that everything after ``<backup_id>/`` is relative to the
    backup's folder, and the folder is where its manifest was found. A key
    that does not name the backup's folder is returned unchanged (and the
    storage layer refuses it if it climbs out).
    """
    root = layout.root + "/"
    if key.startswith(root):
        return key
    mark = layout.backup_id + "/"
    if key.startswith(mark):
        return root + key[len(mark):]
    i = key.find("/" + mark)
    if i < 0:
        return key
    return root + key[i + 1 + len(mark):]


def parse_segment_key(key: str) -> tuple[str, str, str, str]:
    """(backup_id, vhost, queue, file name) of a segment key, prefix ignored."""
    parts = key.split("/")
    try:
        i = len(parts) - 1 - parts[::-1].index(QUEUES_DIR)
    except ValueError:
        raise ValueError(f"not a segment key: {key!r}") from None
    if i < 1 or len(parts) != i + 4:
        raise ValueError(f"not a segment key: {key!r}")
    return parts[i - 1], decode_vhost(parts[i + 1]), decode_name(parts[i + 2]), parts[i + 3]
