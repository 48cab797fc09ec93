"""The restore's logic on the memory transport (``rbak.broker.memory``): no broker.

Plans, checkpoints and resume, lossy targets that drop or refuse, confirms, returns and a connection
lost mid-publish, each asserted on what the target queue holds (bodies in order, properties) and on
what the restore reports. The same behaviours against real brokers stay in the other test_restore_*
modules; these run in the quick lane.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from rbak import cli
from rbak.broker.memory import MemoryBroker, MemoryMessage
from rbak.commands import restore as restore_cmd
from rbak.errors import ConfigError, PublishError, RestoreError
from rbak.format.amqp091 import decode_basic_properties
from rbak.format.record import Long, Table
from rbak.restore import run_restore
from rbak.restore.checkpoint import RestoreCheckpoint
from rbak.restore.engine import checkpoint_fingerprint
from rbak.restore.options import RestoreOptions
from rbak.storage import MemoryStorage
from support.restores import build_backup, expected_after_restore, headers_equal, make_records

V = "prod"


def _bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def _backup(queues, max_bytes: int = 1 << 20, every_type: bool = False, start_ts: int = 1_700_000_000_000):
    """A memory storage holding backup "b" of ``queues``: {name: bodies} in vhost V."""
    storage = MemoryStorage()
    build_backup(storage, "b", [(V, name, "classic", make_records(V, name, bodies, every_type=every_type,
                                                                  start_ts=start_ts))
                                for name, bodies in queues.items()], max_bytes=max_bytes)
    return storage


def _broker(*queues: str, arguments: dict | None = None, **kw) -> MemoryBroker:
    broker = MemoryBroker(**kw)
    for q in queues:
        broker.declare(V, q, arguments=arguments)
    return broker


def _options(broker: MemoryBroker, **kw) -> RestoreOptions:
    kw.setdefault("produce_batch_size", 100)
    return RestoreOptions("b", transport=broker, **kw)


def test_every_record_lands_in_order_with_its_properties_and_the_checks_share_one_connection():
    bodies = _bodies(300)
    storage = _backup({"orders": bodies, "small": [b"a", b"b", b"c"]}, max_bytes=64 * 1024, every_type=True)
    broker = _broker("orders", "small")

    summary = run_restore(storage, _options(broker))

    assert summary.ok
    by_queue = {q.source_queue: q for q in summary.queues}
    assert {n: (q.status, q.published, q.confirmed, q.failed) for n, q in by_queue.items()} == {
        "orders": ("restored", 300, 300, 0), "small": ("restored", 3, 3, 0)}
    assert by_queue["orders"].protocol == "amqp091"
    assert (by_queue["orders"].initial_depth, by_queue["orders"].expected_depth,
            by_queue["orders"].found_depth) == (0, 300, 300)
    assert broker.bodies(V, "orders") == bodies
    assert broker.bodies(V, "small") == [b"a", b"b", b"c"]
    for m, r in zip(broker.messages(V, "orders"), make_records(V, "orders", bodies), strict=True):
        props, headers = decode_basic_properties(m.header)
        assert (m.exchange, m.routing_key, props) == ("", "orders", r.properties)
        assert headers_equal(headers, expected_after_restore(r.headers))
    # the checks before publishing (split target, lossy targets, max_message_size) share one connection;
    # each queue's run opens its own
    assert broker.connections_opened == 1 + 2


def test_a_time_window_and_a_mapping_select_and_move_exactly_the_records_inside():
    bodies = _bodies(50)
    storage = _backup({"orders": bodies}, max_bytes=256)  # backed_up_at = start + i ms
    broker = MemoryBroker()
    broker.declare("staging", "orders-copy")
    start = 1_700_000_000_000
    opts = _options(broker, window_start_ms=start + 10, window_end_ms=start + 19,
                    vhost_mapping=((V, "staging"),), queue_mapping=(("orders", "orders-copy"),))

    summary = run_restore(storage, opts)

    (q,) = summary.queues
    assert (q.status, q.target_vhost, q.target_queue, q.selected, q.confirmed) == (
        "restored", "staging", "orders-copy", 10, 10)
    assert q.skipped_records == 40
    assert broker.bodies("staging", "orders-copy") == bodies[10:20]
    assert broker.queue(V, "orders") is None


def test_a_non_empty_target_is_refused_and_allow_non_empty_adds_after_what_it_holds():
    storage = _backup({"orders": _bodies(5)})
    broker = _broker("orders")
    broker.queue(V, "orders").messages.append(MemoryMessage("", "orders", b"", b"already", "amqp091"))

    (q,) = run_restore(storage, _options(broker)).queues
    assert q.status == "failed" and "already holds 1 message(s)" in q.error and q.confirmed == 0
    assert broker.bodies(V, "orders") == [b"already"]

    (q,) = run_restore(storage, _options(broker, allow_non_empty=True)).queues
    assert (q.status, q.initial_depth, q.confirmed, q.found_depth) == ("restored", 1, 5, 6)
    assert broker.bodies(V, "orders") == [b"already", *_bodies(5)]


def test_a_target_whose_max_length_would_refuse_is_refused_before_anything_is_published():
    storage = _backup({"orders": _bodies(10)})
    broker = _broker("orders", arguments={"x-max-length": 5, "x-overflow": "reject-publish"})

    with pytest.raises(RestoreError) as e:
        run_restore(storage, _options(broker))

    assert "may drop, expire or dead-letter restored messages" in str(e.value)
    assert "max-length 5 (queue argument x-max-length) leaves room for 5 of the 10 message(s)" in str(e.value)
    assert "Nothing was published" in str(e.value)
    assert broker.bodies(V, "orders") == [] and broker.taken == 0


def test_a_lossy_target_that_rejects_fails_the_queue_with_the_confirmed_prefix_only():
    bodies = _bodies(10)
    storage = _backup({"orders": bodies})
    broker = _broker("orders", arguments={"x-max-length": 5, "x-overflow": "reject-publish"})

    summary = run_restore(storage, _options(broker, allow_lossy_target=True))

    (q,) = summary.queues
    assert not summary.ok
    assert q.status == "failed"
    assert q.error.startswith("AMQP error: the broker rejected (nack) a message for queue 'orders' in vhost 'prod'")
    assert (q.published, q.confirmed, q.failed) == (10, 5, 5)
    assert q.lossy_settings and q.lossy_settings[0].startswith("max-length 5")
    assert broker.bodies(V, "orders") == bodies[:5]


def test_a_lossy_target_that_drops_the_oldest_fails_the_depth_check_naming_what_is_missing():
    bodies = _bodies(10)
    storage = _backup({"orders": bodies})
    broker = _broker("orders", arguments={"x-max-length": 5})  # overflow drop-head: every publish is confirmed

    (q,) = run_restore(storage, _options(broker, allow_lossy_target=True)).queues

    assert q.status == "failed" and (q.confirmed, q.expected_depth, q.found_depth) == (10, 10, 5)
    assert ("holds 5 message(s) after the restore, expected 10 (0 before + 10 confirmed): 5 restored message(s) "
            "are missing") in q.error
    assert broker.bodies(V, "orders") == bodies[5:]


def test_a_connection_lost_mid_publish_resumes_from_the_checkpoint_without_a_duplicate(tmp_path):
    bodies = _bodies(1000)
    storage = _backup({"orders": bodies}, max_bytes=2048)
    broker = _broker("orders")
    broker.lose_connection_after = 650
    cp = str(tmp_path / "cp.db")

    (first,) = run_restore(storage, _options(broker, checkpoint_state=cp)).queues

    assert first.status == "failed" and "connection lost while publishing queue 'orders'" in first.error
    assert broker.bodies(V, "orders") == bodies[:650]  # the broker took 650; fewer were confirmed
    checkpointed = _checkpointed(cp, broker)
    assert first.confirmed == checkpointed < 650 and first.published == 650

    (second,) = run_restore(storage, _options(broker, checkpoint_state=cp)).queues

    assert second.status == "restored"
    assert second.reconciled == 650 - checkpointed  # enqueued by the first run, not confirmed to it
    assert (second.published, second.confirmed, second.found_depth) == (350, 1000, 1000)
    assert broker.bodies(V, "orders") == bodies

    (third,) = run_restore(storage, _options(broker, checkpoint_state=cp)).queues
    assert (third.status, third.confirmed, third.published) == ("already-done", 1000, 0)
    assert broker.bodies(V, "orders") == bodies


def _checkpointed(path: str, broker: MemoryBroker) -> int:
    cp = RestoreCheckpoint(path, checkpoint_fingerprint(_options(broker, checkpoint_state=path)))
    try:
        return cp.load(V, "orders").confirmed
    finally:
        cp.close()


def test_an_unroutable_record_in_exchange_mode_is_returned_and_stops_the_queue():
    storage = MemoryStorage()
    records = make_records(V, "orders", _bodies(4), exchange="ex", routing_key="k", every_type=False)
    records[2] = dataclasses.replace(records[2], routing_key="nowhere")
    build_backup(storage, "b", [(V, "orders", "classic", records)])
    broker = _broker("orders")
    broker.bind(V, "ex", "orders", "k")

    (q,) = run_restore(storage, _options(broker, publish_mode="exchange")).queues

    assert q.status == "failed"
    assert ("message for queue 'orders' in vhost 'prod' -> queue 'orders' in vhost 'prod' was returned as "
            "unroutable by exchange 'ex' with routing key 'nowhere': 312 NO_ROUTE") in q.error
    assert (q.published, q.confirmed, q.failed) == (4, 2, 1)
    assert [(m.exchange, m.routing_key, m.body) for m in broker.messages(V, "orders")] == [
        ("ex", "k", b"m-0"), ("ex", "k", b"m-1"), ("ex", "k", b"m-3")]  # the broker took m-3: not confirmed


def test_a_management_url_of_another_cluster_refuses_the_restore_before_publishing():
    storage = _backup({"orders": _bodies(3)})
    broker = _broker("orders")
    broker.management_cluster_name = "rabbit@elsewhere"

    with pytest.raises(ConfigError, match="answers for cluster 'rabbit@elsewhere', but .* is cluster "
                                          "'rabbit@memory'"):  # a configuration error: exit 2
        run_restore(storage, _options(broker))
    assert broker.taken == 0


def test_a_record_over_the_announced_max_message_size_is_refused_or_skipped_and_listed():
    bodies = [b"a" * 10, b"b" * 300, b"c" * 10]
    storage = _backup({"orders": bodies})
    broker = _broker("orders", max_message_size=100)

    with pytest.raises(RestoreError, match="record 1 of .* has a 300-byte body, over the target's "
                                           "max_message_size 100"):
        run_restore(storage, _options(broker))
    assert broker.taken == 0

    (q,) = run_restore(storage, _options(broker, allow_oversize_skip=True)).queues
    assert (q.status, q.confirmed) == ("restored", 2)
    assert [(o["index"], o["bytes"]) for o in q.oversize_skipped] == [(1, 300)]
    assert broker.bodies(V, "orders") == [b"a" * 10, b"c" * 10]


def test_amqp10_publishes_the_sections_to_the_queue_address():
    bodies = _bodies(300)
    storage = _backup({"orders": bodies})
    broker = _broker("orders")

    (q,) = run_restore(storage, _options(broker, protocol="amqp10")).queues

    assert (q.status, q.protocol, q.confirmed) == ("restored", "amqp10", 300)
    assert broker.bodies(V, "orders") == bodies
    assert {m.encoding for m in broker.messages(V, "orders")} == {"amqp10"}


def test_the_memory_publisher_keeps_the_contract_confirmed_prefix_then_a_nack():
    broker = _broker("q", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    conn = broker.connect(V)
    pub = broker.publisher(conn, V, "q", "queue 'q'", 10, True, "amqp091")
    for token in (1, 2, 3, 4):
        pub.publish("", "q", b"", b"x%d" % token, token)
    assert pub.take_progress() == (False, None) and pub.in_flight == 4  # confirms not read yet

    with pytest.raises(PublishError, match=r"rejected \(nack\) a message for queue 'q'"):
        pub.drain()
    assert (pub.published, pub.confirmed, pub.failed) == (4, 2, 2)
    assert pub.take_progress() == (True, 2)
    with pytest.raises(PublishError):
        pub.publish("", "q", b"", b"x5", 5)
    assert broker.bodies(V, "q") == [b"x1", b"x2"]


def test_the_cli_reports_a_refused_queue_in_its_json_and_exits_non_zero(monkeypatch, capsys):
    bodies = _bodies(10)
    storage = _backup({"orders": bodies})
    broker = _broker("orders", arguments={"x-max-length": 5, "x-overflow": "reject-publish"})
    options = _options(broker, allow_lossy_target=True, write_dir=None)
    monkeypatch.setattr(restore_cmd, "build", lambda args: (storage, options, None))

    code = cli.main(["restore", "--json", "--backup-id", "b"])

    assert code == RestoreError.exit_code and code != 0
    out = json.loads(capsys.readouterr().out)
    assert (out["ok"], out["exit_code"], out["error"]["class"]) == (False, code, "RestoreError")
    assert out["error"]["message"].startswith("Restore error: 1 queue(s) failed, first queue 'orders' in vhost 'prod': AMQP error: "
                                              "the broker rejected (nack) a message")
    (q,) = out["queues"]
    assert (q["status"], q["confirmed"], q["failed"]) == ("failed", 5, 5)
    assert broker.bodies(V, "orders") == bodies[:5]


def test_the_cli_says_restore_error_once_and_names_the_queue_as_rbak_does(monkeypatch, capsys):
    """A new user's trial of issue 49: "Restore error: ... first //trial49-q: Restore error: ..."."""
    storage = MemoryStorage()
    build_backup(storage, "b", [("/", "trial49-q", "classic", make_records("/", "trial49-q", _bodies(3)))])
    broker = MemoryBroker()
    broker.declare("/", "other")  # the vhost is there, the queue is not
    monkeypatch.setattr(restore_cmd, "build", lambda args: (storage, _options(broker, write_dir=None), None))

    code = cli.main(["restore", "--backup-id", "b"])

    assert code == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == ("rbak: Restore error: 1 queue(s) failed, first queue 'trial49-q' in vhost '/': queue 'trial49-q' "
                   "in vhost '/' does not exist (restore the definitions first, or create it); it is the target of "
                   "queue 'trial49-q' in vhost '/'"), err


def test_a_record_1_0_cannot_carry_switches_the_rest_of_the_queue_to_0_9_1_in_order():
    storage = MemoryStorage()
    records = make_records(V, "orders", _bodies(6), every_type=False)
    records[3] = dataclasses.replace(records[3], headers=(("nested", Table((("k", Long(1)),))),))  # 1.0: no tables
    build_backup(storage, "b", [(V, "orders", "classic", records)])
    broker = _broker("orders")

    (q,) = run_restore(storage, _options(broker, protocol="amqp10")).queues

    assert (q.status, q.protocol, q.published, q.confirmed) == ("restored", "amqp10+amqp091", 6, 6)
    assert [(m.body, m.encoding) for m in broker.messages(V, "orders")] == [
        (b"m-0", "amqp10"), (b"m-1", "amqp10"), (b"m-2", "amqp10"),
        (b"m-3", "amqp091"), (b"m-4", "amqp091"), (b"m-5", "amqp091")]
    _, headers = decode_basic_properties(broker.messages(V, "orders")[3].header)
    assert headers_equal(headers, (("nested", Table((("k", Long(1)),))),))
