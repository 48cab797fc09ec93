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
import stat
from dataclasses import dataclass, field
from typing import Union

from ...errors import ImportFormatError
from ...format.manifest import QueueStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    offset: int | None
    reason: str
    queue: str | None = None  # e.g. "queue 'orders' in vhost '/'": file names alone are hashes
    queue_key: tuple[str, str] | None = None  # (vhost, name) of that queue, for the manifest's queue_status

    def __str__(self) -> str:
        where = self.path if self.offset is None else f"{self.path} at byte {self.offset}"
        return f"{self.queue + ': ' if self.queue else ''}{where}: {self.reason}"


@dataclass
class ImportContext:
    skip_damaged: bool = False
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # benign, e.g. transient messages dropped
    queue: str | None = None  # the queue being read, named in every problem reported meanwhile
    queue_key: tuple[str, str] | None = None  # its (vhost, name)

    def reading(self, kind: str, vhost: str, name: str) -> None:
        """Name the queue every problem reported from now on belongs to."""
        self.queue = f"{kind} {name!r} in vhost {vhost!r}"
        self.queue_key = (vhost, name)

    def done_reading(self) -> None:
        self.queue = self.queue_key = None

    def damaged(self, path: str, offset: int | None, reason: str, then: str = "") -> None:
        """Fail naming file and offset, or (``--skip-damaged``) record it and go on.

        ``then`` says what skipping does ("chunk skipped"); it is part of the message only when the
        import goes on, so a fatal error never claims something was skipped."""
        item = Skipped(str(path), offset, f"{reason}; {then}" if then and self.skip_damaged else reason,
                       self.queue, self.queue_key)
        if not self.skip_damaged:
            raise ImportFormatError(str(item))
        log.warning("skipping damaged data: %s", item)
        self.skipped.append(item)

    def queue_statuses(self) -> list[QueueStatus]:
        """What ``--skip-damaged`` stepped over, per queue, as the manifest records a partial backup.

        Every queue with a skipped item is ``partial`` (its reason quotes the items, with the counts
        lost where the files tell them); damage no queue could be told for (an unnamable directory, a
        shared WAL) is a ``failed`` entry named by its path. Empty when nothing was skipped: only then
        is the import complete."""
        by_queue: dict[tuple[str, str], list[Skipped]] = {}
        for s in self.skipped:
            by_queue.setdefault(s.queue_key or ("", s.path), []).append(s)
        out = []
        for (vhost, name), items in by_queue.items():
            why = "; ".join(f"{s.path}{'' if s.offset is None else f' at byte {s.offset}'}: {s.reason}"
                            for s in items[:3]) + (f" (and {len(items) - 3} more)" if len(items) > 3 else "")
            out.append(QueueStatus(vhost, name, "partial" if items[0].queue_key else "failed",
                                   f"damaged data skipped by --skip-damaged: {why}"))
        return out

    def note(self, text: str) -> None:
        log.info("%s", text)
        self.notes.append(text)


MAP_ABOVE = 64 * 1024 * 1024
"""Files up to this size are read; larger ones (hostile or huge) are memory-mapped, so only the
pages a reader touches are ever resident."""
WINDOW = 32 * 1024 * 1024

FileView = Union[bytes, mmap.mmap]
"""A :class:`MappedFile`'s contents: read (bytes) or mapped; slicing either gives bytes."""


class MappedFile:
    """A file read whole, read-only (never written, never locked).

    Queue index and per-queue store files are bounded by their segment size
    (a few MiB), so one sequential read is both simpler and faster than
    memory-mapping them (page faults cost more than read() in sandboxes).
    Past ``MAP_ABOVE`` the file is mapped instead, and anything but a regular
    file (a FIFO, ``/dev/zero`` behind a symlink) is refused naming it.
    """

    __slots__ = ("path", "size", "view", "_map")

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self._map: mmap.mmap | None = None
        self.view: FileView
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ImportFormatError(f"{self.path}: not a regular file")
            if st.st_size > MAP_ABOVE:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                self.view = self._map  # slices are bytes, like the read() path's
            else:
                self.view = f.read()
        self.size = len(self.view)

    def find(self, sub: bytes, start: int) -> int:
        if self._map is None:
            return self.view.find(sub, start)
        # Mapped: search window by window, dropping the pages already searched, so resident
        # memory stays one window whatever the file holds (a huge run of zeros, say).
        pos = start
        while pos < self.size:
            end = min(self.size, pos + WINDOW)
            i = self._map.find(sub, pos, end + len(sub) - 1)
            if i >= 0:
                return i
            self.release_before(end)
            pos = end
        return -1

    def release_before(self, offset: int) -> None:
        """Drop mapped pages before ``offset`` from memory (no-op when the file was read)."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            upto = offset - offset % mmap.PAGESIZE
            if upto > 0:
                self._map.madvise(mmap.MADV_DONTNEED, 0, upto)

    def close(self) -> None:
        self.view = b""
        if self._map is not None:
            self._map.close()
            self._map = None

    def __enter__(self) -> "MappedFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
