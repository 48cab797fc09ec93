"""Hostile ``mosquitto.db`` inputs: every one a one-line error naming the file (and offset), bounded memory.

Run as a user runs them (``rbak import mosquitto-db`` in a subprocess), with
peak RSS measured by the kernel, and nothing written outside the target.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from rbak.repo.catalog import load_manifest
from rbak.offline.mosquitto import ClientChunk, ClientMsgChunk, MsgStoreChunk, SubChunk, write_db
from rbak.storage import open_storage
from support.rss import BOUND_MIB, rbak_measured


def import_db(path, url, *extra, backup_id="m1"):
    return rbak_measured("import", "mosquitto-db", str(path), "--to", url, "--backup-id", backup_id, *extra)


def good_chunks(client="good", n=20):
    chunks = [MsgStoreChunk(i + 1, f"t/{i}", b"payload-%d" % i, 1, False) for i in range(n)]
    chunks.append(ClientChunk(client, session_expiry_interval=0xFFFFFFFF))
    chunks += [ClientMsgChunk(i + 1, client, i + 1, 1, 11, 1) for i in range(n)]
    return chunks


def one_line_error(r) -> str:
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_dev_zero_is_refused_at_once_with_bounded_memory(tmp_path):
    r, peak = import_db("/dev/zero", f"file://{tmp_path}/out")
    line = one_line_error(r)
    assert "/dev/zero" in line and "byte offset 0" in line and "not a Mosquitto persistence file" in line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.zst"))
    assert peak < BOUND_MIB


def test_a_huge_file_with_a_valid_magic_and_junk_stays_bounded(tmp_path):
    db = tmp_path / "mosquitto.db"
    write_db(db, good_chunks())
    with open(db, "r+b") as f:  # a 3 GiB sparse tail of zeros: chunk headers of type 0, length 0
        f.truncate(3 * 1024**3)
    r, peak = import_db(db, f"file://{tmp_path}/out")
    line = one_line_error(r)
    assert str(db) in line and "byte offset" in line
    assert peak < BOUND_MIB, f"import peaked at {peak:.0f} MiB"


def test_a_non_utf8_client_id_names_file_and_offset_and_skip_damaged_skips_it(tmp_path):
    db = tmp_path / "mosquitto.db"
    bad = "bad-\udcfd-client"  # written as the raw byte 0xfd
    chunks = good_chunks()
    chunks += [MsgStoreChunk(100 + i, "x/y", b"bad-%d" % i, 1, False) for i in range(3)]
    chunks.append(ClientChunk(bad, session_expiry_interval=0xFFFFFFFF))
    chunks += [ClientMsgChunk(100 + i, bad, i + 1, 1, 11, 1) for i in range(3)]
    chunks.append(SubChunk(bad, "x/#", 1))
    write_db(db, chunks)
    raw = db.read_bytes()
    first_bad = raw.index(b"bad-\xfd-client")
    url = f"file://{tmp_path}/out"
    r, _ = import_db(db, url)
    line = one_line_error(r)
    assert str(db) in line and "not valid UTF-8" in line and "client id" in line
    offset = int(re.search(r"byte offset (\d+)", line).group(1))
    assert offset == first_bad + 4  # the 0xfd byte itself
    assert "Serialization error" not in line
    assert not list(open_storage(url).list(""))

    r2, _ = import_db(db, url, "--skip-damaged")
    assert r2.returncode == 3, r2.stderr  # partial: what was skipped is in the manifest, never "complete"
    assert "SKIPPED damaged data" in r2.stdout and "not valid UTF-8" in r2.stdout and "PARTIAL" in r2.stderr
    m = load_manifest(open_storage(url), "m1")
    assert [(q.name, q.message_count) for q in m.queues] == [("mqtt-subscription-goodqos1", 20)]
    assert m.state == "partial" and "not valid UTF-8" in m.queue_status[0].reason


def test_a_truncated_file_names_the_offset_and_skip_damaged_counts_what_is_lost(tmp_path):
    db = tmp_path / "mosquitto.db"
    write_db(db, good_chunks(n=50))
    size = db.stat().st_size
    os.truncate(db, size - 7)
    r, _ = import_db(db, f"file://{tmp_path}/out")
    line = one_line_error(r)
    assert str(db) in line and re.search(r"byte offset \d+", line) and "truncated" in line
    r2, _ = import_db(db, f"file://{tmp_path}/out2", "--skip-damaged")
    assert r2.returncode == 3 and "SKIPPED damaged data" in r2.stdout


@pytest.mark.parametrize("length", [0xFFFF_FFF0, 1 << 30])
def test_an_absurd_chunk_length_is_an_error_not_an_allocation(tmp_path, length):
    db = tmp_path / "mosquitto.db"
    write_db(db, good_chunks(n=3))
    data = bytearray(db.read_bytes())
    # v6: a 23-byte header, the CFG chunk (8 + 16 bytes), then the first MSG_STORE: type u32 BE, length u32 BE
    assert data[47:51] == (2).to_bytes(4, "big")
    data[51:55] = length.to_bytes(4, "big")
    Path(db).write_bytes(bytes(data))
    r, peak = import_db(db, f"file://{tmp_path}/out")
    line = one_line_error(r)
    assert str(db) in line and "byte offset" in line
    assert peak < BOUND_MIB
