"""A backup whose checkpoint cannot be opened (a new user's trial of issue 49: the image's working
directory is read-only, so the default ``./.rbak-state/offsets.db`` failed with "Read-only file system")
names ``offset_storage.path`` and how to fix it, and writes nothing to the storage: the failed run left
an in-progress ``<backup-id>/`` that the next run "resumed" with the failed run's created time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest


@contextmanager
def read_only_dir(tmp_path):
    """A read-only file system where one can be mounted (root with CAP_SYS_ADMIN), else sysfs, where no
    file may be made either."""
    d = tmp_path / "ro"
    d.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(d)], capture_output=True).returncode == 0
    try:
        yield (str(d), "Read-only file system") if mounted else ("/sys", "Operation not permitted")
    finally:
        if mounted:
            subprocess.run(["umount", str(d)], check=True)


def _config(tmp_path, broker, vhost: str, state: str):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
mode: backup
source:
  amqp_url: {broker.amqp_url(vhost)}
  management_url: {broker.management_url}
  queues: {{vhosts: ["{vhost}"]}}
storage: {{backend: filesystem, path: "{tmp_path / 'store'}"}}
offset_storage: {{path: "{state}"}}
""")
    return cfg


def _backup(cfg) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", "backup", "--config", str(cfg), "--backup-id", "b1", "--json"],
                          capture_output=True, text=True, env=dict(os.environ), timeout=120)


@pytest.mark.skipif(os.geteuid() != 0, reason="root: the mount, or sysfs refusing even root")
def test_an_unusable_state_path_is_named_and_nothing_is_stored(rmq40, vhost_factory, tmp_path):
    vhost = vhost_factory(rmq40)
    rmq40.publish(vhost, "q", [b"m1", b"m2"], declare={})
    store = tmp_path / "store"
    store.mkdir()
    with read_only_dir(tmp_path) as (ro, reason):
        path = f"{ro}/.rbak-state/offsets.db"
        r = _backup(_config(tmp_path, rmq40, vhost, path))
    assert r.returncode == 1, r.stderr
    assert f"rbak: Checkpoint error: offset_storage.path {path}: cannot open the checkpoint database: " in r.stderr
    assert reason in r.stderr, r.stderr
    assert ("set offset_storage.path to a file in a writable directory (in the container image: "
            "${RBAK_STATE_DIR}/offsets.db, with RBAK_STATE_DIR a writable volume") in r.stderr
    assert json.loads(r.stdout)["error"]["class"] == "CheckpointError"
    assert list(store.iterdir()) == []  # nothing written: no in-progress b1/ for a next run to resume
    assert rmq40.message_count(vhost, "q") == 2

    r = _backup(_config(tmp_path, rmq40, vhost, str(tmp_path / "state" / "offsets.db")))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["completed"] and out["total_messages"] == 2
