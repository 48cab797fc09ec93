"""A vhost's ``recovery.dets``: what each classic queue's index held at a clean shutdown.

``rabbit_recovery_terms`` stores one ``{QueueDirName, Terms}`` per queue when the node
stops cleanly, and clears them when it boots; for a CQv1 queue ``Terms`` holds
``{segments, [{Seg, Unacked}]}`` (``rabbit_queue_index:terminate``: publishes minus
acks per segment file + journal) and ``persistent_count``. They are the only record of
how many entries the index files must hold, so a file cut exactly on a record
boundary (which parses cleanly) is detected by comparing against them.

DETS (format 9) is read as far as that needs: the header's cookie, version and
"closed properly" flag (a node killed while the table was open may have left stale
terms: then none are used), and every active slot ``<<Size:32, 16#12345678:32,
Objects>>`` with objects ``<<ObjSize:32, term_to_binary(Object)>>`` (ObjSize counting
its own 4 bytes). A key found twice with different terms is not trusted.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

from .erlang_terms import binary_to_term
from ...errors import TermError

FILE = "recovery.dets"
COOKIE = 0x00ABCDEF
VERSION = 9
ACTIVE = b"\x12\x34\x56\x78"
MAX_BYTES = 64 << 20  # a recovery table this large is not one RabbitMQ wrote
_U32 = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class QueueTerms:
    segments: dict[int, int] | None  # CQv1: unacked entries per segment; None for other indexes
    persistent_count: int | None


def read_recovery_terms(vhost_dir: str) -> tuple[dict[str, QueueTerms], str | None]:
    """(terms by queue directory name, why none are used or None)."""
    path = os.path.join(vhost_dir, FILE)
    try:
        size = os.path.getsize(path)
    except OSError:
        return {}, None
    if size > MAX_BYTES:
        return {}, f"{path}: {size} bytes, not a recovery table; index counts not cross-checked"
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 20:
        return {}, f"{path}: too short for a DETS header; index counts not cross-checked"
    cookie, closed, version = _U32.unpack_from(data, 4)[0], _U32.unpack_from(data, 8)[0], _U32.unpack_from(data, 16)[0]
    if cookie != COOKIE or version != VERSION:
        return {}, f"{path}: not a DETS v9 file; index counts not cross-checked"
    if closed != 1:
        return {}, f"{path}: not closed properly (the node did not stop cleanly); index counts not cross-checked"
    found: dict[str, Any] = {}
    conflicting: set[str] = set()
    pos = data.find(ACTIVE, 4)
    while pos >= 4:
        for key, terms in _slot(data, pos - 4):
            if key in found and found[key] != terms:
                conflicting.add(key)
            found[key] = terms
        pos = data.find(ACTIVE, pos + 1)
    return {k: _queue_terms(v) for k, v in found.items() if k not in conflicting}, None


def _slot(data: bytes, start: int) -> list[tuple[str, Any]]:
    """The ``{Key, Terms}`` objects of the active slot at ``start``; [] if it is not one."""
    (size,) = _U32.unpack_from(data, start)
    end = start + size
    if size < 13 or end > len(data):
        return []
    out, p = [], start + 8
    while p < end:
        if p + 4 > end:
            return []
        (osz,) = _U32.unpack_from(data, p)
        if osz < 5 or p + osz > end:
            return []
        try:
            obj = binary_to_term(data[p + 4 : p + osz])
        except TermError:
            return []
        if not (isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], list)
                and all(isinstance(c, int) and 0 < c < 128 for c in obj[0])):
            return []
        out.append(("".join(map(chr, obj[0])), obj[1]))
        p += osz
    return out


def _queue_terms(terms: Any) -> QueueTerms:
    d = {}
    if isinstance(terms, list):
        for t in terms:
            if isinstance(t, tuple) and len(t) == 2 and isinstance(t[0], str):
                d[str(t[0])] = t[1]
    segs = d.get("segments")
    segments = None
    if isinstance(segs, list) and all(isinstance(s, tuple) and len(s) == 2 and all(isinstance(x, int) for x in s)
                                      for s in segs):
        segments = {int(s): int(n) for s, n in segs}
    pc = d.get("persistent_count")
    return QueueTerms(segments, pc if isinstance(pc, int) else None)
