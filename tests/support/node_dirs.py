"""Data directories written by private RabbitMQ nodes, shared by the offline-import tests."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from rbak.format.manifest import BackupManifest
from rbak.format.segment import decode_segment
from rbak.offline.rabbitmq.rabbitmq_dir import queue_dir_name, vhost_dir_name
from rbak.storage import open_storage
from support.node_scenarios import get_scenario
from support.private_node import chroot_ready
from support.require import require_that


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory) -> Path:
    # Under xdist the parent of basetemp is shared by all workers of one run.
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def scenario(name: str, shared_root: Path):
    if name == "main-4.0":
        require_that(chroot_ready())
    return get_scenario(name, shared_root)


def qdir(data_dir: Path, vhost: str, queue: str) -> Path:
    return data_dir / "msg_stores" / "vhosts" / vhost_dir_name(vhost) / "queues" / queue_dir_name(vhost, queue)


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.stat(p)
            out[p] = (st.st_size, st.st_mtime_ns, hashlib.sha256(Path(p).read_bytes()).hexdigest())
    return out


def read_backup(url: str, backup_id: str) -> tuple[BackupManifest, dict]:
    st = open_storage(url)
    m = BackupManifest.from_json(st.get(f"{backup_id}/manifest.json"))
    got = {}
    for q in m.queues:
        recs = [r for s in q.segments for r in decode_segment(st.get(s.key), s.key).records]
        got[(q.vhost, q.name)] = recs
    return m, got
