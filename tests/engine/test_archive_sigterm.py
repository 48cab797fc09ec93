"""Trial finding F12 (issue 48): after a clean SIGTERM of ``rbak archive``, the archive's recoverable-until once
fell short of the last records read. A clean stop names everything read, so what ``rbak describe`` says must
cover every record archived, and a restore to it must give them all back."""

from __future__ import annotations

import json
import time

from support.backups import fast_publish
from support.archives import MAX_DELAY, Archiver, archive_config, bodies, declare_stream, fs_storage, generations, rbak, \
    restore_into

N = 200
STREAMS = ("a", "b")


def test_a_clean_stop_is_recoverable_up_to_its_last_records(broker, vhost_factory, tmp_path):
    """Ticks with nothing new are 30 s apart (the default), so only the stop's own tick can move the watermark
    past the last busy tick: it must, to at least the SIGTERM (every record was read and stored by then)."""
    vhost, fresh = vhost_factory(broker), vhost_factory(broker)
    for s in STREAMS:
        declare_stream(broker, vhost, s)
    store = fs_storage(tmp_path)
    cfg = archive_config(tmp_path, broker, vhost, store, idle_tick_secs=30, relist_secs=30)
    arc = Archiver(cfg, tmp_path / "archiver.log").running()
    sent = {s: [b"%s-%d" % (s.encode(), i) for i in range(N)] for s in STREAMS}
    for s in STREAMS:
        fast_publish(broker, vhost, s, sent[s])  # confirmed
    published_at = int(time.time() * 1000)  # after the last confirm
    time.sleep(2 * MAX_DELAY)  # read and ticked; the next idle tick is 30 s away
    stopped_at = int(time.time() * 1000)
    summary = arc.stop()
    assert summary["errors"] == [], summary["errors"]
    path = str(tmp_path / "store")
    (gen,) = generations(path)
    described = json.loads(rbak("describe", "--path", path, "--backup-id", gen["backup_id"], "--format",
                                "json").stdout)
    w = described["archive"]["recoverable_until"]
    last_read = {q["name"]: q["last_message_timestamp"] for q in described["queues"]}
    assert sorted(last_read) == list(STREAMS) and all(q["message_count"] == N for q in described["queues"])
    stored_ticks = list((tmp_path / "store" / gen["backup_id"] / "archive").glob("tick-*.json"))
    assert described["archive"]["ticks"] == len(stored_ticks) >= 2  # the ticks stored, not one more for the close
    print(f"\n{broker.name}: recoverable-until {w - max(last_read.values()):+d} ms from the last record read, "
          f"{w - published_at:+d} ms from the last confirm, {w - stopped_at:+d} ms from the SIGTERM")
    assert w >= max(last_read.values()), (w, last_read)
    assert w >= published_at, (w, published_at)

    for s in STREAMS:
        declare_stream(broker, fresh, s)
    out = restore_into(tmp_path, broker, store, gen["backup_id"], vhost, fresh, "--pitr-end", str(w))
    assert out["ok"], out
    for s in STREAMS:
        assert bodies(broker, fresh, s) == sent[s]
    assert w >= stopped_at, (w, stopped_at)  # idle and fully stored at the stop: complete up to it
