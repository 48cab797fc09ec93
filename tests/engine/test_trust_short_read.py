"""Issue 27 scenario 1: a read that falls short of the depth the queue had at the start is PARTIAL.

The test's own consumer holds 10 messages unacked; after the backup's first (one-message) quorum
window it acks them and waits until the broker has handed it 10 more, which the backup then cannot
read. The backup must say partial everywhere: manifest (expected and read), summary, list,
describe, the exit code of the CLI view, and keep what it read restorable.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pika
import pytest

from rbak.backup import BackupEngine
from rbak.errors import PARTIAL_EXIT_CODE, PartialBackupError, ShortRead
from support.backups import backup_config, fast_publish, load, records, wait_count

N, HELD = 200, 10


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_consumer_taking_messages_mid_read_makes_the_queue_partial(broker, vhost, tmp_path):
    q = "short-q"
    fast_publish(broker, vhost, q, (f"m-{i}".encode() for i in range(N)),
                 declare={"x-queue-type": "quorum", "x-delivery-limit": 1000})
    wait_count(broker, vhost, q, N)
    app = broker.connect(vhost)
    ch = app.channel()
    ch.basic_qos(prefetch_count=HELD)
    held: list = []
    ch.basic_consume(q, lambda c, m, p, b: held.append(m.delivery_tag), auto_ack=False)
    while len(held) < HELD:
        app.process_data_events(0.1)
    fired = []

    def after(n: int) -> None:
        if n == 1 and not fired:  # the backup's first window is one message; the next is not open yet
            fired.append(1)
            ch.basic_ack(held[-1], multiple=True)  # these 10 are gone; the broker gives the app 10 more
            while len(held) < 2 * HELD:
                app.process_data_events(0.1)

    cfg = backup_config(broker, vhost, tmp_path / "store", "short-1", tmp_path / "state.db", read_timeout_secs=2)
    try:
        with pytest.raises(PartialBackupError) as ei:
            BackupEngine(cfg, throttle=after).run()
    finally:
        app.close()  # the app's 10 unacked go back
    err = ei.value
    assert err.exit_code == PARTIAL_EXIT_CODE == 3
    s = err.summary
    expected, read = N - HELD, N - 2 * HELD
    assert s.completed and s.partial and s.to_json_obj()["partial"] is True
    (qs,) = s.queues
    assert (qs.status, qs.expected, qs.messages) == ("partial", expected, read)
    assert f"read {read} of the {expected}" in qs.error

    m = load(tmp_path / "store", "short-1")
    assert m.is_complete and m.is_partial and m.state == "partial"
    (st,) = m.queue_status
    assert (st.status, st.expected, st.read) == ("partial", expected, read)
    qb = m.find_queue(vhost, q)
    assert (qb.message_count, qb.expected_messages) == (read, expected)
    # what was read is kept, in order: the 11th message, then all after the 10 the app took next
    got = [r.body for r in records(tmp_path / "store", m, vhost, q)]
    assert got == [f"m-{HELD}".encode()] + [f"m-{i}".encode() for i in range(2 * HELD + 1, N)]
    raw = json.loads((tmp_path / "store" / "short-1" / "manifest.json").read_text())
    assert raw["queue_status"] == [{"vhost": vhost, "name": q, "status": "partial", "reason": st.reason,
                                    "expected": expected, "read": read}]

    lst = _cli("list", "--path", "store", "--format", "json", cwd=tmp_path)
    assert lst.returncode == 0 and json.loads(lst.stdout)[0]["status"] == "partial"
    txt = _cli("list", "--path", "store", cwd=tmp_path).stdout
    assert "partial" in txt and f"read {read} of {expected}" in txt
    d = _cli("describe", "--path", "store", "--backup-id", "short-1", cwd=tmp_path)
    assert d.returncode == 0 and "(partial)" in d.stdout and f"(read {read} of {expected})" in d.stdout
    dj = json.loads(_cli("describe", "--path", "store", "--backup-id", "short-1", "--format", "json",
                         cwd=tmp_path).stdout)
    assert dj["status"] == "partial" and dj["queues"][0]["expected_messages"] == expected
    # nothing was taken from the source: the app's ack removed 10, everything else is back
    wait_count(broker, vhost, q, N - HELD)
    with pika.BlockingConnection(broker.connection_parameters(vhost)) as c:
        assert c.channel().queue_declare(q, passive=True).method.message_count == N - HELD


def test_cli_exit_code_3_and_json_summary_for_a_partial_backup(broker, vhost, tmp_path):
    """A queue refused at read time (its returns would cost the application: on 3.10 and 4.0 a
    delivery limit of 1, on 4.3 delayed retries of every return): the run completes, backs up the
    other queue, exits 3, and ``--json``, ``list`` and ``describe`` say partial."""
    fast_publish(broker, vhost, "ok-q", (b"o%d" % i for i in range(5)), declare={"x-queue-type": "classic"})
    costly = {"x-queue-type": "quorum"} | (
        {"x-delayed-retry-type": "all", "x-delayed-retry-min": 60000, "x-delayed-retry-max": 60000}
        if broker.name == "rmq43" else {"x-delivery-limit": 1})
    fast_publish(broker, vhost, "costly-q", (b"s%d" % i for i in range(3)), declare=costly)
    wait_count(broker, vhost, "ok-q", 5)
    wait_count(broker, vhost, "costly-q", 3)
    cfg = {
        "mode": "backup", "backup_id": "p-3",
        "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                   "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
        "backup": {"include_definitions": False},
        "offset_storage": {"path": str(tmp_path / "state.db")},
    }
    (tmp_path / "b.yaml").write_text(json.dumps(cfg))
    r = _cli("backup", "-c", "b.yaml", "--json", "--no-progress", cwd=tmp_path)
    assert r.returncode == PARTIAL_EXIT_CODE == 3, r.stderr
    s = json.loads(r.stdout)  # one object: the summary's fields, ok false, the exit code and the error (issue 45)
    assert (s["ok"], s["exit_code"], s["error"]["class"]) == (False, 3, "PartialBackupError")
    assert s["error"]["message"].startswith("Backup partial: 1 of 2 queue(s)")
    assert (s["completed"], s["partial"], s["total_messages"]) == (True, True, 5)
    by = {q["name"]: q for q in s["queues"]}
    assert (by["ok-q"]["status"], by["ok-q"]["messages"], by["ok-q"]["expected"]) == ("done", 5, 5)
    assert by["costly-q"]["status"] == "refused" and "refused before reading" in by["costly-q"]["error"]
    assert "rbak: Backup partial: 1 of 2 queue(s)" in r.stderr and "PARTIAL" in r.stderr
    lst = json.loads(_cli("list", "--path", "store", "--format", "json", cwd=tmp_path).stdout)
    assert [(e["backup_id"], e["status"]) for e in lst] == [("p-3", "partial")]
    d = json.loads(_cli("describe", "--path", "store", "--backup-id", "p-3", "--format", "json", cwd=tmp_path).stdout)
    assert d["status"] == "partial" and [x["name"] for x in d["queue_status"]] == ["costly-q"]
    assert broker.message_count(vhost, "costly-q") == 3 and broker.message_count(vhost, "ok-q") == 5


def test_a_short_read_crosses_from_a_reader_process():
    """Reader processes send failures back pickled: a short read keeps its segments and reason."""
    import pickle

    from rbak.format.manifest import QueueBackup, SegmentMetadata

    qb = QueueBackup("/", "q", "classic", expected_messages=9)
    qb.add_segment(SegmentMetadata("k", 1, 7, 10, 20, 1, 2, "c"))
    e = pickle.loads(pickle.dumps(ShortRead(qb, "read 7 of the 9 messages")))
    assert (e.backup.message_count, e.backup.expected_messages, e.reason) == (7, 9, "read 7 of the 9 messages")
    assert str(e) == "Partial: queue 'q' in vhost '/': read 7 of the 9 messages"
