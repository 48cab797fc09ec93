"""A delivery as pika hands it becomes the record the core encodes and decodes back unchanged."""

from __future__ import annotations


import pika.spec
from hypothesis import given, settings, strategies as st

from rbak.backup.convert import to_record
from rbak.broker.deliveries import KeptProperties
from rbak.format.record import Float, Long, decode_record, encode_record

short = st.one_of(st.none(), st.text(max_size=20))


def _received(props: pika.spec.BasicProperties) -> pika.spec.BasicProperties:
    """What a delivery carries: pika's decode of the wire bytes, raw bytes kept (``KeptProperties``)."""
    return KeptProperties(b"".join(props.encode()))


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), ct=short, mid=short, app=short, prio=st.one_of(st.none(), st.integers(0, 9)),
       ts=st.one_of(st.none(), st.integers(0, 2**40)), red=st.booleans(), tag=st.integers(1, 2**40),
       rk=st.text(max_size=30))
def test_delivery_round_trips_through_the_record(body, ct, mid, app, prio, ts, red, tag, rk):
    props = _received(pika.spec.BasicProperties(content_type=ct, message_id=mid, app_id=app, priority=prio,
                                                timestamp=ts, delivery_mode=2))
    method = pika.spec.Basic.Deliver("ctag", tag, red, "ex", rk)
    rec = to_record(method, props, body, "vh", "q", 1_700_000_000_123)
    back = decode_record(encode_record(rec))
    assert back == rec
    assert back.body == body


def test_typed_headers_survive_pika():
    """pika would truncate the float and merge int widths; the raw path keeps both."""
    from rbak.format.amqp091 import encode_basic_properties
    from rbak.format.record import BackupProperties

    raw = encode_basic_properties(BackupProperties(delivery_mode=1), (("f", Float(2.5)), ("n", Long(-(2**62)))))
    props = KeptProperties(raw)
    rec = decode_record(encode_record(to_record(pika.spec.Basic.Deliver("c", 1, False, "", "q"), props, b"x", "/", "q", 1)))
    assert rec.headers == (("f", Float(2.5)), ("n", Long(-(2**62))))


def test_header_decode_memo_gives_each_message_its_own_decoding():
    """Deliveries with the same header bytes share one typed decode; different bytes (another value,
    another header set dropped) never get a cached one that is not theirs, and a full memo is cleared."""
    from rbak.backup import convert
    from rbak.format.amqp091 import encode_basic_properties
    from rbak.format.record import BackupProperties, Short

    def delivered(headers, **kw):
        return KeptProperties(encode_basic_properties(BackupProperties(**kw), headers))

    m = pika.spec.Basic.Deliver("c", 1, False, "", "q")
    convert._DECODED.clear()
    a1 = to_record(m, delivered((("x-delivery-count", Long(1)),), delivery_mode=2), b"a", "/", "q", 1)
    a2 = to_record(m, delivered((("x-delivery-count", Long(1)),), delivery_mode=2), b"b", "/", "q", 2)
    b = to_record(m, delivered((("x-delivery-count", Long(2)),), delivery_mode=2), b"c", "/", "q", 3)
    c = to_record(m, delivered((("x-delivery-count", Short(2)),), delivery_mode=1), b"d", "/", "q", 4)
    s = to_record(m, delivered((("x-stream-offset", Long(7)), ("k", Long(2))),), b"e", "/", "q", 5,
                  drop_headers=frozenset({"x-stream-offset"}))
    s2 = to_record(m, delivered((("x-stream-offset", Long(7)), ("k", Long(2))),), b"e", "/", "q", 5)
    assert a1.headers == a2.headers == (("x-delivery-count", Long(1)),)
    assert b.headers == (("x-delivery-count", Long(2)),)
    assert c.headers == (("x-delivery-count", Short(2)),) and c.properties.delivery_mode == 1
    assert s.headers == (("k", Long(2)),) and s2.headers == (("x-stream-offset", Long(7)), ("k", Long(2)))
    for i in range(convert.DECODED_CACHE + 5):
        r = to_record(m, delivered((("n", Long(i)),)), b"", "/", "q", 1)
        assert r.headers == (("n", Long(i)),)
    assert len(convert._DECODED) <= convert.DECODED_CACHE


def test_headerless_memo_equals_pika_fields():
    """Header-less deliveries: the memoised properties are exactly those built from pika's fields,
    distinct raw bytes never share, and a stream's dropped headers are never memoised."""
    from rbak.backup import convert
    from rbak.format.amqp091 import encode_basic_properties
    from rbak.format.record import BackupProperties

    def delivered(headers=None, **kw):
        return KeptProperties(encode_basic_properties(BackupProperties(**kw), headers))

    m = pika.spec.Basic.Deliver("c", 7, True, "ex", "rk")
    convert._DECODED.clear()
    kws = [dict(content_type="text/plain", delivery_mode=2), dict(content_type="text/plain", delivery_mode=1),
           dict(message_id="m-1", priority=3, timestamp=1_700_000_000), dict()]
    for kw in kws * 2:
        rec = to_record(m, delivered(**kw), b"x", "/", "q", 5)
        assert rec.properties == BackupProperties(**kw) and rec.headers == ()
        assert (rec.delivery_tag, rec.redelivered, rec.exchange, rec.routing_key) == (7, True, "ex", "rk")
    assert len(convert._DECODED) == len(kws)
    convert._DECODED.clear()
    s = to_record(m, delivered((("x-stream-offset", Long(9)),), delivery_mode=2), b"x", "/", "q", 5,
                  drop_headers=frozenset({"x-stream-offset"}), stream_offset=9)
    assert s.headers == () and s.delivery_tag == 9 and s.properties == BackupProperties(delivery_mode=2)
    assert len(convert._DECODED) == 0


def test_a_header_pika_cannot_decode_is_kept_exactly():
    """pika's decoder fails on a NaN float: the properties say so, and the record decodes the raw bytes."""
    import math

    from rbak.format.amqp091 import encode_basic_properties
    from rbak.format.record import BackupProperties, Double

    raw = encode_basic_properties(BackupProperties(message_id="m"), (("nan", Double(math.nan)), ("f", Float(0.5))))
    props = KeptProperties(raw)
    assert props.undecodable and props.raw == raw
    rec = to_record(pika.spec.Basic.Deliver("c", 1, False, "", "q"), props, b"x", "/", "q", 1)
    assert rec.properties == BackupProperties(message_id="m")
    assert rec.headers[1] == ("f", Float(0.5)) and rec.headers[0][0] == "nan" and math.isnan(rec.headers[0][1].value)
