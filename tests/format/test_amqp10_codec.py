"""The AMQP 1.0 codec's two halves in one module (``rbak.format.amqp10``): what the encoders write, the
decoder reads back as the same AMQP type and value, in the narrow and the wide forms."""

from __future__ import annotations

import pytest

from rbak.format import amqp10 as a
from rbak.format.amqp10 import Value

CASES = [
    (a.encode_null(), Value("null", None)),
    (a.encode_bool(True), Value("boolean", True)),
    (a.encode_bool(False), Value("boolean", False)),
    (a.encode_ubyte(255), Value("ubyte", 255)),
    (a.encode_uint(2**32 - 1), Value("uint", 2**32 - 1)),
    (a.encode_short(-7), Value("short", -7)),
    (a.encode_long(-(2**63)), Value("long", -(2**63))),
    (a.encode_float(1.5), Value("float", 1.5)),
    (a.encode_double(-2.25), Value("double", -2.25)),
    (a.encode_timestamp(1_700_000_000_123), Value("timestamp", 1_700_000_000_123)),
    (a.encode_binary(b"\x00\xff"), Value("binary", b"\x00\xff")),
    (a.encode_binary(b"x" * 300), Value("binary", b"x" * 300)),  # vbin32
    (a.encode_utf8("héllo"), Value("utf8", "héllo".encode())),
    (a.encode_symbol("s" * 256), Value("symbol", b"s" * 256)),  # sym32
]


@pytest.mark.parametrize("data,want", CASES, ids=[f"{w.type}-{len(d)}" for d, w in CASES])
def test_each_encoder_decodes_back(data, want):
    assert a.decode_value(data) == (want, len(data))


@pytest.mark.parametrize("n", [3, 200])  # list8 / list32 (more than 255 bytes)
def test_sections_decode_back(n):
    fields = [a.encode_utf8(f"f{i}") for i in range(n)] + [None, None]  # trailing nulls are dropped
    props = a.list_section(a.PROPERTIES, list(fields))
    app = a.map_section(a.APPLICATION_PROPERTIES, [(a.encode_utf8("k"), a.encode_long(1))])
    body = a.data_section(b"b" * n)
    got = a.decode_all(props + app + body)
    assert [pos for pos, _ in got] == [0, len(props), len(props) + len(app)]
    kinds = [v for _, v in got]
    assert kinds[0] == Value("described", (Value("ulong", a.PROPERTIES),
                                           Value("list", tuple(Value("utf8", f"f{i}".encode()) for i in range(n)))))
    assert kinds[1].value[1] == Value("map", ((Value("utf8", b"k"), Value("long", 1)),))
    assert kinds[2].value == (Value("ulong", a.DATA), Value("binary", b"b" * n))
