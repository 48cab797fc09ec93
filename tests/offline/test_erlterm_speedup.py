"""The C fast path of the Erlang term decoder (``rbak/format/_erlterm.c``) against the pure-Python one.

Where the C helper returns a term it must be exactly the Python decoder's (same values and types,
same end offset); where Python raises, C must hand the term back (None), so every error and its
offset stays the Python decoder's. Checked on every tag, real Ra log entries, and every
truncation and many single-byte corruptions of them.
"""

from __future__ import annotations

import os
import random
import struct

import erlang
import pytest

from rbak.errors import TermError
from rbak.format import backend
from rbak.offline.rabbitmq import erlang_terms as et
from support.require import unavailable

A = et.Atom


def same(a, b) -> bool:
    """Equal values of exactly the same types all the way down (Atom is not str, list not tuple)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(k in b and type(next(k2 for k2 in b if k2 == k)) is type(k)
                                        and same(v, b[k]) for k, v in a.items())
    if isinstance(a, et.ImproperList):
        return same(a.items, b.items) and same(a.tail, b.tail)
    if isinstance(a, et.Opaque):
        return a.tag == b.tag and same(a.node, b.node) and a.data == b.data
    if isinstance(a, float):
        return struct.pack(">d", a) == struct.pack(">d", b)
    return a == b


def python_decode(data: bytes, pos: int):
    return et._term(data, len(data), pos, 0)


def check(data: bytes, pos: int = 1) -> bool:
    """C and Python agree on the bare term at ``pos``; True when it decoded."""
    fast = et._fast(data, pos)
    try:
        want = python_decode(data, pos)
    except TermError:
        assert fast is None, f"C decoded what Python rejects: {data[pos:pos + 60]!r}"
        return False
    if fast is not None:
        assert fast[1] == want[1] and same(fast[0], want[0]), (fast, want)
    return True


def _node() -> bytes:
    return b"w\x0crabbit@host1"


PID = b"X" + _node() + b"\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x01"
OLD_PID = b"g" + b"d\x00\x06node@h" + b"\x00\x00\x00\x05\x00\x00\x00\x00\x01"
REF = b"Z\x00\x03" + _node() + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x02" * 3
OLD_REF = b"r\x00\x02" + b"s\x04node" + b"\x01" + b"\x00\x00\x00\x02" * 2
PORT = b"Y" + _node() + b"\x00\x00\x00\x07\x00\x00\x00\x01"
V4PORT = b"x" + _node() + b"\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00\x01"
OLDPORT = b"f" + b"s\x04node" + b"\x00\x00\x00\x07\x01"

HAND_MADE = [
    b"a\x07", b"b\xff\xff\xff\xfe", b"b\x7f\xff\xff\xff", b"F" + struct.pack(">d", -2.5),
    b"n\x00\x00", b"n\x08\x01" + b"\xff" * 8, b"n\x09\x00" + b"\x01" * 9, b"o\x00\x00\x00\x02\x00\x01\x02",
    b"d\x00\x03abc", b"d\x00\x02\xe9t", b"v\x00\x02\xc3\xa9", b"s\x02ok", b"w\x04true", b"w\x02\xff\xfe",
    b"m\x00\x00\x00\x00", b"M\x00\x00\x00\x01\x03\xe0", b"j", b"k\x00\x03abc", b"k\x00\x00",
    b"l\x00\x00\x00\x01a\x01j", b"l\x00\x00\x00\x01a\x01a\x02", b"l\x00\x00\x00\x01a\x01k\x00\x00",
    b"h\x02a\x01h\x00", b"i\x00\x00\x00\x02a\x01j",
    b"t\x00\x00\x00\x02w\x01am\x00\x00\x00\x01xa\x01h\x01a\x02",
    b"t\x00\x00\x00\x01l\x00\x00\x00\x01a\x01ja\x01",  # an unhashable (list) key: Python freezes it
    b"t\x00\x00\x00\x02a\x01a\x02a\x01a\x03",  # a duplicate key: the last wins on both paths
    PID, OLD_PID, REF, OLD_REF, PORT, V4PORT, OLDPORT,
    b"c" + b"1.50000000000000000000e+00".ljust(31, b"\x00"),  # FLOAT_EXT: Python only
    b"q" + b"d\x00\x01m" + b"d\x00\x01f" + b"a\x01",  # an export: unsupported on both
    b"h" + b"\x01" * 0 + b"\x03" + b"w\x02mc" + b"w\x08mc_amqpl" + b"t\x00\x00\x00\x00",
]


@pytest.fixture(autouse=True)
def _need_c():
    if os.environ.get(backend.ENV) == "0":
        pytest.skip("RBAK_SPEEDUPS=0: the pure-Python decoder alone (nothing to compare)")
    if not backend.BUILT:
        unavailable("the C helper rbak.format._speedups is not built (python setup.py build_ext --inplace)")
    assert et._fast is not None, "the C helper is built but erlang_terms does not use its erl_decode"


def test_every_tag_decodes_alike_on_both_paths():
    decoded = 0
    for raw in HAND_MADE:
        data = b"\x83" + raw
        decoded += check(data)
        for cut in range(1, len(data)):  # every truncation: C hands it back, Python gives the error
            check(data[:cut])
        fast = et._fast(data, 1)
        if raw[:1] in (b"c", b"q") or raw.startswith(b"t\x00\x00\x00\x01l"):
            assert fast is None  # left to Python on purpose
    assert decoded == len(HAND_MADE) - 2  # the export and the bad UTF-8 atom are errors


def test_deep_nesting_is_left_to_python():
    deep = b"\x83" + b"l\x00\x00\x00\x01" * 1200 + b"j" * 1201
    assert et._fast(deep, 1) is None
    with pytest.raises(TermError, match="nested too deeply"):
        et.binary_to_term(deep)
    assert et._fast(b"\x83" + b"h\x01" * 300 + b"a\x01", 1) is None  # past C's limit: Python decides
    ok = b"\x83" + b"h\x01" * 150 + b"a\x01"
    assert same(et._fast(ok, 1)[0], python_decode(ok, 1)[0])


def test_random_terms_and_corruptions_agree():
    rnd = random.Random(18)
    atoms = [erlang.OtpErlangAtom(n) for n in (b"undefined", b"basic_message", b"mc_amqpl")]

    def gen(depth: int):
        k = rnd.randrange(9 if depth < 4 else 5)
        if k == 0:
            return rnd.randrange(-(1 << 70), 1 << 70)
        if k == 1:
            return rnd.randrange(-300, 300)
        if k == 2:
            return rnd.choice(atoms)
        if k == 3:
            return bytes(rnd.randrange(256) for _ in range(rnd.randrange(40)))
        if k == 4:
            return rnd.random() * 1e6
        if k == 5:
            return tuple(gen(depth + 1) for _ in range(rnd.randrange(5)))
        if k == 6:
            return [gen(depth + 1) for _ in range(rnd.randrange(5))]
        if k == 7:
            return {rnd.choice(atoms): gen(depth + 1) for _ in range(rnd.randrange(3))}
        return erlang.OtpErlangList([gen(depth + 1), gen(depth + 1)], improper=True)

    for _ in range(300):
        data = erlang.term_to_binary(gen(0))
        assert check(data)
        assert same(et.binary_to_term(data), python_decode(data, 1)[0])
        for _ in range(20):
            bad = bytearray(data)
            bad[rnd.randrange(1, len(bad))] = rnd.randrange(256)
            check(bytes(bad))


def test_terms_real_erlang_writes_with_pids_refs_and_compression():
    """A quorum enqueue command as Ra logs it (``'$usr'`` meta map, a live pid and ref, a
    ``basic_message``), written by real Erlang, plain and compressed, both atom encodings."""
    import subprocess

    expr = ("{'$usr', #{ts => 1732500000000, from => {self(), make_ref()}}, "
            "{enqueue, self(), 7, {basic_message, {resource, <<\"/\">>, exchange, <<>>}, [<<\"q\">>], "
            "{content, 60, none, <<176,0,24>>, rabbit_framing_amqp_0_9_1, [<<1,2,3>>]}, <<9:128>>, true}}, "
            "{notify, 3, self()}}")
    code = ("lists:foreach(fun(O) -> io:format(\"~w~n\", [binary_to_list(term_to_binary(" + expr + ", O))]) end, "
            "[[{minor_version, 1}], [{minor_version, 2}], [compressed, {minor_version, 2}]]), halt().")
    out = subprocess.run(["erl", "-noshell", "-eval", code], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    blobs = [bytes(int(x) for x in line.strip()[1:-1].split(",")) for line in out.splitlines() if line.strip()]
    assert len(blobs) == 3 and blobs[2][1] == 80
    for data in blobs[:2]:
        assert check(data)
        t = et.binary_to_term(data)
        assert t[2][3][0] == "basic_message" and isinstance(t[2][1], et.Opaque)
        for cut in range(1, len(data)):
            check(data[:cut])
    assert same(et.binary_to_term(blobs[2])[2], et.binary_to_term(blobs[1])[2])  # the ref differs per call


def test_a_memoryview_decodes_like_bytes():
    """Ra log entries are views into the file's bytes: decoding one gives what its bytes give,
    errors (with their offsets) included."""
    for raw in HAND_MADE:
        for data in (b"\x83" + raw, b"\x83" + raw[:-1]):
            try:
                want = et.decode(data)
            except TermError as e:
                with pytest.raises(TermError) as got:
                    et.decode(memoryview(b"xx" + data)[2:])
                assert str(got.value) == str(e)
                continue
            got = et.decode(memoryview(b"xx" + data)[2:])
            assert got[1] == want[1] and same(got[0], want[0])


def test_the_recent_atom_and_pid_caches_never_mix_up_values():
    """The C decoder reuses the atoms and the pid it met last: same bytes under another atom tag (Latin-1
    vs UTF-8), hash neighbours, and pids differing in one byte or node must still decode as Python does."""
    node2 = b"w\x0crabbit@host2"
    pid2 = b"X" + node2 + PID[1 + len(_node()):]
    pid_other = PID[:-1] + b"\x02"
    seq = [PID, PID, pid_other, PID, pid2, PID, REF, REF, OLD_PID, OLD_PID,
           b"d\x00\x02\xc3\xa9", b"v\x00\x02\xc3\xa9", b"d\x00\x02\xc3\xa9", b"s\x02\xc3\xa9", b"w\x02\xc3\xa9"]
    rnd = random.Random(7)
    names = [bytes(rnd.choice(b"abcdefgh_") for _ in range(rnd.randint(1, 50))) for _ in range(2000)]
    for name in names + names[::-1]:  # more atoms than cache slots, each twice, some longer than cached
        tag = rnd.choice([b"d\x00" + bytes([len(name)]), b"v\x00" + bytes([len(name)]), b"s" + bytes([len(name)]),
                          b"w" + bytes([len(name)])])
        seq.append(tag + name)
    for t in seq:
        assert check(b"\x83" + t)
    a, b = et._fast(b"\x83" + PID, 1)[0], et._fast(b"\x83" + pid_other, 1)[0]
    assert a != b and a.data != b.data and et._fast(b"\x83" + pid2, 1)[0].node == "rabbit@host2"
