"""Which backup "the latest" is: complete, and not proven damaged by its last validation."""

from __future__ import annotations


import orjson

from rbak.repo.catalog import latest_complete, latest_validation
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
