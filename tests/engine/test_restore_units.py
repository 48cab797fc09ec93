"""Pure parts of the restore: AMQP field encoding, planning, checkpoint, options (no broker)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbak.config import Config
from rbak.errors import CheckpointError, ConfigError, SerializationError
from rbak.format.manifest import BackupManifest, QueueBackup, SegmentMetadata
from rbak.format.record import (
    VOID, Array, BackupProperties, Bool, Bytes, Double, Float, Long, LongString, Short, ShortString, Table, Timestamp,
)
from rbak.restore.checkpoint import RestoreCheckpoint
from rbak.restore.fields import decode_basic_properties, decode_table, encode_basic_properties, encode_table, header_equal
from rbak.restore.options import RestoreOptions, options_from_config
from rbak.restore.plan import map_queue, plan_restore, segment_in_window

names = st.text(min_size=0, max_size=20).filter(lambda s: len(s.encode()) <= 255)
scalars = st.one_of(
    st.text(max_size=30).map(LongString),
    st.text(max_size=30).map(ShortString),
    st.integers(-(2**63), 2**63 - 1).map(Long),
    st.integers(-32768, 32767).map(Short),
    st.booleans().map(Bool),
    st.binary(max_size=30).map(Bytes),
    st.integers(0, 2**64 - 1).map(Timestamp),
    st.floats(width=32, allow_nan=False).map(Float),
    st.floats(allow_nan=True).map(Double),
    st.just(VOID),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(st.tuples(names, inner), max_size=4).map(lambda kv: Table(tuple(kv))),
        st.lists(inner, max_size=4).map(lambda xs: Array(tuple(xs))),
    ),
    max_leaves=12,
)


def _wire(v):
    """What a header reads back as: ShortString travels as a long string."""
    if type(v) is ShortString:
        return LongString(v.value)
    if type(v) is Table:
        return Table(tuple((k, _wire(x)) for k, x in v.value))
    if type(v) is Array:
        return Array(tuple(_wire(x) for x in v.value))
    return v


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(names, values), max_size=6))
def test_header_tables_round_trip_through_the_wire_encoding(pairs):
    headers = tuple(pairs)
    back = decode_table(encode_table(headers))
    assert header_equal(Table(back), _wire(Table(headers)))


def test_every_property_round_trips_and_absent_ones_stay_absent():
    p = BackupProperties("text/plain", "gzip", 2, 9, "c", "r", "60000", "id", 1_700_000_000, "t", "guest", "app", "cl")
    assert decode_basic_properties(encode_basic_properties(p, ((("k", Long(1)),)))) == (p, (("k", Long(1)),))
    empty = encode_basic_properties(BackupProperties(), ())
    assert empty == b"\x00\x00"
    assert decode_basic_properties(empty) == (BackupProperties(), None)


def test_wire_types_rabbitmq_and_other_clients_use_are_read_into_variants():
    def entry(key, kind, payload):
        k = key.encode()
        return bytes([len(k)]) + k + kind + payload

    body = b"".join([
        entry("b", b"b", struct.pack(">b", -5)), entry("B", b"B", b"\xfa"), entry("u", b"u", struct.pack(">H", 40000)),
        entry("U", b"U", struct.pack(">h", -2)), entry("I", b"I", struct.pack(">i", -7)),
        entry("i", b"i", struct.pack(">I", 4_000_000_000)), entry("D", b"D", b"\x02" + struct.pack(">i", 12345)),
        entry("S", b"S", struct.pack(">I", 2) + b"\xff\xfe"),
    ])
    table = struct.pack(">I", len(body)) + body
    assert decode_table(table) == (
        ("b", Short(-5)), ("B", Short(250)), ("u", Long(40000)), ("U", Short(-2)), ("I", Long(-7)),
        ("i", Long(4_000_000_000)), ("D", LongString("123.45")), ("S", Bytes(b"\xff\xfe")),
    )


def test_values_that_do_not_fit_fail_naming_the_header():
    with pytest.raises(SerializationError, match=r"headers\.outer\.inner: Short 40000"):
        encode_table((("outer", Table((("inner", Short(40000)),))),))
    with pytest.raises(SerializationError, match="message_id: 300 bytes"):
        encode_basic_properties(BackupProperties(message_id="x" * 300), ())
    with pytest.raises(SerializationError, match="Float 1e\\+40"):
        encode_table((("f", Float(1e40)),))


def _seg(seq, first, last, n=10):
    return SegmentMetadata(f"k{seq}", seq, n, 100, 100, first, last, "")


def test_plan_skips_segments_outside_the_window_and_maps_names():
    q = QueueBackup("prod", "orders", segments=[_seg(1, 0, 9), _seg(2, 10, 19), _seg(3, 20, 29)])
    m = BackupManifest("b", 0, 1, queues=[q, QueueBackup("prod", "other", segments=[_seg(1, 0, 9)])])
    opts = RestoreOptions("b", window_start_ms=12, window_end_ms=19, vhost_mapping=(("prod", "staging"),),
                          queue_mapping=(("prod/orders", "orders-copy"), ("other", "x")))
    p1, p2 = plan_restore(m, opts)
    assert [s.sequence for s in p1.segments] == [2] and p1.skipped_segments == 2 and p1.skipped_records == 20
    assert (p1.target_vhost, p1.target_queue, p2.target_queue) == ("staging", "orders-copy", "x")
    assert not segment_in_window(0, 9, 10, 10, None) and segment_in_window(None, None, 1, 5, 6)
    assert map_queue("v", "q", {"q": "a", "v/q": "b"}) == "b"
    clash = RestoreOptions("b", queue_mapping=(("orders", "same"), ("other", "same")))
    with pytest.raises(ConfigError, match="would both be restored into queue 'same'"):
        plan_restore(m, clash)


def test_checkpoint_resumes_from_the_furthest_confirmed_record_and_refuses_another_config(tmp_path):
    path = str(tmp_path / "cp.db")
    cp = RestoreCheckpoint(path, {"backup_id": "b"})
    cp.start_queue("/", "q", "/", "q", 3)
    cp.record("/", "q", 1, 10, True, 10)
    cp.record("/", "q", 2, 4, False, 14)
    cp.close()
    state = RestoreCheckpoint(path, {"backup_id": "b"}).load("/", "q")
    assert (state.initial_depth, state.confirmed, state.resume_point()) == (3, 14, (2, 4))
    with pytest.raises(CheckpointError, match="belongs to a different restore"):
        RestoreCheckpoint(path, {"backup_id": "other"})


def test_options_from_the_config_file_sections():
    cfg = Config.from_dict({
        "mode": "restore", "backup_id": "b1",
        "target": {"amqp_url": "amqp://u:p@rabbit:5672/%2f", "management_url": "http://rabbit:15672"},
        "storage": {"backend": "filesystem", "path": "/tmp/x", "prefix": "pre"},
        "restore": {"time_window_start": "2024-01-01T00:00:00Z", "time_window_end": 1_800_000_000_000,
                    "publish_mode": "queue", "vhost_mapping": {"/": "staging"}, "allow_non_empty": True,
                    "definitions_selection": {"vhosts": ["/"]}, "produce_batch_size": 100},
    }, env={})
    o = options_from_config(cfg, dry_run=True)
    assert (o.backup_id, o.prefix, o.window_start_ms, o.window_end_ms) == ("b1", "pre", 1_704_067_200_000, 1_800_000_000_000)
    assert (o.publish_mode, o.vhost_map, o.allow_non_empty, o.dry_run, o.produce_batch_size) == ("queue", {"/": "staging"}, True, True, 100)
    assert o.definitions_selection.vhosts == ("/",)
    assert (o.target.management_username, o.target.management_password) == ("u", "p")
    assert "p@" not in repr(o.target)
