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

from rbak.offline.rabbitmq.rabbitmq_dir import import_rabbitmq_dir


def _bodies(sc, q):
    return [r.body for r in sc.quorum[("/", q)]]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qlim-3.10", "qlim-4.0", "qlim-4.3"])
def test_limits_and_dead_letters_import_what_a_consumer_read(name, shared_root, tmp_path):
    sc = scenario(name, shared_root)
    before = snapshot(sc.data_dir)
    url = f"file://{tmp_path}/b"
    res = import_rabbitmq_dir(str(sc.data_dir), url, "l1", types={"quorum"})
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
    return snap


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qlimsnap-3.10", "qlimsnap-4.0", "qlimsnap-4.3"])
def test_limits_and_dead_letters_from_a_snapshot(name, shared_root, tmp_path):
    """The policy's limit lives only in the snapshot's #cfg; on 4.3 dead letters pending across it too."""
    sc = scenario(name, shared_root)
    _compacted(sc.data_dir, SNAP_LIMIT_QUEUE)
    url = f"file://{tmp_path}/b"
    res = import_rabbitmq_dir(str(sc.data_dir), url, "s1", types={"quorum"})
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
