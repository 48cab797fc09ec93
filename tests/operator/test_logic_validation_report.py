"""What the operator's validation message says from the stored report (issue 45): an unverified deep
check (nothing decrypted) is named as such, never taken for a pass or a list of bad segments."""

from __future__ import annotations

from rbak.repo.validate import ValidationReport, store_report
from rbak.storage import open_storage
from rbak_operator.reconcile.storage import report_problems


def test_an_unverified_report_is_named_and_a_failed_one_lists_its_problems(tmp_path, monkeypatch):
    monkeypatch.setenv("RBAK_OPERATOR_PVC_ROOT", str(tmp_path))
    (tmp_path / "claim" / "backups").mkdir(parents=True)
    storage = open_storage(f"file://{tmp_path / 'claim' / 'backups'}")
    body = {"metadata": {"namespace": "ns"}, "spec": {"storage": {"pvc": {"claimName": "claim"}}}}

    rep = ValidationReport("b1", deep=True, complete=True, unverified="encrypted with key id 'k1', which is not in "
                                                                      "the keyring")
    assert (rep.ok, rep.result) == (False, "unverified")
    key = store_report(storage, rep.to_json_obj(), "b1")
    msg = report_problems(None, body, "b1")
    assert msg == ("unverified: not decrypted (encrypted with key id 'k1', which is not in the keyring); only the "
                   "stored objects' sizes and SHA-256 were checked, which proves nothing about whether the contents "
                   f"can be restored (report {key})")

    bad = ValidationReport("b2", deep=True, complete=True, problems=["b2/queues/q/segment-0001.zst: missing"],
                           unverified="whatever")
    assert bad.result == "invalid"  # a wrong checksum or a missing segment is invalid, key or no key
    key = store_report(storage, {**bad.to_json_obj(), "all_problems": bad.all_problems()}, "b2")
    assert report_problems(None, body, "b2") == f"b2/queues/q/segment-0001.zst: missing (report {key})"
