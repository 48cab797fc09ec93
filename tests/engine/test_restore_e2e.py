"""Acceptance, end to end on both brokers: backup -> source unchanged -> delete everything ->
restore definitions and messages -> consumers see what was there before, in order."""

from __future__ import annotations

import os
from dataclasses import replace
from support.restores import (
    EVERY_HEADER, EVERY_PROPERTY, STREAM_HEADERS, STREAM_PROPERTY, consume_all, expected_after_restore,
    headers_equal,
)

from rbak.backup.engine import run_backup
from rbak.config import Config
from rbak.format.record import Long
from rbak.restore import run_restore
from rbak.format.amqp091 import encode_basic_properties
from rbak.config import ConnectionConfig, DefinitionsSelection
from rbak.restore.options import RestoreOptions
from rbak.restore.publisher import ConfirmingPublisher

HOSTILE = "a/b c%d ünï 🐇"
QUEUES = {  # name -> (type, routing key on e2e.x, headers, properties, bodies)
    "classic-q": ("classic", "rk.classic"),
    "quorum-q": ("quorum", "rk.quorum"),
    "stream-q": ("stream", "rk.stream"),
    HOSTILE: ("classic", "rk.hostile"),
}
IGNORED = ("x-stream-offset", "x-delivery-count", "x-acquired-count")  # added by the broker on delivery (4.3: acquired)


def _messages(name, qtype):
    bodies = [b"", bytes(range(256)) * 3] + [f"{name}-{i}".encode() for i in range(40)]
    if name == "classic-q":
        bodies.append(os.urandom(16 * 1024 * 1024))
    stream = qtype == "stream"
    base_h, base_p = (STREAM_HEADERS, STREAM_PROPERTY) if stream else (EVERY_HEADER, EVERY_PROPERTY)
    return [(b, base_h + (("seq", Long(i)),), replace(base_p, message_id=f"{name}-{i}")) for i, b in enumerate(bodies)]


def _check(got, sent, qtype):
    assert [d.body for d in got] == [b for b, _, _ in sent]
    for d, (_, h, p) in zip(got, sent):
        assert d.properties == p
        assert headers_equal(d.headers, expected_after_restore(h), ignore=IGNORED)


def test_backup_delete_everything_restore_definitions_and_messages(broker, vhost, tmp_path):
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.exchange_declare("e2e.x", "direct", durable=True)
        for name, (qtype, rk) in QUEUES.items():
            ch.queue_declare(name, durable=True, arguments={"x-queue-type": qtype})
            ch.queue_bind(name, "e2e.x", rk)
    sent = {name: _messages(name, qtype) for name, (qtype, _) in QUEUES.items()}
    with broker.wire(vhost) as conn:  # every header variant needs rbak's encoder (pika cannot express them)
        pub = ConfirmingPublisher(conn, "e2e", window=100)
        for name, (qtype, rk) in QUEUES.items():
            for i, (body, headers, props) in enumerate(sent[name]):
                pub.publish("e2e.x", rk, encode_basic_properties(props, headers), body, i)
        pub.drain()
        pub.close()

    cfg = Config.from_dict({
        "mode": "backup", "backup_id": "e2e",
        "source": {"amqp_url": broker.amqp_url("/"), "management_url": broker.management_url,
                   "stream_port": broker.stream_port, "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
    }, env={})
    summary = run_backup(cfg)
    assert summary.completed, summary.to_json_obj()
    assert {q.name: q.messages for q in summary.queues} == {n: len(m) for n, m in sent.items()}

    # the source is unchanged: same messages, same order (reading it here drains it)
    for name, (qtype, _) in QUEUES.items():
        _check(consume_all(broker, vhost, name, len(sent[name]), stream=qtype == "stream"), sent[name], qtype)

    broker.delete_vhost(vhost)  # delete everything
    assert not broker.vhost_exists(vhost)

    target = ConnectionConfig(amqp_url=broker.server_url(), management_url=broker.management_url)
    options = RestoreOptions(backup_id="e2e", target=target, restore_definitions=True, publish_mode="exchange",
                             definitions_selection=DefinitionsSelection(vhosts=[vhost]))
    storage = cfg.storage.open()
    result = run_restore(storage, options)
    assert result.ok, result.to_json_obj()
    assert result.definitions.imported and result.definitions.rollback_key
    assert broker.vhost_exists(vhost)
    assert {q["name"]: q["type"] for q in broker.list_queues(vhost)} == {n: t for n, (t, _) in QUEUES.items()}
    assert {q.source_queue: q.confirmed for q in result.queues} == {n: len(m) for n, m in sent.items()}
    for name, (qtype, _) in QUEUES.items():
        _check(consume_all(broker, vhost, name, len(sent[name]), stream=qtype == "stream"), sent[name], qtype)
