"""Which records AMQP 1.0 carries exactly, how they are encoded, and which protocol a queue gets (no broker)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rbak.format.record import (
    VOID,
    Array,
    BackupProperties,
    Bool,
    Bytes,
    Double,
    Float,
    Long,
    LongString,
    Short,
    ShortString,
    Table,
    Timestamp,
)
from rbak.format.amqp10 import data_section, decode_all, decode_bare_message
from rbak.restore.amqp10_message import SectionsCache, encode_sections
from rbak.restore.record_publisher import choose_protocol

FULL = BackupProperties(content_type="application/json", content_encoding="gzip", delivery_mode=2, priority=7,
                        correlation_id="c-1", reply_to="replies", expiration="60000", message_id="m-1",
                        timestamp=1_700_000_123, type_field="order.created", user_id="guest", app_id="shop")
HEADERS = (("x-tenant", LongString("acme")), ("name", LongString("héllo")), ("short", ShortString("s")),
           ("n", Long(-(2**63))), ("s", Short(-2)), ("b", Bool(False)), ("t", Timestamp(1_700_000_000)),
           ("f", Float(1.5)), ("d", Double(-0.0)), ("v", VOID))


def _v(v):
    """A decoded value, strings and symbols as str (the decoder keeps their bytes)."""
    return v.value.decode() if v.type in ("utf8", "symbol") else v.value


def _sections(p=FULL, h=HEADERS):
    enc = encode_sections(p, h)
    assert enc is not None
    return {desc.value[0].value: desc.value[1] for _, desc in decode_all(enc + data_section(b"body"))}


def test_every_property_lands_where_rabbitmq_reads_it():
    s = _sections()
    header = [v.value for v in s[0x70].value]
    assert header == [True, 7, 60000]  # durable, priority, ttl
    props = [_v(v) for v in s[0x73].value]
    assert props[0] == "m-1" and props[1] == b"guest" and props[4] == "replies" and props[5] == "c-1"
    assert props[6] == "application/json" and s[0x73].value[6].type == "symbol" and props[7] == "gzip"
    assert props[9] == 1_700_000_123_000 and props[10] == "shop"  # creation-time in ms; app_id is group-id
    annotations = {_v(k): _v(v) for k, v in s[0x72].value}
    assert annotations == {"x-tenant": "acme", "x-basic-type": "order.created"}
    app = {_v(k): (v.type, _v(v)) for k, v in s[0x74].value}
    assert app["name"] == ("utf8", "héllo") and app["short"] == ("utf8", "s")
    assert app["n"] == ("long", -(2**63)) and app["s"] == ("short", -2) and app["b"] == ("boolean", False)
    assert app["t"] == ("timestamp", 1_700_000_000_000) and app["f"] == ("float", 1.5) and app["v"][0] == "null"
    assert s[0x75].value == b"body"


def test_sections_are_a_valid_bare_message_in_spec_order():
    enc = encode_sections(FULL, HEADERS)
    codes = [desc.value[0].value for _, desc in decode_all(enc + data_section(b"x" * 300))]
    assert codes == [0x70, 0x72, 0x73, 0x74, 0x75]
    msg = enc[enc.index(b"\x00\x53\x73"):] + data_section(b"x" * 300)
    assert list(decode_bare_message(msg).data) == [b"x" * 300]


def test_unset_delivery_mode_is_a_non_durable_header_and_1_is_left_to_0_9_1():
    """4.x reads durable=false back as no delivery mode, and a header-less message as durable (4.0/4.1)."""
    s = _sections(BackupProperties(priority=4), ())
    assert [v.value for v in s[0x70].value] == [False, 4]
    assert encode_sections(BackupProperties(delivery_mode=1), ()) is None


@pytest.mark.parametrize("props,headers,why", [
    (replace(FULL, cluster_id="c"), (), "cluster_id has no 1.0 field"),
    (replace(FULL, delivery_mode=3), (), "delivery mode other than 2/unset"),
    (replace(FULL, delivery_mode=1), (), "delivery mode 1 reads back unset"),
    (replace(FULL, expiration="0100"), (), "non-canonical expiration"),
    (replace(FULL, expiration="-1"), (), "negative expiration"),
    (replace(FULL, expiration=str(2**32)), (), "expiration over 32 bits"),
    (replace(FULL, content_type="tëxt/plain"), (), "non-ASCII content type"),
    (replace(FULL, reply_to="/queues/x"), (), "reply_to that 4.1+ decodes as an address"),
    (replace(FULL, reply_to="amq.rabbitmq.reply-to.g2dk"), (), "direct reply-to"),
    (replace(FULL, message_id="m" * 256), (), "message id over a short string"),
    (replace(FULL, message_id="caf\udce9"), (), "message id that is not UTF-8"),
    (FULL, (("b", Bytes(b"\x00")),), "binary header comes back as a long string"),
    (FULL, (("t", Table(())),), "table header"),
    (FULL, (("a", Array(())),), "array header"),
    (FULL, (("plain", Long(1)), ("x-late", Long(2))), "x- header after a plain one"),
    (FULL, (("k", Long(1)), ("k", Long(2))), "repeated name"),
    (FULL, (("CC", LongString("q2")),), "CC routes in 0-9-1"),
    (FULL, (("x-death", LongString("d")),), "x-death is the broker's"),
    (FULL, (("x-basic-type", LongString("t")),), "x-basic-* are the broker's"),
    (FULL, (("ke\udcffy", Long(1)),), "header name that is not UTF-8"),
    (FULL, (("t", Timestamp(2**63)),), "timestamp past the ms range"),
])
def test_records_1_0_cannot_carry_exactly_are_left_to_0_9_1(props, headers, why):
    assert encode_sections(props, headers) is None, why


def test_non_utf8_header_value_travels_as_binary():
    s = _sections(h=(("raw", LongString("caf\udce9")),))
    ((_, v),) = s[0x74].value
    assert (v.type, v.value) == ("binary", b"caf\xe9")  # RabbitMQ converts binary to a 0-9-1 long string


def test_cache_returns_the_same_encoding_and_remembers_refusals():
    from rbak.format.record import BackupRecord

    cache = SectionsCache()
    r = BackupRecord(body=b"a", properties=FULL, headers=HEADERS)
    assert cache(r) == encode_sections(FULL, HEADERS)
    assert cache(replace(r, headers=(("t", Table(())),))) is None
    assert cache(replace(r, properties=BackupProperties(delivery_mode=1))) is None


@pytest.mark.parametrize("setting,qtype,mode,expected", [
    ("auto", "quorum", "queue", "amqp091"),  # auto is 0-9-1 everywhere: 1.0 measured no faster (issue 45)
    ("auto", "classic", "queue", "amqp091"),
    ("auto", "stream", "queue", "amqp091"),
    ("amqp091", "classic", "queue", "amqp091"),
    ("amqp10", "classic", "queue", "amqp10"),  # a 3.x or TLS target is refused later, naming the field
    ("amqp10", "quorum", "queue", "amqp10"),
    ("amqp10", "stream", "queue", "amqp091"),
    ("amqp10", "classic", "exchange", "amqp091"),
])
def test_protocol_choice(setting, qtype, mode, expected):
    assert choose_protocol(setting, qtype, mode) == expected
