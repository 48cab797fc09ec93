"""Which backup "the latest" is: complete, and not proven damaged by its last validation."""

from __future__ import annotations

import subprocess
import sys

import orjson

from rbak.repo.catalog import latest_complete, latest_validation, list_backups
from rbak.storage import open_storage
from rbak.repo.validate import store_report
from rbak_spark.synthetic import QueueSpec, write_backup


def test_latest_complete_skips_a_backup_whose_last_validation_failed(tmp_path, caplog):
    st = open_storage(f"file://{tmp_path}")
    for i, bid in enumerate(("b1", "b2", "b3")):
        write_backup(st, bid, [QueueSpec("/", "q", 5)], start_ms=1_700_000_000_000 + i * 1000)
    assert latest_complete(st).backup_id == "b3" and latest_validation(st, "b3") is None

    key = store_report(st, {"ok": False, "all_problems": ["segment x: CRC32 mismatch"]}, "b3")
    assert key.startswith("b3/validation/report-") and latest_validation(st, "b3") == (key, orjson.loads(st.get(key)))
    assert latest_complete(st).backup_id == "b2"
    assert "skipping backup 'b3': its last validation failed" in caplog.text

    st.put("b2/validation/report-20990101T000000000Z.json", b"{not json")  # unreadable counts as failed
    assert latest_complete(st).backup_id == "b1"

    store_report(st, {"ok": True}, "b3")  # the newest report decides
    assert latest_complete(st).backup_id == "b3"


def test_a_folder_of_backups_listed_from_above_is_named_as_such(tmp_path):
    """Trial F19: ``rbak list --path s3://bucket`` for backups written under ``prod/`` showed ``prod`` as an
    incomplete backup with no word of why; a crashed backup's folder keeps its own error."""
    write_backup(open_storage(f"file://{tmp_path}/prod"), "b1", [QueueSpec("/", "q", 2)])
    st = open_storage(f"file://{tmp_path}")
    st.put("c1/segments/x", b"half")  # a backup that crashed before its manifest
    entries = {e.backup_id: e for e in list_backups(st)}
    assert entries["prod"].status == "incomplete" and entries["prod"].error is None
    assert entries["prod"].note == "not a backup: a folder of backups ('b1', ...); list them with --prefix prod"
    assert entries["c1"].error is None and entries["c1"].status == "incomplete"
    r = subprocess.run([sys.executable, "-m", "rbak", "list", "--path", f"file://{tmp_path}"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "list them with --prefix prod" in r.stdout, r.stdout + r.stderr
    assert [e.backup_id for e in list_backups(st, "prod")] == ["b1"]
