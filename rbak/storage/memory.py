"""In-process storage: for tests and dry runs. ``memory://NAME`` is shared within the process."""

from __future__ import annotations

import threading
from typing import Iterator

from ..errors import NotFoundError
from .base import Storage, check_key

_NAMED: dict[str, "MemoryStorage"] = {}
_NAMED_LOCK = threading.Lock()


class MemoryStorage(Storage):
    def __init__(self, url: str = "memory://"):
        self.url = url
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @classmethod
    def named(cls, name: str) -> "MemoryStorage":
        with _NAMED_LOCK:
            if name not in _NAMED:
                _NAMED[name] = cls(f"memory://{name}")
            return _NAMED[name]

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        check_key(key)
        data = bytes(data)  # an immutable copy: callers reuse their buffers
        with self._lock:
            self._data[key] = data

    def get(self, key: str) -> bytes:
        with self._lock:
            try:
                return self._data[key]
            except KeyError:
                raise NotFoundError(f"{self.url}: no object at key {key!r}") from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.get(key)[start : start + length]

    def list(self, prefix: str = "") -> Iterator[str]:
        with self._lock:
            keys = sorted(k for k in self._data if k.startswith(prefix))
        return iter(keys)

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)

    def size(self, key: str) -> int | None:
        with self._lock:
            v = self._data.get(key)
        return None if v is None else len(v)
