"""Ra's on-disk log: the shared write-ahead log, per-server segments and snapshots.

Formats as ``ra_log_wal.erl``, ``ra_log_segment.erl`` and ``ra_log_snapshot.erl``
write them (integers big-endian; each entry's data is ``term_to_binary`` of the
command):

- WAL (``<system dir>/NNNN.wal``): ``"RAWA"``, version 1, then records. The
  first record of a server in a file names it: ``Trunc:1, 0:1, Ref:22,
  UIdLen:16, UId``; later ones refer to it: ``Trunc:1, 1:1, Ref:22``. Both
  continue ``Adler32:32, Len:32, Idx:64, Term:64, Data`` (the checksum covers
  idx, term and data; 0 means "not computed"). All zeros ends a
  pre-allocated file. ``Trunc`` means the server's log restarts at this index
  (after a snapshot was installed): earlier entries are gone. Recovery drops a
  record failing its checksum only when it is the last one (a write cut
  short); anywhere else it refuses to start, so the reader reports it.
- segment (``<server dir>/NNNN.segment``): ``"RASG"``, version u16 (1 or 2),
  max count u16, an index of ``max count`` records (v1: idx u64, term u64,
  offset u32, length u32, crc32 u32; v2: offset u64), then the data. An all
  zero index record ends the index; an index going backwards drops the
  entries above it (a rewritten tail).
- snapshot (``<server dir>/snapshots/<term hex>_<index hex>/snapshot.dat``,
  ``ra_log_snapshot.erl``): ``"RASN"``, version u8 = 1, crc32 u32 of
  everything after it, meta size u32, meta (``term_to_binary`` of ``#{index,
  term, cluster, machine_version}``), then ``term_to_binary`` of the machine
  state. ``checkpoints/`` holds the same format (Ra promotes one to a
  snapshot); recovery starts from the newest snapshot and replays the log
  after it, so checkpoints are not needed here. Ra 3.x (4.3) writes an
  ``indexes`` file beside it: the live indexes compaction keeps.

A later write of an index replaces an earlier one (a new leader may rewrite
a follower's tail), so the newest WAL file wins over segments and older WAL
files, as in Ra's own read path.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field

from .damage import ImportContext
from .erlang_terms import Atom, binary_to_term
from ...errors import TermError

WAL_MAGIC = b"RAWA"
SEG_MAGIC = b"RASG"
SNAP_MAGIC = b"RASN"
SNAP_VERSION = 1
_WAL_FIRST = struct.Struct(">IH")
_WAL_TAIL = struct.Struct(">IIQQ")  # adler32, length, idx, term
_SEG_IDX = {1: struct.Struct(">QQIII"), 2: struct.Struct(">QQQII")}


def adler32(data: bytes | memoryview) -> int:
    return zlib.adler32(data) & 0xFFFFFFFF


@dataclass
class ServerLog:
    """Every entry one Ra server (a UId) has in the files read: idx -> (term, data, file, offset).

    ``data`` is a read-only memoryview into the file's bytes (entries are decoded straight from
    it; ``bytes(data)`` for a copy)."""

    uid: str
    entries: dict[int, tuple[int, memoryview, str, int]] = field(default_factory=dict)

    last: int = -1

    def put(self, idx: int, term: int, data: memoryview, path: str, pos: int) -> None:
        if idx <= self.last:
            # A rewrite of idx drops everything after it (Ra's mem table does the same).
            for k in [k for k in self.entries if k > idx]:
                del self.entries[k]
        self.entries[idx] = (term, data, path, pos)
        self.last = idx

    def truncate_before(self, idx: int) -> None:
        for k in [k for k in self.entries if k < idx]:
            del self.entries[k]
        self.last = max(self.entries, default=-1)


def read_segment(path: str, log: ServerLog, ctx: ImportContext) -> None:
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != SEG_MAGIC or len(data) < 8:
        ctx.damaged(path, 0, "not a Ra segment (no RASG header)")
        return
    version, max_count = struct.unpack_from(">HH", data, 4)
    rec = _SEG_IDX.get(version)
    if rec is None:
        ctx.damaged(path, 4, f"unknown Ra segment version {version}")
        return
    pos, last = 8, 0
    seen: dict[int, tuple[int, int, int, int, int]] = {}
    for _ in range(max_count):
        if pos + rec.size > len(data):
            break
        idx, term, off, length, crc = rec.unpack_from(data, pos)
        if idx == 0 and term == 0 and off == 0:
            break
        if idx < last:
            for k in [k for k in seen if k > idx]:
                del seen[k]
        seen[idx] = (term, off, length, crc, pos)
        last = idx
        pos += rec.size
    view = memoryview(data)
    for idx in sorted(seen):
        term, off, length, crc, ipos = seen[idx]
        if off + length > len(data):
            ctx.damaged(path, ipos, f"index {idx}: entry at byte {off} of {length} bytes runs past the end of the file")
            continue
        entry = view[off: off + length]
        if crc and zlib.crc32(entry) != crc:
            ctx.damaged(path, off, f"index {idx}: entry fails its CRC32")
            continue
        log.put(idx, term, entry, path, off)


def read_wal(path: str, logs: dict[str, ServerLog], ctx: ImportContext, last_file: bool) -> None:
    """Add every record of one WAL file to ``logs`` (by UId), in file order."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != WAL_MAGIC or len(data) < 5:
        if data:
            ctx.damaged(path, 0, "not a Ra WAL file (no RAWA header)")
        return
    if data[4] != 1:
        ctx.damaged(path, 4, f"unknown Ra WAL version {data[4]}")
        return
    refs: dict[int, str] = {}
    view = memoryview(data)
    pos, n = 5, len(data)
    while pos < n:
        if n - pos < 3:
            _tail(path, data, pos, ctx, last_file, "a record header cut short")
            return
        b0 = data[pos]
        trunc, has_ref = b0 >> 7, (b0 >> 6) & 1
        ref = ((b0 & 0x3F) << 16) | (data[pos + 1] << 8) | data[pos + 2]
        p = pos + 3
        if not has_ref:
            if p + 2 > n:
                _tail(path, data, pos, ctx, last_file, "a record header cut short")
                return
            (ulen,) = struct.unpack_from(">H", data, p)
            uid_b = data[p + 2: p + 2 + ulen]
            p += 2 + ulen
            if ref == 0 and trunc == 0 and data[p: p + 8] == b"\0" * 8:
                return  # all zeros: the end of a pre-allocated file
            uid = uid_b.decode("utf-8", "surrogateescape")
        if p + _WAL_TAIL.size > n:
            _tail(path, data, pos, ctx, last_file, "a record header cut short")
            return
        cks, length, idx, term = _WAL_TAIL.unpack_from(data, p)
        body_at = p + _WAL_TAIL.size
        if body_at + length > n:
            _tail(path, data, pos, ctx, last_file, f"index {idx}: an entry of {length} bytes cut short")
            return
        entry = view[body_at: body_at + length]
        if cks and adler32(view[p + 8: body_at + length]) != cks:
            if not data[body_at + length:].strip(b"\0"):
                ctx.note(f"{path}: the last record (byte {pos}) fails its checksum: a write cut short; "
                         "dropped as Ra's WAL recovery drops it")
                return
            ctx.damaged(path, pos, f"index {idx}: record fails its Adler-32 checksum with records after it "
                        "(Ra refuses to recover such a WAL)", then="the rest of the file is skipped")
            return
        if has_ref:
            named = refs.get(ref)
            if named is None:
                ctx.damaged(path, pos, f"record refers to writer #{ref}, which no earlier record named")
                pos = body_at + length
                continue
            uid = named
        else:
            refs[ref] = uid
        log = logs.setdefault(uid, ServerLog(uid))
        if trunc:
            log.truncate_before(idx)
        log.put(idx, term, entry, path, pos)
        pos = body_at + length


def _tail(path: str, data: bytes, pos: int, ctx: ImportContext, last_file: bool, what: str) -> None:
    if last_file or not data[pos:].strip(b"\0"):
        ctx.note(f"{path}: {what} at byte {pos} (the node stopped mid-write); dropped as Ra's WAL recovery does")
    else:
        ctx.damaged(path, pos, f"{what} in a WAL file that is not the newest")


@dataclass(frozen=True, slots=True)
class Snapshot:
    path: str
    index: int
    term: int
    meta: dict
    state_bytes: bytes  # term_to_binary of the machine state
    state_at: int = 0  # byte offset of the state in the file
    machine_version: int = 0


def read_snapshot(path: str, ctx: ImportContext) -> Snapshot | None:
    """One ``snapshot.dat``: every check Ra's own ``ra_log_snapshot`` makes (magic, version, CRC32 of
    the rest, meta size), each failure reported with the file and byte offset."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != SNAP_MAGIC:
        ctx.damaged(path, 0, "not a Ra snapshot (no RASN header)")
        return None
    if len(data) < 13:
        ctx.damaged(path, len(data), "snapshot header cut short (a truncated file)")
        return None
    if data[4] != SNAP_VERSION:
        ctx.damaged(path, 4, f"unknown Ra snapshot version {data[4]}")
        return None
    (crc,) = struct.unpack_from(">I", data, 5)
    (msize,) = struct.unpack_from(">I", data, 9)
    if 13 + msize > len(data):
        ctx.damaged(path, 13, f"snapshot meta of {msize} bytes runs past the end of the file (truncated)")
        return None
    if zlib.crc32(memoryview(data)[9:]) != crc:
        ctx.damaged(path, 5, f"snapshot fails its CRC32 (file of {len(data)} bytes: truncated or damaged)")
        return None
    try:
        meta = binary_to_term(data[13: 13 + msize])
    except TermError as e:
        ctx.damaged(path, 13 + e.offset, f"snapshot meta: {e}")
        return None
    if not isinstance(meta, dict):
        ctx.damaged(path, 13, "snapshot meta is not a map")
        return None
    idx = meta.get(_atom("index"))
    term = meta.get(_atom("term"))
    mv = meta.get(_atom("machine_version"))
    return Snapshot(path, idx if isinstance(idx, int) else 0, term if isinstance(term, int) else 0, meta,
                    data[13 + msize:], 13 + msize, mv if isinstance(mv, int) else 0)


def _atom(name: str):
    return Atom(name)


def snapshot_files(server_dir: str) -> list[str]:
    """The server's ``snapshots/<term hex>_<index hex>/snapshot.dat`` files, in the order Ra's
    recovery tries them (``ra_snapshot:find_snapshots``: names reverse-sorted, newest first)."""
    root = os.path.join(server_dir, "snapshots")
    if not os.path.isdir(root):
        return []
    names = sorted((d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "snapshot.dat"))),
                   reverse=True)
    return [os.path.join(root, d, "snapshot.dat") for d in names]


def latest_snapshot(server_dir: str, ctx: ImportContext) -> Snapshot | None:
    """The newest snapshot, read (a damaged one is reported through ``ctx`` and None returned)."""
    files = snapshot_files(server_dir)
    return read_snapshot(files[0], ctx) if files else None


def wal_files(system_dir: str) -> list[str]:
    return sorted(os.path.join(system_dir, n) for n in os.listdir(system_dir) if n.endswith(".wal"))


def read_server_logs(system_dir: str, ctx: ImportContext) -> dict[str, ServerLog]:
    """Every server's entries: its segments first (oldest name first), then the WAL files (oldest first)."""
    logs: dict[str, ServerLog] = {}
    for d in sorted(os.listdir(system_dir)):
        sdir = os.path.join(system_dir, d)
        if not os.path.isdir(sdir):
            continue
        log = logs.setdefault(d, ServerLog(d))
        for seg in sorted(n for n in os.listdir(sdir) if n.endswith(".segment")):
            read_segment(os.path.join(sdir, seg), log, ctx)
    wals = wal_files(system_dir)
    for i, w in enumerate(wals):
        read_wal(w, logs, ctx, i == len(wals) - 1)
    return logs
