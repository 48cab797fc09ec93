"""A small strict decoder of Erlang's external term format (``term_to_binary``).

RabbitMQ stores every message as ``term_to_binary`` of a record; we need only
the tags those records use, decoded into plain Python values so the message
decoders stay simple and fast:

* atoms -> :class:`Atom` (a ``str`` subclass, so ``Atom("true") == "true"``
  but ``isinstance(x, Atom)`` tells an atom from a binary). ``ATOM_EXT`` (100,
  Latin-1, written by OTP <= 25) and the UTF-8 atoms (118/119, OTP 26+) give
  equal values: the encoding is normalised away.
* binaries (109) -> ``bytes``; bit binaries (77) -> :class:`BitBinary`;
* integers (97, 98, 110, 111) -> ``int``; floats (70, 99) -> ``float``;
* tuples (104, 105) -> ``tuple``; lists (106, 107, 108) -> ``list`` (an
  improper tail becomes :class:`ImproperList`); maps (116) -> ``dict``;
* zlib-compressed terms (80) are inflated.
* pids, ports and references decode to :class:`Opaque` (compared, never looked into).

Anything else (pids, ports, refs, funs) raises :class:`TermError` with the
offset: a message record never holds them, so meeting one means the bytes
are not what we think. ``decode(data, pos)`` returns ``(term, end)`` so a
caller can tell where the term stops (the v2 queue store may zero-pad after
it); ``binary_to_term`` insists on the exact length.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any, Callable
from ...errors import TermError

VERSION = 131

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_F64 = struct.Struct(">d")


class Atom(str):
    """An Erlang atom; compares equal to its name."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Atom({str.__repr__(self)})"


@dataclass(frozen=True, slots=True)
class BitBinary:
    data: bytes
    bits: int  # significant bits in the last byte


@dataclass(frozen=True, slots=True)
class ImproperList:
    items: list
    tail: Any


TRUE = Atom("true")
FALSE = Atom("false")
UNDEFINED = Atom("undefined")

# Atoms repeat constantly (record names, 'undefined'); intern them.
MAX_DEPTH = 1000


_LATIN1_ATOMS: dict[bytes, Atom] = {}
_UTF8_ATOMS: dict[bytes, Atom] = {}


def _atom(raw: bytes, latin1: bool, pos: int) -> Atom:
    cache = _LATIN1_ATOMS if latin1 else _UTF8_ATOMS
    a = cache.get(raw)
    if a is None:
        try:
            name = raw.decode("latin-1" if latin1 else "utf-8")
        except UnicodeDecodeError:
            raise TermError("atom is not valid UTF-8", pos) from None
        a = Atom(name)
        if len(cache) < 100_000:
            cache[raw] = a
    return a


def decode(data: bytes | memoryview, pos: int = 0) -> tuple[Any, int]:
    """Decode one versioned term starting at ``pos``; returns (term, end offset)."""
    if _fast is not None and type(data) is memoryview and pos + 1 < len(data) and data[pos] == VERSION \
            and data[pos + 1] != 80:
        r = _fast(data, pos + 1)  # straight from the view (a Ra log entry): no copy first
        if r is not None:
            return r
    mv = data if type(data) is bytes else bytes(data)
    if pos >= len(mv):
        raise TermError("no term: empty input", pos)
    if mv[pos] != VERSION:
        raise TermError(f"bad version byte {mv[pos]} (expected 131)", pos)
    if pos + 1 < len(mv) and mv[pos + 1] == 80:  # compressed
        if pos + 6 > len(mv):
            raise TermError("truncated compressed term header", pos + 1)
        (usize,) = _U32.unpack_from(mv, pos + 2)
        d = zlib.decompressobj()
        try:
            raw = d.decompress(memoryview(mv)[pos + 6 :], usize + 1)
        except zlib.error as e:
            raise TermError(f"compressed term does not inflate: {e}", pos + 6) from None
        if len(raw) != usize or not d.eof:
            raise TermError(f"compressed term inflates to {len(raw)} bytes, header says {usize}", pos + 6)
        consumed = len(mv) - pos - 6 - len(d.unused_data)
        term, end = _Decoder(raw).term(0, 0)
        if end != usize:
            raise TermError("trailing bytes inside compressed term", pos + 6 + end)
        return term, pos + 6 + consumed
    return _bare(mv, pos + 1)


def decode_bare(data: bytes | memoryview, pos: int) -> tuple[Any, int]:
    """Decode a term without the version byte (one embedded in a larger term)."""
    return _Decoder(data).term(pos, 0)


def _bare(data: bytes, pos: int) -> tuple[Any, int]:
    """The term at ``pos``: the C helper's result when it handles the term, else (and for every
    error, so messages and offsets are this module's) the Python decoder's; both give equal values."""
    if _fast is not None:
        r = _fast(data, pos)
        if r is not None:
            return r
    try:
        return _term(data, len(data), pos, 0)
    except RecursionError:  # Python's own stack ends before MAX_DEPTH: the same verdict
        raise TermError("term nested too deeply", pos) from None


def binary_to_term(data: bytes | memoryview) -> Any:
    """Decode a buffer holding exactly one term."""
    term, end = decode(data, 0)
    if end != len(data):
        raise TermError(f"{len(data) - end} unparsed bytes after the term", end)
    return term


class _Decoder:
    """Decodes from an immutable ``bytes`` copy (indexing bytes is much faster than a memoryview)."""

    __slots__ = ("data", "n")

    def __init__(self, data: bytes | memoryview):
        self.data = data if type(data) is bytes else bytes(data)
        self.n = len(self.data)

    def term(self, pos: int, depth: int) -> tuple[Any, int]:
        if depth == 0:
            return _bare(self.data, pos)
        return _term(self.data, self.n, pos, depth)


_u16 = _U16.unpack_from
_u32 = _U32.unpack_from
_i32 = _I32.unpack_from
_f64 = _F64.unpack_from


def _short(n: int, pos: int, k: int, what: str) -> TermError:
    return TermError(f"truncated {what}: needs {k} bytes, {n - pos} left", pos)


def _items(data: bytes, n: int, p: int, count: int, depth: int) -> tuple[list, int]:
    """``count`` consecutive terms; binaries, atoms and small integers inline (the hot path:
    a stored message is mostly those), anything else through ``_term``."""
    items: list = []
    append = items.append
    for _ in range(count):
        tag = data[p] if p < n else -1
        if tag == 109:
            if p + 5 <= n:
                ln = _u32(data, p + 1)[0]
                e = p + 5 + ln
                if e <= n:
                    append(data[p + 5 : e])
                    p = e
                    continue
        elif tag == 119 or tag == 115:
            if p + 2 <= n:
                e = p + 2 + data[p + 1]
                if e <= n:
                    append(_atom(data[p + 2 : e], tag == 115, p))
                    p = e
                    continue
        elif tag == 100 or tag == 118:
            if p + 3 <= n:
                e = p + 3 + _u16(data, p + 1)[0]
                if e <= n:
                    append(_atom(data[p + 3 : e], tag == 100, p))
                    p = e
                    continue
        elif tag == 97:
            if p + 2 <= n:
                append(data[p + 1])
                p += 2
                continue
        x, p = _term(data, n, p, depth)  # everything else, and every error, goes the long way
        append(x)
    return items, p


def _term(data: bytes, n: int, pos: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise TermError("term nested too deeply", pos)
    if pos >= n:
        raise _short(n, pos, 1, "term tag")
    tag = data[pos]
    decode = _DECODERS.get(tag)
    if decode is None:
        raise TermError(f"unsupported term tag {tag}", pos)
    return decode(data, n, pos + 1, depth, tag)


def _length(data: bytes, n: int, p: int, size: int, what: str) -> tuple[int, int]:
    """A u8/u16/u32 length at ``p`` and the position after it."""
    if p + size > n:
        raise _short(n, p, size, what)
    if size == 1:
        return data[p], p + 1
    return (_u16(data, p)[0] if size == 2 else _u32(data, p)[0]), p + size


def _bytes(data: bytes, n: int, p: int, ln: int, what: str) -> bytes:
    if p + ln > n:
        raise _short(n, p, ln, what)
    return data[p : p + ln]


def _binary(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # BINARY_EXT
    ln, p = _length(data, n, p, 4, "binary length")
    return _bytes(data, n, p, ln, "binary"), p + ln


def _small_tuple(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # SMALL_TUPLE_EXT
    arity, p = _length(data, n, p, 1, "tuple arity")
    if p + arity > n:  # each element is >= 1 byte
        raise _short(n, p, arity, "tuple elements")
    items, p = _items(data, n, p, arity, depth + 1)
    return tuple(items), p


def _large_tuple(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # LARGE_TUPLE_EXT
    arity, p = _length(data, n, p, 4, "tuple arity")
    if p + arity > n:
        raise _short(n, p, arity, "tuple elements")
    items = []
    for _ in range(arity):
        x, p = _term(data, n, p, depth + 1)
        items.append(x)
    return tuple(items), p


def _atom_ext(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:
    """ATOM_EXT / SMALL_ATOM_EXT (Latin-1), ATOM_UTF8_EXT / SMALL_ATOM_UTF8_EXT."""
    small = tag in (115, 119)
    ln, q = _length(data, n, p, 1 if small else 2, "atom length")
    return _atom(_bytes(data, n, q, ln, "atom"), tag in (100, 115), p - 1), q + ln


def _small_integer(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # SMALL_INTEGER_EXT
    if p >= n:
        raise _short(n, p, 1, "small integer")
    return data[p], p + 1


def _integer(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # INTEGER_EXT
    if p + 4 > n:
        raise _short(n, p, 4, "integer")
    return _i32(data, p)[0], p + 4


def _nil(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # NIL_EXT
    return [], p


def _list(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # LIST_EXT
    ln, p = _length(data, n, p, 4, "list length")
    if p + ln + 1 > n:
        raise _short(n, p, ln + 1, "list elements")
    items, p = _items(data, n, p, ln, depth + 1)
    tail, p = _term(data, n, p, depth + 1)
    if type(tail) is list and not tail:
        return items, p
    return ImproperList(items, tail), p


def _string(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # STRING_EXT: small integers
    ln, p = _length(data, n, p, 2, "string length")
    return list(_bytes(data, n, p, ln, "string")), p + ln


def _map(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # MAP_EXT
    arity, p = _length(data, n, p, 4, "map arity")
    if p + 2 * arity > n:
        raise _short(n, p, 2 * arity, "map entries")
    out: dict[Any, Any] = {}
    d = depth + 1
    for _ in range(arity):
        k, p = _term(data, n, p, d)
        v, p = _term(data, n, p, d)
        try:
            out[k] = v
        except TypeError:  # unhashable key (a list or map): keep it as a tuple of pairs
            out[_freeze(k)] = v
    return out, p


def _new_float(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # NEW_FLOAT_EXT
    if p + 8 > n:
        raise _short(n, p, 8, "float")
    return _f64(data, p)[0], p + 8


def _old_float(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # FLOAT_EXT: printf text
    txt = _bytes(data, n, p, 31, "float").split(b"\x00", 1)[0]
    try:
        return float(txt), p + 31
    except ValueError:
        raise TermError(f"bad float text {txt!r}", p) from None


def _bignum(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # SMALL_BIG_EXT, LARGE_BIG_EXT
    ln, p = _length(data, n, p, 1 if tag == 110 else 4, "bignum length")
    if p + ln + 1 > n:
        raise _short(n, p, ln + 1, "bignum")
    sign = data[p]
    v = int.from_bytes(data[p + 1 : p + 1 + ln], "little")
    return (-v if sign else v), p + 1 + ln


def _bit_binary(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:  # BIT_BINARY_EXT
    if p + 5 > n:
        raise _short(n, p, 5, "bit binary header")
    ln = _u32(data, p)[0]
    bits = data[p + 4]
    p += 5
    return BitBinary(_bytes(data, n, p, ln, "bit binary"), bits), p + ln


def _opaque(data: bytes, n: int, p: int, depth: int, tag: int) -> tuple[Any, int]:
    """Pids, ports, references: kept as an opaque id (the node atom + the raw bytes)."""
    if tag == 90 or tag == 114:  # NEWER_REFERENCE_EXT / NEW_REFERENCE_EXT: id count u16, node, creation, ids
        if p + 2 > n:
            raise _short(n, p, 2, "reference length")
        ln = _u16(data, p)[0]
        node, q = _term(data, n, p + 2, depth + 1)
        end = q + (4 if tag == 90 else 1) + 4 * ln
    else:
        node, q = _term(data, n, p, depth + 1)
        end = q + _OPAQUE[tag]
    if end > n:
        raise _short(n, q, end - q, "pid/port/reference")
    return Opaque(tag, node, data[q:end]), end


#: Tag -> bytes after the node atom: NEW_PID_EXT, PID_EXT, NEW_PORT_EXT, PORT_EXT, V4_PORT_EXT; references
#: (90, 114) have a length first.
_OPAQUE = {88: 12, 103: 9, 89: 8, 102: 5, 120: 12, 90: 0, 114: 0}

_DECODERS = {
    109: _binary, 104: _small_tuple, 105: _large_tuple, 100: _atom_ext, 118: _atom_ext, 115: _atom_ext,
    119: _atom_ext, 97: _small_integer, 98: _integer, 106: _nil, 108: _list, 107: _string, 116: _map,
    70: _new_float, 99: _old_float, 110: _bignum, 111: _bignum, 77: _bit_binary,
    **{t: _opaque for t in _OPAQUE},
}


@dataclass(frozen=True, slots=True)
class Opaque:
    """A pid, port or reference: only ever compared (e.g. which consumer a command names)."""

    tag: int
    node: Any
    data: bytes


def _freeze(x: Any) -> Any:
    if isinstance(x, list):
        return tuple(_freeze(i) for i in x)
    if isinstance(x, dict):
        return tuple((_freeze(k), _freeze(v)) for k, v in x.items())
    return x


def _load_fast() -> Callable[..., Any] | None:
    """``erl_decode`` of the optional C helper (``rbak/format/_erlterm.c``), configured with this
    module's classes and atom caches; None with ``RBAK_SPEEDUPS=0`` or an install without it."""
    from ...format.backend import speedups

    fn = getattr(speedups, "erl_decode", None)
    if fn is None:
        return None
    speedups.erl_configure(Atom, ImproperList, BitBinary, Opaque, _LATIN1_ATOMS, _UTF8_ATOMS)  # type: ignore[union-attr]  # fn is None without speedups
    return fn


_fast = _load_fast()
