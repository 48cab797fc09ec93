"""The one AMQP 0-9-1 property / field-table codec (rbak.format.amqp091).

Table-driven per field type (RabbitMQ's rabbit_binary_parser dialect), strict
truncation at every byte, and decode(encode(v)) round trips.
"""

from __future__ import annotations

import math
import re
import struct
from decimal import Decimal

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbak.errors import PropertiesError, RbakError, SerializationError
from rbak.format import amqp091
from rbak.format.amqp091 import (FIELD_TYPES, decode_basic_properties, decode_table, encode_basic_properties, encode_table, header_equal, parse_table, read_back)
from rbak.format.record import (
    VOID, Array, BackupProperties, Bool, Bytes, Double, Float, Long, LongString, Short, ShortString,
    Table, Timestamp, decimal_header,
)
from rbak.offline.rabbitmq import amqp_props
from rbak.offline.rabbitmq.erlang_terms import Atom

from .strategies import header_values, properties, text


def entry(key: str, wire: bytes) -> bytes:
    k = key.encode()
    return bytes([len(k)]) + k + wire


def table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def sized(t: bytes, payload: bytes) -> bytes:
    return t + struct.pack(">I", len(payload)) + payload


# (type octet + payload as RabbitMQ writes it, the variant it reads as)
WIRE_CASES = [
    (sized(b"S", "héllo ✓".encode()), LongString("héllo ✓")),
    (sized(b"S", b""), LongString("")),
    (sized(b"S", b"\xff\xfe"), Bytes(b"\xff\xfe")),  # not UTF-8: kept as bytes
    (sized(b"x", b"\x00\x01\x02"), Bytes(b"\x00\x01\x02")),
    (b"b" + struct.pack(">b", -128), Short(-128)),
    (b"B" + b"\xff", Short(255)),
    (b"s" + struct.pack(">h", -300), Short(-300)),
    (b"u" + struct.pack(">H", 5), Long(5)),  # u16: Long whatever the value
    (b"u" + struct.pack(">H", 65535), Long(65535)),
    (b"I" + struct.pack(">i", -70000), Long(-70000)),
    (b"i" + struct.pack(">I", 4_000_000_000), Long(4_000_000_000)),
    (b"l" + struct.pack(">q", -(2**63)), Long(-(2**63))),
    (b"L" + b"\xff" * 8, Long(-1)),  # RabbitMQ reads L as signed too
    (b"f" + struct.pack(">f", 1.5), Float(1.5)),
    (b"d" + struct.pack(">d", -2.25), Double(-2.25)),
    (b"D" + b"\x02" + struct.pack(">I", 12345), decimal_header(2, 12345)),
    (b"D" + b"\x02" + b"\xff\xff\xff\xff", decimal_header(2, -1)),  # signed, as pika and the Java client
    (b"D" + b"\x00" + struct.pack(">I", 7), decimal_header(0, 7)),
    (b"t\x00", Bool(False)),
    (b"t\x01", Bool(True)),
    (b"t\x02", Bool(True)),  # RabbitMQ: Value /= 0
    (b"T" + struct.pack(">Q", 2**64 - 1), Timestamp(2**64 - 1)),
    (b"V", VOID),
    (b"F" + table(), Table(())),
    (b"F" + table(entry("a", b"V"), entry("a", b"t\x01")), Table((("a", VOID), ("a", Bool(True))))),
    (sized(b"A", b""), Array(())),
    (sized(b"A", b"b\x01" + b"F" + table(entry("k", sized(b"A", b"V"))) + sized(b"x", b"z")),
     Array((Short(1), Table((("k", Array((VOID,))),)), Bytes(b"z")))),
]


@pytest.mark.parametrize("wire,variant", WIRE_CASES, ids=[repr(w[:1]) for w, _ in WIRE_CASES])
def test_every_field_type_reads_as_its_variant_in_tables_arrays_and_properties(wire, variant):
    assert decode_table(table(entry("k", wire))) == (("k", variant),)
    assert decode_table(table(entry("k", sized(b"A", wire + wire)))) == (("k", Array((variant, variant))),)
    props = struct.pack(">H", amqp091.FLAG_HEADERS) + table(entry("k", wire))
    assert decode_basic_properties(props) == (BackupProperties(), (("k", variant),))
    # What the restore sends back reads as the same variant (D and non-UTF-8 aside: see the docstring).
    assert decode_table(encode_table((("k", variant),))) == (("k", variant),)


def test_the_docstring_table_lists_exactly_the_accepted_types():
    rows = re.findall(r"^(\S(?: \S)?)\s{2,}\S", amqp091.__doc__.split("====\n", 2)[2], re.M)
    documented = {c for row in rows for c in row.split() if len(c) == 1}
    assert documented == set(FIELD_TYPES) == set("SxbBsuIilLtTfdDVFA")
    assert {w[:1].decode() for w, _ in WIRE_CASES} == set(FIELD_TYPES)


@pytest.mark.parametrize("octet", [b"U", b"Z", b"\x00", b"c", b"\xff"])
def test_a_type_rabbitmq_does_not_parse_is_refused_naming_the_field_and_offset(octet):
    data = table(entry("outer", sized(b"A", b"l" + bytes(8) + b"F" + table(entry("x", octet + b"\x00\x00")))))
    with pytest.raises(PropertiesError) as e:
        decode_table(data)
    assert e.value.field == "table['outer'][1]['x']"
    assert e.value.offset == len(data) - 3  # the type octet
    assert "unknown field type" in str(e.value) and isinstance(e.value, RbakError)


def test_lengths_may_not_run_past_their_table():
    inner = b"F" + struct.pack(">I", 10) + entry("a", b"V")  # says 10, has 3
    data = table(entry("t", inner))
    with pytest.raises(PropertiesError, match=r"'F' value of 10 bytes runs past its end: 3 left in table\['t'\]"):
        decode_table(data)
    with pytest.raises(PropertiesError, match="table length says 3 bytes, 4 follow"):
        decode_table(struct.pack(">I", 3) + entry("a", b"V") + b"\x00")


def every_type_properties() -> tuple[bytes, BackupProperties, tuple]:
    headers = tuple((f"h{i}", v) for i, (_, v) in enumerate(WIRE_CASES))
    body = b"".join(entry(f"h{i}", w) for i, (w, _) in enumerate(WIRE_CASES))
    props = BackupProperties("text/plain", "gzip", 2, 9, "c", "r", "60000", "id", 1_700_000_000, "t", "u", "a", "cl")
    raw = encode_basic_properties(props, (("x", VOID),))
    # Splice the hand-written table in place of the encoder's one-entry table.
    small = encode_table((("x", VOID),))
    i = raw.index(small)
    return raw[:i] + struct.pack(">I", len(body)) + body + raw[i + len(small):], props, headers


def test_properties_with_every_field_type_decode():
    raw, props, headers = every_type_properties()
    assert decode_basic_properties(raw) == (props, headers)
    assert amqp_props.decode_properties(raw) == (props, headers)


def test_truncation_at_every_byte_raises_our_error_with_an_offset_inside_the_input():
    raw, _, _ = every_type_properties()
    for k in range(len(raw)):
        with pytest.raises(PropertiesError) as e:
            decode_basic_properties(raw[:k])
        assert 0 <= e.value.offset <= k, (k, str(e.value))
    with pytest.raises(PropertiesError, match="1 bytes left after the last property"):
        decode_basic_properties(raw + b"\x00")


def test_a_table_cut_inside_any_entry_fails_and_cut_between_entries_is_the_shorter_table():
    body = b"".join(entry(f"h{i}", w) for i, (w, _) in enumerate(WIRE_CASES))
    bounds, pos = {0: 0}, 0
    for i, (w, _) in enumerate(WIRE_CASES):
        pos += len(entry(f"h{i}", w))
        bounds[pos] = i + 1
    for k in range(len(body) + 1):
        if k in bounds:
            assert len(parse_table(body[:k])) == bounds[k]
            continue
        with pytest.raises(PropertiesError) as e:
            parse_table(body[:k])
        assert 0 <= e.value.offset <= k and e.value.field.startswith("table"), (k, str(e.value))
        if e.value.field != "table":  # the value's type octet was read: the entry is named
            assert re.fullmatch(r"table\['h\d+'\](\[.*\])?", e.value.field)


def test_each_property_names_itself_when_truncated():
    p = BackupProperties(content_type="ct", delivery_mode=2, timestamp=5, cluster_id="c")
    raw = encode_basic_properties(p, (("k", Long(1)),))
    seen = set()
    for k in range(len(raw)):
        with pytest.raises(PropertiesError) as e:
            decode_basic_properties(raw[:k])
        seen.add(e.value.field.split("[")[0])
    assert {"flags", "content_type", "headers", "delivery_mode", "timestamp", "cluster_id"} <= seen


def test_reserved_flag_bits_are_ignored_as_rabbitmq_does():
    assert decode_basic_properties(b"\x00\x03") == (BackupProperties(), None)
    assert decode_basic_properties(b"\x80\x01\x01a") == (BackupProperties(content_type="a"), None)
    assert decode_basic_properties(b"\x00\x00") == (BackupProperties(), None)
    assert amqp_props.decode_properties(b"\x00\x00") == (BackupProperties(), ())
    assert decode_basic_properties(encode_basic_properties(BackupProperties(), ())) == (BackupProperties(), None)


def test_non_utf8_short_strings_encode_back_to_their_bytes():
    name = b"\xffk"
    raw = (struct.pack(">H", amqp091.FLAG_HEADERS | amqp091.FLAG_MESSAGE_ID)
           + table(bytes([len(name)]) + name + b"V") + b"\x02\xfe\x41")
    p, h = decode_basic_properties(raw)
    assert encode_basic_properties(p, h) == raw


def test_decoded_p_basic_terms_use_the_same_mapping_as_the_binary():
    for letter, atom, layout, variant in amqp091.NUMERIC_TYPES:
        v = 1.5 if variant in (Float, Double) else 7
        wire = letter.encode() + struct.pack(layout, v)
        assert amqp_props.table_from_terms([(b"k", Atom(atom), v)]) == decode_table(table(entry("k", wire)))
    assert amqp_props.table_from_terms([(b"k", Atom("decimal"), (2, 12345))]) == (("k", decimal_header(2, 12345)),)
    # RabbitMQ keeps the 32 bits unsigned in its terms; rbak reads them signed, as from the wire
    assert (amqp_props.table_from_terms([(b"k", Atom("decimal"), (3, 2**32 - 1))])
            == decode_table(table(entry("k", b"D\x03\xff\xff\xff\xff"))) == (("k", decimal_header(3, -1)),))


def test_values_that_do_not_fit_fail_naming_the_header():
    with pytest.raises(SerializationError, match=r"headers\.outer\.inner: Short 40000"):
        encode_table((("outer", Table((("inner", Short(40000)),))),))
    with pytest.raises(SerializationError, match="message_id: 300 bytes"):
        encode_basic_properties(BackupProperties(message_id="x" * 300), ())
    with pytest.raises(SerializationError, match="Float 1e\\+40"):
        encode_table((("f", Float(1e40)),))
    with pytest.raises(SerializationError, match=r"headers\.a\[1\]: Long"):
        encode_table((("a", Array((Long(1), Long(2**63)))),))
    with pytest.raises(SerializationError, match="priority: 256 is not an octet"):
        encode_basic_properties(BackupProperties(priority=256), ())


# --------------------------------------------------------------------------
# Round trips.
# --------------------------------------------------------------------------

EXTREMES = [
    Long(-(2**63)), Long(2**63 - 1), Short(-32768), Short(32767), Timestamp(0), Timestamp(2**64 - 1),
    Float(math.nan), Float(math.inf), Float(-0.0), Float(3.4028234663852886e38), Double(math.nan),
    Double(-math.inf), Double(5e-324), LongString("\x00ü🐇" * 100), Bytes(bytes(range(256))),
    ShortString("s" * 300), Table((("", VOID), ("k" * 255, Bool(False)))), Array((Array(()), Table(()))),
]


@pytest.mark.parametrize("v", EXTREMES, ids=repr)
def test_extreme_values_round_trip(v):
    p = BackupProperties(timestamp=2**64 - 1, priority=255, delivery_mode=0, message_id="m" * 255)
    got = decode_basic_properties(encode_basic_properties(p, (("k", v),)))
    assert got[0] == p and header_equal(got[1][0][1], read_back(v))


@settings(max_examples=300, deadline=None)
@given(properties, st.lists(st.tuples(text, header_values), max_size=6))
def test_decode_of_encode_gives_every_property_and_header_back(props, pairs):
    headers = tuple(pairs)
    got_props, got_headers = decode_basic_properties(encode_basic_properties(props, headers))
    assert got_props == props
    if not headers:
        assert got_headers is None
    else:
        assert header_equal(Table(got_headers), read_back(Table(headers)))
    assert header_equal(Table(decode_table(encode_table(headers))), read_back(Table(headers)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(text, header_values), max_size=4), st.data())
def test_damaged_encodings_decode_or_raise_our_error_and_nothing_else(pairs, data):
    raw = bytearray(encode_basic_properties(BackupProperties(message_id="m"), tuple(pairs)))
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        decode_basic_properties(bytes(raw[:cut]))
    except PropertiesError as e:
        assert 0 <= e.offset <= cut


def test_header_equal_compares_floats_as_sent():
    assert header_equal(Double(math.nan), Double(math.nan))
    assert header_equal(Float(0.1), Float(float(struct.unpack(">f", struct.pack(">f", 0.1))[0])))
    assert not header_equal(Long(1), Short(1))


@pytest.mark.parametrize("value", [
    Decimal("-0.001"), Decimal("0.001"), Decimal(0), Decimal("-0"), Decimal("123.45"), Decimal(7),
    Decimal(2**31 - 1), Decimal(-(2**31)), Decimal("-2147483648E-255"), Decimal("2147483647E-255"),
    Decimal("1E-255"), Decimal("-1E-9"), Decimal("-21474.83648"),
])
def test_decimal_headers_keep_pika_s_bytes_and_value(value):
    """A ``D`` header as pika writes it comes back as the same bytes and the same Decimal, through the
    stored record (its JSON form uses the spec's variants only: a Table of a Short and a Long)."""
    from pika.data import decode_table as pika_decode
    from pika.data import encode_table as pika_encode

    from rbak.format.record import decimal_parts, header_value_from_json, header_value_to_json

    out: list[bytes] = []
    pika_encode(out, {"d": value})
    wire = b"".join(out)
    headers = decode_table(wire)
    ((_, stored),) = headers
    parts = decimal_parts(stored)
    assert parts is not None and parts[1] == int(value.scaleb(parts[0]))
    as_json = orjson.loads(orjson.dumps(header_value_to_json(stored), option=orjson.OPT_SERIALIZE_NUMPY))
    assert as_json == {"Table": [["rbak:decimal", {"Array": [{"Short": parts[0]}, {"Long": parts[1]}]}]]}
    assert header_value_from_json(as_json) == stored
    assert encode_table(headers) == wire
    back, _ = pika_decode(encode_table(headers), 0)
    assert back["d"] == value and back["d"].as_tuple().sign == (parts[1] < 0)


def test_only_the_exact_decimal_shape_is_sent_as_d():
    """A user's table that merely looks like one (wrong types, extra keys, value out of i32) stays a table."""
    for v in (Table((("rbak:decimal", Array((Short(3), Long(2**31)))),)),
              Table((("rbak:decimal", Array((Long(3), Long(1)))),)),
              Table((("rbak:decimal", Array((Short(3), Long(1)))), ("x", Long(1)))),
              Table((("rbak:decimal", Array((Short(256), Long(1)))),))):
        assert encode_table((("k", v),))[4 + 2] == ord("F")
