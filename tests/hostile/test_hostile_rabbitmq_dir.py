"""Hostile RabbitMQ data directories (.qi/.qs/.idx/.rdq), on a real node's files.

A CQv2 index cut at an entry boundary (silently short before), a queue file
that is a symlink to /dev/zero, and a huge sparse .rdq: each a one-line error
naming file and offset (or a --skip-damaged item with the count lost), peak
RSS under the bound, nothing written outside the target.
"""

from __future__ import annotations

import os
import re
import shutil
from support.node_dirs import qdir, scenario, shared_root  # noqa: E402,F401
from support.node_scenarios import VHOST2  # noqa: E402

from rbak.offline.rabbitmq_dir import vhost_dir_name  # noqa: E402
from support.rss import BOUND_MIB, rbak_measured  # noqa: E402


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
    assert r2.returncode == 0, r2.stderr
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
