"""The C fast path of the AMQP 1.0 decoder (``rbak/format/_amqp10.c``) against the pure-Python one.

Where C returns a value it must be exactly the Python decoder's (same ``Value`` types and Python
values, same end); where Python raises, C must hand the value back (None), so every error and its
offset stays the Python decoder's. Checked on every format code, random nested values, and every
truncation and many single-byte corruptions of them.
"""

from __future__ import annotations

import os
import random
import struct

import pytest
from support.require import unavailable

from rbak.format import backend
from rbak.format import amqp10
from rbak.format.amqp10 import Value
from rbak.errors import Amqp10Error


@pytest.fixture(autouse=True)
def _need_c():
    if os.environ.get(backend.ENV) == "0":
        pytest.skip("RBAK_SPEEDUPS=0: the pure-Python decoder alone (nothing to compare)")
    if not backend.BUILT:
        unavailable("the C helper rbak.format._speedups is not built (python setup.py build_ext --inplace)")
    assert amqp10._fast is not None, "the C helper is built but amqp10 does not use its amqp_value"


def same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, Value):
        return a.type == b.type and same(a.value, b.value)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return struct.pack(">d", a) == struct.pack(">d", b) or (a != a and b != b)
    return a == b


def check(data: bytes, pos: int = 0, end: int | None = None) -> bool:
    end = len(data) if end is None else end
    fast = amqp10._fast(data, pos, end)
    try:
        want = amqp10._Decoder(data, end).value(pos, 0)
    except Amqp10Error:
        assert fast is None, f"C decoded what Python rejects: {data[pos:pos + 40].hex()}"
        return False
    if fast is not None:
        assert fast[1] == want[1] and same(fast[0], want[0]), (fast, want)
    return True


def enc(rnd: random.Random, depth: int = 0) -> bytes:
    """A random valid encoding (every format code, both widths of compounds)."""
    k = rnd.randrange(12 if depth < 4 else 8)
    if k == 0:
        return bytes([rnd.choice([0x40, 0x41, 0x42, 0x43, 0x44, 0x45])])
    if k == 1:
        code = rnd.choice([0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56])
        return bytes([code, rnd.randrange(2) if code == 0x56 else rnd.randrange(256)])
    if k == 2:
        code, w = rnd.choice([(0x60, 2), (0x61, 2), (0x70, 4), (0x71, 4), (0x72, 4), (0x80, 8), (0x81, 8),
                              (0x82, 8), (0x83, 8), (0x74, 4), (0x84, 8), (0x94, 16), (0x98, 16)])
        return bytes([code]) + os.urandom(w)
    if k == 3:
        return b"\x73" + struct.pack(">I", rnd.choice([0x41, 0xE9, 0x1F600, 0xD800]))
    if k in (4, 5):
        raw = os.urandom(rnd.randrange(300))
        code = rnd.choice([0xA0, 0xA1, 0xA3]) if len(raw) < 256 and rnd.random() < 0.7 else rnd.choice([0xB0, 0xB1, 0xB3])
        return bytes([code]) + (bytes([len(raw)]) if code < 0xB0 else struct.pack(">I", len(raw))) + raw
    if k == 6:
        return b"\x00" + rnd.choice([b"\x53\x75", b"\xa3\x04abcd"]) + enc(rnd, depth + 1)
    if k == 7:
        return b"\x40"
    if k in (8, 9):  # list or map
        n = rnd.randrange(6) * (2 if k == 9 else 1)
        body = b"".join(enc(rnd, depth + 1) for _ in range(n))
        small = len(body) + 1 < 256 and n < 256 and rnd.random() < 0.7
        code = (0xC0 if k == 8 else 0xC1) if small else (0xD0 if k == 8 else 0xD1)
        if small:
            return bytes([code, len(body) + 1, n]) + body
        return bytes([code]) + struct.pack(">II", len(body) + 4, n) + body
    # array: one constructor, n elements of that type
    n = rnd.randrange(5)
    code, w = rnd.choice([(0x50, 1), (0x70, 4), (0xA1, None), (0x40, 0), (0x56, 1)])
    desc = b"\x00\x53\x70" if rnd.random() < 0.3 else b""
    elems = b""
    for _ in range(n):
        if w is None:
            s = os.urandom(rnd.randrange(10))
            elems += bytes([len(s)]) + s
        elif code == 0x56:
            elems += bytes([rnd.randrange(2)])
        else:
            elems += os.urandom(w)
    body = desc + bytes([code]) + elems
    if len(body) + 1 < 256 and rnd.random() < 0.7:
        return bytes([0xE0, len(body) + 1, n]) + body
    return b"\xf0" + struct.pack(">II", len(body) + 4, n) + body


def test_random_values_truncations_and_corruptions_agree():
    rnd = random.Random(18)
    for _ in range(600):
        data = enc(rnd)
        assert check(data), data.hex()
        assert same(amqp10.decode_value(data)[0], amqp10._Decoder(data, len(data)).value(0, 0)[0])
        for cut in range(len(data)):
            check(data[:cut])
        for _ in range(15):
            bad = bytearray(data)
            bad[rnd.randrange(len(bad))] = rnd.randrange(256)
            check(bytes(bad))
            check(bytes(bad), 0, max(0, len(bad) - 1))


def test_checks_python_makes_are_left_to_python():
    for raw in (b"\x56\x02", b"\x73\x00\x11\x00\x00", b"\xc1\x03\x01\x40", b"\x00\x00\x53\x70\x53\x01\x40",
                b"\xc0\x00\x00", b"\xe0\x02\x01\x00", b"\x01", b"\xc0\x04\x02\x40\x40\x40"):
        assert amqp10._fast(raw, 0, len(raw)) is None
        with pytest.raises(Amqp10Error):
            amqp10.decode_value(raw)
    huge = b"\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40"  # 4 billion nulls: a damaged count, not an OOM
    assert amqp10._fast(huge, 0, len(huge)) is None
    with pytest.raises(Amqp10Error, match="zero-width elements"):
        amqp10.decode_value(huge)
    deep = b"\xc0\x03\x01" * 150 + b"\x40"  # sizes do not matter: C stops at its depth limit first
    assert amqp10._fast(deep, 0, len(deep)) is None


def test_constants_are_the_shared_objects():
    for code, v in amqp10._CONSTANTS.items():
        assert amqp10._fast(bytes([code]), 0, 1) == (v, 1)
        assert amqp10._fast(bytes([code]), 0, 1)[0] is v
