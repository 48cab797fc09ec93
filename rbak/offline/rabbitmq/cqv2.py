"""Classic queue index v2: ``<Seg>.qi`` entries, ``<Seg>.qs`` per-queue store.

Both files start with a 64-byte header: magic u32 (``RCQI`` / ``RCQS``),
version u8 = 2, FromSeqId u64, ToSeqId u64, zeros. The index holds one
32-byte entry per SeqId at ``64 + (SeqId - FromSeqId) * 32``:

  status u8 (1 present, 0 absent or acked) | flags u8 (bit 0 persistent) |
  0 u8 | location 17 bytes | body size u32 | expiry u64 (microseconds)

Location: all zero = the message lived in memory only (not on disk); ``01`` +
MsgId = in the shared ``msg_store_persistent``; ``02`` + offset u64 + size
u32 + 4 zero bytes = in this segment's ``.qs``. A ``.qs`` entry is ``Size
u32 | flags u8 (bit 0: CRC used) | CRC u16 (low 16 bits of CRC-32 of the
term) | 0 u8 | term``; from 3.12 the term may be followed by zero padding up
to ``Size``. A file shorter than its last slot simply has no more entries.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from typing import Iterator

from .damage import ImportContext, MappedFile
from .erlang_terms import decode
from .msg_store import MessageStore
from .stored_message import StoredMessage, fast_decode, message_from_term
from ...errors import MessageFormatError, TermError

QI_MAGIC = 0x52435149
QS_MAGIC = 0x52435153
VERSION = 2
HEADER_SIZE = 64
ENTRY_SIZE = 32
_HEADER = struct.Struct(">IBQQ")
_ENTRY = struct.Struct(">BBB17sIQ")
_QS_LOC = struct.Struct(">BQII")
_QS_ENTRY = struct.Struct(">IBHB")
MAX_SEGMENT_ENTRIES = 1 << 20  # RabbitMQ writes 4096 per segment by default; this bounds what a header can claim
_QI_RE = re.compile(r"^(\d+)\.qi$")


def has_v2_files(qdir: str) -> bool:
    return any(_QI_RE.match(n) for n in os.listdir(qdir))


def _header(f: MappedFile, magic: int, ctx: ImportContext) -> tuple[int, int] | None:
    if f.size < HEADER_SIZE:
        ctx.damaged(f.path, 0, f"truncated header: {f.size} of {HEADER_SIZE} bytes")
        return None
    m, ver, first, last = _HEADER.unpack_from(f.view, 0)
    if m != magic:
        ctx.damaged(f.path, 0, f"bad magic {m:#010x}, expected {magic:#010x}")
        return None
    if ver != VERSION:
        ctx.damaged(f.path, 4, f"unknown version {ver}, expected {VERSION}")
        return None
    if last <= first:
        ctx.damaged(f.path, 5, f"empty SeqId range {first}..{last}")
        return None
    if last - first > MAX_SEGMENT_ENTRIES:
        ctx.damaged(f.path, 5, f"implausible SeqId range {first}..{last}: more than {MAX_SEGMENT_ENTRIES} entries")
        return None
    return first, last


def iter_messages(
    qdir: str, store: MessageStore, ctx: ImportContext, where: str
) -> Iterator[tuple[int, StoredMessage]]:
    """Every present, persistent message of a v2 queue directory, in SeqId order."""
    segs = sorted(int(m.group(1)) for n in os.listdir(qdir) if (m := _QI_RE.match(n)))
    memory_only = transient = 0
    for seg in segs:
        path = os.path.join(qdir, f"{seg}.qi")
        with MappedFile(path) as qi:
            hdr = _header(qi, QI_MAGIC, ctx)
            if hdr is None:
                continue
            first, last = hdr
            count = last - first
            if first != seg * count:
                ctx.damaged(path, 5, f"segment {seg} starts at SeqId {first}, expected {seg * count}")
                continue
            qs: MappedFile | None = None
            qs_ok: bool | None = None
            try:
                mv = qi.view
                n = qi.size
                end = min(n, HEADER_SIZE + count * ENTRY_SIZE)
                pos = HEADER_SIZE
                while pos < end:
                    if pos + ENTRY_SIZE > end:
                        ctx.damaged(path, pos, f"truncated entry: {end - pos} of {ENTRY_SIZE} bytes")
                        break
                    status, flags, unused, loc, size, _expiry = _ENTRY.unpack_from(mv, pos)
                    seq_id = first + (pos - HEADER_SIZE) // ENTRY_SIZE
                    entry_at = pos
                    pos += ENTRY_SIZE
                    if status == 0:
                        continue
                    if status != 1 or flags & 0xFE or unused:
                        ctx.damaged(path, entry_at, f"not an index entry (status {status}, flags {flags})")
                        continue
                    if not flags & 1:
                        transient += 1
                        continue
                    kind = loc[0]
                    if kind == 1:
                        msg = store.read(loc[1:17], f"{where} SeqId {seq_id}")
                    elif kind == 2:
                        _, off, ssize, zero = _QS_LOC.unpack(loc)
                        if zero:
                            ctx.damaged(path, entry_at, "bad per-queue store location")
                            continue
                        if qs_ok is None:
                            qs_path = os.path.join(qdir, f"{seg}.qs")
                            if not os.path.exists(qs_path):
                                ctx.damaged(qs_path, None, f"missing, but {path} points into it")
                                qs_ok = False
                            else:
                                qs = MappedFile(qs_path)
                                qs_ok = _header(qs, QS_MAGIC, ctx) is not None
                        if not qs_ok:
                            continue
                        assert qs is not None  # qs_ok is True only once qs is open
                        msg = _read_qs(qs, off, ssize, seq_id, ctx)
                    elif not loc.strip(b"\x00"):
                        memory_only += 1
                        continue
                    else:
                        ctx.damaged(path, entry_at, f"unknown message location type {kind}")
                        continue
                    if msg is not None:
                        yield seq_id, msg
                _check_store_tail(path, qs, end, ctx)
            finally:
                if qs is not None:
                    qs.close()
    if transient:
        ctx.note(f"{qdir}: {transient} transient message(s) not exported (RabbitMQ drops them on recovery)")
    if memory_only:
        ctx.note(f"{qdir}: {memory_only} message(s) were only in the broker's memory, not on disk")


def _count_qs_entries(qs: MappedFile) -> int:
    """Entries of a per-queue store file, walked by their sizes (one per SeqId stored in it)."""
    mv, n, pos, count = qs.view, qs.size, HEADER_SIZE, 0
    while pos + 8 <= n:
        (size,) = struct.unpack_from(">I", mv, pos)
        if size == 0 or pos + 8 + size > n:
            break
        count += 1
        pos += 8 + size
    return count


def _check_store_tail(path: str, qs: MappedFile | None, end: int, ctx: ImportContext) -> None:
    """A ``.qi`` cut at an entry boundary looks like a shorter segment; its ``.qs`` tells.

    Every message embedded in the store has a slot in the index (acked ones
    too: an ack rewrites the slot, never removes it), so a store holding more
    entries than the index has slots means index entries were lost.
    """
    if qs is None:
        qs_path = path[: -len(".qi")] + ".qs"
        if not os.path.exists(qs_path):
            return
        with MappedFile(qs_path) as f:
            if f.size < HEADER_SIZE:
                return
            stored = _count_qs_entries(f)
    else:
        stored = _count_qs_entries(qs)
    slots = max(0, end - HEADER_SIZE) // ENTRY_SIZE
    if stored > slots:
        ctx.damaged(path, end, f"index truncated: it ends after {slots} entries, but its per-queue store holds "
                               f"{stored} messages; at least {stored - slots} message(s) lost")


def _read_qs(qs: MappedFile, off: int, size: int, seq_id: int, ctx: ImportContext) -> StoredMessage | None:
    mv = qs.view
    n = qs.size
    if off < HEADER_SIZE or off + 8 > n:
        ctx.damaged(qs.path, off, f"SeqId {seq_id}: entry header beyond the end of the file ({n} bytes)")
        return None
    esize, flags, crc, _ = _QS_ENTRY.unpack_from(mv, off)
    if esize != size:
        ctx.damaged(qs.path, off, f"SeqId {seq_id}: entry size {esize}, the index says {size}")
        return None
    start = off + 8
    if start + size > n:
        ctx.damaged(qs.path, off, f"SeqId {seq_id}: truncated entry: needs {size} bytes, {n - start} left")
        return None
    data = mv[start : start + size]
    fast = fast_decode(data)
    if fast is not None:
        msg, tend = fast
    else:
        msg = None
        try:
            term, tend = decode(data, 0)
        except TermError as e:
            ctx.damaged(qs.path, off, f"SeqId {seq_id}: {e}")
            return None
    if tend != size and bytes(data[tend:]).strip(b"\x00"):
        ctx.damaged(qs.path, off, f"SeqId {seq_id}: {size - tend} unexpected bytes after the message term")
        return None
    if flags & 1:
        # The writer's CRC covers the term without padding; RabbitMQ's reader
        # checks all Size bytes. Accept either.
        if zlib.crc32(memoryview(data)[:tend]) & 0xFFFF != crc and zlib.crc32(data) & 0xFFFF != crc:
            ctx.damaged(qs.path, off, f"SeqId {seq_id}: CRC mismatch")
            return None
    if msg is not None:
        return msg
    try:
        return message_from_term(term)
    except MessageFormatError as e:
        ctx.damaged(qs.path, off, f"SeqId {seq_id}: {e}")
        return None
