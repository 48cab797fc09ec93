"""Real ``mosquitto.db`` files: written by Debian's Mosquitto, read by us; written by us, loaded by Mosquitto.

Each test runs a private broker (own config, free loopback port, tmp
persistence dir) and stops it with SIGTERM so it saves its database.
"""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path

import pytest
from support.require import require, require_that, unavailable
from support.mosquitto import (
    CORR,
    MOSQUITTO,
    V5_PAYLOAD,
    MosquittoBroker,
    client,
    close,
    drain,
    mosquitto_version,
    subscribe,
    trixie_mosquitto,
    write_sample_db,
)

from rbak.offline.mosquitto import (
    ClientChunk,
    ClientMsgChunk,
    CfgChunk,
    Direction,
    MqttProperties,
    MsgState,
    MsgStoreChunk,
    RetainChunk,
    SubChunk,
    encode_db,
    read_db,
    write_db,
)

require("paho.mqtt.client", "paho-mqtt")
require_that(None if os.path.exists(MOSQUITTO) else f"{MOSQUITTO} is missing; .ci/setup installs mosquitto")

@pytest.fixture(scope="module", params=["bookworm-2.0.11", "trixie-2.0.21"])
def mosquitto_cmd(request) -> list[str]:
    """Debian bookworm's broker (the machine's), and trixie's run from the CI chroot's libraries."""
    if request.param.startswith("bookworm"):
        return [MOSQUITTO]
    cmd = trixie_mosquitto()
    if isinstance(cmd, str):
        unavailable(cmd)
    return cmd


@pytest.fixture(scope="module")
def real_db(tmp_path_factory, mosquitto_cmd) -> tuple[Path, int, int]:
    """A mosquitto.db written by the real broker: retained, queued QoS 1/2, v5 properties, three sessions."""
    return write_sample_db(tmp_path_factory.mktemp("mosq-real"), mosquitto_cmd)


def test_real_file_exact_contents(real_db, mosquitto_cmd):
    path, t0, port = real_db
    db = read_db(path)
    assert db.header.version == 6 and db.header.crc == 0
    assert isinstance(db.chunks[0], CfgChunk) and db.cfg.shutdown and db.cfg.dbid_size == 8
    stores = {m.topic: m for m in db.msg_stores.values()}
    assert set(stores) == {"a/b.c", "a/x", "a/ret", "a/q0", "r/other"}
    assert db.cfg.last_db_id == max(m.store_id for m in stores.values())

    v5 = stores["a/b.c"]
    assert (v5.payload, v5.qos, v5.retain, v5.source_id, v5.source_username) == (V5_PAYLOAD, 1, False, "pub", "bob")
    assert v5.source_port == port
    assert t0 + 3600 <= v5.expiry_time <= int(time.time()) + 3600  # host-order 64-bit, absolute seconds
    p = v5.properties
    assert p.content_type == "application/octet-stream"
    assert p.correlation_data == CORR
    assert p.response_topic == "reply/to/me"
    assert p.user_properties == (("k1", "v1"), ("k2", "v2"), ("k1", "again"))
    assert p.payload_format_indicator == 0
    assert p.message_expiry_interval is None  # Mosquitto keeps expiry in expiry_time, not in the block

    assert (stores["a/x"].qos, stores["a/x"].payload, stores["a/x"].properties) == (2, b"hello-q2", MqttProperties())
    assert (stores["a/ret"].retain, stores["a/ret"].qos) == (True, 1)
    assert (stores["r/other"].retain, stores["r/other"].qos, stores["r/other"].properties.content_type) == (
        True, 0, "text/plain")
    assert {stores_topic(db, r.store_id) for r in db.retains} == {"a/ret", "r/other"}

    clients = {c.client_id: c for c in db.clients}
    assert list(clients) == ["sub-311", "sub-v5", "sub-qos0"]  # connect order = save order
    assert clients["sub-311"].username == b"alice"
    assert clients["sub-311"].session_expiry_interval == 0xFFFFFFFF  # v3.1.1 clean session false: never
    assert clients["sub-v5"].session_expiry_interval == 3600
    assert t0 + 3600 <= clients["sub-v5"].session_expiry_time <= int(time.time()) + 3600
    version = mosquitto_version(mosquitto_cmd)
    assert version >= (2, 0, 11)
    # 2.0.11 still knows the listener of a disconnected session; 2.0.21 has dropped it.
    assert [c.listener_port for c in clients.values()] == [port if version < (2, 0, 16) else 0] * 3
    # 2.0.0-2.0.15 reused the CLIENT struct: the second username-less client
    # carries the first one's byte-swapped username_len (5 -> 0x0500) and that
    # many stale bytes; the third swaps it back and repeats "alice". The reader
    # must take both without failing.
    if version < (2, 0, 16):
        assert len(clients["sub-v5"].username) == 0x0500
        assert clients["sub-v5"].username.startswith(b"alice")
        assert clients["sub-qos0"].username == b"alice"
    else:
        assert clients["sub-v5"].username is None and clients["sub-qos0"].username is None

    def queued(cid):
        return [(stores_topic(db, m.store_id), m.qos, MsgState(m.state), Direction(m.direction))
                for m in db.client_msgs if m.client_id == cid]

    q = MsgState.QUEUED
    out = Direction.OUT
    # delivery QoS = min(subscription, publish); QoS 0 queued because of queue_qos0_messages
    assert queued("sub-311") == [("a/b.c", 1, q, out), ("a/x", 2, q, out), ("a/ret", 1, q, out), ("a/q0", 0, q, out)]
    assert queued("sub-v5") == [("a/b.c", 1, q, out), ("a/x", 1, q, out), ("a/ret", 1, q, out), ("a/q0", 0, q, out)]
    assert queued("sub-qos0") == [("a/q0", 0, q, out)]
    assert sorted((s.client_id, s.topic, s.qos) for s in db.subs) == [
        ("sub-311", "a/#", 2), ("sub-qos0", "a/q0", 0), ("sub-v5", "a/#", 1)]


def stores_topic(db, store_id: int) -> str:
    return db.msg_stores[store_id].topic


def test_real_file_reencodes_byte_for_byte(real_db):
    path, _, _ = real_db
    data = path.read_bytes()
    db = read_db(path)
    assert encode_db(db.chunks, reorder=False) == data


def test_our_file_is_loaded_by_mosquitto_and_served(tmp_path, mosquitto_cmd):
    """Our v6 writer -> real Mosquitto loads it -> paho receives retained and queued messages."""
    props = MqttProperties(((3, "text/plain"), (9, b"\x01\x02"), (8, "re/ply"), (38, ("origin", "rbak"))))
    chunks = [
        MsgStoreChunk(1, "rbak/one", b"first retained", qos=1, retain=True, source_id="writer",
                      properties=props),
        MsgStoreChunk(2, "rbak/two/deep", bytes(range(256)), qos=0, retain=True),
        MsgStoreChunk(3, "rbak/queued", b"for durable", qos=1, retain=False),
        RetainChunk(1),
        RetainChunk(2),
        ClientChunk("durable", session_expiry_interval=0xFFFFFFFF),
        ClientMsgChunk(3, "durable", mid=1, qos=1, state=MsgState.QUEUED, direction=Direction.OUT),
        SubChunk("durable", "rbak/queued", qos=1),
    ]
    b = MosquittoBroker(tmp_path, command=mosquitto_cmd)
    write_db(b.db, chunks)
    b.start()
    try:
        inbox: queue.Queue = queue.Queue()
        c = client("reader", b.port, v5=True, inbox=inbox)
        subscribe(c, "rbak/#", 1)
        got = {m.topic: m for m in drain(inbox, 2)}
        close(c)
        assert set(got) == {"rbak/one", "rbak/two/deep"}, b.log_text()
        one = got["rbak/one"]
        assert one.payload == b"first retained" and one.retain and one.qos == 1
        assert one.properties.ContentType == "text/plain"
        assert one.properties.CorrelationData == b"\x01\x02"
        assert one.properties.ResponseTopic == "re/ply"
        assert one.properties.UserProperty == [("origin", "rbak")]
        assert got["rbak/two/deep"].payload == bytes(range(256)) and got["rbak/two/deep"].qos == 0

        durable_inbox: queue.Queue = queue.Queue()
        d = client("durable", b.port, v5=False, clean=False, inbox=durable_inbox)
        msgs = drain(durable_inbox, 1)
        close(d)
        assert [(m.topic, m.payload, m.qos) for m in msgs] == [("rbak/queued", b"for durable", 1)], b.log_text()
    finally:
        assert b.stop() == 0
    # Mosquitto saved again on SIGTERM: what it rewrote still has our retained messages.
    again = read_db(b.db)
    assert sorted(again.msg_stores[r.store_id].topic for r in again.retains) == ["rbak/one", "rbak/two/deep"]


def test_real_file_half_acknowledged_flows_are_exported_by_state(tmp_path, mosquitto_cmd):
    """In-flight states from a real broker: unacked QoS 1 out, QoS 2 out past PUBREC, QoS 2 in before PUBREL."""
    from support.mosquitto import RawMqtt

    from rbak.offline.mosquitto.mapping import MappingStats, iter_records

    b = MosquittoBroker(tmp_path, command=mosquitto_cmd).start()
    try:
        sub = RawMqtt(b.port, "slow-sub")
        sub.subscribe("s/#", 2)
        pub = client("pub", b.port, v5=False)
        pub.publish("s/one", b"unacked-q1", qos=1).wait_for_publish(5)
        pub.publish("s/two", b"pubrec-sent-q2", qos=2).wait_for_publish(5)
        close(pub)
        assert sub.recv_publish()[:3] == ("s/one", b"unacked-q1", 1)  # no PUBACK
        topic, _, qos, pid = sub.recv_publish()
        assert (topic, qos) == ("s/two", 2)
        sub.send(0x50, pid.to_bytes(2, "big"))  # PUBREC ...
        assert sub.recv()[0] == 0x62  # ... broker's PUBREL; no PUBCOMP
        sub.abort()

        half = RawMqtt(b.port, "half-pub")
        half.publish("in/flight", b"never-released", 2, pid=7)
        assert half.recv() == (0x50, b"\x00\x07")  # PUBREC; no PUBREL
        half.abort()
        time.sleep(0.3)
    finally:
        assert b.stop() == 0, b.log_text()

    db = read_db(b.db)
    topic = {m.store_id: m.topic for m in db.msg_stores.values()}
    states = sorted((m.client_id, topic[m.store_id], MsgState(m.state), Direction(m.direction)) for m in db.client_msgs)
    assert states == [
        ("half-pub", "in/flight", MsgState.WAIT_FOR_PUBREL, Direction.IN),
        ("slow-sub", "s/one", MsgState.WAIT_FOR_PUBACK, Direction.OUT),
        ("slow-sub", "s/two", MsgState.WAIT_FOR_PUBCOMP, Direction.OUT),
    ]
    st = MappingStats()
    recs = list(iter_records(db, vhost="/", now_ms=int(time.time() * 1000), stats=st))
    assert [(r.source_queue, r.body, r.redelivered) for r in recs] == [
        ("mqtt-subscription-slow-subqos1", b"unacked-q1", True),
        ("mosquitto-incoming", b"never-released", False),
    ]  # sessions in connect order (Mosquitto's save order)
    incoming = next(r for r in recs if r.source_queue == "mosquitto-incoming")
    assert dict(incoming.headers)["x-mqtt-client-id"].value == "half-pub"
    assert (st.client_owned, st.incoming, st.queued) == (1, 1, 1)
