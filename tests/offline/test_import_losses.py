"""Imports that know what they lost (issue 45): real 4.3.6 node files, cut the way a disk or a copy cuts them.

A quorum member's ``meta.dets`` records its last applied index, and Osiris indexes every chunk it
wrote and names each segment by its first offset: so a WAL cut at a record boundary or inside one,
and a stream segment cut short, are losses the files prove. Each fails the queue, named, with the
indexes or offsets; ``--skip-damaged`` exports the rest as a *partial* backup (exit 3) that
``list``, ``describe`` and ``validate --deep`` call partial. A running node's data directory is
refused (the CI brokers are running nodes).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rbak.offline.rabbitmq import osiris, ra_log
from rbak.offline.rabbitmq.damage import ImportContext
from support.node_dirs import read_backup, shared_root  # noqa: F401
from support.node_qs_scenarios import versioned_scenario as scenario
from support.node_scenarios import VHOST2


def rbak(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=600)


def import_(node: Path, url: str, backup_id: str, *extra: str) -> subprocess.CompletedProcess:
    return rbak("import", "rabbitmq-dir", str(node), "--to", url, "--backup-id", backup_id, "--no-progress", *extra)


def copy_node(shared_root: Path, tmp_path: Path):
    sc = scenario("qs-4.3", shared_root)
    copy = tmp_path / "node"
    shutil.copytree(sc.data_dir, copy)
    return sc, copy


def cut_wal(copy: Path, into_record: bool) -> None:
    """Cut the quorum WAL at its middle record's start (a record boundary), or one byte into it."""
    sysdir = next((copy / "quorum").iterdir())
    wal = ra_log.wal_files(str(sysdir))[-1]
    logs = ra_log.read_server_logs(str(sysdir), ImportContext())
    starts = sorted(e[3] for log in logs.values() for e in log.entries.values() if e[2] == wal)
    data = Path(wal).read_bytes()
    Path(wal).write_bytes(data[: starts[len(starts) // 2] + (1 if into_record else 0)])


def assert_partial_everywhere(url: str, backup_id: str, queues: set[str]) -> None:
    """list, describe and validate --deep all say partial and name the queues that lost data."""
    path = url
    listed = json.loads(rbak("list", "--path", path, "--format", "json").stdout)
    assert {b["backup_id"]: b["status"] for b in listed}[backup_id] == "partial", listed
    d = rbak("describe", "--path", path, "--backup-id", backup_id, "--format", "json")
    m = json.loads(d.stdout)
    assert m["status"] == "partial", d.stdout
    assert {s["name"] for s in m["queue_status"] if s["status"] == "partial"} == queues, m["queue_status"]
    v = rbak("validate", "--path", path, "--backup-id", backup_id, "--deep", "--no-progress")
    assert f"backup {backup_id} is valid, partial" in v.stdout, v.stdout + v.stderr
    assert "backup {backup_id} is valid (" not in v.stdout


@pytest.mark.slow
@pytest.mark.parametrize("into_record", [False, True], ids=["record-boundary", "inside-a-record"])
def test_a_quorum_wal_cut_short_fails_the_queue_with_both_indexes(shared_root, tmp_path, into_record):
    sc, copy = copy_node(shared_root, tmp_path)
    cut_wal(copy, into_record)
    url = f"file://{tmp_path}/b"
    r = import_(copy, url, "q1")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    m = re.search(r"quorum queue '([^']+)' in vhost '([^']*)': (\S+): its Ra log ends at index (\d+), below the "
                  r"last applied index (\d+)", line)
    assert m, line
    end, applied = int(m.group(4)), int(m.group(5))
    assert end < applied and f"{applied - end} log entries (indexes {end + 1}-{applied})" in line, line
    assert "skipped" not in line and "exported what" not in line, "a fatal error must read as fatal"
    assert not (tmp_path / "b" / "q1").exists() or not any((tmp_path / "b" / "q1").rglob("*"))

    r2 = import_(copy, url, "q2", "--skip-damaged")
    assert r2.returncode == 3, r2.stdout + r2.stderr
    assert "is PARTIAL" in r2.stderr and "exported what the log holds" in r2.stderr
    lost = set(re.findall(r"quorum queue '([^']+)' in vhost '[^']*': \S+: its Ra log ends", r2.stderr))
    assert m.group(1) in lost
    manifest, got = read_backup(url, "q2")
    differ = set()
    for vhost, name in sc.quorum:
        n, ref = len(got.get((vhost, name), [])), len(sc.quorum[(vhost, name)])
        if name in lost:  # lost enqueues are missing, lost acks bring consumed messages back
            differ |= {name} if n != ref else set()
        else:
            assert n == ref, name
    assert differ, "the cut changed what a queue holds"
    assert "qq-ü" in lost and not got.get((VHOST2, "qq-ü")), "qq-ü, published last, is all in the cut half"
    assert_partial_everywhere(url, "q2", lost)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["first", "last", "first-and-its-index"])
def test_a_stream_segment_cut_short_names_the_offsets_it_lost(shared_root, tmp_path, where):
    """The first segment and the last are each cut inside their middle chunk (their index says what
    they held); then the first at a chunk boundary with its index cut to match, where only the next
    segment's name (its first offset) tells where it ended."""
    sc, copy = copy_node(shared_root, tmp_path)
    sdir = max((copy / "stream").iterdir(), key=lambda p: len(osiris.segment_files(str(p))))
    segs = osiris.segment_files(str(sdir))
    assert len(segs) >= 3, segs
    seg = segs[-1] if where == "last" else segs[0]
    data = Path(seg).read_bytes()
    chunks = list(osiris.iter_chunks(seg, data, ImportContext(), False))
    mid = chunks[len(chunks) // 2]
    if where == "first-and-its-index":
        index = Path(seg[: -len(".segment")] + ".index")
        records = osiris.index_records(str(index), ImportContext())
        kept = sum(1 for _cid, pos in records if pos < mid.pos)
        index.write_bytes(index.read_bytes()[: osiris.FILE_HEADER_SIZE + kept * osiris.INDEX_RECORD_SIZE])
        Path(seg).write_bytes(data[: mid.pos])
    else:
        Path(seg).write_bytes(data[: mid.pos + 20])
    url = f"file://{tmp_path}/b"
    r = import_(copy, url, "s1", "--types", "stream")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "stream 'orders-stream' in vhost '/'" in line and seg in line and "skipped" not in line, line
    if where == "first-and-its-index":
        nxt = int(Path(segs[1]).name.split(".")[0])
        assert f"at byte {mid.pos}" in line and f"next one starts at {nxt}: offsets {mid.chunk_id}-{nxt - 1}" \
            in line and "are lost" in line, line
    else:
        assert f"at byte {mid.pos}" in line and f"offsets from {mid.chunk_id} on" in line and "lost" in line, line

    r2 = import_(copy, url, "s2", "--types", "stream", "--skip-damaged")
    assert r2.returncode == 3, r2.stdout + r2.stderr
    _m, got = read_backup(url, "s2")
    refs = sc.streams[("/", "orders-stream")]
    kept = [rec.delivery_tag for rec in got[("/", "orders-stream")]]
    lost_upto = chunks[-1].chunk_id + chunks[-1].num_records
    assert kept == [f.offset for f in refs if not mid.chunk_id <= f.offset < lost_upto]
    assert_partial_everywhere(url, "s2", {"orders-stream"})


def test_a_running_nodes_data_directory_is_refused(broker, tmp_path):
    """The CI brokers are running nodes: their data directories, with the pid file beside them."""
    assert Path(str(broker.data_dir) + ".pid").is_file()
    r = import_(broker.data_dir, f"file://{tmp_path}/b", "live")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "the node is running" in line and f"{broker.data_dir}.pid" in line and "import a copy" in line, line
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("*"))
