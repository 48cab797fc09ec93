"""The non-destructive guarantee at depth, across several quorum channels, and when the read is cut off."""

from __future__ import annotations

import pytest

from rbak.backup import BackupEngine, queue_reader
from rbak.backup.engine import effective_delivery_limit
from rbak.backup.management import QueueInfo

from support.backups import backup_config, drain, fast_publish, load, records
from support.brokers import wait_until
from rbak.errors import BackupError

N_DEEP = 50_000


@pytest.mark.slow
def test_50k_messages_same_order_after_backup(broker, vhost, tmp_path):
    bodies = [b"%06d" % i for i in range(N_DEEP)]
    fast_publish(broker, vhost, "deep-classic", bodies, declare={})
    fast_publish(broker, vhost, "deep-quorum", bodies, declare={"x-queue-type": "quorum"})
    store = tmp_path / "store"
    s = BackupEngine(backup_config(broker, vhost, store, "deep", tmp_path / "st.db")).run()
    assert s.completed and s.total_messages == 2 * N_DEEP
    m = load(store, "deep")
    for q in ("deep-classic", "deep-quorum"):
        assert [r.body for r in records(store, m, vhost, q)] == bodies, q
        assert [x[0] for x in drain(broker, vhost, q)] == bodies, q


def test_quorum_over_several_channels_keeps_order(broker, vhost, tmp_path, monkeypatch):
    """Deeper than one channel's prefetch: channels filled one after another, closed in the same order."""
    monkeypatch.setattr(queue_reader, "QUORUM_PREFETCH", 1000)
    bodies = [b"q-%05d" % i for i in range(3500)]
    fast_publish(broker, vhost, "multi", bodies, declare={"x-queue-type": "quorum"})
    store = tmp_path / "store"
    for i in range(3):  # repeated backups: each one must leave the order intact
        s = BackupEngine(backup_config(broker, vhost, store, f"m{i}", tmp_path / "st.db")).run()
        assert s.total_messages == 3500
        assert [r.body for r in records(store, load(store, f"m{i}"), vhost, "multi")] == bodies
    assert [x[0] for x in drain(broker, vhost, "multi")] == bodies


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_connection_killed_mid_read_fails_clearly_and_returns_everything(broker, vhost, tmp_path, qtype,
                                                                        monkeypatch):
    """What a consumer_timeout (or any broker-side close) does mid-read: a clear error, nothing lost.

    (A quorum read whose messages all reached the client before the close simply completes:
    the backup holds them all and the broker returned them; a small prefetch makes this one
    need the connection again after the kill.)"""
    from urllib.parse import quote

    monkeypatch.setattr(queue_reader, "QUORUM_PREFETCH", 500)
    bodies = [b"k-%05d" % i for i in range(3000)]
    fast_publish(broker, vhost, "cut", bodies, declare={"x-queue-type": qtype})
    killed = []

    def kill_at_1000(n: int) -> None:
        if n == 1000 and not killed:
            # management lists the connection after its stats tick (a loaded machine: seconds)
            def listed() -> list:
                conns = [c for c in broker.api("GET", "/api/connections") if c.get("vhost") == vhost]
                # the reading connection, not only the lease's (listed first: it opened first)
                return conns if any((c.get("client_properties") or {}).get("connection_name") == f"rbak-backup {vhost}"
                                    for c in conns) else []

            conns = wait_until(listed, timeout=120, what="the backup's reading connection in the management API")
            for c in conns:
                broker.api("DELETE", "/api/connections/" + quote(c["name"], safe=""), ok=(204, 404))
            killed.append(len(conns))

    store = tmp_path / "store"
    eng = BackupEngine(backup_config(broker, vhost, store, "cut", tmp_path / "st.db"), throttle=kill_at_1000)
    with pytest.raises(BackupError) as ei:
        eng.run()
    assert killed and killed[0] >= 1
    msg = str(ei.value)
    assert f"{vhost}/cut" in msg and "connection was lost" in msg and "returns every unacked message" in msg
    cut = load(store, "cut")  # the manifest says: partial, naming the queue and why
    assert cut.state == "partial" and [(q.name, q.status) for q in cut.queue_status] == [("cut", "failed")]
    assert "connection was lost" in cut.queue_status[0].reason and cut.find_queue(vhost, "cut") is None
    # the broker returns the killed connection's unacked messages as it closes it: wait for all of them
    wait_until(lambda: broker.message_count(vhost, "cut") == len(bodies), timeout=120, what="every message back")
    after = [x[0] for x in drain(broker, vhost, "cut")]
    assert sorted(after) == bodies
    if qtype == "classic":
        assert after == bodies


def test_effective_delivery_limit():
    q = QueueInfo("/", "q", "quorum", 0, {"x-delivery-limit": 5}, None, {"delivery-limit": 3})
    assert effective_delivery_limit(q, "3.10.8") == 3
    assert effective_delivery_limit(QueueInfo("/", "q", "quorum", 0), "3.10.8") is None
    assert effective_delivery_limit(QueueInfo("/", "q", "quorum", 0), "4.0.5") == 20
    assert effective_delivery_limit(QueueInfo("/", "q", "quorum", 0, {"x-delivery-limit": -1}), "4.0.5") is None


@pytest.mark.slow
def test_real_consumer_timeout(rmq40, vhost_factory, tmp_path, monkeypatch):
    """4.0's per-queue x-consumer-timeout (1 s; the broker checks every 60 s) fires during a slow read.

    A classic queue whose messages had all reached rbak before the timeout completes (every
    message is in the backup and back in the queue); a quorum read still needing channels
    fails clearly, and nothing is lost either way."""
    import time

    vhost = vhost_factory(rmq40)
    monkeypatch.setattr(queue_reader, "QUORUM_PREFETCH", 5)
    bodies = [b"ct-%d" % i for i in range(10)]
    fast_publish(rmq40, vhost, "slow-c", bodies, declare={"x-consumer-timeout": 1000})
    fast_publish(rmq40, vhost, "slow-q", bodies, declare={"x-queue-type": "quorum", "x-consumer-timeout": 1000})
    def stall(n: int) -> None:
        if n == 5:  # each queue's reader (two workers) stalls once, at the same time
            # a backup slower than the broker's consumer_timeout: its check runs on the channel's 60 s
            # tick, so 75 s leave a loaded broker 15 s for a late tick (the broker's close cannot be
            # waited for here: the stalled reader's own connection would have to answer it)
            time.sleep(75)

    store = tmp_path / "store"
    cfg = backup_config(rmq40, vhost, store, "ct", tmp_path / "st.db", max_concurrent_queues=2)
    with pytest.raises(BackupError) as ei:
        BackupEngine(cfg, throttle=stall).run()
    msg = str(ei.value)
    assert "1 of 2 queue(s) failed" in msg
    assert f"{vhost}/slow-q" in msg and "consumer_timeout" in msg and "returned to the queue" in msg
    m = load(store, "ct")
    assert m.state == "partial" and [q.name for q in m.queue_status] == ["slow-q"]
    assert [r.body for r in records(store, m, vhost, "slow-c")] == bodies  # had all its messages: done
    assert [x[0] for x in drain(rmq40, vhost, "slow-c")] == bodies
    assert sorted(x[0] for x in drain(rmq40, vhost, "slow-q")) == sorted(bodies)
