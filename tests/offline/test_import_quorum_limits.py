"""Quorum queues past x-max-length / x-max-length-bytes and with at-least-once dead-lettering import
exactly what the broker still delivered (3.10.8, 4.0.5, 4.3.6).

The scenarios (node_limit_scenarios.py) fill queues past their limits on real
nodes (drop-head by count with returned messages at the head, by bytes,
reject-publish, a policy that sets a limit after the messages were
published, at-most-once dead-lettering of dropped messages into another
quorum queue) and leave messages awaiting at-least-once dead-lettering to an
exchange that does not exist. A live consumer's read is the reference.
"""

from __future__ import annotations

import pytest
import support.node_limit_scenarios  # noqa: F401 - registers the qlim-* scenarios
from support.node_dirs import read_backup, shared_root, snapshot  # noqa: F401
from support.node_limit_scenarios import (
    DLX_REJECTED,
    SNAP_DLX_PENDING,
    SNAP_DLX_QUEUE,
    SNAP_LIMIT_QUEUE,
)
from support.node_qs_scenarios import assert_same_records as _same
from support.node_qs_scenarios import versioned_scenario as scenario

from rbak.offline.rabbitmq.rabbitmq_dir import RabbitImportOptions, import_rabbitmq_dir


def _bodies(sc, q):
    return [r.body for r in sc.quorum[("/", q)]]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qlim-3.10", "qlim-4.0", "qlim-4.3"])
def test_limits_and_dead_letters_import_what_a_consumer_read(name, shared_root, tmp_path):
    sc = scenario(name, shared_root)
    before = snapshot(sc.data_dir)
    url = f"file://{tmp_path}/b"
    res = import_rabbitmq_dir(str(sc.data_dir), url, "l1", RabbitImportOptions(types={"quorum"}))
    assert snapshot(sc.data_dir) == before
    _m, got = read_backup(url, "l1")
    for key, refs in sc.quorum.items():
        _same(got.get(key, []), refs, key)
    # The limits really shaped the queues (so the import could not pass by exporting every enqueue).
    maxlen = _bodies(sc, "qq-maxlen")
    assert len(maxlen) == 10 and maxlen != [f"len-{i}".encode() for i in range(18, 28)], maxlen
    assert 0 < len(_bodies(sc, "qq-maxbytes")) < 30 and sum(map(len, _bodies(sc, "qq-maxbytes"))) <= 2000
    assert sc.rejected > 0 and len(_bodies(sc, "qq-reject")) >= 3
    assert _bodies(sc, "qq-policy") == [f"pol-{i}".encode() for i in range(15, 22)]
    assert _bodies(sc, "qq-drop-dlx") == [f"dd-{i}".encode() for i in range(5, 8)]
    assert _bodies(sc, "qq-dead") == [f"dd-{i}".encode() for i in range(5)]
    # At-least-once: the rejected messages are not the source queue's any more, and the summary says so.
    assert len(_bodies(sc, "qq-dlx")) == 10 - DLX_REJECTED
    notes = "\n".join(res.ctx.notes)
    assert f"'qq-dlx' in vhost '/': {DLX_REJECTED} message(s) awaiting at-least-once dead-lettering" in notes, notes
    assert "'qq-maxlen' in vhost '/': 18 message(s) had been dropped from the head" in notes, notes
    assert "'qq-policy' in vhost '/': 15 message(s) had been dropped from the head" in notes, notes
    assert "'qq-drop-dlx' in vhost '/': 5 message(s) had left it for exchange '' with routing key 'qq-dead'" \
        in notes, notes


def _compacted(data_dir, queue: str):
    """The queue's newest Ra snapshot, after checking the log before it is gone (only the snapshot knows)."""
    from rbak.offline.rabbitmq import ra_log
    from rbak.offline.rabbitmq.damage import ImportContext

    sdir = next(d for s in (data_dir / "quorum").iterdir() for d in s.iterdir()
                if (d / "config").is_file() and queue.encode() in (d / "config").read_bytes())
    snap = ra_log.latest_snapshot(str(sdir), ImportContext())
    assert snap is not None and snap.index > 1000, f"no Ra snapshot for {queue}"
    entries = ra_log.read_server_logs(str(sdir.parent), ImportContext())[sdir.name].entries
    assert len([i for i in entries if i <= snap.index]) < snap.index // 2, f"{queue}: log not compacted"
    assert b"max_length => undefined" in (sdir / "config").read_bytes() or queue != SNAP_LIMIT_QUEUE
    return len([i for i in entries if i > snap.index])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qlimsnap-3.10", "qlimsnap-4.0", "qlimsnap-4.3"])
def test_limits_and_dead_letters_from_a_snapshot(name, shared_root, tmp_path):
    """The policy's limit lives only in the snapshot's #cfg; on 4.3 dead letters pending across it too."""
    sc = scenario(name, shared_root)
    after = _compacted(sc.data_dir, SNAP_LIMIT_QUEUE)
    if not sc.version.startswith("4.3"):  # 4.3's Ra snapshotted after the last publishes (only the state is tested)
        assert after > 100, "the publishes past the limit should be replayed after the snapshot"
    url = f"file://{tmp_path}/b"
    res = import_rabbitmq_dir(str(sc.data_dir), url, "s1", RabbitImportOptions(types={"quorum"}))
    _m, got = read_backup(url, "s1")
    for key, refs in sc.quorum.items():
        _same(got.get(key, []), refs, key)
    refs = _bodies(sc, SNAP_LIMIT_QUEUE)
    assert len(refs) == 100 and refs[-33:] == [f"after-{i}".encode() for i in range(33)]
    if ("/", SNAP_DLX_QUEUE) in sc.quorum:
        _compacted(sc.data_dir, SNAP_DLX_QUEUE)
        notes = "\n".join(res.ctx.notes)
        assert f"'{SNAP_DLX_QUEUE}' in vhost '/': {SNAP_DLX_PENDING} message(s) awaiting at-least-once" in notes, notes
        assert len(_bodies(sc, SNAP_DLX_QUEUE)) == 10 - SNAP_DLX_PENDING


def _usr(cmd, ts=1):
    from rbak.offline.rabbitmq.erlang_terms import Atom as A

    return (A("$usr"), {A("ts"): ts}, cmd, A("noreply"))


def test_replay_drop_head_by_bytes_and_v8_metadata_size():
    """Pure replay: 4.x enqueue sizes ``{Meta, Body}`` weigh the body before machine version 8, both from 8."""
    from rbak.offline.rabbitmq.erlang_terms import Atom as A
    from rbak.offline.rabbitmq.fifo_limits import Limits
    from rbak.offline.rabbitmq.rabbit_fifo import FifoReplay

    for mv, kept in ((5, [3, 4, 5]), (8, [5])):
        r = FifoReplay(mv, lambda i, m: 4, None, limits=Limits(max_bytes=300))
        for idx in range(1, 6):
            r.apply(idx, _usr((A("e"), idx, b"m", (60, 100))))
        assert [m.idx for m in r.remaining()] == kept and r.maxlen_dropped == 5 - len(kept), mv


def test_replay_messages_held_at_stop_come_back_under_the_limit():
    """A killed node's consumers hold messages; the restarted queue returns them and drops its head."""
    from rbak.offline.rabbitmq.erlang_terms import Atom as A
    from rbak.offline.rabbitmq.fifo_limits import Limits
    from rbak.offline.rabbitmq.rabbit_fifo import FifoReplay

    r = FifoReplay(5, lambda i, m: 4, None, limits=Limits(max_length=2))
    r.apply(1, _usr((A("checkout"), (b"tag", "pid"), (A("auto"), (A("simple_prefetch"), 2)), {})))
    for idx in range(2, 5):
        r.apply(idx, _usr((A("e"), idx, b"m", (0, 1))))
    assert [m.idx for m in r.remaining()] == [3, 4] and r.maxlen_dropped == 1


def test_replay_reject_publish_keeps_and_policy_change_drops():
    from rbak.offline.rabbitmq.erlang_terms import Atom as A
    from rbak.offline.rabbitmq.fifo_limits import Limits
    from rbak.offline.rabbitmq.rabbit_fifo import FifoReplay

    r = FifoReplay(5, lambda i, m: 4, None, limits=Limits(max_length=2, overflow="reject_publish"))
    for idx in range(1, 6):
        r.apply(idx, _usr((A("e"), idx, b"m", (0, 1))))
    dlh = (A("at_most_once"), (A("rabbit_quorum_queue"), A("dead_letter_publish"),
                               [(A("resource"), b"/", A("exchange"), b"dlx"), b"rk", None]))
    r.apply(6, _usr((A("update_config"), {A("max_length"): 3, A("overflow_strategy"): A("drop_head"),
                                          A("dead_letter_handler"): dlh})))
    assert [m.idx for m in r.remaining()] == [3, 4, 5] and r.maxlen_dropped == 2 and r.dead_lettered == 2
    assert r.limits.describe() == "exchange 'dlx' with routing key 'rk'"


def test_replay_at_least_once_dead_letters_until_the_worker_settles():
    """Rejected messages go to the dead-letter state (not the queue); a new worker takes back what the old held."""
    from rbak.offline.rabbitmq.erlang_terms import Atom as A
    from rbak.offline.rabbitmq.fifo_limits import Limits
    from rbak.offline.rabbitmq.rabbit_fifo import FifoReplay

    r = FifoReplay(5, lambda i, m: 4, None, limits=Limits(overflow="reject_publish", dlh="at_least_once"))
    for idx in range(1, 6):
        r.apply(idx, _usr((A("e"), idx, b"m", (0, 1))))
    r.apply(6, _usr((A("checkout"), (b"tag", "pid"), (A("auto"), (A("simple_prefetch"), 3)), {})))
    r.apply(7, _usr((A("discard"), 6, [0, 1, 2])))
    r.apply(8, _usr((A("dlx"), (A("checkout"), "worker", 2))))
    assert sorted(r.dlx.checked) == [0, 1] and len(r.dlx.discards) == 1
    r.apply(9, _usr((A("dlx"), (A("settle"), [0]))))
    r.apply(10, _usr((A("dlx"), (A("checkout"), "worker2", 1))))
    assert [m.idx for m in r.dlx.pending()] == [2, 3] and r.dlx.stat() == (2, 2)
    assert [m.idx for m in r.remaining()] == [4, 5]
    r.apply(11, _usr((A("update_config"), {A("dead_letter_handler"): A("undefined")})))
    assert r.dlx_lost == 2 and not r.dlx.pending()


def test_snapshot_cfg_limits_and_dead_letter_state():
    from rbak.offline.rabbitmq.erlang_terms import Atom as A
    from rbak.offline.rabbitmq.erlang_terms import ImproperList
    from rbak.offline.rabbitmq.fifo_snapshot import load_state

    cfg = (A("cfg"), A("n"), None, A("nil"), A("at_least_once"), None, A("reject_publish"), 10, 4096,
           A("competing"), A("undefined"), A("undefined"), A("undefined"))
    dlx_con = (A("dlx_consumer"), "pid", 32, {0: ImproperList([A("rejected"), 7], 50)}, 1)
    dlx = (A("rabbit_fifo_dlx"), dlx_con, (1, [], [ImproperList([A("expired"), 9], 20)]), A("nil"), 20, 50)
    state = [A("rabbit_fifo"), cfg, (A("rabbit_fifo_q"), ([], []), ([], [ImproperList([11], 5)]), 1, 0), 1,
             (0, [], []), 0, {}, 0, 0, {}, (A("queue"), [], [], 0), dlx, 5, 0, [], 0, A("undefined")]
    replay, _notes = load_state(tuple(state), 5, None, lambda i, m: 4)
    assert (replay.limits.max_length, replay.limits.max_bytes, replay.limits.overflow,
            replay.limits.dlh) == (10, 4096, "reject_publish", "at_least_once")
    assert [m.idx for m in replay.dlx.pending()] == [7, 9] and replay.dlx.stat() == (2, 70)
    assert [(m.idx, m.size) for m in replay.remaining()] == [(11, 5)]
