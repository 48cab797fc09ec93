"""``rbak list`` with one backup whose manifest cannot be read (a new user's trial of issue 49: a
root-owned manifest, mode 0600, listed as uid 1000 failed the whole listing with "cannot read key
'x/manifest.json': Permission denied"): the others are listed, the unreadable one is named with its key
and the reason on stderr and in the table or JSON, and the exit code is 1.

The tests run as root, which ignores file modes, so the CLI runs in-process with its effective uid
set to 1000 (the image's user): the kernel's own EACCES, through the file storage."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager

import pytest
from support.restores import build_backup, make_records

from rbak.cli import main
from rbak.storage import open_storage

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as uid 1000")


@contextmanager
def as_uid_1000():
    """Python and its packages live under /root (mode 0700): what the commands import lazily is imported
    first, as root, by the same commands on a readable copy."""
    os.seteuid(1000)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def store():
    path = tempfile.mkdtemp(prefix="rbak-list-")  # not tmp_path: pytest's folders are root's, mode 0700
    os.chmod(path, 0o755)
    storage = open_storage(path)
    for bid in ("ok-1", "locked", "ok-2"):
        build_backup(storage, bid, [("/", "q", "classic", make_records("/", "q", [b"m1", b"m2"]))])
    for args in (["list", "--path", path], ["list", "--path", path, "--format", "json"],
                 ["describe", "--path", path, "--backup-id", "locked"]):
        main(args)  # as root: every module these commands import lazily is loaded now
    for root, dirs, files in os.walk(path):  # the file storage writes 0600 (mkstemp): readable by all here
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    os.chmod(os.path.join(path, "locked", "manifest.json"), 0o600)
    yield path
    shutil.rmtree(path)


def test_list_names_the_unreadable_backup_lists_the_others_and_exits_1(store, capsys):
    capsys.readouterr()
    with as_uid_1000():
        code = main(["list", "--path", store])
    out, err = capsys.readouterr()
    assert code == 1
    reason = f"Storage error: file://{store}: cannot read key 'locked/manifest.json': Permission denied"
    assert f"rbak: backup 'locked': {reason}" in err, err
    assert ("rbak: Storage error: 1 backup(s) listed as unreadable (their manifest could not be read: 'locked'); the others are "
            "listed") in err
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {"ok-1", "locked", "ok-2"}
    assert "complete" in rows["ok-1"] and "complete" in rows["ok-2"]
    assert "unreadable" in rows["locked"] and "cannot read key 'locked/manifest.json': Permission denied" in rows["locked"]


def test_list_json_holds_every_backup_and_the_error(store, capsys):
    capsys.readouterr()
    with as_uid_1000():
        code = main(["list", "--path", store, "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 1
    doc = json.loads(out)
    assert doc["ok"] is False and doc["exit_code"] == 1 and doc["error"]["class"] == "StorageError"
    listed = {e["backup_id"]: e for e in doc["result"]}
    assert set(listed) == {"ok-1", "locked", "ok-2"}
    assert listed["ok-1"]["status"] == listed["ok-2"]["status"] == "complete"
    assert listed["locked"]["status"] == "unreadable"
    assert listed["locked"]["error"] == f"Storage error: file://{store}: cannot read key 'locked/manifest.json': Permission denied"
    assert "rbak: backup 'locked': " in err


def test_describe_of_the_unreadable_backup_fails_naming_it(store, capsys):
    capsys.readouterr()
    with as_uid_1000():
        code = main(["describe", "--path", store, "--backup-id", "locked"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "cannot read key 'locked/manifest.json': Permission denied" in err, err


def test_a_readable_storage_still_lists_with_exit_0(store, capsys):
    capsys.readouterr()
    os.chmod(os.path.join(store, "locked", "manifest.json"), 0o644)
    with as_uid_1000():
        assert main(["list", "--path", store]) == 0
    assert "unreadable" not in capsys.readouterr().out
