from __future__ import annotations

import json

import pytest

from rbak.errors import ManifestError
from rbak.format.manifest import BackupManifest, DefinitionsBackup, QueueBackup, SegmentMetadata

SEG = {"key": "b/queues/_default/orders/segment-0001.zst", "sequence": 1, "record_count": 1000,
       "size_bytes": 348160, "uncompressed_bytes": 1048576, "first_timestamp": 1712700000000,
       "last_timestamp": 1712720000000, "checksum": "a" * 64}


def manifest_obj():
    return {
        "backup_id": "b", "created_at": 1712756400000, "completed_at": 1712756535000,
        "source_cluster": "rabbit@node1", "rabbitmq_version": "3.13.2", "backup_tool_version": "0.1.0",
        "definitions": {"key": "b/definitions/definitions.json.zst", "vhost_count": 2, "queue_count": 5,
                        "exchange_count": 8, "user_count": 3, "size_bytes": 4300},
        "queues": [{"vhost": "/", "name": "orders", "queue_type": "classic", "segments": [SEG],
                    "message_count": 1000, "first_message_timestamp": 1712700000000,
                    "last_message_timestamp": 1712720000000}],
        "total_messages": 1000, "total_bytes": 348160, "total_segments": 1,
    }


def test_spec_manifest_round_trips_with_field_order():
    obj = manifest_obj()
    m = BackupManifest.from_json(json.dumps(obj))
    assert m.is_complete and m.queues[0].segments[0] == SegmentMetadata(**SEG)
    out = m.to_json()
    assert json.loads(out) == obj
    assert list(json.loads(out)) == list(obj)  # same key order as the spec
    assert out.startswith(b'{\n  "backup_id": "b",')


def test_totals_derive_from_queues():
    q = QueueBackup("/", "orders")
    q.add_segment(SegmentMetadata(**SEG))
    q.add_segment(SegmentMetadata(**{**SEG, "sequence": 2, "record_count": 5, "size_bytes": 10,
                                     "first_timestamp": 1712720000001, "last_timestamp": 1712720000009}))
    m = BackupManifest("b", 1, queues=[q], definitions=DefinitionsBackup("k"))
    m.recompute_totals()
    assert (m.total_messages, m.total_segments, m.total_bytes) == (1005, 2, 348170)
    assert (q.first_message_timestamp, q.last_message_timestamp) == (1712700000000, 1712720000009)


def test_incomplete_and_lenient():
    obj = manifest_obj()
    obj["completed_at"] = None
    obj["something_new"] = [1]
    del obj["definitions"]
    m = BackupManifest.from_json(json.dumps(obj))
    assert not m.is_complete and m.definitions is None


@pytest.mark.parametrize("mutate,match", [
    (lambda o: o.pop("backup_id"), "missing required field 'backup_id'"),
    (lambda o: o.__setitem__("created_at", "yesterday"), "'created_at' must be int"),
    (lambda o: o["queues"][0]["segments"][0].pop("key"), "queue 0 '/'/'orders' segment 0: missing required field 'key'"),
    (lambda o: o.__setitem__("queues", {}), "'queues' must be a list"),
])
def test_bad_manifests_name_the_field(mutate, match):
    obj = manifest_obj()
    mutate(obj)
    with pytest.raises(ManifestError, match=match):
        BackupManifest.from_json(json.dumps(obj))
    with pytest.raises(ManifestError, match="not valid JSON"):
        BackupManifest.from_json(b"{nope")
