"""Classic queue index v1 (``rabbit_queue_index``): ``<Seg>.idx`` + ``journal.jif``.

Segment records (big-endian):

* publish: ``1:1, IsPersistent:1, RelSeq:14`` then MsgId 16, Expiry u64,
  Size u32, EmbLen u32 and EmbLen bytes of the embedded message term;
* deliver/ack: ``01:2, RelSeq:14`` - the first such record for a RelSeq is the
  deliver, the second the ack.

``SeqId = Seg * segment_entry_count + RelSeq``; the count comes from the vhost's
``.config`` (2048 for vhosts created by 3.8.17+, 16384 before). An all-zero
segment file is empty.

Journal entries: ``Prefix:2, SeqId:62`` (00 persistent publish, 01 transient
publish - both followed by the publish body as above - 10 deliver, 11 ack).
Parsing stops at an all-zero publish entry (a dirty shutdown's preallocation).
The journal is laid over the segments: every SeqId ends up with a publish
(or none), delivered and acked flags; what is published and not acked is
exported, in SeqId order. Transient publishes are dropped, as RabbitMQ drops
them when it recovers a durable queue.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import Iterator

from .damage import FileView, ImportContext, MappedFile
from .msg_store import MessageStore
from .stored_message import StoredMessage, decode_stored_message
from ...errors import MessageFormatError

PUB_BODY = 16 + 8 + 4  # MsgId, Expiry, Size
PUB_TAIL = PUB_BODY + 4  # + EmbLen
_PUB_TAIL = struct.Struct(">16sQII")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_IDX_RE = re.compile(r"^(\d+)\.idx$")
JOURNAL = "journal.jif"
LEGACY_SEGMENT_ENTRY_COUNT = 16384


@dataclass(slots=True)
class Pub:
    persistent: bool
    msg_id: bytes
    expiry: int  # microseconds since the epoch, 0 = none
    size: int  # body bytes
    file: MappedFile
    emb_start: int  # embedded term in file.view[emb_start:emb_end]; empty = in the store
    emb_end: int
    offset: int  # of the record, for error messages


@dataclass(slots=True)
class Entry:
    pub: Pub | None = None
    delivered: bool = False
    acked: bool = False


@dataclass(slots=True)
class IndexEntry:
    """One unacked, persistent message as the index knows it."""

    seq_id: int
    pub: Pub


def iter_index(qdir: str, segment_entry_count: int, ctx: ImportContext,
               expected: dict[int, int] | None = None) -> Iterator[IndexEntry]:
    """Every unacked persistent message of a v1 queue directory, in SeqId order.

    One segment file is in memory at a time (plus the journal), so a large
    queue does not need its whole index in memory. The entries point into
    the file they came from: use them before asking for the next one.

    ``expected``: unacked entries per segment from the recovery terms of a clean
    shutdown (``recovery_terms``); a segment holding another number was cut (on a
    record boundary, which parses cleanly) or damaged, and is reported before any
    of its entries is used.
    """
    jfiles: list[MappedFile] = []
    try:
        journal = _read_journal(os.path.join(qdir, JOURNAL), segment_entry_count, ctx, jfiles)
        segs = {int(m.group(1)) for n in os.listdir(qdir) if (m := _IDX_RE.match(n))}
        transient = 0
        for seg in sorted(segs | set(journal) | set(expected or ())):
            entries: dict[int, Entry] = {}
            files: list[MappedFile] = []
            if seg in segs:
                _read_segment(os.path.join(qdir, f"{seg}.idx"), segment_entry_count, entries, ctx, files)
            for rel, kind, pub in journal.get(seg, ()):
                e = entries.get(rel)
                if e is None:
                    e = entries[rel] = Entry()
                if kind == "pub":
                    if e.pub is None:
                        e.pub = pub
                elif kind == "del":
                    e.delivered = True
                else:
                    e.acked = True
            if expected is not None:
                _check_count(qdir, seg, entries, expected.get(seg, 0), seg in segs, bool(journal.get(seg)), ctx)
            base = seg * segment_entry_count
            for rel in sorted(entries):
                e = entries[rel]
                if e.pub is None or e.acked:
                    continue
                if not e.pub.persistent:
                    transient += 1
                    continue
                yield IndexEntry(base + rel, e.pub)
            for f in files:
                f.close()
        if transient:
            ctx.note(f"{qdir}: {transient} transient message(s) not exported (RabbitMQ drops them on recovery)")
    finally:
        for f in jfiles:
            f.close()


def _check_count(qdir: str, seg: int, entries: dict[int, Entry], want: int, has_file: bool, in_journal: bool,
                 ctx: ImportContext) -> None:
    """Compare a segment's unacked entries (persistent or not) with the recovery terms' count."""
    have = sum(1 for e in entries.values() if e.pub is not None and not e.acked)
    if have == want:
        return
    seg_path = os.path.join(qdir, f"{seg}.idx")
    files = [f"{seg}.idx" if has_file else f"{seg}.idx (missing)"] + ([JOURNAL] if in_journal else [])
    path = seg_path if has_file or not in_journal else os.path.join(qdir, JOURNAL)
    offset = os.path.getsize(path) if os.path.exists(path) else None
    if have < want:
        what = f"{want - have} message(s) lost"
    elif ctx.skip_damaged:  # which entries lost their ack is unknown: exporting them could resurrect consumed messages
        what = f"{have - want} ack(s) gone, so the segment is skipped: {want} message(s) lost"
    else:
        what = f"{have - want} ack(s) gone: consumed messages would come back"
    ctx.damaged(path, offset, f"index truncated: segment {seg} ({' + '.join(files)}) holds {have} unacked "
                f"entr{'y' if have == 1 else 'ies'}, the recovery terms of the last clean shutdown say {want}: {what}")
    if have > want:
        entries.clear()


def _parse_pub(mv: FileView, pos: int, n: int, persistent: bool, f: MappedFile) -> Pub | str:
    """The publish body at ``pos``; a string says what is wrong."""
    if pos + PUB_TAIL > n:
        return f"truncated publish record: needs {PUB_TAIL} bytes, {n - pos} left"
    msg_id, expiry, size, emb_len = _PUB_TAIL.unpack_from(mv, pos)
    start = pos + PUB_TAIL
    if start + emb_len > n:
        return f"truncated embedded message: needs {emb_len} bytes, {n - start} left"
    if emb_len and mv[start] != 131:
        return f"embedded message does not start with an Erlang term (byte {mv[start]})"
    return Pub(persistent, msg_id, expiry, size, f, start, start + emb_len, pos)


def _read_segment(path: str, count: int, entries: dict[int, Entry], ctx: ImportContext, files: list[MappedFile]) -> None:
    f = MappedFile(path)
    files.append(f)
    mv = f.view
    n = f.size
    if n == 0 or (mv[0] == 0 and not bytes(mv).strip(b"\x00")):
        return  # RabbitMQ treats an empty or all-zero segment as holding nothing
    pos = 0
    while pos < n:
        if pos + 2 > n:
            ctx.damaged(path, pos, "truncated record: 1 byte left")
            return
        (w,) = _U16.unpack_from(mv, pos)
        rel = w & 0x3FFF
        if rel >= count:
            ctx.damaged(path, pos, f"RelSeq {rel} is beyond the segment size {count}")
            return
        if w & 0x8000:
            pub = _parse_pub(mv, pos + 2, n, bool(w & 0x4000), f)
            if isinstance(pub, str):
                ctx.damaged(path, pos, pub)
                return
            pub.offset = pos
            entries[rel] = Entry(pub)
            pos = pub.emb_end
        elif w & 0xC000 == 0x4000:
            e = entries.get(rel)
            if e is None or e.pub is None or e.acked:
                ctx.damaged(path, pos, f"deliver/ack for RelSeq {rel} without a pending publish")
                return
            if not e.delivered:
                e.delivered = True
            else:
                e.acked = True
            pos += 2
        else:
            ctx.damaged(path, pos, f"unknown record prefix {w >> 14:02b} (not a queue index segment?)")
            return


def _read_journal(path: str, count: int, ctx: ImportContext, files: list[MappedFile]) -> dict[int, list]:
    by_seg: dict[int, list] = {}
    if not os.path.exists(path):
        return by_seg
    f = MappedFile(path)
    files.append(f)
    mv = f.view
    n = f.size
    pos = 0
    while pos < n:
        if pos + 8 > n:
            ctx.damaged(path, pos, f"truncated journal entry: {n - pos} of 8 bytes")
            break
        (w,) = _U64.unpack_from(mv, pos)
        prefix = w >> 62
        seq = w & ((1 << 62) - 1)
        seg, rel = divmod(seq, count)
        if prefix >= 2:
            by_seg.setdefault(seg, []).append((rel, "del" if prefix == 2 else "ack", None))
            pos += 8
            continue
        if w == 0 and pos + 8 + PUB_TAIL <= n and not bytes(mv[pos + 8 : pos + 8 + PUB_TAIL]).strip(b"\x00"):
            break  # an all-zero entry: RabbitMQ stops reading here (dirty shutdown)
        pub = _parse_pub(mv, pos + 8, n, prefix == 0, f)
        if isinstance(pub, str):
            ctx.damaged(path, pos, pub)
            break
        pub.offset = pos
        by_seg.setdefault(seg, []).append((rel, "pub", pub))
        pos = pub.emb_end
    return by_seg


def load_message(e: IndexEntry, store: MessageStore, ctx: ImportContext, where: str) -> StoredMessage | None:
    """The message of an index entry: embedded, or from the shared store by MsgId."""
    p = e.pub
    if p.emb_end > p.emb_start:
        try:
            return decode_stored_message(p.file.view[p.emb_start : p.emb_end])
        except MessageFormatError as err:
            ctx.damaged(p.file.path, p.offset, f"SeqId {e.seq_id}: {err}")
            return None
    return store.read(p.msg_id, f"{where} SeqId {e.seq_id}")


def iter_messages(
    qdir: str, segment_entry_count: int, store: MessageStore, ctx: ImportContext, where: str,
    expected: dict[int, int] | None = None,
) -> Iterator[tuple[int, StoredMessage]]:
    for e in iter_index(qdir, segment_entry_count, ctx, expected):
        m = load_message(e, store, ctx, where)
        if m is not None:
            yield e.seq_id, m
