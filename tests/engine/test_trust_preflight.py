"""Issue 27: a configuration error is found before anything is written, and said in one line.

Wrong AMQP password, wrong AMQP port, a vhost that does not exist, a user who may not declare
the lease queue: exit code, exactly one line on stderr naming the cause (no pika log lines, no
traceback), and the storage directory holds nothing. ``rbak list`` of a missing path is an error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

from support.backups import drain, fast_publish, wait_count


def _config(tmp: Path, amqp_url: str, mgmt_url: str, vhosts: list[str], **backup) -> Path:
    cfg = {
        "mode": "backup", "backup_id": "pf-1",
        "source": {"amqp_url": amqp_url, "management_url": mgmt_url, "management_username": "guest",
                   "management_password": "guest", "queues": {"vhosts": vhosts}},
        "storage": {"backend": "filesystem", "path": str(tmp / "store")},
        "backup": {"include_definitions": False, **backup},
        "offset_storage": {"path": str(tmp / "state" / "offsets.db")},
    }
    p = tmp / "backup.yaml"
    p.write_text(json.dumps(cfg))
    return p


def _backup(cfg: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", "backup", "-c", str(cfg), "--no-progress", *extra],
                          capture_output=True, text=True, timeout=180, cwd=cfg.parent)


def _one_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("rbak: ") and "Traceback" not in r.stderr
    return lines[0]


def _nothing_stored(tmp: Path) -> None:
    store = tmp / "store"
    assert not store.exists() or not any(store.rglob("*")), sorted(store.rglob("*"))


def _seed(broker, vhost: str) -> None:
    fast_publish(broker, vhost, "pf-q", (b"x%d" % i for i in range(10)), declare={"x-queue-type": "classic"})
    wait_count(broker, vhost, "pf-q", 10)


def test_wrong_amqp_password_writes_nothing(broker, vhost, tmp_path):
    _seed(broker, vhost)
    url = broker.amqp_url(vhost).replace("guest:guest@", "guest:wrong-pw@")
    r = _backup(_config(tmp_path, url, broker.management_url, [vhost]), "--json")
    line = _one_line(r)
    assert r.returncode == 1
    assert "authentication failed for user 'guest'" in line and f"vhost {vhost!r}" in line and "wrong-pw" not in line
    # --json: one object on stdout, the same one line (issue 45)
    assert json.loads(r.stdout) == {"ok": False, "exit_code": 1, "error": {"class": "AmqpAuthenticationError",
                                                                          "message": line.removeprefix("rbak: ")}}
    _nothing_stored(tmp_path)
    assert broker.message_count(vhost, "pf-q") == 10


def test_wrong_amqp_port_writes_nothing(broker, vhost, tmp_path):
    _seed(broker, vhost)
    url = broker.amqp_url(vhost).replace(f":{broker.amqp_port}/", ":1/")
    r = _backup(_config(tmp_path, url, broker.management_url, [vhost]))
    line = _one_line(r)
    assert r.returncode == 1 and f"{broker.host}:1 " in line and "Connection refused" in line, line
    _nothing_stored(tmp_path)


def test_missing_vhost_says_so_and_writes_nothing(broker, tmp_path):
    missing = f"no-such-{uuid.uuid4().hex[:8]}"
    r = _backup(_config(tmp_path, broker.amqp_url(missing), broker.management_url, [missing]))
    line = _one_line(r)
    assert r.returncode == 2
    assert f"vhost {missing!r} does not exist" in line and "404" not in line, line
    _nothing_stored(tmp_path)


@contextmanager
def _limited_user(broker, vhost: str, tmp: Path, name: str, perms: dict):
    """A ``monitoring`` user (no access to /api/permissions) with ``perms`` on the vhost, and the
    backup config (as a dict, also written to backup.yaml) that runs as it; deleted afterwards."""
    user, pw = f"{name}-{uuid.uuid4().hex[:8]}", "pw-1"
    broker.api("PUT", f"/api/users/{user}", json={"password": pw, "tags": "monitoring"})
    try:
        broker.api("PUT", f"/api/permissions/{vhost}/{user}", json=perms)
        url = broker.amqp_url(vhost).replace("guest:guest@", f"{user}:{pw}@")
        cfg = json.loads(_config(tmp, url, broker.management_url, [vhost]).read_text())
        cfg["source"].update(management_username=user, management_password=pw)
        (tmp / "backup.yaml").write_text(json.dumps(cfg))
        yield cfg
    finally:
        broker.api("DELETE", f"/api/users/{user}", ok=(404,))


def test_no_configure_permission_for_the_lease(broker, vhost, tmp_path):
    _seed(broker, vhost)
    with _limited_user(broker, vhost, tmp_path, "rbak-nolease",
                       {"configure": "^$", "write": "", "read": ".*"}) as cfg:
        r = _backup(tmp_path / "backup.yaml")
        line = _one_line(r)
        assert r.returncode == 2
        assert "configure permission" in line and "rbak.lease" in line and "backup.lease: false" in line, line
        _nothing_stored(tmp_path)
        # the documented opt-out: no lease, the backup runs (and is complete)
        cfg["backup"]["lease"] = False
        (tmp_path / "backup.yaml").write_text(json.dumps(cfg))
        r = _backup(tmp_path / "backup.yaml")
        assert r.returncode == 0, r.stderr
        assert "pf-q (classic): 10 messages [done]" in r.stdout
    assert broker.message_count(vhost, "pf-q") == 10


def test_no_read_permission_is_found_without_an_administrator(broker, vhost, tmp_path):
    """A ``monitoring`` user cannot read ``/api/permissions``; rbak asks the broker over AMQP instead
    (a ``basic.consume`` the broker refuses with 403 before it refuses the probe's argument with
    406): the queues it may not read are named, exit 2, nothing written, no consumer ever attached."""
    _seed(broker, vhost)
    fast_publish(broker, vhost, "secret-q", (b"s%d" % i for i in range(5)), declare={"x-queue-type": "quorum"})
    wait_count(broker, vhost, "secret-q", 5)
    with _limited_user(broker, vhost, tmp_path, "rbak-noread",
                       {"configure": "^rbak\\.lease$", "write": "", "read": "^(pf-q|rbak\\.lease)$"}) as cfg:
        r = _backup(tmp_path / "backup.yaml")
        line = _one_line(r)
        assert r.returncode == 2, r.stderr
        assert f"no read permission on queue(s) {vhost}/secret-q:" in line and "pf-q" not in line, line
        _nothing_stored(tmp_path)
        # leaving it out is enough: the readable queue is backed up
        cfg["source"]["queues"]["exclude"] = ["secret-q"]
        (tmp_path / "backup.yaml").write_text(json.dumps(cfg))
        r = _backup(tmp_path / "backup.yaml")
        assert r.returncode == 0, r.stderr
        assert "pf-q (classic): 10 messages [done]" in r.stdout
    assert broker.message_count(vhost, "pf-q") == 10
    assert broker.message_count(vhost, "secret-q") == 5
    got = drain(broker, vhost, "secret-q")  # the probe never delivered anything: none came back redelivered
    assert [(b, r) for b, _, r in got] == [(b"s%d" % i, False) for i in range(5)]


def test_list_of_a_missing_path_is_an_error(tmp_path):
    for args in (["list", "--path", str(tmp_path / "nope")], ["list", "--path", f"file://{tmp_path}/nope"],
                 ["describe", "--path", str(tmp_path / "nope"), "--backup-id", "b"]):
        r = subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "nope' does not exist" in _one_line(r) and r.stdout == "", r
    (tmp_path / "empty").mkdir()
    r = subprocess.run([sys.executable, "-m", "rbak", "list", "--path", str(tmp_path / "empty")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "no backups" in r.stdout


def test_wrong_management_password_or_port_writes_nothing(broker, vhost, tmp_path):
    _seed(broker, vhost)
    cfg = json.loads(_config(tmp_path, broker.amqp_url(vhost), broker.management_url, [vhost]).read_text())
    cfg["source"]["management_password"] = "wrong-mgmt-pw"
    (tmp_path / "backup.yaml").write_text(json.dumps(cfg))
    r = _backup(tmp_path / "backup.yaml")
    line = _one_line(r)
    assert r.returncode == 1 and "401 Unauthorized for user 'guest'" in line and "wrong-mgmt-pw" not in line, line
    _nothing_stored(tmp_path)
    cfg["source"].update(management_password="guest", management_url=f"http://{broker.host}:1")
    (tmp_path / "backup.yaml").write_text(json.dumps(cfg))
    r = _backup(tmp_path / "backup.yaml")
    line = _one_line(r)
    assert r.returncode == 1 and f"{broker.host}:1/api/overview" in line and "Connection refused" in line, line
    _nothing_stored(tmp_path)
