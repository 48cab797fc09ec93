"""Read-only file views and the one place that decides: fail, or skip and report.

Every reader reports a problem through :meth:`ImportContext.damaged` with the
file and byte offset. Without ``--skip-damaged`` that raises
``ImportFormatError`` naming both; with it the problem is recorded, the
reader skips what it cannot trust, and the CLI prints the list at the end.
"""

from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass, field

from ..errors import ImportFormatError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    offset: int | None
    reason: str

    def __str__(self) -> str:
        where = self.path if self.offset is None else f"{self.path} at byte {self.offset}"
        return f"{where}: {self.reason}"


@dataclass
class ImportContext:
    skip_damaged: bool = False
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # benign, e.g. transient messages dropped

    def damaged(self, path: str, offset: int | None, reason: str) -> None:
        item = Skipped(str(path), offset, reason)
        if not self.skip_damaged:
            raise ImportFormatError(str(item))
        log.warning("skipping damaged data: %s", item)
        self.skipped.append(item)

    def note(self, text: str) -> None:
        log.info("%s", text)
        self.notes.append(text)


class MappedFile:
    """A file opened read-only and memory-mapped (never written, never locked)."""

    __slots__ = ("path", "size", "_f", "_mm", "view")

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self._f = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        self.size = os.fstat(self._f.fileno()).st_size
        if self.size:
            self._mm: mmap.mmap | None = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
            self.view = memoryview(self._mm)
        else:
            self._mm = None
            self.view = memoryview(b"")

    def find(self, sub: bytes, start: int) -> int:
        return self._mm.find(sub, start) if self._mm is not None else -1

    def close(self) -> None:
        self.view.release()
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a caller still holds a slice; let GC close it
                pass
        self._f.close()

    def __enter__(self) -> "MappedFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
