"""Messages RabbitMQ 4.0.5 stored from AMQP 1.0 (``mc_amqp``) and MQTT (``mc_mqtt``) survive an offline import.

A private 4.0.5 node (trixie chroot, rabbitmq_mqtt enabled) gets, through
``amq.fanout`` and ``amq.topic``, the same interleaved AMQP 1.0
(python-qpid-proton), AMQP 0-9-1 (pika) and MQTT 5 (paho-mqtt) messages in
two durable classic queues. One queue is consumed over 0-9-1 from the live
node: that is the reference, what RabbitMQ itself hands a 0-9-1 consumer.
The node is stopped, the other queue imported from its files, restored into
a fresh vhost of the shared 4.0.5 broker and consumed: bodies, properties,
headers and order must equal the reference. A third queue holds values
RabbitMQ 4.0.5 cannot deliver over 0-9-1 at all (rbak's documented mapping),
a fourth a decimal, which rbak reports as damaged instead of guessing.
The decoder itself is checked on truncated and garbage input.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import pika
import pytest
from support.require import require, require_that
from support.private_node import CHROOT, PrivateNode, chroot_ready

from rbak.errors import Amqp10Error, ImportFormatError, MappingError, MessageFormatError, MqttMappingError
from rbak.format.manifest import BackupManifest
from rbak.format.record import (
    VOID, Array, BackupProperties, Bool, Bytes, Double, Float, Long, LongString, Short, Table, Timestamp,
)
from rbak.format.segment import decode_segment
from rbak.format import amqp10
from rbak.offline.rabbitmq import mc_amqp
from rbak.format.amqp10 import Value, decode_bare_message, decode_value
from rbak.offline.rabbitmq.rabbitmq_dir import import_rabbitmq_dir
from rbak.storage import open_storage

MAIN, LIVE, ODD, BAD = "a10-main", "a10-live", "a10-odd", "a10-bad"
N_MESSAGES = 14  # exported from MAIN; LIVE also holds one MQTT QoS 0 (transient) message


class MqttNode(PrivateNode):
    """A private node with rabbitmq_mqtt enabled from boot (PrivateNode writes an empty plugin list)."""

    def __init__(self, base: Path):
        from support.private_node import free_port

        self.mqtt_port = free_port()
        super().__init__("4.0", base, conf=[f"mqtt.listeners.tcp.default = {self.mqtt_port}"])

    def _env(self) -> dict[str, str]:
        env = super()._env()
        env["RABBITMQ_ENABLED_PLUGINS_FILE"] = self._inner(self.base / "enabled_plugins_mqtt")
        return env

    def start(self) -> "MqttNode":
        self.base.mkdir(parents=True, exist_ok=True)
        (self.base / "enabled_plugins_mqtt").write_text("[rabbitmq_mqtt].\n")
        super().start()
        return self


class _NodeAsBroker:
    """Lets the restore tests' consume_all read from the private node."""

    def __init__(self, node: PrivateNode):
        self.node = node

    def connect(self, vhost: str) -> pika.BlockingConnection:
        return self.node.connect(vhost)

    def wire(self, vhost: str):
        return self.node.wire(vhost)


def _amqp10_messages():
    """(kind, proton Message | (pika props, body)) in publish order: 1.0 and 0-9-1 interleaved."""
    from proton import Message, byte, float32, int32, short, symbol, timestamp, ubyte, uint, ulong, ushort

    rich_app = {
        "s": "strïng", "long": 7, "neg": -(2**40), "i32": int32(-5), "ub": ubyte(200), "b": byte(-3),
        "sh": short(-300), "us": ushort(60000), "ui": uint(4_000_000_000), "ul": ulong(2**63 + 5),
        "f": float32(1.5), "d": -2.25, "t": True, "fa": False, "ts": timestamp(1_700_000_000_123),
        "bin-utf8": b"abc", "bin": b"\x00\xff", "nul": None, "sym": symbol("a-symbol"),
    }
    rich_ann = {
        symbol("x-foo"): "bar", symbol("x-num"): 42, symbol("x-list"): ["a", 1, True],
        symbol("x-map"): {"k": "v", "n": ulong(3)},
        symbol("x-basic-type"): "my.type",
    }
    out = [
        ("amqp10", Message(
            body=b"data-0 \xc3\xbc", inferred=True, durable=True, id="m0", correlation_id="corr-0",
            content_type="text/plain", content_encoding="utf-8", subject="subj", address="/queues/ignored",
            reply_to="/queues/reply", creation_time=1_700_000_000.123, ttl=86400, priority=7,
            user_id=b"guest", group_id="grp", group_sequence=9, reply_to_group_id="rgrp",
            expiry_time=4_000_000_000.0, properties=rich_app, annotations=rich_ann)),
        ("amqp091", (pika.BasicProperties(delivery_mode=2, message_id="m1", headers={"h": "v", "n": 1},
                                          content_type="application/json", priority=2), b'{"m": 1}')),
        ("amqp10", Message(body=bytes(range(256)) * 24, inferred=True, durable=True,  # 6144 bytes: .rdq
                           id=uuid.UUID("12345678-1234-5678-1234-567812345678"), correlation_id=b"\x01\x02bin")),
        ("amqp10", Message(body={"k": "v", "n": 3, "l": [1, 2]}, durable=True, id=ulong(99))),  # amqp-value
        ("amqp091", (pika.BasicProperties(delivery_mode=2, message_id="m4"), b"big-091 " * 800)),
        ("amqp10", Message(body=[["seq", 1], ["seq", 2]], inferred=True, durable=True,  # amqp-sequence
                           id="m5", correlation_id="c" * 300)),
        ("amqp10", Message(body="big amqp-value string " * 300, durable=True, id="m6")),  # amqp-value, .rdq
        ("amqp10", Message(body=b"", inferred=True, durable=True, id="m7", properties={"only": "app"})),
        ("amqp091", (pika.BasicProperties(delivery_mode=2, message_id="m8", timestamp=1_700_000_008), b"m8")),
        ("amqp10", Message(body=b"bytes as amqp-value", durable=True, id="i" * 256)),  # id too long for 0-9-1
        ("amqp10", Message(body=b"x" * 5000, inferred=True, durable=True, id="m10",
                           properties={"k" * 300: "key too long: dropped", "ok": "fine"})),
        ("mqtt", ("t/all/props", "mqtt-12 ü".encode(), 1, {
            "ContentType": "text/plain", "CorrelationData": b"corr-12", "ResponseTopic": "resp/to/x",
            "UserProperty": [("a", "1"), ("b", "2"), ("a", "3")], "MessageExpiryInterval": 3600,
            "PayloadFormatIndicator": 1})),
        ("mqtt", ("t/qos0", b"qos0: transient, not exported", 0, {})),
        ("mqtt", ("t/big", b"y" * 6000, 1, {"CorrelationData": b"\xff\x00bin", "ContentType": "t\u00ebxt"})),
        ("amqp091", (pika.BasicProperties(delivery_mode=2, message_id="m11"), b"last")),
    ]
    assert len(out) == N_MESSAGES + 1
    return out


def _odd_message():
    from proton import Message, char

    u = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
    return Message(body=b"odd", inferred=True, durable=True, id="odd",
                   properties={"u": u, "c": char("é")})


def _bad_message():
    from proton import Message, decimal32

    return Message(body=b"bad", inferred=True, durable=True, id="bad", properties={"dec": decimal32(12345)})


@pytest.fixture(scope="module")
def node_dir(tmp_path_factory):
    """(data dir copy, live 0-9-1 deliveries of LIVE, node)."""
    require_that(chroot_ready())
    require("proton", "python-qpid-proton")
    from support.restores import consume_all
    from proton.utils import BlockingConnection

    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    base = CHROOT / "tmp" / f"rbak-a10-{uuid.uuid4().hex[:8]}"
    node = MqttNode(base)
    try:
        node.start()
        conn = node.connect("/")
        ch = conn.channel()
        ch.confirm_delivery()
        for q in (MAIN, LIVE, ODD, BAD):
            ch.queue_declare(q, durable=True)
        for q in (MAIN, LIVE):
            ch.queue_bind(q, "amq.fanout")
            ch.queue_bind(q, "amq.topic", "t.#")
        a10 = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", allowed_mechs="PLAIN", timeout=30)
        fanout = a10.create_sender("/exchanges/amq.fanout")
        mq = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="rbak-pub", protocol=mqtt.MQTTv5)
        mq.username_pw_set("guest", "guest")
        mq.connect("127.0.0.1", node.mqtt_port)
        mq.loop_start()
        for kind, m in _amqp10_messages():
            if kind == "amqp10":
                fanout.send(m)  # blocks until the broker settled it (accepted)
            elif kind == "mqtt":
                topic, payload, qos, props = m
                p = Properties(PacketTypes.PUBLISH)
                for k, v in props.items():
                    setattr(p, k, v)
                info = mq.publish(topic, payload, qos=qos, properties=p)
                info.wait_for_publish(30)  # QoS 1: the PUBACK (after the queues confirmed)
                if qos == 0:
                    time.sleep(0.3)  # no acknowledgement to wait for; keep the order
            else:
                props, body = m
                ch.basic_publish("amq.fanout", "rk-091", body, props)
        mq.loop_stop()
        mq.disconnect()
        a10.create_sender(f"/queues/{ODD}").send(_odd_message())
        bad = a10.create_sender(f"/queues/{BAD}")
        bad.send(_plain_message("before"))
        bad.send(_bad_message())
        bad.send(_plain_message("after"))
        a10.close()
        conn.close()
        live = consume_all(_NodeAsBroker(node), "/", LIVE, N_MESSAGES + 1)
        assert len(live) == N_MESSAGES + 1
        # RabbitMQ drops non-persistent messages when it recovers a queue, and so does the importer.
        assert [d.body for d in live if d.properties.delivery_mode == 1] == [b"qos0: transient, not exported"]
        live = [d for d in live if d.properties.delivery_mode != 1]
        node.stop()
        copy = tmp_path_factory.mktemp("a10") / node.data_dir.name
        shutil.copytree(node.data_dir, copy)
        yield copy, live
    finally:
        node.cleanup()


def _plain_message(text: str):
    from proton import Message

    return Message(body=text.encode(), inferred=True, durable=True, id=text)


def _read_backup(url: str, backup_id: str) -> dict:
    st = open_storage(url)
    m = BackupManifest.from_json(st.get(f"{backup_id}/manifest.json"))
    return {q.name: [r for s in q.segments for r in decode_segment(st.get(s.key), s.key).records]
            for q in m.queues}


def test_stored_form_is_mc_amqp_v1(node_dir):
    """The facts the decoders rely on, read from the real files: {mc, mc_amqp, #v1{}, Anns} and
    {mc, mc_mqtt, #mqtt_msg{}, Anns}."""
    from rbak.offline.rabbitmq.erlang_terms import decode

    data_dir, _ = node_dir
    seen = set()
    for qs in data_dir.glob("msg_stores/vhosts/*/queues/*/*.qs"):
        data = qs.read_bytes()
        off = 64
        while off + 8 <= len(data) and (size := int.from_bytes(data[off : off + 4], "big")):
            term, _ = decode(data[off + 8 : off + 8 + size], 0)
            off += 8 + size
            if term[1] == "mc_mqtt":
                assert term[2][0] == "mqtt_msg" and len(term[2]) == 9 and isinstance(term[2][7], dict)
                seen.add("mqtt")
            if term[1] != "mc_amqp":
                continue
            tag, ma, bare, props_pos, app_pos, body_pos, body_code = term[2]
            assert tag == "v1" and isinstance(ma, list) and isinstance(bare, bytes)
            assert props_pos in (0, []) and (app_pos == [] or isinstance(app_pos, int))
            assert bare[body_pos : body_pos + 3] == bytes((0, 0x53, body_code))
            assert set(term[3]) >= {"x", "rk", "d"}
            seen.add(body_code)
    assert seen == {amqp10.DATA, amqp10.AMQP_VALUE, amqp10.AMQP_SEQUENCE, "mqtt"}


@pytest.mark.broker
def test_import_restore_equals_live_amqp091_delivery(node_dir, tmp_path, rmq40, vhost_factory):
    from support.restores import consume_all, declare, options_for

    from rbak.restore import run_restore

    data_dir, live = node_dir
    url = f"file://{tmp_path}/b"
    res = import_rabbitmq_dir(str(data_dir), url, "a10", queues={MAIN})
    assert not res.ctx.skipped
    recs = _read_backup(url, "a10")[MAIN]
    assert len(recs) == N_MESSAGES
    # Order: AMQP 1.0 and 0-9-1 messages interleaved exactly as published.
    ids = [r.properties.message_id for r in recs]
    assert ids[:2] == ["m0", "m1"] and ids[3:6] == ["99", "m4", "m5"] and ids[-1] == "m11"
    assert [r.body[:7] for r in recs[11:13]] == [b"mqtt-12", b"yyyyyyy"]
    assert [r.delivery_tag for r in recs] == sorted(r.delivery_tag for r in recs)
    # Routing as the live broker reports it to a 0-9-1 consumer.
    assert [(r.exchange, r.routing_key) for r in recs] == [(d.exchange, d.routing_key) for d in live]
    # The import itself already equals the live delivery.
    for r, d in zip(recs, live):
        assert (r.body, r.properties, r.headers) == (d.body, d.properties, d.headers or ()), r.properties.message_id

    target = vhost_factory(rmq40)
    declare(rmq40, target, MAIN)
    summary = run_restore(open_storage(url), options_for(rmq40, "a10", vhost_mapping=(("/", target),)))
    assert summary.ok, summary.to_json_obj()
    got = consume_all(rmq40, target, MAIN, N_MESSAGES)
    assert len(got) == N_MESSAGES
    for g, d in zip(got, live):
        assert g.body == d.body, d.properties.message_id
        assert g.properties == d.properties, d.properties.message_id
        assert g.headers == d.headers, d.properties.message_id

    # Spot checks of the mapping (what RabbitMQ does, so what the reference shows too).
    r0, r3, r5, r6, r9 = recs[0], recs[3], recs[5], recs[6], recs[9]
    assert r0.body == "data-0 ü".encode()
    assert r0.properties == BackupProperties(
        content_type="text/plain", content_encoding="utf-8", delivery_mode=2, priority=7, correlation_id="corr-0",
        reply_to="/queues/reply", expiration="86400000", message_id="m0", timestamp=1_700_000_000,
        type_field="my.type", user_id="guest", app_id="grp")
    h = dict(r0.headers)
    assert [k for k, _ in r0.headers] == sorted(h, key=str.encode)
    assert h["s"] == LongString("strïng") and h["neg"] == Long(-(2**40)) and h["i32"] == Long(-5)
    assert h["ub"] == Short(200) and h["b"] == Short(-3) and h["sh"] == Short(-300) and h["us"] == Long(60000)
    assert h["ui"] == Long(4_000_000_000) and h["ul"] == Long(2**63 + 5 - 2**64)  # RabbitMQ's signed 64 bits
    assert h["f"] == Float(1.5) and h["d"] == Double(-2.25) and h["t"] == Bool(True) and h["fa"] == Bool(False)
    assert h["ts"] == Timestamp(1_700_000_000) and h["nul"] == VOID and h["sym"] == LongString("a-symbol")
    assert h["bin-utf8"] == LongString("abc") and h["bin"] == Bytes(b"\x00\xff")
    assert h["x-foo"] == LongString("bar") and h["x-num"] == Long(42)
    assert h["x-list"] == Array((LongString("a"), Long(1), Bool(True)))
    assert h["x-map"] == Table((("k", LongString("v")), ("n", Long(3))))
    assert "x-basic-type" not in h
    assert r3.properties.type_field == "amqp-1.0" and r3.body.startswith(b"\x00\x53\x77")
    assert r5.properties.correlation_id is None and dict(r5.headers)["x-correlation-id"] == LongString("c" * 300)
    assert r5.body.startswith(b"\x00\x53\x76")
    assert r6.body.startswith(b"\x00\x53\x77\xb1")  # str32 amqp-value in the message store
    assert r9.properties.message_id is None and dict(r9.headers)["x-message-id"] == LongString("i" * 256)
    assert recs[2].properties.message_id == "urn:uuid:12345678-1234-5678-1234-567812345678"
    assert dict(recs[2].headers)["x-correlation-id"] == Bytes(b"\x01\x02bin")
    assert recs[2].body == bytes(range(256)) * 24

    # MQTT (RabbitMQ's mc_mqtt -> mc_amqpl conversion).
    m12, m13 = recs[11], recs[12]
    assert (m12.exchange, m12.routing_key) == ("amq.topic", "t.all.props")
    assert m12.properties.content_type == "text/plain" and m12.properties.correlation_id == "corr-12"
    assert m12.properties.expiration == "3600000" and m12.properties.delivery_mode == 2
    assert abs(m12.properties.timestamp - time.time()) < 600  # publish time, from the expiry
    assert m12.headers == (("a", LongString("1")), ("b", LongString("2")),
                           ("x-reply-to-topic", LongString("resp.to.x")))
    assert m13.properties.content_type is None  # not ASCII: dropped, as RabbitMQ
    assert dict(m13.headers)["x-correlation-id"] == Bytes(b"\xff\x00bin") and m13.body == b"y" * 6000

    # Values RabbitMQ 4.0.5 cannot hand a 0-9-1 consumer: rbak's documented mapping.
    assert not import_rabbitmq_dir(str(data_dir), url, "odd", queues={ODD}).ctx.skipped
    (odd,) = _read_backup(url, "odd")[ODD]
    assert dict(odd.headers) == {"u": LongString("urn:uuid:00112233-4455-6677-8899-aabbccddeeff"),
                                 "c": LongString("é")}


def test_unmappable_value_is_reported_with_file_and_offset(node_dir, tmp_path):
    data_dir, _ = node_dir
    url = f"file://{tmp_path}/b"
    with pytest.raises(ImportFormatError) as ei:
        import_rabbitmq_dir(str(data_dir), url, "bad1", queues={BAD})
    msg = str(ei.value)
    assert ".qs at byte" in msg and "decimal32" in msg and "application property 'dec'" in msg, msg
    res = import_rabbitmq_dir(str(data_dir), url, "bad2", queues={BAD}, skip_damaged=True)
    assert len(res.ctx.skipped) == 1 and "decimal32" in res.ctx.skipped[0].reason
    assert [r.body for r in _read_backup(url, "bad2")[BAD]] == [b"before", b"after"]


# --------------------------------------------------------------------------
# The decoder on its own.
# --------------------------------------------------------------------------


def _bare(*sections: bytes) -> bytes:
    return b"".join(sections)


PROPS = bytes.fromhex("005373") + bytes((0xC0, 6, 2, 0xA1, 2)) + b"id" + b"\x40"
DATA1 = bytes.fromhex("005375") + bytes((0xA0, 3)) + b"abc"
DATA2 = bytes.fromhex("005375") + bytes((0xA0, 2)) + b"de"


def test_decoder_sections_and_values():
    app = bytes.fromhex("005374") + bytes((0xC1, 6, 2, 0xA1, 1)) + b"k" + bytes((0x55, 0x07))
    b = decode_bare_message(_bare(PROPS, app, DATA1, DATA2), body_pos=len(PROPS) + len(app), body_code=0x75)
    assert b.properties.message_id == Value("utf8", b"id") and b.properties.user_id is None
    assert b.application_properties == ((Value("utf8", b"k"), Value("long", 7)),)
    assert b.data == (b"abc", b"de") and b.application_properties_pos == len(PROPS)
    props, headers, body = mc_amqp.map_message(b, [])
    assert body == b"abcde" and props.message_id == "id" and headers == (("k", Long(7)),)
    # Symbolic descriptors, arrays, described values, every fixed width.
    v, end = decode_value(bytes.fromhex("e00803a1016101620163"))
    assert v == Value("array", (Value("utf8", b"a"), Value("utf8", b"b"), Value("utf8", b"c"))) and end == 10
    v, _ = decode_value(b"\x00\xa3\x03foo\x52\x05")
    assert v == Value("described", (Value("symbol", b"foo"), Value("uint", 5)))
    for raw, want in [(b"\x56\x01", Value("boolean", True)), (b"\x44", Value("ulong", 0)),
                      (b"\x81" + (-2).to_bytes(8, "big", signed=True), Value("long", -2)),
                      (b"\x83" + (1000).to_bytes(8, "big"), Value("timestamp", 1000)),
                      (b"\x73\x00\x00\x00\xe9", Value("char", "é")), (b"\x45", Value("list", ()))]:
        assert decode_value(raw) == (want, len(raw))
    sym = b"\x00\xa3\x10amqp:data:binary\xa0\x01z"
    assert decode_bare_message(sym).data == (b"z",)


@pytest.mark.parametrize("raw, pattern", [
    (b"", r"truncated format code.*at byte 0"),
    (b"\xa1\x05abc", r"truncated utf8: needs 5 bytes, 3 left.*at byte 2"),
    (b"\xc0\x05\x02\xa1\x01a", r"truncated list: size 5.*at byte 0"),
    (b"\xc0\x04\x02\xa1\x01a", r"list holds fewer than its 2 elements.*at byte 6"),
    (b"\xc1\x04\x01\xa1\x01a", r"map has an odd element count 1.*at byte 0"),
    (b"\xc0\x04\x01\x40\x40\x40", r"list of 1 elements ends at byte 4, its size says 6.*at byte 0"),
    (b"\x56\x02", r"boolean byte 2.*at byte 1"),
    (b"\xff", r"unknown format code 0xff.*at byte 0"),
    (b"\x73\x00\x11\x00\x00", r"not a Unicode code point.*at byte 1"),
    (b"\xe0\x04\x02\xa1\x01a", r"array holds fewer than its 2 elements.*at byte 6"),
    (b"\x00\x00\x53\x70\x40", r"descriptor must not itself be described.*at byte 1"),
])
def test_decoder_rejects_truncated_and_garbage_values(raw, pattern):
    with pytest.raises(Amqp10Error, match=pattern):
        v, end = decode_value(raw)


@pytest.mark.parametrize("raw, pattern", [
    (_bare(PROPS), r"no body section"),
    (_bare(DATA1, PROPS), r"unexpected properties section.*at byte 8"),
    (_bare(DATA1, b"\x00\x53\x77\x40"), r"amqp-value section after a data body section.*at byte 8"),
    (_bare(b"\x00\x53\x72\xc1\x01\x00", DATA1), r"unexpected message-annotations section"),
    (_bare(b"\x00\x53\x99\x40"), r"not a message section descriptor.*at byte 1"),
    (_bare(b"\x53\x75"), r"expected a described section, found a ulong.*at byte 0"),
    (_bare(DATA1)[:-1], r"truncated binary: needs 3 bytes, 2 left.*at byte 5"),
    (_bare(b"\x00\x53\x75\xa1\x01a"), r"data section must hold a binary"),
    (_bare(b"\x00\x53\x73\xc0\x03\x01\x52\x01", DATA1), r"property message-id must be ulong or uuid"),
])
def test_decoder_rejects_bad_bare_messages(raw, pattern):
    with pytest.raises(Amqp10Error, match=pattern):
        decode_bare_message(raw)


def test_recorded_positions_must_agree():
    with pytest.raises(Amqp10Error, match="RabbitMQ recorded 3"):
        decode_bare_message(_bare(PROPS, DATA1), body_pos=3)
    with pytest.raises(Amqp10Error, match="RabbitMQ recorded descriptor 0x77"):
        decode_bare_message(_bare(PROPS, DATA1), body_code=0x77)
    bare = _bare(PROPS, DATA1)
    v1 = ("v1", [], bare, [], [], len(PROPS), 0x75)  # properties present, position says omitted
    with pytest.raises(MappingError, match="properties position"):
        mc_amqp.convert(v1)


def test_stored_message_errors_are_message_format_errors():
    """A garbage mc_amqp term is a MessageFormatError (reported with file and offset by the readers)."""
    from rbak.offline.rabbitmq.erlang_terms import Atom
    from rbak.offline.rabbitmq.stored_message import message_from_term

    A = Atom  # noqa: N806 - Atom's short name in the literal terms below
    good = (A("v1"), [], _bare(PROPS, DATA1), 0, [], len(PROPS), 0x75)
    anns = {A("x"): b"", A("rk"): [b"q"], A("d"): A("true")}
    m = message_from_term((A("mc"), A("mc_amqp"), good, anns))
    assert m.body == b"abc" and m.properties.delivery_mode == 2 and m.routing_keys == ["q"]
    truncated = good[:2] + (good[2][:-2],) + good[3:]
    with pytest.raises(MessageFormatError, match=r"AMQP 1.0 message: truncated binary.*at byte"):
        message_from_term((A("mc"), A("mc_amqp"), truncated, anns))
    with pytest.raises(MessageFormatError, match="not the 4.0 #v1"):
        message_from_term((A("mc"), A("mc_amqp"), (A("v2"),), anns))
    with pytest.raises(MessageFormatError, match="mc_stomp"):
        message_from_term((A("mc"), A("mc_stomp"), (), anns))


def test_mapping_of_values_rabbitmq_cannot_deliver():
    """rbak's documented choices where RabbitMQ 4.0.5's own 0-9-1 conversion has no clause."""
    from rbak.offline.rabbitmq.erlang_terms import Atom as A

    described = mc_amqp.from_erlang((A("described"), (A("symbol"), b"my:desc"), (A("utf8"), b"inner")))
    assert mc_amqp.to_091(described, "x") == LongString("inner")
    assert mc_amqp.to_091(Value("char", "é"), "x") == LongString("é")
    assert mc_amqp.to_091(mc_amqp.from_erlang((A("uuid"), bytes(range(16)))), "x") == \
        LongString("urn:uuid:00010203-0405-0607-0809-0a0b0c0d0e0f")
    # RabbitMQ stores NaN/infinity and decimals as {as_is, Code, Bytes}.
    nan = mc_amqp.from_erlang((A("as_is"), 0x82, b"\x7f\xf8" + bytes(6)))
    assert nan.type == "double" and nan.value != nan.value
    with pytest.raises(MappingError, match="decimal64 value has no AMQP 0-9-1 form"):
        mc_amqp.to_091(mc_amqp.from_erlang((A("as_is"), 0x84, bytes(8))), "x")
    with pytest.raises(MappingError, match="cannot be an AMQP 0-9-1 field-table name"):
        mc_amqp.to_091(Value("map", ((Value("ulong", 1), NULL_V),)), "x")
    with pytest.raises(MappingError, match="not an AMQP 1.0 value"):
        mc_amqp.from_erlang((A("utf8"), 5))


NULL_V = amqp10.NULL


def test_mqtt_state_errors():
    from rbak.offline.rabbitmq import mc_mqtt
    from rbak.offline.rabbitmq.erlang_terms import Atom as A

    ok = (A("mqtt_msg"), A("false"), 1, b"t/x", A("false"), 1, [b"a", [98, b"c"]], {}, A("undefined"))
    props, headers, body = mc_mqtt.convert(ok)
    assert body == b"abc" and props.delivery_mode == 2 and headers == ()
    with pytest.raises(MqttMappingError, match="QoS 2"):
        mc_mqtt.convert(ok[:2] + (2,) + ok[3:])
    with pytest.raises(MqttMappingError, match="not iodata"):
        mc_mqtt.convert(ok[:6] + (A("x"),) + ok[7:])
    with pytest.raises(MqttMappingError, match="#mqtt_msg"):
        mc_mqtt.convert(ok[:5])


def test_decoder_never_fails_other_than_with_its_error():
    """Every truncation and many random corruptions of a rich bare message: decoded (and mapped, or a
    MappingError), or Amqp10Error; never another exception."""
    import random

    from proton import Message, symbol, timestamp, ulong

    m = Message(body=[["x", 1.5, None, True], {"k": [1, 2]}], inferred=True, id=ulong(7), subject="s",
                creation_time=1.5, properties={"a": "b", "t": timestamp(5), "n": None},
                content_type=symbol("text/plain"))
    enc = m.encode()
    bare = enc[enc.index(b"\x00\x53\x73"):]  # from the properties section on (no header/annotations)
    assert decode_bare_message(bare).body_code == amqp10.AMQP_SEQUENCE
    rnd = random.Random(7)
    cases = [bare[:i] for i in range(len(bare))]
    for _ in range(2000):
        b = bytearray(bare)
        for _ in range(rnd.randint(1, 3)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        cases.append(bytes(b))
    failed = 0
    for c in cases:
        try:
            b = decode_bare_message(c)
        except Amqp10Error as e:
            assert 0 <= e.offset <= len(c)
            failed += 1
            continue
        try:
            mc_amqp.map_message(b, [])
        except MappingError:
            pass
    assert failed > len(bare) - 5
