"""Record JSON: exact writer (spec field order, compact), lenient reader."""

from __future__ import annotations

import json
import shutil
import os

import orjson
import pytest
from rbak.format import backend
from support.require import unavailable
from hypothesis import given, settings
from hypothesis import strategies as st

from rbak.errors import SerializationError
from rbak.format.batch import decode_records, encode_records
from rbak.format.record import (
    Array, BackupProperties, BackupRecord, Bool, Bytes, Double, Float, Long, LongString, Short,
    ShortString, Table, Timestamp, Void, decode_record, encode_record, record_to_json_obj,
)

from .strategies import properties, records

SPEC_RECORD = {  # the example record of segment-format.md / storage-format.md
    "body": [104, 101, 108, 108, 111],
    "properties": {
        "content_type": "application/json", "content_encoding": None, "delivery_mode": 2, "priority": None,
        "correlation_id": "corr-123", "reply_to": None, "expiration": None, "message_id": "msg-456",
        "timestamp": 1712756400, "type_field": "order.created", "user_id": None, "app_id": "my-service",
        "cluster_id": None,
    },
    "headers": [["x-retry-count", {"Long": 3}], ["x-source", {"LongString": "api-gateway"}]],
    "exchange": "orders.exchange", "routing_key": "order.created", "delivery_tag": 42,
    "redelivered": False, "backed_up_at": 1712756400123, "source_queue": "orders", "source_vhost": "/",
}


def spec_record() -> BackupRecord:
    return BackupRecord(
        body=b"hello",
        properties=BackupProperties(
            content_type="application/json", delivery_mode=2, correlation_id="corr-123", message_id="msg-456",
            timestamp=1712756400, type_field="order.created", app_id="my-service",
        ),
        headers=(("x-retry-count", Long(3)), ("x-source", LongString("api-gateway"))),
        exchange="orders.exchange", routing_key="order.created", delivery_tag=42, redelivered=False,
        backed_up_at=1712756400123, source_queue="orders", source_vhost="/",
    )


def test_spec_example_encodes_exactly_as_serde_compact():
    expected = json.dumps(SPEC_RECORD, separators=(",", ":")).encode()
    assert encode_record(spec_record()) == expected
    assert encode_records([spec_record()]) == [expected]


def test_spec_example_decodes():
    assert decode_record(json.dumps(SPEC_RECORD).encode()) == spec_record()


def test_every_header_variant_json_form_and_round_trip():
    headers = (
        ("ls", LongString("v")), ("ss", ShortString("s")), ("l", Long(-(2**63))), ("s", Short(-5)),
        ("b", Bool(True)), ("by", Bytes(b"\x00\xff")), ("ts", Timestamp(1712756400)),
        ("f", Float(3.14)), ("d", Double(3.14159)), ("v", Void()),
        ("t", Table((("inner", Array((Long(1), Void(), Table((("x", Bool(False)),))))),))),
        ("a", Array(())), ("et", Table(())),
    )
    r = BackupRecord(body=b"x", headers=headers)
    obj = orjson.loads(encode_record(r))
    assert obj["headers"] == [
        ["ls", {"LongString": "v"}], ["ss", {"ShortString": "s"}], ["l", {"Long": -(2**63)}],
        ["s", {"Short": -5}], ["b", {"Bool": True}], ["by", {"Bytes": [0, 255]}],
        ["ts", {"Timestamp": 1712756400}], ["f", {"Float": 3.14}], ["d", {"Double": 3.14159}],
        ["v", "Void"], ["t", {"Table": [["inner", {"Array": [{"Long": 1}, "Void", {"Table": [["x", {"Bool": False}]]}]}]]}],
        ["a", {"Array": []}], ["et", {"Table": []}],
    ]
    # Float is written as the shortest f32 repr ("3.14"), as serde_json writes an f32.
    assert b'{"Float":3.14}' in encode_record(r)
    back = decode_record(encode_record(r))
    assert back.headers[7][1] == Float(pytest.approx(3.14, rel=1e-6))
    assert back.headers[:7] == headers[:7] and back.headers[8:] == headers[8:]


def test_empty_body_is_null_and_reads_back_empty():
    r = BackupRecord(body=b"")
    data = encode_record(r)
    assert data.startswith(b'{"body":null,')
    assert decode_record(data).body == b""
    assert decode_records([data])[0].body == b""


@pytest.mark.parametrize("body", [b"", b"\x00\x01\xfe\xff", bytes(range(256)), "ünïcødé".encode("utf-16"),
                                  os.urandom(16 * 1024 * 1024)], ids=["empty", "binary", "all-bytes", "utf16", "16MiB"])
def test_bodies_round_trip_on_both_paths(body):
    r = BackupRecord(body=body, source_queue="q")
    data = encode_record(r)
    assert encode_records([r]) == [data]
    assert decode_record(data).body == body
    assert decode_records([data])[0].body == body


def test_reader_is_lenient():
    raw = {
        "source_vhost": "v", "extra_field": {"ignored": True}, "body": [], "headers": None,
        "properties": {"content_type": "text/plain", "future_property": 1}, "backed_up_at": 5,
    }
    r = decode_record(json.dumps(raw, indent=3).encode())
    assert (r.body, r.source_vhost, r.properties.content_type, r.headers, r.backed_up_at) == (b"", "v", "text/plain", (), 5)
    spaced = b'{ "body" : [ 1 , 2 ] , "source_queue" : "q" }'
    assert decode_records([spaced])[0] == decode_record(spaced) == BackupRecord(body=b"\x01\x02", source_queue="q")


@pytest.mark.parametrize("raw", [b"[1,2]", b"{", b'{"body":[256]}', b'{"body":[1,-1]}', b'{"headers":[["k",{"Nope":1}]]}',
                                 b'{"body":"', b"\xff\xfe", b'{"body":[01,2],"exchange":"x"}',
                                 b'{"body":[1,2,],"exchange":"x"}', b'{"body":[1,,2],"exchange":"x"}'])
def test_malformed_records_raise_our_error(raw):
    with pytest.raises(SerializationError):
        decode_record(raw)
    with pytest.raises(SerializationError, match="record 0"):
        decode_records([raw])


@settings(max_examples=150, deadline=None)
@given(records)
def test_round_trip_and_fast_paths_agree(r):
    data = encode_record(r)
    assert encode_records([r]) == [data]
    back = decode_record(data)
    assert decode_records([data]) == [back]
    assert encode_record(back) == data  # a second trip is byte-identical
    assert back.body == r.body and back.properties == r.properties
    assert (back.exchange, back.routing_key, back.delivery_tag, back.backed_up_at) == (
        r.exchange, r.routing_key, r.delivery_tag, r.backed_up_at)


@settings(max_examples=60, deadline=None)
@given(st.lists(records, max_size=6))
def test_pure_python_fallback_matches_the_c_helper(rs):
    """Without a compiler the install uses the NumPy/orjson paths: same bytes, same records."""
    import rbak.format.batch as batch

    need_c_helper()

    hooks = ("_c_join", "_c_split", "_c_decode_many", "_c_decode_payload", "_c_encode_many", "_c_encode_payload")
    with_c = batch.encode_records(rs)
    decoded_c = batch.decode_records(with_c)
    payload = b"".join(len(j).to_bytes(4, "little") + j for j in with_c)
    assert batch.encode_payload(rs) == payload
    assert batch.decode_payload_records(payload) == decoded_c
    saved = {h: getattr(batch, h) for h in hooks}
    for h in hooks:
        setattr(batch, h, None)
    try:
        assert batch.encode_records(rs) == with_c == [encode_record(r) for r in rs]
        assert batch.encode_payload(rs) == payload
        assert batch.decode_records(with_c) == decoded_c
        assert batch.decode_payload_records(payload) is None  # the caller's Python loop takes over
    finally:
        for h, f in saved.items():
            setattr(batch, h, f)


# --------------------------------------------------------------------------
# The C codec (batch.py's encode_many/decode_payload) against orjson, which
# stays the reference: same bytes out, same records back.
# --------------------------------------------------------------------------

scalar_headers = st.lists(
    st.tuples(st.text(max_size=60), st.one_of(
        st.text(max_size=60).map(LongString), st.text(max_size=8).map(ShortString),
        st.integers(-(2**63), 2**63 - 1).map(Long), st.integers(-(2**15), 2**15 - 1).map(Short),
        st.booleans().map(Bool), st.integers(0, 2**63 - 1).map(Timestamp),
    )), max_size=5).map(tuple)
canonical_records = st.builds(
    BackupRecord, body=st.binary(max_size=200), properties=properties, headers=scalar_headers,
    exchange=st.text(max_size=60), routing_key=st.text(), delivery_tag=st.integers(0, 2**64 - 1),
    redelivered=st.booleans(), backed_up_at=st.integers(0, 2**63 - 1),
    source_queue=st.text(max_size=60), source_vhost=st.text(max_size=5),
)


def _orjson_reference(r: BackupRecord) -> bytes:
    return orjson.dumps(record_to_json_obj(r), option=orjson.OPT_SERIALIZE_NUMPY)


@settings(max_examples=300, deadline=None)
@given(st.lists(canonical_records, min_size=1, max_size=4))
def test_c_codec_matches_orjson_on_canonical_records(rs):
    import rbak.format.batch as batch

    need_c_helper()
    encoded = batch._c_encode_many(rs)
    assert None not in encoded  # all of these take the C path...
    assert encoded == [_orjson_reference(r) for r in rs]  # ...and write orjson's exact bytes
    assert batch._c_encode_payload(rs) == b"".join(len(j).to_bytes(4, "little") + j for j in encoded)
    assert batch._c_decode_many(encoded) == [decode_record(j) for j in encoded] == rs


STRINGS = [
    "".join(map(chr, range(0x80))),  # every ASCII character, controls included
    'quote " backslash \\ slash / del \x7f', "ünïcødé ✓ \u2028\u2029 😀 \U0010ffff", "x" * 49, "",
]


@pytest.mark.parametrize("s", STRINGS, ids=range(len(STRINGS)))
def test_c_codec_strings(s):
    r = BackupRecord(body=s.encode(), properties=BackupProperties(message_id=s), headers=((s, LongString(s)),),
                     exchange=s, routing_key=s, source_queue=s, source_vhost=s)
    data = encode_records([r])[0]
    assert data == _orjson_reference(r)
    assert decode_records([data]) == [r]


def test_c_decoder_reads_other_writers_escapes_like_orjson():
    base = encode_record(BackupRecord(body=b"a", exchange="EX"))
    for escaped in (rb'\u00e9\/\n', rb'\ud83d\ude00', rb'\u0041\"\\', rb'\t\b\f\r'):
        raw = base.replace(b'"EX"', b'"' + escaped + b'"')
        assert decode_records([raw])[0].exchange == orjson.loads(raw)["exchange"]
    for bad in (rb'\ud83d', rb'\x41', rb'\u12'):  # lone surrogate, bad escapes: the lenient path's error
        with pytest.raises(SerializationError, match="record 0"):
            decode_records([base.replace(b'"EX"', b'"' + bad + b'"')])


def test_c_codec_integer_limits_and_fallbacks():
    edge = BackupRecord(body=b"\x00", headers=(("min", Long(-(2**63))), ("max", Long(2**63 - 1))),
                        delivery_tag=2**64 - 1, backed_up_at=0)
    data = encode_records([edge])[0]
    assert data == _orjson_reference(edge) and decode_records([data]) == [edge]
    with pytest.raises(SerializationError):  # beyond u64: orjson's error, via the fallback
        encode_records([BackupRecord(delivery_tag=2**64)])
    too_big = data.replace(b'"delivery_tag":18446744073709551615', b'"delivery_tag":18446744073709551616')
    assert decode_records([too_big])[0].delivery_tag == orjson.loads(too_big)["delivery_tag"]  # orjson decides
    leading_zero = data.replace(b'"backed_up_at":0', b'"backed_up_at":007')
    with pytest.raises(SerializationError, match="record 0"):
        decode_records([leading_zero])
    # A float where an int is expected, and a non-scalar header: both decoded by the lenient path.
    floaty = data.replace(b'"backed_up_at":0', b'"backed_up_at":1.5')
    assert decode_records([floaty])[0].backed_up_at == 1.5
    mixed = [edge, BackupRecord(body=b"x", headers=(("t", Table((("k", Void()),))),)), edge]
    enc = encode_records(mixed)
    assert enc == [_orjson_reference(r) for r in mixed]
    assert decode_records(enc) == mixed


def need_c_helper() -> None:
    """C-only tests: skipped when RBAK_SPEEDUPS=0 chose pure Python, unavailable when never built."""
    if backend.speedups is None:
        if backend.BUILT:
            pytest.skip("RBAK_SPEEDUPS=0: the pure-Python backend is under test")
        unavailable("rbak was built without the C helper (no compiler at install time)")


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_install_built_the_c_helper():
    """With a compiler present (CI, the image's build stage) the install must
    have built _speedups: a silent fallback would only show as a slow codec."""
    assert backend.BUILT, "rbak.format._speedups was not built by `pip install`"


def test_c_decoder_never_accepts_what_orjson_rejects():
    """Random damage to canonical records: whatever the C decoder still builds,
    orjson must read as valid JSON giving the same record (else it must hand
    the record over to the lenient path, which raises)."""
    import random

    import rbak.format.batch as batch

    need_c_helper()
    rnd = random.Random(7)
    base = encode_records([
        BackupRecord(body=bytes(range(40)), properties=BackupProperties(message_id="m", priority=3),
                     headers=(("k", LongString('q"\\\n\u00e9')), ("n", Long(-5)), ("b", Bool(True))),
                     exchange="ex", routing_key="rk", delivery_tag=9, backed_up_at=12, source_queue="q"),
        BackupRecord(body=b""),
    ])
    alphabet = b'{}[]":,0123456789-.eEtrufalsn\\u \x00\xff'
    built = 0
    for _ in range(20000):
        raw = bytearray(rnd.choice(base))
        i = rnd.randrange(len(raw))
        op = rnd.random()
        if op < 0.5:
            raw[i] = rnd.choice(alphabet)
        elif op < 0.75:
            del raw[i : i + rnd.randint(1, 3)]
        else:
            raw[i:i] = bytes([rnd.choice(alphabet)])
        rec = batch._c_decode_many([bytes(raw)])[0]
        if rec is not None:
            built += 1
            assert decode_record(bytes(raw)) == rec, bytes(raw)
    assert built > 500  # the mutations do reach the C path
