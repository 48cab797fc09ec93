"""Storage URLs, as the Rust tool's ``from_url`` takes them.

``file:///path``, ``s3://bucket/prefix?region=..&endpoint=..&path_style=true``
(also ``&sse=AES256`` or ``&sse=aws:kms&sse_kms_key_id=..``),
``memory://`` (fresh) or ``memory://NAME`` (shared in the process). ``azure://``
and ``gcs://`` are recognised and refused clearly. A bare path is a directory.
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import NotFoundError, StorageError, UnsupportedStorageError
from .base import Storage
from .fs import FilesystemStorage
from .memory import MemoryStorage

_TRUE = {"1", "true", "yes", "on"}
_S3_PARAMS = {"region", "endpoint", "path_style", "sse", "sse_kms_key_id", "object_lock_mode",
              "object_lock_retain_days"}


def _float(v: str | None, url: str) -> float | None:
    if not v:
        return None
    try:
        return float(v)
    except ValueError:
        raise StorageError(f"S3 URL {url!r}: object_lock_retain_days must be a number, got {v!r}") from None


def open_storage(url: str) -> Storage:
    if not isinstance(url, str) or not url.strip():
        raise StorageError("empty storage URL")
    url = url.strip()
    if "://" not in url:
        return FilesystemStorage(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StorageError(f"file URL {url!r} must be file:///absolute/path")
        path = unquote(parts.path)
        if not path:
            raise StorageError(f"file URL {url!r} has no path")
        return FilesystemStorage(path, url=url)
    if scheme == "memory":
        name = parts.netloc + parts.path
        return MemoryStorage.named(name) if name else MemoryStorage()
    if scheme == "s3":
        from .s3 import S3Storage  # noqa: PLC0415 - boto3 takes ~1 s to import; only S3 users pay it

        q = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        unknown = set(q) - _S3_PARAMS
        if unknown:
            raise StorageError(f"S3 URL {url!r}: unknown parameter(s) {sorted(unknown)}; known: {sorted(_S3_PARAMS)}")
        if not parts.netloc:
            raise StorageError(f"S3 URL {url!r} has no bucket")
        return S3Storage(
            bucket=parts.netloc,
            prefix=unquote(parts.path).strip("/"),
            region=q.get("region") or None,
            endpoint=q.get("endpoint") or None,
            path_style=q.get("path_style", "").lower() in _TRUE,
            sse=q.get("sse") or None,
            sse_kms_key_id=q.get("sse_kms_key_id") or None,
            object_lock_mode=q.get("object_lock_mode") or None,
            object_lock_retain_days=_float(q.get("object_lock_retain_days"), url),
            url=url,
        )
    if scheme in ("azure", "gcs", "gs"):
        raise UnsupportedStorageError(f"{scheme}:// storage is not supported yet (URL {url!r}); use s3:// or file://")
    raise StorageError(f"unknown storage URL scheme {scheme!r} in {url!r}; use file://, s3:// or memory://")


def open_existing_storage(url: str) -> Storage:
    """The storage at ``url`` for reading; a directory that does not exist is an error, never "no
    backups" (a typo must not look like an empty storage)."""
    st = open_storage(url)
    if isinstance(st, FilesystemStorage) and not st.root.is_dir():
        what = "is not a directory" if st.root.exists() else "does not exist"
        raise NotFoundError(f"--path: {url!r} {what} ({st.root})")
    return st
