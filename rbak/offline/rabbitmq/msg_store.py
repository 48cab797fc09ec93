"""The shared message store, ``msg_store_persistent/<N>.rdq``.

Record layout (``rabbit_msg_file`` 3.10-3.12, ``rabbit_msg_store`` 3.13+)::

    Size:u64 BE (= 16 + len(Term)) | MsgId:16 | Term = term_to_binary(Msg) | 0xFF

Files also hold acked messages, duplicates and (3.13+) compaction leftovers,
so nothing here decides what to export: queue indexes look messages up by
MsgId. We scan each file once, remembering only where each MsgId lives, and
decode a term when asked. The scan accepts a record when its size fits, its
end marker is 0xFF and its term starts with the version byte 131; elsewhere
it resynchronises on the next candidate (zero-filled holes are normal). A
record cut off by the end of the file and unparseable bytes are remembered
as damage and reported only if a queue needs a message that is not found.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass

from .damage import WINDOW, ImportContext, MappedFile
from .stored_message import StoredMessage, decode_stored_message
from ...errors import MessageFormatError

_U64 = struct.Struct(">Q")
_RDQ_RE = re.compile(r"^(\d+)\.rdq$")
HEADER = 8 + 16  # size + MsgId


def _nonzero(f: MappedFile, start: int, end: int) -> bool:
    """Whether ``[start, end)`` holds a non-zero byte, looked at one window at a time."""
    for a in range(start, end, WINDOW):
        if f.view[a:min(end, a + WINDOW)].strip(b"\x00"):
            return True
        f.release_before(a + WINDOW)
    return False


class _RdqFile:
    """An .rdq file: scanned once from a whole read, then read by pread (files roll at 16 MiB)."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def pread(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True, slots=True)
class StoreLocation:
    file: int  # index into MessageStore.files
    offset: int  # of the record
    size: int  # the Size field


class MessageStore:
    def __init__(self, directory: str, ctx: ImportContext):
        self.directory = directory
        self.ctx = ctx
        self.files: list[_RdqFile] = []
        self.index: dict[bytes, StoreLocation] = {}
        self.damage: list[str] = []
        self._scanned = False

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files.clear()

    def _scan(self) -> None:
        self._scanned = True
        if not os.path.isdir(self.directory):
            return
        names = sorted(
            (int(m.group(1)), n) for n in os.listdir(self.directory) if (m := _RDQ_RE.match(n))
        )
        for _, name in names:
            path = os.path.join(self.directory, name)
            self.files.append(_RdqFile(path))
            with MappedFile(path) as f:
                self._scan_file(len(self.files) - 1, f)

    def _scan_file(self, fi: int, f: MappedFile) -> None:
        mv = f.view
        n = f.size
        index = self.index
        pos = 0
        bad_from: int | None = None
        released = 0
        while pos + HEADER + 2 <= n:
            (size,) = _U64.unpack_from(mv, pos)
            end = pos + 8 + size
            if pos - released > WINDOW:
                f.release_before(pos)  # a mapped (huge) file stays a window in memory
                released = pos
            if size >= 17 and end < n and mv[end] == 0xFF and mv[pos + HEADER] == 131:
                if bad_from is not None:
                    self.damage.append(f"{f.path} at byte {bad_from}: {pos - bad_from} unparseable bytes")
                    bad_from = None
                msg_id = bytes(mv[pos + 8 : pos + HEADER])
                if msg_id not in index:
                    index[msg_id] = StoreLocation(fi, pos, size)
                pos = end + 1
                continue
            if size >= 17 and end >= n and mv[pos + HEADER] == 131 and bad_from is None:
                # A record cut off by the end of the file (crash or truncated copy).
                self.damage.append(
                    f"{f.path} at byte {pos}: truncated record (needs {size + 9} bytes, file has {n - pos})"
                )
                return
            if size != 0 and bad_from is None:
                bad_from = pos
            # Resynchronise: a record has 131 at +24; jump to the next such byte.
            q = f.find(b"\x83", pos + HEADER + 1)
            if q < 0:
                break
            pos = q - HEADER
        if bad_from is not None:
            self.damage.append(f"{f.path} at byte {bad_from}: unparseable bytes up to the end of the file")
        elif pos < n and _nonzero(f, pos, n):
            self.damage.append(f"{f.path} at byte {pos}: {n - pos} trailing bytes that are not a record")

    def read(self, msg_id: bytes, wanted_by: str) -> StoredMessage | None:
        """The message with this id, or None after reporting it missing/damaged."""
        if not self._scanned:
            self._scan()
        loc = self.index.get(msg_id)
        if loc is None:
            why = "; ".join(self.damage[:5]) if self.damage else "no .rdq file holds it"
            self.ctx.damaged(
                self.directory, None,
                f"message {msg_id.hex()} needed by {wanted_by} is not in the message store ({why})",
            )
            return None
        f = self.files[loc.file]
        try:
            return decode_stored_message(f.pread(loc.offset + HEADER, loc.size - 16))
        except MessageFormatError as e:
            self.ctx.damaged(f.path, loc.offset, f"message {msg_id.hex()}: {e}")
            return None
