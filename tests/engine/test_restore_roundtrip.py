"""Backups built with the core writer, restored into real brokers, consumed back: equal, in order."""

from __future__ import annotations

import os

import pytest
from support.restores import (
    HOSTILE_NAMES, build_backup, consume_all, declare, expected_after_restore, headers_equal, make_records, options_for,
    storage_for,
)

from rbak.restore import run_restore


@pytest.mark.parametrize("qtype", ["classic", "quorum", "stream"])
def test_every_property_and_header_type_round_trips(broker, vhost, tmp_path, qtype):
    storage = storage_for(tmp_path)
    bodies = [b"", bytes(range(256)) * 4, b"plain text", os.urandom(70_000)] + [b"m%d" % i for i in range(300)]
    records = make_records(vhost, "orders", bodies, stream=qtype == "stream")
    build_backup(storage, "b1", [(vhost, "orders", qtype, records)], max_bytes=64 * 1024)
    declare(broker, vhost, "orders", qtype)
    summary = run_restore(storage, options_for(broker, "b1", produce_batch_size=50))
    assert summary.ok, summary.to_json_obj()
    (q,) = summary.queues
    assert (q.status, q.published, q.confirmed) == ("restored", len(bodies), len(bodies))
    got = consume_all(broker, vhost, "orders", len(bodies), stream=qtype == "stream")
    assert [d.body for d in got] == bodies
    for d, r in zip(got, records):
        assert d.properties == r.properties
        assert headers_equal(d.headers, expected_after_restore(r.headers)), (d.headers, r.headers)


def test_hostile_queue_names_and_16mib_body(broker, vhost, tmp_path):
    storage = storage_for(tmp_path)
    big = os.urandom(16 * 1024 * 1024)
    queues = []
    for i, name in enumerate(HOSTILE_NAMES):
        bodies = [b"%d-%s" % (j, name.encode()) for j in range(5)] + ([big] if i == 0 else [])
        queues.append((vhost, name, "classic", make_records(vhost, name, bodies, every_type=False)))
        declare(broker, vhost, name)
    build_backup(storage, "hostile", queues, max_bytes=1 << 20)
    summary = run_restore(storage, options_for(broker, "hostile", max_concurrent_queues=3))
    assert summary.ok, summary.to_json_obj()
    for _, name, _, records in queues:
        got = consume_all(broker, vhost, name, len(records))
        assert [d.body for d in got] == [r.body for r in records], name
