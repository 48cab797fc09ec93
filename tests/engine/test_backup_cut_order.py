"""Issue 27 scenario 4: the broker closes rbak's connection in the middle of a quorum read.

The read spans several windows (``QUORUM_PREFETCH`` lowered so a queue this test can fill
quickly needs several consumers, as 100,000 messages do at 65,535). The connection is
closed through the management API (``DELETE /api/connections/{name}``) at several points;
afterwards the backup has failed naming the queue, and the source, drained, holds every
message in its original order, on all three brokers.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest

from rbak.backup import BackupEngine, queue_reader

from support.backups import backup_config, drain, fast_publish, load
from rbak.errors import BackupError

N = 12_000
WINDOW = 2_000


def _killer(broker, vhost: str, at: int, killed: list):
    def kill(n: int) -> None:
        if n == at and not killed:
            conns: list = []
            for _ in range(50):  # the management API lists a connection after its stats tick
                conns = [c for c in broker.api("GET", "/api/connections") if c.get("vhost") == vhost]
                if conns:
                    break
                time.sleep(0.1)
            for c in conns:
                broker.api("DELETE", "/api/connections/" + quote(c["name"], safe=""), ok=(204, 404))
            killed.append(len(conns))
    return kill


@pytest.mark.parametrize("at", [1, 2_500, 7_000, 11_500])
def test_cut_mid_quorum_read_keeps_order(broker, vhost, tmp_path, monkeypatch, at):
    monkeypatch.setattr(queue_reader, "QUORUM_PREFETCH", WINDOW)
    bodies = [b"c-%05d" % i for i in range(N)]
    fast_publish(broker, vhost, "cutq", bodies, declare={"x-queue-type": "quorum"})
    killed: list = []
    store = tmp_path / "store"
    eng = BackupEngine(backup_config(broker, vhost, store, "cut", tmp_path / "st.db"),
                       throttle=_killer(broker, vhost, at, killed))
    with pytest.raises(BackupError) as ei:
        eng.run()
    assert killed and killed[0] >= 1
    assert f"{vhost}/cutq" in str(ei.value) and "connection was lost" in str(ei.value)
    assert "rotated" not in str(ei.value)  # never returned before: the order is kept
    m = load(store, "cut")
    assert m.state == "partial" and [(q.name, q.status) for q in m.queue_status] == [("cutq", "failed")]
    deadline = time.monotonic() + 30
    while broker.message_count(vhost, "cutq") != N and time.monotonic() < deadline:
        time.sleep(0.2)  # the broker returns a closed connection's messages asynchronously
    after = [x[0] for x in drain(broker, vhost, "cutq")]
    assert len(after) == N and sorted(after) == bodies
    if after != bodies:
        first = next(i for i, (a, b) in enumerate(zip(after, bodies)) if a != b)
        pytest.fail(f"source reordered at position {first}: {after[max(0, first - 2):first + 4]}")


def test_cut_after_a_complete_backup_rotates_and_says_so(broker, vhost, tmp_path, monkeypatch):
    """rabbit_fifo (3.10.8, 4.0.5, 4.3.6) appends returned messages to the tail of its returns: once a
    complete backup has returned the whole queue, a later read cut off in the middle gives back what
    it had taken BEHIND what it had not. rbak cannot prevent that (no return puts a message at the
    head); the error says so, and nothing is lost: the source is exactly a rotation of itself."""
    monkeypatch.setattr(queue_reader, "QUORUM_PREFETCH", WINDOW)
    bodies = [b"r-%05d" % i for i in range(N)]
    fast_publish(broker, vhost, "rotq", bodies, declare={"x-queue-type": "quorum"})
    store = tmp_path / "store"
    assert BackupEngine(backup_config(broker, vhost, store, "full", tmp_path / "st.db")).run().completed
    killed: list = []
    eng = BackupEngine(backup_config(broker, vhost, store, "cut", tmp_path / "st.db"),
                       throttle=_killer(broker, vhost, 7_000, killed))
    with pytest.raises(BackupError) as ei:
        eng.run()
    msg = str(ei.value)
    assert killed and "connection was lost" in msg and "the queue is now rotated" in msg, msg
    deadline = time.monotonic() + 30
    while broker.message_count(vhost, "rotq") != N and time.monotonic() < deadline:
        time.sleep(0.2)
    after = [x[0] for x in drain(broker, vhost, "rotq")]
    assert len(after) == N and sorted(after) == bodies
    k = bodies.index(after[0])
    assert 7_000 <= k < N and after == bodies[k:] + bodies[:k]  # the taken prefix, intact, at the tail
