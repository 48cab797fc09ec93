"""Pure parts of the restore: planning, checkpoint, options (no broker).

The AMQP property codec the publisher uses is tested in tests/format/test_amqp091.py.
"""

from __future__ import annotations

import pytest

from rbak.config import Config
from rbak.errors import CheckpointError, ConfigError
from rbak.format.manifest import BackupManifest, QueueBackup, SegmentMetadata
from rbak.restore.checkpoint import RestoreCheckpoint
from rbak.restore.options import RestoreOptions, options_from_config
from rbak.restore.plan import map_queue, plan_restore, segment_in_window


def _seg(seq, first, last, n=10):
    return SegmentMetadata(f"k{seq}", seq, n, 100, 100, first, last, "")


def test_plan_skips_segments_outside_the_window_and_maps_names():
    q = QueueBackup("prod", "orders", segments=[_seg(1, 0, 9), _seg(2, 10, 19), _seg(3, 20, 29)])
    m = BackupManifest("b", 0, 1, queues=[q, QueueBackup("prod", "other", segments=[_seg(1, 0, 9)])])
    opts = RestoreOptions("b", window_start_ms=12, window_end_ms=19, vhost_mapping=(("prod", "staging"),),
                          queue_mapping=(("prod/orders", "orders-copy"), ("other", "x")))
    p1, p2 = plan_restore(m, opts)
    assert [s.sequence for s in p1.segments] == [2] and p1.skipped_segments == 2 and p1.skipped_records == 20
    assert (p1.target_vhost, p1.target_queue, p2.target_queue) == ("staging", "orders-copy", "x")
    assert not segment_in_window(0, 9, 10, 10, None) and segment_in_window(None, None, 1, 5, 6)
    assert map_queue("v", "q", {"q": "a", "v/q": "b"}) == "b"
    clash = RestoreOptions("b", queue_mapping=(("orders", "same"), ("other", "same")))
    with pytest.raises(ConfigError, match="would both be restored into queue 'same'"):
        plan_restore(m, clash)


def test_checkpoint_resumes_from_the_furthest_confirmed_record_and_refuses_another_config(tmp_path):
    path = str(tmp_path / "cp.db")
    cp = RestoreCheckpoint(path, {"backup_id": "b"})
    cp.start_queue("/", "q", "/", "q", 3)
    cp.record("/", "q", 1, 10, True, 10)
    cp.record("/", "q", 2, 4, False, 14)
    cp.close()
    state = RestoreCheckpoint(path, {"backup_id": "b"}).load("/", "q")
    assert (state.initial_depth, state.confirmed, state.resume_point()) == (3, 14, (2, 4))
    with pytest.raises(CheckpointError, match="belongs to a different restore"):
        RestoreCheckpoint(path, {"backup_id": "other"})


def test_options_from_the_config_file_sections():
    cfg = Config.from_dict({
        "mode": "restore", "backup_id": "b1",
        "target": {"amqp_url": "amqp://u:p@rabbit:5672/%2f", "management_url": "http://rabbit:15672"},
        "storage": {"backend": "filesystem", "path": "/tmp/x", "prefix": "pre"},
        "restore": {"time_window_start": "2024-01-01T00:00:00Z", "time_window_end": 1_800_000_000_000,
                    "publish_mode": "queue", "vhost_mapping": {"/": "staging"}, "allow_non_empty": True,
                    "definitions_selection": {"vhosts": ["/"]}, "produce_batch_size": 100},
    }, env={})
    o = options_from_config(cfg, dry_run=True)
    assert (o.backup_id, o.prefix, o.window_start_ms, o.window_end_ms) == ("b1", "pre", 1_704_067_200_000, 1_800_000_000_000)
    assert (o.publish_mode, o.vhost_map, o.allow_non_empty, o.dry_run, o.produce_batch_size) == ("queue", {"/": "staging"}, True, True, 100)
    assert list(o.definitions_selection.vhosts) == ["/"]
    assert (o.target.mgmt_username, o.target.mgmt_password) == ("u", "p")
    assert "p@" not in repr(o.target)


def test_a_stream_target_is_judged_by_its_next_offset_not_its_sampled_count(monkeypatch):
    """4.0.5 answered a passive declare of a just re-declared stream with the deleted one's 21 messages."""
    from rbak.restore import queue_restore as qr
    from rbak.restore.plan import QueuePlan

    next_offset = {"value": 0}
    monkeypatch.setattr(qr, "queue_depth", lambda conn, vhost, queue: 21)
    monkeypatch.setattr(qr, "stream_next_offset", lambda conn, vhost, queue, target=None: next_offset["value"])
    stream = QueuePlan("v", "s", "stream", "v", "s", (), 0, 0)
    opts = RestoreOptions("b")
    assert qr.target_contents(None, stream, opts) == (0, 0)
    assert qr.held_description(*qr.target_contents(None, stream, opts)) is None
    next_offset["value"] = 7
    assert qr.held_description(*qr.target_contents(None, stream, opts)) == "messages (its next offset is 7)"
    classic = QueuePlan("v", "q", "classic", "v", "q", (), 0, 0)
    assert qr.held_description(*qr.target_contents(None, classic, opts)) == "21 message(s)"
    monkeypatch.setattr(qr, "queue_depth", lambda conn, vhost, queue: None)
    assert qr.target_contents(None, stream, opts) == (None, None)  # no such queue: the caller names it
