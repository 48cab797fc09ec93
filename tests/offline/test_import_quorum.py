"""``rbak import rabbitmq-dir`` rebuilds quorum queues from Ra logs written by real 4.0.5 / 4.3.6 / 3.10.8 nodes.

Reference: what a live AMQP 0-9-1 consumer read from each quorum queue (no
acks; closing returned everything) just before the node stopped or was
killed. Before that, a consumer acked 30 messages, nacked 10 back and left 10
unacked; messages carry priorities (4.0: two levels, 4.3: strict). The import
must give the same messages in the same order with the same properties and
headers (``x-delivery-count``/``x-acquired-count`` are added by the broker on
delivery, and 4.x re-sorts a header table it adds to, so the top-level header
order is not compared), then restore into a live broker alike.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.node_qs_scenarios import _body

from rbak.cli import main as rbak_main
from rbak.errors import ImportFormatError
from rbak.offline.rabbitmq import ra_log
from rbak.offline.rabbitmq.damage import ImportContext
from rbak.offline.rabbitmq.quorum import erlang_binary_literal
from rbak.offline.rabbitmq.rabbitmq_dir import import_rabbitmq_dir
from support.node_dirs import read_backup, shared_root, snapshot  # noqa: F401

from support.node_qs_scenarios import DELIVERY_HEADERS
from support.node_qs_scenarios import assert_same_records as _same
from support.node_qs_scenarios import versioned_scenario as scenario


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qs-4.0", "qs-4.3", "qs-kill-4.3", "qs-3.10"])
def test_quorum_queues_import_exactly_what_a_consumer_read(name, shared_root, tmp_path, capsys):
    sc = scenario(name, shared_root)
    before = snapshot(sc.data_dir)
    url = f"file://{tmp_path}/b"
    rc = rbak_main(["import", "rabbitmq-dir", str(sc.data_dir), "--to", url, "--backup-id", "q1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert snapshot(sc.data_dir) == before, "the importer changed the node's files"
    m, got = read_backup(url, "q1")
    kinds = {q.name: q.queue_type for q in m.queues}
    for key, refs in sc.quorum.items():
        assert kinds[key[1]] == "quorum"
        _same(got[key], refs, key)
    assert sum(len(v) for v in sc.quorum.values()) > 400
    # The consumer's acks, returns and priorities really shaped the order.
    fifo = [_body("q", i) for i in range(30, 300)] + [_body("r", i) for i in range(60)]
    bodies = [f.body for f in sc.quorum[("/", "qq-orders")]]
    assert len(bodies) == len(fifo) and bodies != fifo
    assert "queue 'qq-orders' (quorum, leader (single member), last applied index" in out, out
    assert "quorum: 3 queue(s)" in out and "stream: 3 queue(s)" in out and "classic:" not in out, out


@pytest.mark.slow
def test_quorum_wal_cut_short_and_damaged(shared_root, tmp_path):
    sc = scenario("qs-4.3", shared_root)
    copy = tmp_path / "node"
    shutil.copytree(sc.data_dir, copy)
    sysdir = next((copy / "quorum").iterdir())
    wal = ra_log.wal_files(str(sysdir))[-1]
    data = Path(wal).read_bytes()
    end = len(data.rstrip(b"\0"))
    # A node killed mid-write of an entry it never applied (a torn record after the last one): dropped
    # as Ra recovery drops it. (Cutting an entry the member had applied is a loss: test_import_losses.)
    logs = ra_log.read_server_logs(str(sysdir), ImportContext())
    last_at = max(e[3] for log in logs.values() for e in log.entries.values() if e[2] == wal)
    Path(wal).write_bytes(data[:end] + data[last_at: end - 5])
    res = import_rabbitmq_dir(str(copy), f"file://{tmp_path}/b", "w1", types={"quorum"})
    assert any("stopped mid-write" in n or "cut short" in n for n in res.ctx.notes), res.ctx.notes
    assert not res.ctx.skipped and res.manifest.state == "complete"
    # One flipped byte in the middle of the WAL: named with file and offset; --skip-damaged goes on.
    logs = ra_log.read_server_logs(str(sysdir), ImportContext())
    entries = [e for log in logs.values() for e in log.entries.values() if e[2] == wal and len(e[1]) > 100]
    victim = entries[len(entries) // 3][1]  # an entry in the middle of the WAL: flip a byte of its data
    bad = bytearray(data)
    bad[data.find(victim) + len(victim) // 2] ^= 0x55
    Path(wal).write_bytes(bytes(bad))
    with pytest.raises(ImportFormatError) as e:
        import_rabbitmq_dir(str(copy), f"file://{tmp_path}/b", "w2", types={"quorum"})
    assert wal in str(e.value) and "byte" in str(e.value)
    assert "skipped" not in str(e.value), "a fatal error must not say the rest was skipped"
    res = import_rabbitmq_dir(str(copy), f"file://{tmp_path}/b", "w3", types={"quorum"}, skip_damaged=True)
    assert res.ctx.skipped and all(s.path == wal or s.path.startswith(str(sysdir)) for s in res.ctx.skipped)


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.parametrize("name", ["qs-4.0", "qs-4.3"])
def test_imported_quorum_queue_restores_into_a_live_broker(name, shared_root, tmp_path, broker, vhost):
    from support.restores import consume_all, declare, expected_after_restore, headers_equal, options_for

    from rbak.restore import run_restore
    from rbak.storage import open_storage

    sc = scenario(name, shared_root)
    url = f"file://{tmp_path}/b"
    assert rbak_main(["import", "rabbitmq-dir", str(sc.data_dir), "--to", url, "--backup-id", "e2e",
                      "--types", "quorum", "--vhost", "/", "--queue", "qq-orders"]) == 0
    declare(broker, vhost, "qq-orders", "classic")  # FIFO target: the backup's order is what comes out
    summary = run_restore(open_storage(url), options_for(broker, "e2e", vhost_mapping=(("/", vhost),)))
    assert summary.ok, summary.to_json_obj()
    refs = sc.quorum[("/", "qq-orders")]
    got = consume_all(broker, vhost, "qq-orders", len(refs))
    assert [d.body for d in got] == [r.body for r in refs]
    for d, r in zip(got, refs):
        assert d.properties == r.properties
        want = tuple((k, v) for k, v in r.headers if k not in DELIVERY_HEADERS)
        assert headers_equal(d.headers, expected_after_restore(want)), (d.headers, r.headers)


def test_erlang_binary_literals():
    assert erlang_binary_literal(b'<<"/">>') == b"/"
    assert erlang_binary_literal('<<"imp-vh-ü">>'.encode()) == "imp-vh-ü".encode()
    assert erlang_binary_literal(b'<<"a\\"b\\\\c\\n">>') == b'a"b\\c\n'
    assert erlang_binary_literal(b"<<104,105>>") == b"hi"
    assert erlang_binary_literal('<<"ü"/utf8>>'.encode()) == "ü".encode()
    assert erlang_binary_literal(b"<<\"\\x{1F407}\">>") == "\U0001F407".encode()
    assert erlang_binary_literal(b"nope") is None
