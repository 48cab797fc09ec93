"""Batched record codec: the fast path for whole segments.

A backup is mostly message bodies, and the spec stores each body as a JSON
array of integers. Converting those one record at a time costs more than the
compression itself, so segments are encoded and decoded in batches:

- with the optional C helper (``_speedups.c``), records of the canonical
  shape (as rbak and the Rust tool write them) are encoded straight from
  their slots and decoded straight into ``BackupRecord`` objects, a whole
  payload per call, with repeated short strings shared. Anything else (other
  key order, whitespace, floats, Bytes/Table/Array headers, invalid JSON)
  comes back as None and takes the orjson path, which also produces the
  precise error. JSON libraries were measured first: orjson and simdjson
  both build Python ints or typed buffers at 80-130 MB/s here, under 0.3x
  zstd; orjson over dicts plus C for the body reached 0.23x on decode.
- without the helper (no C compiler at install): all bodies of a batch are
  serialised by ONE ``orjson.dumps`` of a NumPy ``uint8`` array, a byte
  lookup table giving each body's span in that text; decoding uses orjson.

Both paths produce exactly the bytes and objects of ``record.py``; the tests
check that on random records.
"""

from __future__ import annotations

import contextlib
import gc
import struct
from typing import Iterator, Sequence

import numpy as np
import orjson

from ..errors import SerializationError
from .backend import speedups as _c
from .record import (
    _ORJSON_OPTS, BackupRecord, decode_record, encode_record, record_from_json_obj, record_rest_obj,
)

_LEN = struct.Struct("<I")
_BODY_OPEN = b'{"body":['
_BODY_NULL = b'{"body":null,'

# Characters each byte value takes in the JSON array, comma included.
_CHARS8 = np.array([len(str(v)) + 1 for v in range(256)], dtype=np.uint8)

#: Bodies encoded per vectorised pass (bounds temporary memory to ~10x this).
BATCH_BODY_BYTES = 4 * 1024 * 1024


def _rest_json(r: BackupRecord) -> bytes:
    """The record's JSON without its body: b'{"properties":...}'."""
    return orjson.dumps(record_rest_obj(r), option=_ORJSON_OPTS)


def _body_texts(bodies: Sequence[bytes]) -> list:
    """Each body as the inside of its JSON array ('98,121,116'); b'' for empty.

    Returns memoryview slices of one shared text (``bytes.join`` takes them).
    """
    lens = np.fromiter(map(len, bodies), dtype=np.int64, count=len(bodies))
    if not lens.any():
        return [b""] * len(bodies)
    flat = np.frombuffer(b"".join(bodies), dtype=np.uint8)
    text = memoryview(orjson.dumps(flat, option=orjson.OPT_SERIALIZE_NUMPY))  # b"[98,121,...]"
    nonempty = np.flatnonzero(lens)
    starts_in = (np.cumsum(lens) - lens)[nonempty]
    chars = np.add.reduceat(_CHARS8[flat], starts_in, dtype=np.int64)  # chars per body, commas included
    ends = np.cumsum(chars)  # one past the comma (or ']') after each body, minus the '['
    begins = ends - chars + 1
    out: list = [b""] * len(bodies)
    for i, s, e in zip(nonempty.tolist(), begins.tolist(), ends.tolist()):
        out[i] = text[s:e]
    return out


def encode_records(records: Sequence[BackupRecord]) -> list[bytes]:
    """JSON of each record, byte-identical to ``record.encode_record``."""
    with _gc_paused():
        try:
            if _c_encode_many is not None:
                # C writes the canonical ones; None marks a record orjson must do.
                out = _c_encode_many(records)
                for idx, data in enumerate(out):
                    if data is None:
                        out[idx] = encode_record(records[idx])
                return out
            return _encode_records_numpy(records)
        except (TypeError, orjson.JSONEncodeError) as e:
            raise SerializationError(f"cannot encode record: {e}") from e


def _encode_records_numpy(records: Sequence[BackupRecord]) -> list[bytes]:
    out: list[bytes] = []
    i = 0
    n = len(records)
    while i < n:
        j, size = i, 0
        while j < n and (size < BATCH_BODY_BYTES or j == i):
            size += len(records[j].body)
            j += 1
        chunk = records[i:j]
        for r, body in zip(chunk, _body_texts([r.body for r in chunk])):
            rest = _rest_json(r)
            if r.body:
                out.append(b"".join((_BODY_OPEN, body, b"],", rest[1:])))
            else:
                out.append(_BODY_NULL + rest[1:])
        i = j
    return out


def encode_payload(records: Sequence[BackupRecord]) -> bytes:
    """The uncompressed segment payload: [u32 LE length][JSON] per record."""
    if _c_encode_payload is not None:
        data = _c_encode_payload(records)  # one buffer, no per-record objects
        if data is not None:
            return data
    parts: list[bytes] = []
    pack = _LEN.pack
    for data in encode_records(records):
        parts.append(pack(len(data)))
        parts.append(data)
    return b"".join(parts)


if _c is not None:
    _c_decode_many, _c_decode_payload = _c.decode_many, _c.decode_payload
    _c_encode_many, _c_encode_payload = _c.encode_many, _c.encode_payload
    _c_join, _c_split = _c.join_record, _c.split_record
else:  # built without a C compiler, or RBAK_SPEEDUPS=0: NumPy/orjson paths
    _c_join = _c_split = _c_decode_many = _c_decode_payload = _c_encode_many = _c_encode_payload = None

HAVE_SPEEDUPS = _c_split is not None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Batches build thousands of small acyclic objects; the cyclic GC would
    rescan all of them again and again (measured: 2.5x slower decoding)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def decode_records(raws: Sequence[bytes | memoryview]) -> list[BackupRecord]:
    """Decode many records' JSON; raises SerializationError naming the record index."""
    with _gc_paused():
        return _decode_records(raws)


def decode_payload_records(payload: bytes | memoryview) -> list[BackupRecord] | None:
    """All records of a decompressed payload in one C pass; None when the C
    helper is missing or the length framing is broken (the caller's Python
    loop then reports the exact byte offset)."""
    if _c_decode_payload is None:
        return None
    with _gc_paused():
        res = _c_decode_payload(payload)
        if res is None:
            return None
        out, fallbacks = res
        for idx in fallbacks:  # non-canonical records: raw JSON stands in their place
            out[idx] = _decode_records_lenient((out[idx],), idx)[0]
        return out


def _decode_records(raws: Sequence[bytes | memoryview]) -> list[BackupRecord]:
    if _c_decode_many is not None:
        # Canonical records come back built; the others (None) take the lenient path.
        out = _c_decode_many(raws)
        for idx, r in enumerate(out):
            if r is None:
                out[idx] = _decode_records_lenient((raws[idx],), idx)[0]
        return out
    return _decode_records_lenient(raws)


def _decode_records_lenient(raws: Sequence[bytes | memoryview], first: int = 0) -> list[BackupRecord]:
    out: list[BackupRecord] = []
    append = out.append
    loads = orjson.loads
    split = _c_split
    for idx, raw in enumerate(raws, first):
        try:
            s = split(raw) if split is not None else None
            if s is None:
                append(decode_record(raw))
                continue
            d = loads(s[1])
            if type(d) is not dict:
                raise SerializationError("a record must be a JSON object")
            append(record_from_json_obj(d, s[0]))
        except SerializationError as e:
            raise SerializationError(f"record {idx}: {e.args[0]}") from None
        except orjson.JSONDecodeError as e:
            raise SerializationError(f"record {idx} is not valid JSON: {e}") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise SerializationError(f"record {idx} has a malformed field: {e}") from None
    return out
