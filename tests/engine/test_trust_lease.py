"""Issue 27 scenario 1: two backups of one source never overlap by accident.

Two ``rbak backup`` processes started together against a 20,000-message quorum queue (different
ids, then the same id): one waits or is refused naming the holder, and neither reports complete
with less than the queue held. A lease held by the test itself makes the overlap certain: a
backup is refused (exit 4, naming the holder, nothing written), or waits for it
(``backup.lease_wait_secs``) and then reads everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pika
import pika.exceptions
import pytest

from rbak.backup import BackupEngine
from rbak.backup.lease import LEASE_QUEUE
from rbak.errors import LEASE_EXIT_CODE
from support.backups import backup_config, fast_publish, load, wait_count
from support.brokers import wait_until

N = 20_000
Q = "lease-q"


def _config(broker, vhost: str, tmp: Path, backup_id: str, name: str, store: str = "store", **backup) -> Path:
    cfg = {
        "mode": "backup", "backup_id": backup_id,
        "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                   "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "filesystem", "path": str(tmp / store)},
        "backup": {"include_definitions": False, **backup},
        "offset_storage": {"path": str(tmp / f"state-{name}" / "offsets.db")},
    }
    p = tmp / f"{name}.yaml"
    p.write_text(json.dumps(cfg))
    return p


def _start(cfg: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rbak", "backup", "-c", str(cfg), "--no-progress", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cfg.parent)


def _finish(p: subprocess.Popen) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err


def _fill(broker, vhost: str) -> None:
    fast_publish(broker, vhost, Q, (b"m-%d" % i for i in range(N)), declare={"x-queue-type": "quorum"})
    wait_count(broker, vhost, Q, N)


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=120, cwd=tmp)


def _assert_complete(tmp: Path, backup_id: str, out: str) -> None:
    s = json.loads(out)
    assert (s["completed"], s["partial"], s["total_messages"]) == (True, False, N)
    assert s["queues"][0]["expected"] == N and s["queues"][0]["status"] == "done"
    m = load(tmp / "store", backup_id)
    assert m.state == "complete" and not m.queue_status and m.queues[0].expected_messages == N
    assert m.queues[0].message_count == N


def _assert_refused(tmp: Path, backup_id: str, rc: int, err: str, holder: str, out: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO " not in ln]
    assert rc == LEASE_EXIT_CODE == 4, err
    assert len(lines) == 1 and lines[0].startswith("rbak: Backup lease: ") and holder in lines[0], err
    # --json: one object on stdout saying so (issue 45), the same line as stderr's
    assert json.loads(out) == {"ok": False, "exit_code": 4,
                               "error": {"class": "BackupLeaseError", "message": lines[0].removeprefix("rbak: ")}}
    assert "nothing was written" in lines[0]
    assert not (tmp / "store" / backup_id).exists()


def test_two_backups_started_together_different_ids(broker, vhost, tmp_path):
    _fill(broker, vhost)
    a, b = _start(_config(broker, vhost, tmp_path, "ov-a", "a")), _start(_config(broker, vhost, tmp_path, "ov-b", "b"))
    results = {"ov-a": _finish(a), "ov-b": _finish(b)}
    done = [bid for bid, (rc, _, _) in results.items() if rc == 0]
    assert done, results
    for bid, (rc, out, err) in results.items():
        if rc == 0:
            _assert_complete(tmp_path, bid, out)
        else:  # it overlapped the other: refused before writing anything, naming the other backup
            other = "ov-b" if bid == "ov-a" else "ov-a"
            _assert_refused(tmp_path, bid, rc, err, f"rbak-backup {other} lease", out)
    listed = {e["backup_id"]: e["status"] for e in json.loads(_cli(tmp_path, "list", "--path", "store",
                                                                    "--format", "json").stdout)}
    assert listed == {bid: "complete" for bid in done}
    for bid in done:
        d = json.loads(_cli(tmp_path, "describe", "--path", "store", "--backup-id", bid, "--format", "json").stdout)
        assert d["status"] == "complete" and d["total_messages"] == N and d["queue_status"] == []
    wait_count(broker, vhost, Q, N)


def test_two_backups_started_together_same_id(broker, vhost, tmp_path):
    _fill(broker, vhost)
    a, b = _start(_config(broker, vhost, tmp_path, "same", "a")), _start(_config(broker, vhost, tmp_path, "same", "b"))
    results = [_finish(a), _finish(b)]
    assert sorted(rc == 0 for rc, _, _ in results) == [False, True], results
    (rc0, out0, _), = [r for r in results if r[0] == 0]
    _assert_complete(tmp_path, "same", out0)
    (rc1, _, err1), = [r for r in results if r[0] != 0]
    lines = [ln for ln in err1.splitlines() if ln.strip() and " INFO " not in ln]
    assert len(lines) == 1, err1
    if rc1 == LEASE_EXIT_CODE:  # it overlapped the first
        assert "rbak-backup same lease" in lines[0] and "nothing was written" in lines[0]
    else:  # it started after the first had finished
        assert rc1 == 2 and "already exists and is complete" in lines[0], err1
    listed = json.loads(_cli(tmp_path, "list", "--path", "store", "--format", "json").stdout)
    assert [(e["backup_id"], e["status"], e["total_messages"]) for e in listed] == [("same", "complete", N)]
    wait_count(broker, vhost, Q, N)


def _hold_lease(broker, vhost: str, name: str) -> pika.BlockingConnection:
    params = broker.connection_parameters(vhost)
    params.client_properties = {"connection_name": name}
    conn = pika.BlockingConnection(params)
    conn.channel().queue_declare(LEASE_QUEUE, exclusive=True, arguments={"x-queue-type": "classic"})
    return conn


def test_a_held_lease_refuses_then_is_waited_for(broker, vhost, tmp_path):
    _fill(broker, vhost)
    holder = _hold_lease(broker, vhost, "rbak-backup nightly-7 lease (pid 1 on elsewhere)")
    try:
        p = _start(_config(broker, vhost, tmp_path, "late", "late"))
        rc, out, err = _finish(p)
        _assert_refused(tmp_path, "late", rc, err, "'rbak-backup nightly-7 lease (pid 1 on elsewhere)'", out)
        assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*"))
        holder.channel().queue_declare(LEASE_QUEUE, passive=True)  # the refused run left the holder's lease alone
        # with backup.lease_wait_secs it waits: visible as its own lease connection, nothing read yet
        p = _start(_config(broker, vhost, tmp_path, "patient", "patient", lease_wait_secs=240))

        def waiting() -> bool:
            conns = broker.api("GET", f"/api/vhosts/{vhost}/connections") or []
            names = [(c.get("client_properties") or {}).get("connection_name") or "" for c in conns]
            return any(n.startswith("rbak-backup patient lease") for n in names)

        wait_until(waiting, timeout=60, what="the waiting backup's lease connection")
        assert p.poll() is None and broker.message_count(vhost, Q) == N
        assert not (tmp_path / "store" / "patient").exists()
    finally:
        holder.close()  # the holder finishes: its lease goes with its connection
    rc, out, err = _finish(p)
    assert rc == 0, err
    assert "waiting up to 240s for 'rbak-backup nightly-7 lease" in err
    _assert_complete(tmp_path, "patient", out)
    # the lease queue is this run's alone, never backed up, and gone with the run
    assert [q.name for q in load(tmp_path / "store", "patient").queues] == [Q]
    assert broker.queue_info(vhost, LEASE_QUEUE) is None
    wait_count(broker, vhost, Q, N)


def test_a_killed_holder_frees_the_lease(broker, vhost, tmp_path):
    _fill(broker, vhost)
    # a crash is a connection that goes away without a goodbye: the broker frees the lease with it
    sub = subprocess.Popen([sys.executable, "-c", (
        "import pika,sys,time\n"
        f"p=pika.ConnectionParameters(host={broker.host!r},port={broker.amqp_port},virtual_host={vhost!r},"
        "credentials=pika.PlainCredentials('guest','guest'),client_properties={'connection_name':'rbak-backup k lease'})\n"
        "c=pika.BlockingConnection(p)\n"
        f"c.channel().queue_declare({LEASE_QUEUE!r},exclusive=True,arguments={{'x-queue-type':'classic'}})\n"
        "print('held',flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert sub.stdout.readline().strip() == "held"
        rc, out, err = _finish(_start(_config(broker, vhost, tmp_path, "k1", "k1")))
        _assert_refused(tmp_path, "k1", rc, err, "rbak-backup k lease", out)
    finally:
        sub.kill()  # SIGKILL: no connection.close, the socket just goes
        sub.wait()
    rc, out, err = _finish(_start(_config(broker, vhost, tmp_path, "k2", "k2", lease_wait_secs=60)))
    assert rc == 0, err
    _assert_complete(tmp_path, "k2", out)


def test_a_finished_backup_has_freed_its_lease_when_it_returns(broker, vhost, tmp_path):
    """Backups back to back (a cron, a retry): when ``run()`` returns, the lease queue is gone as a
    connection opened before sees it, so the next backup never finds the last one still holding it
    (CI: a loaded 3.10.8 refused a backup, naming the one that had just finished)."""
    fast_publish(broker, vhost, Q, (b"m-%d" % i for i in range(50)), declare={"x-queue-type": "quorum"})
    watcher = pika.BlockingConnection(broker.connection_parameters(vhost))
    try:
        for i in range(3):
            cfg = backup_config(broker, vhost, tmp_path / "store", f"b{i}", tmp_path / "st.db")
            assert BackupEngine(cfg).run().completed
            ch = watcher.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
                ch.queue_declare(LEASE_QUEUE, passive=True)
            assert ei.value.reply_code == 404, f"after backup b{i}"
    finally:
        watcher.close()
    assert [load(tmp_path / "store", f"b{i}").state for i in range(3)] == ["complete"] * 3
