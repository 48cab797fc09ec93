"""Every dry-run flag leaves the broker and the storage exactly as they were.

Flags: ``restore --dry-run``, ``restore --definitions-dry-run`` (alone and
with ``--definitions``), the config's ``restore.dry_run`` and
``restore.definitions_dry_run``, and ``definitions-import --dry-run``. The
backup holds messages and definitions that would create a queue, so a run
that is not dry changes something visible.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rbak.format.compression import Compression, compress
from rbak.format.manifest import BackupManifest, DefinitionsBackup
from rbak.format.layout import BackupLayout
from rbak.storage import open_storage
from rbak_spark.synthetic import QueueSpec, write_backup


def rbak(*args):
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300)


def files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def broker_state(broker, vhost):
    queues = sorted((q["name"], broker.message_count(vhost, q["name"])) for q in broker.list_queues(vhost))
    d = broker.definitions()
    mine = {k: sorted(json.dumps(x, sort_keys=True) for x in d.get(k, []) if x.get("vhost") == vhost)
            for k in ("queues", "exchanges", "bindings", "policies")}
    return queues, mine


@pytest.fixture
def setup(broker, vhost, tmp_path):
    store = tmp_path / "store"
    s = open_storage(f"file://{store}")
    write_backup(s, "b1", [QueueSpec(vhost, "q", 300, 100)])
    doc = {"rabbit_version": "3.10.8", "vhosts": [{"name": vhost}], "users": [], "permissions": [],
           "parameters": [], "policies": [], "exchanges": [], "bindings": [],
           "queues": [{"name": "q", "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}},
                      {"name": "from-definitions", "vhost": vhost, "durable": True, "auto_delete": False,
                       "arguments": {}}]}
    layout = BackupLayout("b1")
    data = json.dumps(doc).encode()
    s.put(layout.definitions(Compression.ZSTD), compress(data, Compression.ZSTD))
    m = BackupManifest.from_json(s.get(layout.manifest))
    m.definitions = DefinitionsBackup(layout.definitions(Compression.ZSTD), 1, 2, 0, 0, len(data))
    s.put(layout.manifest, m.to_json())
    broker.declare_queue(vhost, "q")
    defs = tmp_path / "defs.json"
    defs.write_text(json.dumps(doc))
    cfg = {"mode": "restore", "backup_id": "b1",
           "target": {"amqp_url": broker.server_url(), "management_url": broker.management_url},
           "storage": {"backend": "filesystem", "path": str(store)},
           "restore": {"publish_mode": "queue"}}
    return store, cfg, defs


def _config(tmp_path, cfg, **restore):
    c = json.loads(json.dumps(cfg))
    c["restore"].update(restore)
    p = tmp_path / f"c-{len(os.listdir(tmp_path))}.yaml"
    p.write_text(yaml.safe_dump(c))
    return str(p)


DRY_RUNS = {
    "restore --dry-run": lambda url, cfg, defs, tmp: ["restore", *url, "--dry-run"],
    "restore --definitions --dry-run": lambda url, cfg, defs, tmp: ["restore", *url, "--definitions", "--dry-run"],
    "restore --definitions-dry-run": lambda url, cfg, defs, tmp: ["restore", *url, "--definitions-dry-run"],
    "restore.dry_run": lambda url, cfg, defs, tmp: ["restore", "--config", _config(tmp, cfg, dry_run=True)],
    "restore.definitions_dry_run": lambda url, cfg, defs, tmp: [
        "restore", "--config", _config(tmp, cfg, definitions_dry_run=True)],
    "restore.definitions_dry_run + restore_definitions": lambda url, cfg, defs, tmp: [
        "restore", "--config", _config(tmp, cfg, definitions_dry_run=True, restore_definitions=True)],
    "definitions-import --dry-run": lambda url, cfg, defs, tmp: [
        "definitions-import", "--config", _config(tmp, cfg), "--input", str(defs), "--dry-run"],
}


@pytest.mark.parametrize("flag", sorted(DRY_RUNS))
def test_every_dry_run_flag_changes_nothing(broker, vhost, tmp_path, setup, flag):
    store, cfg, defs = setup
    url = ["--path", f"file://{store}", "--backup-id", "b1", "--target-url", broker.server_url(),
           "--management-url", broker.management_url, "--publish-mode", "queue"]
    before_files, before_broker = files(store), broker_state(broker, vhost)
    r = rbak(*DRY_RUNS[flag](url, cfg, defs, tmp_path))
    assert r.returncode == 0, r.stderr
    assert files(store) == before_files, "a dry run wrote to storage"
    assert broker_state(broker, vhost) == before_broker, "a dry run changed the broker"
    assert broker.message_count(vhost, "q") == 0
    assert broker.queue_info(vhost, "from-definitions") is None


def test_the_same_runs_without_dry_run_do_change_things(broker, vhost, tmp_path, setup):
    """The dry-run test above can fail: the real runs publish and create."""
    store, cfg, defs = setup
    r = rbak("restore", "--config", _config(tmp_path, cfg, restore_definitions=True))
    assert r.returncode == 0, r.stderr
    assert broker.message_count(vhost, "q") == 300
    assert broker.queue_info(vhost, "from-definitions") is not None
