"""AMQP decimal headers through a real backup and restore: the value and the bytes come back (issue 27)."""

from __future__ import annotations

from decimal import Decimal

import pika
import pytest
from support.backups import backup_config, drain
from support.restores import consume_all, declare, headers_equal, options_for

from rbak.backup import BackupEngine
from rbak.format.record import decimal_header
from rbak.restore import run_restore
from rbak.storage import open_storage

DECIMALS = {
    "neg": Decimal("-0.001"), "pos": Decimal("123.45"), "zero": Decimal(0), "int": Decimal(7),
    "i32-max": Decimal(2**31 - 1), "i32-min": Decimal(-(2**31)), "tiny": Decimal("1E-255"),
    "tiny-neg": Decimal("-2147483648E-255"), "neg-frac": Decimal("-21474.83648"),
}


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
@pytest.mark.parametrize("protocol", ["auto", "amqp091"])
def test_decimal_headers_round_trip_exactly(broker, vhost, tmp_path, qtype, protocol):
    declare(broker, vhost, "src", qtype)
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("", "src", b"m%d" % i, pika.BasicProperties(
                delivery_mode=2, headers={**DECIMALS, "nested": {"d": Decimal("-0.5")}, "seq": i}))
    store, state = tmp_path / "store", tmp_path / "state.db"
    summary = BackupEngine(backup_config(broker, vhost, store, "dec", state)).run()
    assert summary.completed
    declare(broker, vhost, "dst", qtype)
    res = run_restore(open_storage(f"file://{store}"), options_for(
        broker, "dec", protocol=protocol, queue_mapping=(("src", "dst"),)))
    assert res.ok, res.to_json_obj()
    (q,) = res.queues
    assert (q.status, q.confirmed) == ("restored", 3)
    if broker.version.startswith("4") and protocol == "auto":
        assert q.protocol in ("amqp091", "amqp10+amqp091")  # AMQP 1.0 cannot carry a decimal exactly
    got = drain(broker, vhost, "dst")
    assert [b for b, _, _ in got] == [b"m0", b"m1", b"m2"]
    for i, (_, props, _) in enumerate(got):
        h = props.headers
        for k, v in DECIMALS.items():
            assert type(h[k]) is Decimal and h[k] == v, (k, h[k], v)
        assert h["neg"].as_tuple() == Decimal("-0.001").as_tuple()
        assert h["nested"] == {"d": Decimal("-0.5")} and h["seq"] == i
    # byte for byte: the source (left intact by the backup) and the restored copy decode to the same
    # typed values, and a D value's decoding is one-to-one with its 5 bytes
    src = consume_all(broker, vhost, "src", 3)
    declare(broker, vhost, "dst2", qtype)
    run_restore(open_storage(f"file://{store}"), options_for(
        broker, "dec", protocol=protocol, queue_mapping=(("src", "dst2"),)))
    dst = consume_all(broker, vhost, "dst2", 3)
    assert sorted(d.body for d in src) == [d.body for d in dst]
    by_body = {d.body: d for d in src}
    for b in dst:
        a = by_body[b.body]  # a quorum source read by the backup gained x-delivery-count (and 4.x x-acquired-count)
        assert headers_equal(a.headers, b.headers, ignore=("x-delivery-count", "x-acquired-count")), (
            sorted(set(a.headers) ^ set(b.headers)))
        assert dict(b.headers)["neg"] == decimal_header(3, -1)
