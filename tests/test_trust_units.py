"""Issue 14 without brokers: manifest extensions stay byte-compatible, the continuity verdict,
partial backups in list/describe/validate/restore, chain links checked before publishing."""

from __future__ import annotations

import json
import pytest

from rbak.backup.stream_chain import StreamBase, decide
from rbak.broker.stream_reader import ProbedRecord
from rbak.format.manifest import BackupManifest, QueueBackup, QueueStatus, SegmentMetadata, StreamGap, StreamInfo
from rbak.restore.chain import expand_chains
from rbak.errors import ChainError

SPEC_EXAMPLE = {
    "backup_id": "b", "created_at": 1, "completed_at": 2, "source_cluster": "rabbit@n", "rabbitmq_version": "3.13.2",
    "backup_tool_version": "0.1.0", "definitions": None,
    "queues": [{"vhost": "/", "name": "q", "queue_type": "classic", "segments": [], "message_count": 0,
                "first_message_timestamp": None, "last_message_timestamp": None}],
    "total_messages": 0, "total_bytes": 0, "total_segments": 0,
}


def test_manifest_without_extensions_is_byte_identical():
    raw = json.dumps(SPEC_EXAMPLE, indent=2).encode()
    m = BackupManifest.from_json(raw)
    assert m.state == "complete" and m.to_json() == raw


def test_extensions_round_trip_after_the_spec_fields():
    m = BackupManifest.from_json(json.dumps(SPEC_EXAMPLE))
    m.queues.append(QueueBackup("/", "s", "stream", stream=StreamInfo(0, 99, "a", 40, "ff", 7, False,
                                                                      [StreamGap(41, 59)])))
    m.queue_status = [QueueStatus("/", "lim", "refused", "delivery limit")]
    obj = json.loads(m.to_json())
    assert list(obj)[-1] == "queue_status" and list(obj["queues"][1])[-1] == "stream"
    assert obj["queues"][1]["stream"]["gaps"] == [{"from_offset": 41, "to_offset": 59, "count": 19}]
    back = BackupManifest.from_json(m.to_json())
    assert back.state == "partial" and back.depends_on == {"a"} and back.gaps[0][1].count == 19
    assert back.to_json() == m.to_json()


def _base(sha="aa", ts=5, last=49):
    return StreamBase("prev", StreamInfo(0, last, last_record_sha256=sha, last_chunk_timestamp=ts))


@pytest.mark.parametrize("probe, start, prev, recreated, gap", [
    (ProbedRecord(49, "aa", 5), 50, "prev", False, None),            # the same record: continues
    (ProbedRecord(49, "aa", None), 50, "prev", False, None),         # no chunk timestamp on this version
    (ProbedRecord(49, "bb", 5), "first", None, True, None),          # another record at that offset
    (ProbedRecord(49, "aa", 9), "first", None, True, None),          # same body, another chunk: recreated
    (None, "first", None, True, None),                                # the log ends before: recreated
    (ProbedRecord(51, "cc", 6), 50, "prev", False, None),            # one-offset hole: bookkeeping, no gap
    (ProbedRecord(80, "cc", 6), 80, "prev", False, (50, 79)),        # retention removed 50..79
])
def test_continuity_verdict(probe, start, prev, recreated, gap):
    d = decide("s", "/", _base(), probe)
    assert (d.start, d.previous_backup, d.recreated) == (start, prev, recreated)
    assert [(g.from_offset, g.to_offset) for g in d.gaps] == ([gap] if gap else [])
    if recreated:
        assert "'s'" in d.warning and "declared again" in d.warning
    assert decide("s", "/", None, probe).start == "first"


def _stream_manifest(bid, prev=None, prev_last=None, first=0, last=9, complete=True):
    m = BackupManifest(bid, 1, 2 if complete else None)
    m.queues.append(QueueBackup("/", "s", "stream", stream=StreamInfo(first, last, prev, prev_last)))
    return m


def test_chain_links_are_checked():
    ms = {"a": _stream_manifest("a"), "b": _stream_manifest("b", "a", 9, 10, 19),
          "c": _stream_manifest("c", "b", 19, 20, 29)}
    out, warnings = expand_chains(ms["c"], ms.__getitem__)
    assert out.queues[0].chain == ("a", "b", "c") and warnings == []
    with pytest.raises(ChainError, match="'b' continues backup 'a' after offset 9, but 'a' ends at offset 12"):
        expand_chains(ms["c"], {**ms, "a": _stream_manifest("a", last=12)}.__getitem__)
    with pytest.raises(ChainError, match="'a', which is incomplete"):
        expand_chains(ms["c"], {**ms, "a": _stream_manifest("a", complete=False)}.__getitem__)
    ms["a"].queues[0].add_segment(SegmentMetadata("a/queues/_default/s/segment-0001.zst", 1, 10, 100, 0, 1, 2, "x"))
    with pytest.raises(ChainError, match="'a' in the chain of 'c' lacks segment a/queues/_default/s/segment-0001"):
        expand_chains(ms["c"], ms.__getitem__, size_of=lambda key: None)
    assert expand_chains(ms["c"], ms.__getitem__, size_of=lambda key: 100)[0].queues[0].message_count == 10
    only, warnings = expand_chains(ms["c"], ms.__getitem__, follow=False)
    assert only.queues[0].chain == () and "restoring only backup 'c'" in warnings[0]
