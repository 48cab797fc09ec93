"""Quorum queues as ``rabbit_fifo`` recovers them after a restart: consumers found dead, 4.3's delayed
retries, (node_fifo_scenarios.py). The reference is a live consumer's read after restarting the node
on the same data (the import reads a copy taken while it was stopped)."""

from __future__ import annotations

import pytest
import support.node_fifo_scenarios  # noqa: F401 - registers the scenarios
from support.node_dirs import read_backup, shared_root, snapshot  # noqa: F401
from support.node_qs_scenarios import assert_same_records as _same
from support.node_qs_scenarios import versioned_scenario as scenario

from rbak.offline.rabbitmq.rabbitmq_dir import RabbitImportOptions, import_rabbitmq_dir


def _import(sc, tmp_path, bid="r1"):
    before = snapshot(sc.data_dir)
    url = f"file://{tmp_path}/b"
    res = import_rabbitmq_dir(str(sc.data_dir), url, bid, RabbitImportOptions(types={"quorum"}))
    assert snapshot(sc.data_dir) == before
    return res, read_backup(url, bid)[1]


def _bodies(sc, q):
    return [r.body.decode() for r in sc.quorum[("/", q)]]


@pytest.mark.slow
def test_delayed_retry_after_a_kill_imports_what_the_restarted_node_delivers(shared_root, tmp_path):
    sc = scenario("qdelay-4.3", shared_root)
    res, got = _import(sc, tmp_path)
    notes = "\n".join(res.ctx.notes)
    assert "'qq-dr-returned' in vhost '/': 2 delayed-retry message(s) held back at the stop" in notes, notes
    assert "'qq-dr-limit' in vhost '/': 2 message(s) consumers held at the stop are past the delivery limit" \
        in notes, notes
    for key, refs in sc.quorum.items():
        _same(got.get(key, []), refs, key)
    # The broker really reordered them, so an import ignoring the delays could not pass:
    # returned: the dead consumer's five come back at once (failed deliveries), then the two nacked
    # ones delayed before the stop, the first nacked first (the timer's cached next) though its index is higher.
    assert _bodies(sc, "qq-dr-returned")[:7] == [f"returned-{i}" for i in (0, 2, 4, 5, 6, 3, 1)], sc.quorum
    # all: the one nacked before the stop is due first; what the dead consumer held is delayed after it.
    assert _bodies(sc, "qq-dr-all")[:3] == ["all-2", "all-1", "all-3"], _bodies(sc, "qq-dr-all")
    # failed: the dead consumer held 0, 2 and 1 (redelivered after its nack), delayed alike: index order.
    assert _bodies(sc, "qq-dr-failed")[:3] == ["failed-0", "failed-1", "failed-2"], _bodies(sc, "qq-dr-failed")
    # delivery limit 0: the dead consumer's messages are failed deliveries past it at the restart.
    assert _bodies(sc, "qq-dr-limit") == [f"limit-{i}" for i in range(4, 12)] + ["late-100"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qcons-3.10", "qcons-4.0", "qcons-4.3"])
def test_consumers_alive_at_the_kill_import_what_the_restarted_node_delivers(name, shared_root, tmp_path):
    """Competing consumers with credit left, single active consumers waiting (with priorities on 4.x) and an
    AMQP 1.0 credited receiver: the restarted queue hands returned messages to consumers it has not yet
    found dead; the import replays that."""
    sc = scenario(name, shared_root)
    _res, got = _import(sc, tmp_path)
    for key, refs in sc.quorum.items():
        _same(got.get(key, []), refs, key)
    # Not the order the consumers held them in (what returning each one's messages in turn would give).
    spare = _bodies(sc, "qq-spare")
    assert sorted(spare) == sorted(f"spare-{i}" for i in range(6)) and spare != [f"spare-{i}" for i in range(6)]
    sac = _bodies(sc, "qq-sac")
    assert len(sac) == 11 and sac[:4] != [f"sac-{i}" for i in range(1, 5)], sac
    credit = _bodies(sc, "qq-credit")
    assert len(credit) == 8 and credit[:3] != [f"credit-{i}" for i in range(3)], credit


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qexpire-3.10", "qexpire-4.0", "qexpire-4.3"])
def test_x_expires_queue_is_exported_with_a_note_saying_when_a_restart_deletes_it(name, shared_root, tmp_path):
    """A restarted node deletes a queue unused for longer than its x-expires, messages and all. When the
    restart happens the files cannot say: the import keeps the messages and says from when a restart deletes it."""
    sc = scenario(name, shared_root)
    res, got = _import(sc, tmp_path)
    assert sc.gone == ["qq-expires"]  # the real restart deleted it (and kept the other queue)
    assert [r.body for r in got[("/", "qq-expires")]] == [f"exp-{i}".encode() for i in range(5)]
    _same(got[("/", "qq-keep")], sc.quorum[("/", "qq-keep")], ("/", "qq-keep"))
    notes = "\n".join(res.ctx.notes)
    assert ("'qq-expires' in vhost '/': x-expires 30000 ms: exported, but RabbitMQ deletes the queue with its "
            "messages at the first tick of a restart after ") in notes, notes
    assert "'qq-keep' in vhost '/': x-expires" not in notes
