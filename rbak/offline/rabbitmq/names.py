"""Which vhost and queue a stream directory belongs to.

A stream's directory is named by ``rabbit_stream_queue``: ``<vhost>_<queue>_<system
time>`` passed through ``osiris_util:to_base64uri`` (every grapheme outside
``A-Za-z0-9_-=`` becomes one ``_``: ``imp-vh-ü`` + ``strm_ü/2`` -> ``imp-vh-__strm___2_<ts>``;
3.10 replaced each UTF-8 byte: ``imp-vh-___strm____2_<ts>``), so the name alone is ambiguous (``/`` and
``_`` and every non-ASCII byte look alike). The queue records the node kept
name the queues exactly: Mnesia's files (``rabbit_queue``/``rabbit_durable_queue``
on 3.x/4.0/4.1) or Khepri's (a Ra log under ``coordination/<node>/`` on 4.2+,
where Ra stores large commands as compressed external terms). Every
``#resource{kind = queue}`` term found there is a candidate; a stream directory
belongs to the candidate whose encoded ``<vhost>_<queue>_`` prefixes its name
followed by digits only.
"""

from __future__ import annotations

import os
import struct
import unicodedata
import zlib

from .erlang_terms import decode_bare
from ...errors import TermError

_ALLOWED_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-=")
_RESOURCE_PATS = [b"h\x04" + p for p in (b"d\x00\x08resource", b"w\x08resource", b"v\x00\x08resource",
                                         b"s\x08resource")]
_MNESIA_EXT = (".DCD", ".DCL", ".LOG", ".DAT")
_RA_EXT = (".wal", ".segment", ".snapshot", "snapshot.dat")
_MAX_SCAN = 256 << 20  # metadata files are small; never read a huge one whole


def _joins(ch: str) -> bool:
    """Extends the previous grapheme (combining mark, ZWJ, variation selector, emoji modifier)."""
    o = ord(ch)
    return (unicodedata.combining(ch) != 0 or o == 0x200D or 0xFE00 <= o <= 0xFE0F or 0x1F3FB <= o <= 0x1F3FF
            or unicodedata.category(ch) in ("Mn", "Me", "Mc"))


def to_base64uri(text: str) -> str:
    """``osiris_util:to_base64uri/1``: per grapheme (approximated: combining marks, ZWJ sequences and
    CR LF join the previous character), anything outside ``A-Za-z0-9_-=`` becomes one ``_``."""
    out: list[str] = []
    prev = ""
    joined = False
    for ch in text:
        if out and ((prev == "\r" and ch == "\n") or _joins(ch) or joined):
            joined = ch == "\u200d"
            if out[-1] != "_" or prev in _ALLOWED_CHARS:
                out[-1] = "_"
            prev = ch
            continue
        joined = False
        out.append(ch if ch in _ALLOWED_CHARS else "_")
        prev = ch
    return "".join(out)


def to_base64uri_bytes(text: str) -> str:
    """The same on 3.x, which passed ``binary_to_list`` (one ``_`` per UTF-8 byte) and had no grapheme rule."""
    return "".join(chr(b) if chr(b) in _ALLOWED_CHARS else "_" for b in text.encode("utf-8", "surrogateescape"))


def stream_dir_matches(dirname: str, vhost: str, queue: str) -> bool:
    name = vhost + "_" + queue + "_"
    for prefix in {to_base64uri(name), to_base64uri_bytes(name)}:
        if dirname.startswith(prefix) and dirname[len(prefix):].isdigit():
            return True
    return False


def queue_resources_in(data: bytes, found: set[tuple[str, str]]) -> None:
    """Add (vhost, queue) of every ``#resource{kind = queue}`` term found anywhere in ``data``
    (Mnesia files, Ra logs: the terms are found by their tag, whatever surrounds them)."""
    for pat in _RESOURCE_PATS:
        i = data.find(pat)
        while i >= 0:
            try:
                t, _ = decode_bare(data, i)
                if len(t) == 4 and t[2] == "queue" and isinstance(t[1], bytes) and isinstance(t[3], bytes):
                    found.add((t[1].decode("utf-8", "surrogateescape"), t[3].decode("utf-8", "surrogateescape")))
            except (TermError, TypeError, ValueError, IndexError):
                pass
            i = data.find(pat, i + 1)


def _compressed_terms(data: bytes):
    """The inflated bytes of every compressed external term (``131, 80, Size:32, zlib``) in data."""
    i = data.find(b"\x83P")
    while i >= 0:
        if i + 6 <= len(data):
            (size,) = struct.unpack_from(">I", data, i + 2)
            if 0 < size < _MAX_SCAN:
                try:
                    d = zlib.decompressobj()
                    out = d.decompress(data[i + 6:], size + 1)
                    if len(out) == size:
                        yield out
                except zlib.error:
                    pass
        i = data.find(b"\x83P", i + 1)


def _files(node_dir: str):
    for name in os.listdir(node_dir):
        if name.endswith(_MNESIA_EXT):
            yield os.path.join(node_dir, name)
    coord = os.path.join(node_dir, "coordination")
    for root, _dirs, files in os.walk(coord):
        for f in files:
            if f.endswith(_RA_EXT):
                yield os.path.join(root, f)


def known_queue_names(node_dir: str) -> set[tuple[str, str]]:
    """(vhost, queue) of every queue resource the node's metadata stores mention."""
    found: set[tuple[str, str]] = set()
    if not os.path.isdir(node_dir):
        return found
    for path in _files(node_dir):
        try:
            if os.path.getsize(path) > _MAX_SCAN:
                continue
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        queue_resources_in(data, found)
        for inner in _compressed_terms(data):
            queue_resources_in(inner, found)
    return found



def name_stream_dir(dirname: str, candidates: set[tuple[str, str]]) -> tuple[str, str] | None:
    """The one candidate this stream directory belongs to (None: none, or several)."""
    hits = [c for c in candidates if stream_dir_matches(dirname, *c)]
    return hits[0] if len(hits) == 1 else None
