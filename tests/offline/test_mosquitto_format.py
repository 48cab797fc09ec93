"""mosquitto.db layout details, on hand-built bytes laid out as Mosquitto's own unit fixtures are.

The real-broker files are covered in test_mosquitto_real.py; these pin the
parts a 2.0 broker never writes (versions 2-5) and the byte-level rules
(host-order 64-bit fields, struct padding, header widths, lengths).
"""

from __future__ import annotations

import struct

import pytest

from rbak.errors import ImportFormatError
from rbak.offline.mosquitto import (
    CfgChunk,
    ClientChunk,
    ClientMsgChunk,
    Direction,
    MAGIC,
    MqttProperties,
    MsgState,
    MsgStoreChunk,
    RetainChunk,
    SubChunk,
    UnknownChunk,
    encode_chunk,
    encode_db,
    parse_db,
    read_db,
)


def hdr(version: int) -> bytes:
    return MAGIC + struct.pack(">II", 0, version)


def c56(ctype: int, body: bytes, length: int | None = None) -> bytes:
    return struct.pack(">II", ctype, len(body) if length is None else length) + body


def c234(ctype: int, body: bytes) -> bytes:
    return struct.pack(">HI", ctype, len(body)) + body


def s16(b: bytes) -> bytes:
    return struct.pack(">H", len(b)) + b


CFG6 = c56(1, bytes.fromhex("0000000012345678") + b"\x01\x08" + bytes(6))


def test_64bit_fields_are_host_order_little_endian():
    # Mosquitto's persist_read_test.c expects last_db_id == 0x7856341200000000
    # from the bytes 00 00 00 00 12 34 56 78 (x86-64), for v3, v4 and v6.
    db = parse_db(hdr(6) + CFG6, "v6-cfg")
    assert db.cfg == CfgChunk(0x7856341200000000, True, 8, offset=23)
    v3 = hdr(3) + c234(1, b"\x01\x08" + bytes.fromhex("0000000012345678"))
    assert parse_db(v3).cfg.last_db_id == 0x7856341200000000
    # A file from a big-endian host reads with byte_order=">".
    assert parse_db(hdr(6) + CFG6, byte_order=">").cfg.last_db_id == 0x12345678


def test_struct_padding_sizes_in_written_chunks():
    assert len(encode_chunk(CfgChunk(1, True))) == 8 + 16
    assert len(encode_chunk(ClientChunk("c"))) == 8 + 24 + 1
    assert len(encode_chunk(SubChunk("c", "t", 1))) == 8 + 12 + 2
    assert len(encode_chunk(ClientMsgChunk(1, "c", 1, 1, 11, 1))) == 8 + 16 + 1
    assert len(encode_chunk(MsgStoreChunk(1, "t", b"p", 0, False))) == 8 + 32 + 2
    assert len(encode_chunk(RetainChunk(1))) == 8 + 8


def test_v6_message_store_with_properties_and_client_chunks():
    fixed = struct.pack("<Qq", 0x0102030405060708, 1_700_000_000) + struct.pack(
        ">IHHHHHBB", 7, 2, 9, 8, 5, 1883, 2, 1)
    # payload format indicator 1, user property k=v, correlation data 00 01 02
    props = bytes([0x01, 0x01, 0x26]) + s16(b"k") + s16(b"v") + bytes([0x09]) + s16(b"\x00\x01\x02")
    block = bytes([len(props)]) + props  # varint length (< 128: one byte)
    store = fixed + b"source_id" + b"username" + b"topic" + b"payload" + block
    client = struct.pack("<q", 35) + struct.pack(">IHHHH", 0xFFFFFFFF, 0x5287, 9, 1883, 7) + bytes(4)
    client += b"client-id" + b"usrname"
    cmsg = struct.pack("<Q", 0x0102030405060708) + struct.pack(">HHBBBB", 0x73, 9, 1, 3, 0x10, 1) + b"client-id"
    sub = struct.pack(">IHHBBxx", 0x7623, 9, 12, 1, 0x0C) + b"client-id" + b"subscription"
    data = hdr(6) + CFG6 + c56(2, store) + c56(6, client) + c56(3, cmsg) + c56(5, sub) + c56(4, struct.pack("<Q", 5), 0)
    db = parse_db(data, "f")
    m = db.msg_stores[0x0102030405060708]
    assert (m.topic, m.payload, m.qos, m.retain, m.source_id, m.source_username, m.source_port, m.source_mid,
            m.expiry_time) == ("topic", b"payload", 2, True, "source_id", "username", 1883, 2, 1_700_000_000)
    assert m.properties.items == ((1, 1), (38, ("k", "v")), (9, b"\x00\x01\x02"))
    assert db.clients == [ClientChunk("client-id", 0x5287, 35, 0xFFFFFFFF, 1883, b"usrname", None, offset=db.clients[0].offset)]
    cm = db.client_msgs[0]
    assert (cm.mid, cm.qos, MsgState(cm.state), cm.retain, cm.dup, Direction(cm.direction)) == (
        0x73, 1, MsgState.WAIT_FOR_PUBACK, True, False, Direction.OUT)
    assert (db.subs[0].identifier, db.subs[0].options, db.subs[0].topic) == (0x7623, 0x0C, "subscription")
    assert db.retains[0].store_id == 5  # a RETAIN chunk with length 0, as in Mosquitto's fixtures
    # Our writer reproduces these bytes (apart from that length-0 RETAIN header).
    assert encode_db(db.chunks, reorder=False) == data[:-16] + c56(4, struct.pack("<Q", 5))


def test_v5_client_has_no_username_or_port():
    body = struct.pack("<q", 35) + struct.pack(">IHH", 0xFFFFFFFF, 0x5287, 9) + b"client-id"
    db = parse_db(hdr(5) + CFG6 + c56(6, body))
    assert db.clients[0] == ClientChunk("client-id", 0x5287, 35, 0xFFFFFFFF, 0, None, None, offset=47)


def test_v3_and_v4_layouts_and_v2_client():
    cfg = c234(1, b"\x01\x08" + struct.pack("<Q", 0x17))
    store3 = struct.pack("<Q", 0x54) + s16(b"source_id") + struct.pack(">HH", 2, 0) + s16(b"topic") + b"\x02\x01" + \
        struct.pack(">I", 7) + b"payload"
    client3 = s16(b"client-id") + struct.pack(">H", 0x5287) + struct.pack("<q", 1553000061)
    cmsg3 = s16(b"client-id") + struct.pack("<Q", 0x54) + struct.pack(">H", 0x73) + bytes([1, 0, 1, 3, 0])
    sub3 = s16(b"client-id") + s16(b"subscription") + b"\x01"
    db = parse_db(hdr(3) + cfg + c234(2, store3) + c234(6, client3) + c234(3, cmsg3) + c234(5, sub3) +
                  c234(4, struct.pack("<Q", 0x54)))
    m = db.msg_stores[0x54]
    assert (m.topic, m.payload, m.qos, m.retain, m.source_id, m.source_mid) == ("topic", b"payload", 2, True, "source_id", 2)
    assert db.clients[0].last_mid == 0x5287 and db.clients[0].disconnect_time == 1553000061
    cm = db.client_msgs[0]
    assert (cm.store_id, cm.mid, cm.qos, cm.state, cm.direction) == (0x54, 0x73, 1, 3, 1)
    assert (db.subs[0].topic, db.subs[0].qos) == ("subscription", 1)
    assert db.retains == [RetainChunk(0x54, offset=db.retains[0].offset)]

    store4 = struct.pack("<Q", 0xFEDCBA9876543210) + s16(b"source_id") + s16(b"username") + struct.pack(">H", 1883) + \
        struct.pack(">HH", 0x88, 0) + s16(b"topic") + b"\x01\x00" + struct.pack(">I", 7) + b"payload"
    m4 = parse_db(hdr(4) + cfg + c234(2, store4)).msg_stores[0xFEDCBA9876543210]
    assert (m4.source_username, m4.source_port, m4.source_mid, m4.qos) == ("username", 1883, 0x88, 1)

    client2 = s16(b"old") + struct.pack(">H", 9)  # v2: no disconnect time
    assert parse_db(hdr(2) + cfg + c234(6, client2)).clients[0].disconnect_time is None


def test_unknown_chunks_are_skipped_by_length():
    db = parse_db(hdr(5) + c56(0xFFFFFFFF, b"abcdefghij") + CFG6)
    assert isinstance(db.chunks[0], UnknownChunk) and db.cfg.last_db_id == 0x7856341200000000
    db3 = parse_db(hdr(3) + c234(0xFFFF, b"nochunk") + c234(1, b"\x01\x08" + struct.pack("<Q", 0x17)))
    assert db3.cfg.last_db_id == 0x17


@pytest.mark.parametrize(
    "data, where",
    [
        (b"", "byte offset 0: file is empty"),
        (b"corrupt\n", "byte offset 0: not a Mosquitto persistence file"),
        (MAGIC + b"\x00\x00", "byte offset 15: truncated file header"),
        (hdr(7), "byte offset 19: unsupported database version 7"),
        (hdr(6) + c56(1, b"\x00" * 8 + b"\x01\x09" + bytes(6)), "dbid_size is 9"),
        (hdr(6) + CFG6 + b"\x00\x00\x00", "byte offset 47: truncated chunk header"),
        (hdr(6) + CFG6 + c56(2, bytes(40), 4000), "runs past the end of the file"),
        (hdr(6) + CFG6 + c56(2, bytes(8) + bytes(8) + struct.pack(">IHHHHHBB", 0, 0, 0, 0, 1, 0, 7, 0) + b"t"),
         "QoS 7"),
        (hdr(6) + CFG6 + c56(77, b"xx", 1 << 30), "runs past the end of the file"),
    ],
)
def test_damage_is_reported_with_file_and_offset(data, where):
    with pytest.raises(ImportFormatError) as e:
        parse_db(data, "/data/mosquitto.db")
    msg = str(e.value)
    assert msg.startswith("Import error: /data/mosquitto.db: byte offset ") and where in msg


def test_read_db_names_missing_file(tmp_path):
    with pytest.raises(ImportFormatError, match="nope.db: cannot read"):
        read_db(tmp_path / "nope.db")


def _sample() -> bytes:
    p = MqttProperties(((3, "text/plain"), (38, ("a", "b"))))
    return encode_db([
        MsgStoreChunk(1, "x/1", b"one", 1, True, properties=p),
        MsgStoreChunk(2, "x/2", b"two" * 20, 2, False),
        MsgStoreChunk(3, "x/3", b"three", 1, False),
        ClientChunk("c1", session_expiry_interval=0xFFFFFFFF, username=b"u"),
        ClientMsgChunk(2, "c1", 1, 2, MsgState.QUEUED, Direction.OUT),
        ClientMsgChunk(3, "c1", 2, 1, MsgState.QUEUED, Direction.OUT),
        SubChunk("c1", "x/#", 2),
        RetainChunk(1),
    ])


def test_every_truncation_is_an_error_or_a_chunk_boundary():
    data = _sample()
    full = parse_db(data)
    boundaries = {c.offset for c in full.chunks} | {len(data)}
    for n in range(len(data)):
        try:
            db = parse_db(data[:n], "trunc.db")
        except ImportFormatError as e:
            assert "trunc.db: byte offset " in str(e)
            continue
        assert n in boundaries, f"truncation at {n} went unnoticed"
        assert db.chunks == full.chunks[: len(db.chunks)]


def test_garbage_after_the_last_chunk_and_skip_damaged():
    data = _sample()
    with pytest.raises(ImportFormatError, match=f"byte offset {len(data)}"):
        parse_db(data + b"\xde\xad\xbe\xef\x99", "g.db")
    db = parse_db(data + b"\xde\xad\xbe\xef\x99", "g.db", skip_damaged=True)
    assert len(db.damaged) == 1 and db.damaged[0].offset == len(data)
    assert len(db.msg_stores) == 3


def test_skip_damaged_steps_over_one_bad_chunk():
    data = bytearray(_sample())
    second = [c for c in parse_db(bytes(data)).chunks if isinstance(c, MsgStoreChunk)][1]
    qos_at = second.offset + 8 + 30
    data[qos_at] = 9
    with pytest.raises(ImportFormatError, match=r"MSG_STORE chunk at offset %d: .*QoS 9" % second.offset):
        parse_db(bytes(data), "bad.db")
    db = parse_db(bytes(data), "bad.db", skip_damaged=True)
    assert sorted(db.msg_stores) == [1, 3]
    assert [d.offset for d in db.damaged] == [second.offset]
    assert len(db.client_msgs) == 2 and len(db.retains) == 1


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
_props = st.lists(st.one_of(
    st.tuples(st.just(3), _text),
    st.tuples(st.just(8), _text),
    st.tuples(st.just(9), st.binary(max_size=20)),
    st.tuples(st.just(1), st.integers(0, 1)),
    st.tuples(st.just(11), st.integers(1, 268_435_455)),
    st.tuples(st.just(38), st.tuples(_text, _text)),
), max_size=5).map(lambda items: MqttProperties(tuple(items)))
_stores = st.builds(
    MsgStoreChunk, st.integers(1, 2**64 - 1), _text, st.binary(max_size=300), st.integers(0, 2), st.booleans(),
    st.integers(0, 2**40), st.integers(0, 65535), st.none() | _text, st.none() | _text, st.integers(0, 65535), _props)
_cmsgs = st.builds(ClientMsgChunk, st.integers(1, 2**64 - 1), _text, st.integers(0, 65535), st.integers(0, 2),
                   st.integers(0, 11), st.integers(0, 1), st.booleans(), st.booleans(), _props)
_clients = st.builds(ClientChunk, _text, st.integers(0, 65535), st.integers(-2**63, 2**63 - 1),
                     st.integers(0, 2**32 - 1), st.integers(0, 65535), st.none() | st.binary(min_size=1, max_size=10))
_subs = st.builds(SubChunk, _text, _text, st.integers(0, 2), st.integers(0, 2**32 - 1), st.integers(0, 255))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(_stores, _cmsgs, _clients, _subs, st.builds(RetainChunk, st.integers(0, 2**64 - 1))),
                max_size=8))
def test_writer_reader_round_trip(chunks):
    data = encode_db(chunks, reorder=False)
    db = parse_db(data)
    got = [c for c in db.chunks if not isinstance(c, CfgChunk)]
    for c in got:
        c.offset = -1
    assert got == chunks
