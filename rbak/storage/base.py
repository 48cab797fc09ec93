"""The one storage interface every backend implements.

Keys are ``/``-separated strings relative to the backend's root. ``put`` is
atomic: a reader sees the old object, the whole new one, or nothing; never a
half-written file under its final name.
"""

from __future__ import annotations

import abc
import builtins
from typing import Iterator

from ..errors import StorageError


class Spool(abc.ABC):
    """An object written piece by piece before it is stored whole under its key (``Storage.open_spool``).

    ``write_at`` may run in another thread than the caller's, one call at a time; nothing is visible
    under ``key`` before ``commit``, and ``discard`` removes every trace of an uncommitted spool."""

    key: str

    @abc.abstractmethod
    def write_at(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write ``data`` at ``offset`` of the object (the bytes the commit's ``data`` has there)."""

    @abc.abstractmethod
    def commit(self, data: bytes | bytearray | memoryview, written: tuple[int, int]) -> None:
        """Store the object, which is ``data``: ``data[written[0]:written[1]]`` came through ``write_at``
        already, the rest is written here; atomic and durable as ``put``."""

    @abc.abstractmethod
    def discard(self) -> None:
        """Drop an uncommitted spool (no error if already committed or discarded)."""


class Storage(abc.ABC):
    url: str = ""
    write_once: bool = False  # S3 Object Lock: every key is put at most once and nothing is overwritten

    def locked_until(self, key: str):
        """When an object lock on ``key`` expires (a UTC datetime), or None when it is not locked."""
        return None

    def purge(self, key: str) -> None:
        """Remove ``key`` with every stored version (versioned/Object Lock buckets); else ``delete``."""
        self.delete(key)

    @abc.abstractmethod
    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` (any bytes-like) atomically. It is only valid during the call (segment
        writers reuse their buffers): a backend that keeps it must keep a copy."""

    def open_spool(self, key: str) -> Spool | None:
        """A ``Spool`` for ``key`` where the backend can write an object in pieces (a local file),
        else None: the caller then ``put``s it whole (the default)."""
        return None

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """Raises NotFoundError naming the key when absent."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer at the end of the object)."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Every key that starts with ``prefix``, sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove a key; absent keys are not an error."""

    @abc.abstractmethod
    def size(self, key: str) -> int | None:
        """Size in bytes, or None when the key is absent."""

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix`` (which must end with '/')."""
        if not prefix.endswith("/"):
            raise StorageError(f"refusing to delete by a prefix that is not a folder: {prefix!r}")
        n = 0
        for key in list(self.list(prefix)):
            self.delete(key)
            n += 1
        return n

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:  # builtins: `list` here is the method
        """Immediate 'sub-folder' names below ``prefix`` (which ends with '/' or is '')."""
        seen: set[str] = set()
        for key in self.list(prefix):
            rest = key[len(prefix):]
            if "/" in rest:
                seen.add(rest.split("/", 1)[0])
        return sorted(seen)

    def close(self) -> None:
        pass

    def __enter__(self) -> "Storage":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


def check_key(key: str) -> str:
    """Refuse keys that could climb out of the root or are not plain paths."""
    if not isinstance(key, str) or not key or key.startswith("/") or "\x00" in key:
        raise StorageError(f"invalid storage key {key!r}")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise StorageError(f"invalid storage key {key!r}: empty, '.' or '..' component")
    return key
