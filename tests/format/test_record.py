"""Record JSON: exact writer (spec field order, compact), lenient reader."""

from __future__ import annotations

import json
import os

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbak.errors import SerializationError
from rbak.format.batch import decode_records, encode_records
from rbak.format.record import (
    Array, BackupProperties, BackupRecord, Bool, Bytes, Double, Float, Long, LongString, Short,
    ShortString, Table, Timestamp, Void, decode_record, encode_record,
)

from .strategies import records

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
                                 b'{"body":"', b"\xff\xfe"])
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

    with_c = batch.encode_records(rs)
    decoded_c = batch.decode_records(with_c)
    saved = batch._c_join, batch._c_split
    batch._c_join = batch._c_split = None
    try:
        assert batch.encode_records(rs) == with_c == [encode_record(r) for r in rs]
        assert batch.decode_records(with_c) == decoded_c
    finally:
        batch._c_join, batch._c_split = saved
