"""Local-directory storage: temp file + fsync + rename, so no half-written file
ever carries a final name, even across a SIGKILL or power loss."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import NotFoundError, StorageError
from .base import Spool, Storage, check_key

TMP_PREFIX = ".rbak-tmp-"


class FilesystemStorage(Storage):
    def __init__(self, root: str | os.PathLike[str], url: str | None = None):
        self.root = Path(root).resolve()
        self.url = url or f"file://{self.root}"

    def _path(self, key: str) -> Path:
        check_key(key)
        return self.root.joinpath(*key.split("/"))

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise
            _fsync_dir(path.parent)
        except OSError as e:
            raise write_error(self.url, key, e) from e

    def open_spool(self, key: str) -> "FileSpool | None":
        if type(self).put is not FilesystemStorage.put:
            return None  # a subclass that wraps put (checks, faults) sees every object whole
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
        except OSError as e:
            raise write_error(self.url, key, e) from e
        return FileSpool(self, key, path, fd, tmp)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"{self.url}: no object at key {key!r}") from None
        except IsADirectoryError:
            raise NotFoundError(f"{self.url}: key {key!r} is a folder, not an object") from None
        except OSError as e:
            raise StorageError(f"{self.url}: cannot read key {key!r}: {e.strerror or e}") from e

    def get_range(self, key: str, start: int, length: int) -> bytes:
        path = self._path(key)
        try:
            with path.open("rb") as f:
                f.seek(start)
                return f.read(length)
        except FileNotFoundError:
            raise NotFoundError(f"{self.url}: no object at key {key!r}") from None
        except OSError as e:
            raise StorageError(f"{self.url}: cannot read key {key!r}: {e.strerror or e}") from e

    def list(self, prefix: str = "") -> Iterator[str]:
        # Walk only the deepest folder the prefix names, not the whole root.
        base_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root.joinpath(*base_rel.split("/")) if base_rel else self.root
        if not base.is_dir():
            return iter(())
        keys = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for name in filenames:
                if name.startswith(TMP_PREFIX):
                    continue
                key = rel + name
                if key.startswith(prefix):
                    keys.append(key)
        keys.sort()
        return iter(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as e:
            raise StorageError(f"{self.url}: cannot delete key {key!r}: {e.strerror or e}") from e
        # Tidy empty parent folders up to the root.
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def size(self, key: str) -> int | None:
        try:
            st = self._path(key).stat()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StorageError(f"{self.url}: cannot stat key {key!r}: {e.strerror or e}") from e
        return st.st_size if not os.path.isdir(self._path(key)) else None


class FileSpool(Spool):
    """A temp file beside the key's final name, written piecewise, then fsynced and renamed (as ``put``).

    After each piece the kernel is asked to start writing it back (``POSIX_FADV_DONTNEED`` on dirty
    pages starts their writeback and drops nothing that is not yet on disk), so the disk writes while
    the rest is produced and the final fsync has little left to wait for. Only a hint: durability
    still comes from that fsync."""

    def __init__(self, storage: FilesystemStorage, key: str, path: Path, fd: int, tmp: str):
        self.storage, self.key, self.path, self._fd = storage, key, path, fd
        self._tmp: str | None = tmp  # None once renamed into place or removed

    def _error(self, e: OSError) -> StorageError:
        return write_error(self.storage.url, self.key, e)

    def _pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        with memoryview(data) as mv, mv.cast("B") as view:
            done = 0
            while done < len(view):
                done += os.pwrite(self._fd, view[done:], offset + done)

    def write_at(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        if self._fd < 0:
            raise StorageError(f"{self.storage.url}: key {self.key!r}: write to a closed spool")
        try:
            self._pwrite(data, offset)
        except OSError as e:
            raise self._error(e) from e
        if _FADV_DONTNEED is not None:
            try:
                os.posix_fadvise(self._fd, offset, len(data), _FADV_DONTNEED)
            except OSError:
                pass  # only a hint (a filesystem may not take it): the commit's fsync still waits for all

    def commit(self, data: bytes | bytearray | memoryview, written: tuple[int, int]) -> None:
        if self._fd < 0:
            raise StorageError(f"{self.storage.url}: key {self.key!r}: commit of a closed spool")
        a, b = written
        try:
            with memoryview(data) as mv:
                if a > 0:
                    self._pwrite(mv[:a], 0)
                self._pwrite(mv[b:], b)
                os.ftruncate(self._fd, len(mv))
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
            assert self._tmp is not None  # only discard() clears it, and it closes the fd too
            os.replace(self._tmp, self.path)
            self._tmp = None
            _fsync_dir(self.path.parent)
        except OSError as e:
            self.discard()
            raise self._error(e) from e
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except OSError:
                pass
            self._tmp = None


_FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)


def write_error(url: str, key: str, e: OSError) -> StorageError:
    """The one wording of a failed write (``put``, a spool's open and its writes)."""
    return StorageError(f"{url}: cannot write key {key!r}: {e.strerror or e}")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
