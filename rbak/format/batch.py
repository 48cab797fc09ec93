"""Batched record codec: the fast path for whole segments.

A backup is mostly message bodies, and the spec stores each body as a JSON
array of integers. Converting those one record at a time costs more than the
compression itself, so segments are encoded and decoded in batches:

- encode: all bodies of a batch are concatenated and serialised by ONE
  ``orjson.dumps`` of a NumPy ``uint8`` array (C speed); a byte lookup table
  gives each body's span in that text, which is sliced into each record.
- decode: each record of the canonical shape (``{"body":[...],...}``, as both
  rbak and the Rust tool write it) has its body array parsed straight into
  bytes by a small optional C helper (``_speedups.c``), and only the small rest
  goes through orjson. Anything else (other key order, a malformed body, or no
  compiled helper) takes the lenient per-record path, which also produces the
  precise error. JSON libraries were measured first: orjson and simdjson both
  build Python ints or typed buffers at 80-130 MB/s here, under 0.3x zstd.

Both paths produce exactly the bytes and objects of ``record.py``; the tests
check that on random records.
"""

from __future__ import annotations

import contextlib
import gc
import struct
from typing import Sequence

import numpy as np
import orjson

from ..errors import SerializationError
from .record import (
    _ORJSON_OPTS, BackupRecord, decode_record, record_from_json_obj, record_rest_obj,
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
            if _c_join is not None:
                dumps, opts, rest_obj, join = orjson.dumps, _ORJSON_OPTS, record_rest_obj, _c_join
                return [join(r.body, dumps(rest_obj(r), option=opts)) for r in records]
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
    parts: list[bytes] = []
    pack = _LEN.pack
    for data in encode_records(records):
        parts.append(pack(len(data)))
        parts.append(data)
    return b"".join(parts)


try:
    from ._speedups import join_record as _c_join, split_record as _c_split
except ImportError:  # built without a C compiler: NumPy/orjson paths
    _c_join = _c_split = None

HAVE_SPEEDUPS = _c_split is not None


@contextlib.contextmanager
def _gc_paused():
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


def _decode_records(raws: Sequence[bytes | memoryview]) -> list[BackupRecord]:
    out: list[BackupRecord] = []
    append = out.append
    loads = orjson.loads
    split = _c_split
    for idx, raw in enumerate(raws):
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
