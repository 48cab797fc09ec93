"""A partial backup (a queue refused or failed) is a state: list, describe, validate say so; restores warn."""

from __future__ import annotations

import json
import subprocess
import sys

from rbak.repo.catalog import load_manifest
from rbak.format.manifest import QueueStatus
from rbak.storage import open_storage
from support.restores import build_backup, make_records


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_partial_backup_is_shown_and_warned(tmp_path):
    st = open_storage(str(tmp_path / "store"))
    build_backup(st, "part", [("/", "q", "classic", make_records("/", "q", [b"a", b"b"]))])
    m = load_manifest(st, "part")
    m.queue_status = [QueueStatus("/", "lim", "refused", "its delivery limit is 2")]
    st.put("part/manifest.json", m.to_json())
    out = json.loads(_cli("list", "--path", "store", "--format", "json", cwd=tmp_path).stdout)
    assert out[0]["status"] == "partial" and out[0]["queue_status"][0]["name"] == "lim"
    assert "partial" in _cli("list", "--path", "store", cwd=tmp_path).stdout
    d = _cli("describe", "--path", "store", "--backup-id", "part", cwd=tmp_path).stdout
    assert "(partial)" in d and "refused //lim: its delivery limit is 2" in d
    v = _cli("validate", "--path", "store", "--backup-id", "part", cwd=tmp_path)
    assert v.returncode == 0 and "valid, partial" in v.stdout and "lim" in v.stdout
    r = _cli("restore", "--path", "store", "--backup-id", "part", "--dry-run", "--target-url",
             "amqp://guest:guest@127.0.0.1:1/", "--management-url", "http://127.0.0.1:1", cwd=tmp_path)  # no broker
    assert r.returncode == 0 and "PARTIAL" in r.stderr and "/lim (refused)" in r.stderr, r.stderr
    assert ("this dry run did not check that the target queues exist and are of the type each is restored as"
            in r.stderr), r.stderr
