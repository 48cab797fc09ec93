"""Hostile manifests and storage layouts, against a real broker: restore runs validate's checks first.

A manifest listing a segment twice, a missing segment, a segment that fails
half-way, a bomb, and the same backup read through a URL that holds its
prefix: every command agrees, restore publishes nothing from a backup
validate rejects, and reports exactly what the broker confirmed when it
stops early.
"""

from __future__ import annotations

import copy
import json
import struct

import pytest
import zstandard

from rbak.format.compression import Compression
from rbak.format.layout import BackupLayout
from rbak.storage import open_storage
from support.rss import BOUND_MIB, rbak_measured
from rbak_spark.synthetic import QueueSpec, write_backup
from support.bombs import GIB, frame, replace_segment, zstd_zeros


def restore(broker, url, *extra, backup_id="b1"):
    # the URL (with its password) through the environment, as the CLI recommends: stderr holds only errors
    return rbak_measured("restore", "--path", url, "--backup-id", backup_id,
                         "--management-url", broker.management_url, "--publish-mode", "queue", "--json", *extra,
                         env={"RBAK_TARGET_URL": broker.server_url()})


def backup_in(tmp_path, vhost, n=200, prefix=""):
    url = f"file://{tmp_path}/backups"
    s = open_storage(url)
    m = write_backup(s, "b1", [QueueSpec(vhost, "q", n, 300)], prefix=prefix, segment_max_bytes=16 * 1024)
    assert len(m.queues[0].segments) >= 4
    return url, s, m


def save(s, m, prefix=""):
    s.put(BackupLayout("b1", prefix).manifest, m.to_json())


def test_a_segment_listed_twice_is_refused_by_validate_and_restore_alike(broker, vhost, tmp_path):
    url, s, m = backup_in(tmp_path, vhost)
    q = m.queues[0]
    dup = copy.copy(q.segments[1])
    dup.sequence = q.segments[-1].sequence + 1
    q.add_segment(dup)
    m.total_messages += dup.record_count
    m.total_segments += 1
    m.total_bytes += dup.size_bytes
    save(s, m)
    broker.declare_queue(vhost, "q")
    v, _ = rbak_measured("validate", "--path", url, "--backup-id", "b1")
    assert v.returncode == 1 and "listed twice" in v.stderr + v.stdout
    r, _ = restore(broker, url)
    assert r.returncode != 0
    assert "listed twice" in r.stderr and dup.key in r.stderr and "nothing published" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert broker.message_count(vhost, "q") == 0


def test_a_missing_segment_is_refused_before_anything_is_published(broker, vhost, tmp_path):
    url, s, m = backup_in(tmp_path, vhost)
    gone = m.queues[0].segments[-1].key
    s.delete(gone)
    broker.declare_queue(vhost, "q")
    r, _ = restore(broker, url)
    assert r.returncode != 0 and gone in r.stderr and "missing from storage" in r.stderr
    assert broker.message_count(vhost, "q") == 0


def test_a_restore_that_stops_on_segment_3_reports_what_the_broker_confirmed(broker, vhost, tmp_path):
    url, s, m = backup_in(tmp_path, vhost)
    seg = m.queues[0].segments[2]
    payload = b"".join(struct.pack("<I", 9) + b"not json!" for _ in range(seg.record_count))
    key = replace_segment(s, "b1", frame(zstandard.ZstdCompressor().compress(payload), Compression.ZSTD,
                                         seg.record_count, seg.first_timestamp, seg.last_timestamp),
                          index=2, uncompressed=len(payload))
    broker.declare_queue(vhost, "q")
    r, _ = restore(broker, url)
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    before = m.queues[0].segments[0].record_count + m.queues[0].segments[1].record_count
    enqueued = broker.message_count(vhost, "q")
    assert enqueued == before
    assert out["confirmed"] == enqueued and out["queues"][0]["confirmed"] == enqueued
    assert out["queues"][0]["status"] == "failed" and key in out["queues"][0]["error"]


def test_a_bomb_fails_the_restore_with_bounded_memory(broker, vhost, tmp_path):
    url, s, m = backup_in(tmp_path, vhost)
    seg = m.queues[0].segments[0]
    key = replace_segment(s, "b1", frame(zstd_zeros(GIB), Compression.ZSTD, seg.record_count, seg.first_timestamp,
                                         seg.last_timestamp))
    broker.declare_queue(vhost, "q")
    r, peak = restore(broker, url)
    assert r.returncode == 1 and key in r.stdout and "expands past" in r.stdout
    assert "Traceback" not in r.stderr
    assert broker.message_count(vhost, "q") == 0
    assert peak < BOUND_MIB, f"restore peaked at {peak:.0f} MiB"


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_prefix_in_the_url_or_in_the_config_reads_the_same_backup(broker, vhost, tmp_path, kind, request):
    if kind == "file":
        base = f"file://{tmp_path}/store"
        with_prefix = f"file://{tmp_path}/store/pfx"
    else:
        bucket = request.getfixturevalue("s3_bucket")
        base, with_prefix = str(bucket), bucket.url_with_prefix(f"{bucket.prefix}/pfx")
    s = open_storage(base)
    m = write_backup(s, "b1", [QueueSpec(vhost, "q", 120, 300)], prefix="pfx", segment_max_bytes=16 * 1024)
    assert m.queues[0].segments[0].key.startswith("pfx/b1/queues/")
    broker.declare_queue(vhost, "q")
    for url, extra in ((with_prefix, ()), (base, ("--prefix", "pfx"))):
        for cmd in (["list"], ["describe", "--backup-id", "b1"], ["validate", "--backup-id", "b1", "--deep"]):
            r, _ = rbak_measured(*cmd, "--path", url, *extra)
            assert r.returncode == 0, (cmd, url, r.stderr)
            if cmd[0] == "list":
                assert "b1" in r.stdout
        dry, _ = restore(broker, url, "--dry-run", *extra)
        assert dry.returncode == 0 and json.loads(dry.stdout)["queues"][0]["selected"] == 120, dry.stderr
    r, _ = restore(broker, with_prefix)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["confirmed"] == 120 == broker.message_count(vhost, "q")
