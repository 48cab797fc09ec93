"""What offline-import.md and restore.md say of restoring an import: it holds no definitions, so a
restore refuses each target queue that does not exist, naming it, and publishes nothing to it; once
the queue is declared, the same restore delivers every message (a Mosquitto import, on each broker)."""

from __future__ import annotations

from rbak.offline.mosquitto import ClientChunk, ClientMsgChunk, MsgStoreChunk, import_mosquitto_db, write_db
from rbak.restore import run_restore
from rbak.storage import open_storage
from support.restores import options_for

N = 12


def test_an_import_restores_once_its_queues_are_declared(broker, vhost, tmp_path):
    chunks = [MsgStoreChunk(i + 1, f"t/{i}", b"payload-%d" % i, 1, False) for i in range(N)]
    chunks.append(ClientChunk("c1", session_expiry_interval=0xFFFFFFFF))
    chunks += [ClientMsgChunk(i + 1, "c1", i + 1, 1, 11, 1) for i in range(N)]
    write_db(tmp_path / "mosquitto.db", chunks)
    url = f"file://{tmp_path}/b"
    summary = import_mosquitto_db(tmp_path / "mosquitto.db", url, "m1")
    (queue,) = summary.stats.queues
    options = options_for(broker, "m1", vhost_mapping=(("/", vhost),))

    refused = run_restore(open_storage(url), options)
    assert not refused.ok
    (failed,) = refused.failed_queues
    assert queue in failed.error and "does not exist" in failed.error and "create it" in failed.error, failed.error
    assert failed.published == 0 and queue not in {q["name"] for q in broker.list_queues(vhost)}

    broker.declare_queue(vhost, queue)
    done = run_restore(open_storage(url), options)
    assert done.ok, done.to_json_obj()
    assert broker.message_count(vhost, queue) == N
