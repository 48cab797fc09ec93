"""Issue 27: the backup lease lost in the middle of a run (its connection closed by the broker).

The run takes it again at once when no one else holds it, and every queue stays complete. When
another backup takes it first, a queue whose read starts while this run holds no lease may miss
messages that backup holds unacked: it is recorded partial naming the holder, never complete,
while the queues read before the loss stay complete.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from rbak.backup import BackupEngine
from rbak.backup.lease import LEASE_QUEUE
from rbak.errors import PartialBackupError

from support.backups import backup_config, fast_publish, load, records
from support.brokers import wait_until

N = 400


def _lease_connections(broker, vhost: str, backup_id: str) -> list[dict]:
    return [c for c in broker.api("GET", "/api/connections") if c.get("vhost") == vhost and
            str((c.get("client_properties") or {}).get("connection_name", "")).startswith(
                f"rbak-backup {backup_id} lease")]


def _take_lease(broker, vhost: str) -> pika.BlockingConnection:
    """Own the lease queue from a connection named like another backup's (retried while the old owner goes)."""
    params = broker.connection_parameters(vhost)
    params.client_properties = {"connection_name": "rbak-backup other lease (test)"}
    deadline = time.monotonic() + 20
    while True:
        conn = pika.BlockingConnection(params)
        try:
            conn.channel().queue_declare(LEASE_QUEUE, exclusive=True, arguments={"x-queue-type": "classic"})
            return conn
        except pika.exceptions.ChannelClosedByBroker:
            conn.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _run(broker, vhost, tmp_path, bid: str, other: bool):
    for q in ("a1", "b2"):
        fast_publish(broker, vhost, q, [b"%s-%04d" % (q.encode(), i) for i in range(N)],
                     declare={"x-queue-type": "quorum"})
    store = tmp_path / "store"
    taken: list = []
    eng: BackupEngine

    def cut_lease(n: int) -> None:
        if taken:
            return
        conns = wait_until(lambda: _lease_connections(broker, vhost, bid), what="the lease connection listed")
        for c in conns:
            broker.api("DELETE", "/api/connections/" + quote(c["name"], safe=""), ok=(204, 404))
        if other:
            taken.append(_take_lease(broker, vhost))
            # the run has noticed, and found who holds it now: a read starting now is at risk
            wait_until(lambda: "other lease" in (eng.lease_risk(vhost, time.monotonic()) or ""),
                       what="the loss noticed and the holder named")
        else:
            taken.append(None)
            wait_until(lambda: vhost in eng.lease.lost and eng.lease_risk(vhost, time.monotonic()) is None,
                       what="the lease taken again")

    eng = BackupEngine(backup_config(broker, vhost, store, bid, tmp_path / "st.db", max_concurrent_queues=1,
                                     reader_processes=False), throttle=cut_lease)
    return eng, store, taken


def test_a_lost_lease_no_one_else_holds_is_taken_again(broker, vhost, tmp_path):
    eng, store, taken = _run(broker, vhost, tmp_path, "ll1", other=False)
    s = eng.run()
    assert taken and s.completed and not s.partial
    m = load(store, "ll1")
    assert m.state == "complete" and not m.queue_status
    for q in ("a1", "b2"):
        assert [r.body for r in records(store, m, vhost, q)] == [b"%s-%04d" % (q.encode(), i) for i in range(N)]
    assert _lease_connections(broker, vhost, "ll1") == []  # released at the end


def test_a_lease_another_backup_took_makes_later_reads_partial(broker, vhost, tmp_path):
    eng, store, taken = _run(broker, vhost, tmp_path, "ll2", other=True)
    try:
        with pytest.raises(PartialBackupError) as ei:
            eng.run()
    finally:
        for c in taken:
            if c is not None:
                c.close()
    msg = str(ei.value)
    assert f"{vhost}/b2 (partial)" in msg and "lease" in msg and "rbak-backup other lease (test)" in msg, msg
    assert f"{vhost}/a1" not in msg  # read before the loss: complete
    m = load(store, "ll2")
    assert m.state == "partial"
    assert [(x.name, x.status) for x in m.queue_status] == [("b2", "partial")]
    assert "rbak-backup other lease (test)" in m.queue_status[0].reason
    assert [r.body for r in records(store, m, vhost, "a1")] == [b"a1-%04d" % i for i in range(N)]
