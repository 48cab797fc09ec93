"""Hostile RabbitMQ data directories (.qi/.qs/.idx/.rdq), on a real node's files.

A CQv2 index cut at an entry boundary (silently short before), a CQv1 ``.idx``
cut on a record boundary (proved short by the clean stop's recovery terms), a queue file
that is a symlink to /dev/zero, and a huge sparse .rdq: each a one-line error
naming file and offset (or a --skip-damaged item with the count lost), peak
RSS under the bound, nothing written outside the target.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from support.node_dirs import qdir, scenario, shared_root  # noqa: F401
from support.node_scenarios import VHOST2

from rbak.offline.rabbitmq.rabbitmq_dir import vhost_dir_name
from support.rss import BOUND_MIB, rbak_measured


def copy_of(shared_root, tmp_path):
    sc = scenario("main-3.10", shared_root)
    copy = tmp_path / sc.data_dir.name
    shutil.copytree(sc.data_dir, copy, symlinks=True)
    return sc, copy


def run_import(copy, tmp_path, *extra, backup_id="h1"):
    return rbak_measured("import", "rabbitmq-dir", str(copy), "--to", f"file://{tmp_path}/out",
                         "--backup-id", backup_id, *extra)


def test_a_qi_cut_at_an_entry_boundary_is_an_error_or_a_counted_skip(shared_root, tmp_path):
    sc, copy = copy_of(shared_root, tmp_path)
    p = qdir(copy, VHOST2, "many-v2") / "0.qi"
    slots = (p.stat().st_size - 64) // 32
    cut = 64 + 32 * (slots // 2)
    os.truncate(p, cut)
    r, peak = run_import(copy, tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "0.qi" in line and f"at byte {cut}" in line and "index truncated" in line, r.stderr
    assert peak < BOUND_MIB
    r2, _ = run_import(copy, tmp_path, "--skip-damaged", backup_id="h2")
    assert r2.returncode == 3, r2.stderr  # partial: recorded in the manifest
    m = re.search(r"at least (\d+) message\(s\) lost", r2.stderr)
    assert m and int(m.group(1)) > 0, r2.stderr


def test_a_queue_file_that_is_dev_zero_is_refused(shared_root, tmp_path):
    sc, copy = copy_of(shared_root, tmp_path)
    p = qdir(copy, VHOST2, "many-v2") / "0.qi"
    p.unlink()
    p.symlink_to("/dev/zero")
    r, peak = run_import(copy, tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "0.qi" in r.stderr and "not a regular file" in r.stderr
    assert peak < BOUND_MIB


def test_a_huge_sparse_rdq_keeps_memory_bounded(shared_root, tmp_path):
    sc, copy = copy_of(shared_root, tmp_path)
    store = copy / "msg_stores" / "vhosts" / vhost_dir_name("/") / "msg_store_persistent"
    n = max(int(q.stem) for q in store.glob("*.rdq")) + 1
    with open(store / f"{n}.rdq", "wb") as f:
        f.truncate(2 * 1024**3)
    r, peak = run_import(copy, tmp_path)
    assert "Traceback" not in r.stderr
    assert peak < BOUND_MIB, f"import peaked at {peak:.0f} MiB"


def _record_starts(p: Path) -> list[tuple[str, int]]:
    """(kind, offset) of every record of a CQv1 segment: P publish (34 bytes + embedded), D deliver/ack."""
    d = p.read_bytes()
    out, pos = [], 0
    while pos < len(d):
        w = int.from_bytes(d[pos:pos + 2], "big")
        out.append(("P" if w & 0x8000 else "D", pos))
        pos += 2 + 32 + int.from_bytes(d[pos + 30:pos + 34], "big") if w & 0x8000 else 2
    return out


V1_QUEUE = "q-ünï-✓"  # 2100 published, 10 acked: 2090 in 0.idx (2038) and 1.idx (52), journal empty


def _v1_backup_count(tmp_path, backup_id: str, queue: str) -> int:
    from rbak.format.manifest import BackupManifest
    from rbak.storage import open_storage

    m = BackupManifest.from_json(open_storage(f"file://{tmp_path}/out").get(f"{backup_id}/manifest.json"))
    qb = m.find_queue(VHOST2, queue)
    return qb.message_count if qb else 0


@pytest.mark.parametrize("how", ["middle", "emptied", "deleted"])
def test_a_v1_idx_cut_on_a_record_boundary_is_an_error_or_a_counted_skip(how, shared_root, tmp_path):
    """Cut on a record boundary, a CQv1 segment parses cleanly; the recovery terms of the clean stop
    (recovery.dets: unacked entries per segment) prove it short."""
    sc, copy = copy_of(shared_root, tmp_path)
    q = qdir(copy, VHOST2, V1_QUEUE)
    seg = q / ("0.idx" if how == "middle" else "1.idx")
    assert (q / "journal.jif").stat().st_size == 0  # a clean stop flushed the journal
    if how == "middle":
        starts = [off for kind, off in _record_starts(seg) if kind == "P"]
        cut = starts[len(starts) // 2]
        os.truncate(seg, cut)
        assert [k for k, _ in _record_starts(seg)][-1] == "D"  # it ends on a whole record: nothing to parse wrong
    elif how == "emptied":
        cut = 0
        os.truncate(seg, 0)
    else:
        cut = None
        seg.unlink()
    r, peak = run_import(copy, tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "index truncated" in line and seg.name in line, r.stderr
    if cut is not None:
        assert f"at byte {cut}" in line, line
    assert peak < BOUND_MIB
    r2, _ = run_import(copy, tmp_path, "--skip-damaged", backup_id="h2")
    assert r2.returncode == 3, r2.stderr  # partial: recorded in the manifest
    m = re.search(r"index truncated: segment \d .*: (\d+) message\(s\) lost", r2.stderr)
    assert m, r2.stderr
    lost = int(m.group(1))
    exported = _v1_backup_count(tmp_path, "h2", V1_QUEUE)
    assert lost > 0 and exported + lost == len(sc.expected[(VHOST2, V1_QUEUE)]) == 2090


def test_an_intact_v1_queue_matches_its_recovery_terms(shared_root, tmp_path):
    """The cross-check is silent on the untouched files (and sees the clean stop's terms)."""
    from rbak.offline.rabbitmq.rabbitmq_dir import queue_dir_name
    from rbak.offline.rabbitmq.recovery_terms import read_recovery_terms

    sc, copy = copy_of(shared_root, tmp_path)
    terms, why = read_recovery_terms(str(copy / "msg_stores" / "vhosts" / vhost_dir_name(VHOST2)))
    assert why is None
    assert terms[queue_dir_name(VHOST2, V1_QUEUE)].segments == {0: 2038, 1: 52}
    r, _ = run_import(copy, tmp_path)
    assert r.returncode == 0, r.stderr
    assert _v1_backup_count(tmp_path, "h1", V1_QUEUE) == 2090
