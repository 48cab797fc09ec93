"""rbak.progress: the record format, the tracker, the sinks and the storage reporter (no broker)."""

from __future__ import annotations

import json
import logging
import threading
from types import SimpleNamespace

import pytest

from rbak.repo.catalog import list_backups
from rbak.errors import ConfigError, ProgressError
from rbak.format.layout import progress_key, progress_prefix
from rbak.repo.progress import (FAILED, FINISHED, RUNNING, PlainLines, ProgressRecord, ProgressSession, RichBar, StorageReporter, Tracker, backup_events, cli_session, counted, latest_progress, restore_events, validate_events)
from rbak.storage.memory import MemoryStorage


class WriteOnceMemory(MemoryStorage):
    """Refuses to put a key twice, as rbak's Object Lock mode promises never to."""

    write_once = True

    def put(self, key, data):
        assert not self.exists(key), f"rewrote {key}"
        super().put(key, data)


def record(**kw) -> ProgressRecord:
    base = dict(kind="backup", run_id="b-1", state=RUNNING, started_at=1000.0, updated_at=1010.0)
    return ProgressRecord(**{**base, **kw})


def test_record_round_trip_and_line():
    r = record(queues_total=4, queues_done=1, records=1500, records_total=3000, bytes=3 * 1024 * 1024,
               rate=150.0, current_queue="/orders", seq=7)
    back = ProgressRecord.from_json(r.to_json(), "k")
    assert back == r
    line = back.line()
    assert "1/4 queues" in line and "1500/3000 records" in line and "3.0 MiB" in line and "150 rec/s" in line
    assert "at /orders" in line and "10s" in line


@pytest.mark.parametrize("data, words", [
    (b"{", ["k.json", "not JSON"]),
    (b"[]", ["k.json", "JSON object"]),
    (json.dumps({"kind": "backup", "run_id": "x", "state": "running", "started_at": 1}).encode(), ["updated_at", "missing"]),
    (record(state="sleeping").to_json(), ["state", "sleeping"]),
    (json.dumps({**json.loads(record().to_json()), "records": -1}).encode(), ["records", "-1"]),
    (json.dumps({**json.loads(record().to_json()), "queues_total": "3"}).encode(), ["queues_total", "'3'"]),
    (json.dumps({**json.loads(record().to_json()), "rate": "fast"}).encode(), ["rate", "fast"]),
])
def test_bad_records_are_one_line_errors_naming_key_and_field(data, words):
    with pytest.raises(ProgressError) as e:
        ProgressRecord.from_json(data, "k.json")
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_unknown_fields_are_ignored():
    obj = {**json.loads(record().to_json()), "future": 1}
    assert ProgressRecord.from_json(json.dumps(obj), "k").run_id == "b-1"


def test_keys_live_outside_every_backup_and_refuse_bad_ids():
    assert progress_prefix("p/q", "backup", "b-1") == "p/q/_progress/backup/b-1/"
    assert progress_prefix("", "restore", "r-1") == "_progress/restore/r-1/"
    assert progress_key("", "backup", "b", 12, 3) == "_progress/backup/b/0000000000012-000003.json"
    with pytest.raises(ConfigError, match="progress run id"):
        progress_prefix("", "backup", "../x")
    with pytest.raises(ConfigError, match="progress kind"):
        progress_prefix("", "drill", "x")


def test_tracker_counts_from_many_threads_and_rate_is_recent():
    now = [100.0]
    t = Tracker("backup", "b", clock=lambda: now[0])
    t.plan(queues=8, records=8000)

    def work(i):
        t.start_queue(f"v/q{i}")
        for _ in range(100):
            t.advance(f"v/q{i}", 10, 3)
        t.finish_queue(f"v/q{i}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    now[0] = 110.0
    s = t.snapshot()
    assert (s.queues_done, s.queues_total, s.records, s.records_total, s.bytes) == (8, 8, 8000, 8000, 2400)
    assert s.current_queue is None and s.rate == 800.0 and s.state == RUNNING
    now[0] = 150.0  # nothing for 40 s: the rate falls to 0 instead of staying at the run's average
    t.snapshot()
    now[0] = 190.0
    assert t.snapshot().rate == 0.0


def test_current_queue_is_the_newest_started_still_running():
    t = Tracker("backup", "b")
    t.start_queue("/a")
    t.start_queue("/b")
    assert t.snapshot().current_queue == "/b"
    t.finish_queue("/b")
    assert t.snapshot().current_queue == "/a"


def test_reporter_keeps_at_most_one_record_and_none_after_the_run():
    st = MemoryStorage()
    rep = StorageReporter(st, "pre", interval=1)
    t = Tracker("backup", "b-1")
    for i in range(3):
        t.advance("/q", 5)
        rep.update(t.snapshot())
        keys = list(st.list("pre/_progress/"))
        assert len(keys) == 1
        assert latest_progress(st, "pre", "backup", "b-1").records == 5 * (i + 1)
    rep.close(t.snapshot(FINISHED))
    assert list(st.list("pre/")) == []
    assert latest_progress(st, "pre", "backup", "b-1") is None


def test_reporter_on_write_once_storage_never_rewrites_and_keeps_every_record():
    st = WriteOnceMemory()
    t = Tracker("restore", "r-1")
    rep = StorageReporter(st, "", interval=1)
    for _ in range(5):
        t.advance("/q", 1)
        rep.update(t.snapshot())  # same millisecond: the sequence keeps keys apart
    rep.close(t.snapshot(FAILED))
    keys = list(st.list("_progress/restore/r-1/"))
    assert len(keys) == 6 and keys == sorted(keys)
    last = latest_progress(st, "", "restore", "r-1")
    assert last.state == FAILED and last.records == 5 and last.seq == 6


def test_progress_records_are_not_backups(tmp_path):
    st = MemoryStorage()
    StorageReporter(st, "", 1).update(Tracker("backup", "b-1").snapshot())
    assert list_backups(st, "") == []


def test_latest_skips_a_damaged_newest_record_with_its_key_in_the_error():
    st = MemoryStorage()
    st.put(progress_key("", "backup", "b", 1, 1), record(run_id="b", records=3).to_json())
    st.put(progress_key("", "backup", "b", 2, 2), b"{broken")
    with pytest.raises(ProgressError, match="0000000000002-000002.json"):
        latest_progress(st, "", "backup", "b")


def test_session_feeds_sinks_and_final_state_follows_the_outcome():
    class Collect:
        interval = 0.01

        def __init__(self):
            self.updates, self.final = [], None

        def update(self, rec):
            self.updates.append(rec)

        def close(self, rec):
            self.final = rec

    ok, bad = Collect(), Collect()
    with ProgressSession(Tracker("validate", "b"), [ok]) as ps:
        ps.tracker.advance("/q", 2)
        while not ok.updates:
            threading.Event().wait(0.01)
    assert ok.final.state == FINISHED and ok.final.records == 2
    with pytest.raises(RuntimeError):
        with ProgressSession(Tracker("validate", "b"), [bad]):
            raise RuntimeError("boom")
    assert bad.final.state == FAILED


def test_plain_lines_log_the_snapshot_and_a_failed_run_ends_silently(caplog):
    caplog.set_level(logging.INFO, "rbak.progress")
    PlainLines(1).update(record(queues_total=2, queues_done=1, records=10))
    assert "1/2 queues, 10 records" in caplog.text
    caplog.clear()
    PlainLines(1).close(record(state=FAILED))  # the error line says it: a bad input stays one line
    assert caplog.text == ""
    PlainLines(1).close(record(state=FINISHED, records=12))
    assert "12 records" in caplog.text and "[finished" in caplog.text


def test_cli_session_picks_the_display_and_the_reporter(monkeypatch):
    monkeypatch.delenv("RBAK_PROGRESS_ID", raising=False)
    monkeypatch.delenv("RBAK_PROGRESS_INTERVAL", raising=False)
    args = SimpleNamespace(no_progress=False, json=False, store_progress=None, progress_interval=None)
    st = MemoryStorage()
    s = cli_session("backup", "b-1", args, storage=st, terminal=False)
    assert [type(x) for x in s.sinks] == [PlainLines] and s.sinks[0].interval == 5.0
    s = cli_session("backup", "b-1", args, storage=st, terminal=True)
    assert [type(x) for x in s.sinks] == [RichBar]
    s.sinks[0].close(s.tracker.snapshot())
    args.no_progress = True
    assert [type(x) for x in cli_session("backup", "b-1", args, storage=st, terminal=True).sinks] == [PlainLines]
    monkeypatch.setenv("RBAK_PROGRESS_ID", "job-7")
    monkeypatch.setenv("RBAK_PROGRESS_INTERVAL", "0.5")
    s = cli_session("restore", "b-1", args, storage=st, terminal=False)
    assert s.tracker.run_id == "job-7" and isinstance(s.sinks[-1], StorageReporter) and s.sinks[-1].interval == 0.5
    args.store_progress = ""  # --store-progress without a value: the command's own id
    assert cli_session("backup", "b-1", args, storage=st, terminal=False).tracker.run_id == "b-1"
    monkeypatch.setenv("RBAK_PROGRESS_INTERVAL", "soon")
    with pytest.raises(ProgressError, match="RBAK_PROGRESS_INTERVAL"):
        cli_session("backup", "b-1", args, storage=st, terminal=False)


def test_adapters_map_each_engine_to_the_same_counts():
    t = Tracker("backup", "b")
    on = backup_events(t)
    on("plan", queues=2, records=None)
    on("start", vhost="/", queue="a", total=10)
    on("advance", vhost="/", queue="a", n=10, bytes=100)
    on("done", vhost="/", queue="a", summary=SimpleNamespace(queue_type="classic", messages=10, bytes=999))
    on("start", vhost="/", queue="s", total=None)
    on("advance", vhost="/", queue="s", n=5)  # a stream counts its records as read, its stored bytes at the end
    assert t.snapshot().records == 15
    on("done", vhost="/", queue="s", summary=SimpleNamespace(queue_type="stream", messages=5, bytes=50))
    s = t.snapshot()
    assert (s.queues_done, s.queues_total, s.records, s.bytes) == (2, 2, 15, 150)  # each record once
    on("done", vhost="/", queue="kept", summary=SimpleNamespace(queue_type="classic", messages=7, bytes=70))  # resumed
    on("advance", vhost="/", queue="f", n=3, bytes=30)
    on("done", vhost="/", queue="f", summary=SimpleNamespace(queue_type="quorum", messages=0, bytes=0))  # failed
    s = t.snapshot()
    assert (s.queues_done, s.records, s.bytes) == (4, 22, 250)  # the summary's 10 + 5 + 7 records

    t = Tracker("restore", "r")
    on_plan, on_progress = restore_events(t)
    on_plan([SimpleNamespace(candidate_records=4), SimpleNamespace(candidate_records=6)])
    r = SimpleNamespace(source_vhost="/", source_queue="a", confirmed=2, bytes=20, status="pending")
    on_progress(r)
    r.confirmed, r.bytes = 4, 40
    on_progress(r)
    r.status = "restored"
    on_progress(r)
    on_progress(r)  # reported twice: counted once
    s = t.snapshot()
    assert (s.queues_done, s.queues_total, s.records, s.records_total, s.bytes) == (1, 2, 4, 10, 40)

    seg = lambda k, n: SimpleNamespace(key=k, record_count=n)  # noqa: E731
    m = SimpleNamespace(queues=[SimpleNamespace(vhost="/", name="a", segments=[seg("k1", 3), seg("k2", 4)]),
                                SimpleNamespace(vhost="/", name="e", segments=[])])
    t = Tracker("validate", "b")
    on = validate_events(t, m)
    on(SimpleNamespace(key="k1", record_count=3, size_bytes=30))
    assert t.snapshot().queues_done == 1  # the empty queue
    on(SimpleNamespace(key="k2", record_count=4, size_bytes=40))
    s = t.snapshot()
    assert (s.queues_done, s.queues_total, s.records, s.records_total, s.bytes) == (2, 2, 7, 7, 70)

    t = Tracker("import", "i")
    qs = counted(t, [("/", "a", "classic", iter([b"x", b"yy"])), ("/", "b", "classic", iter([])),
                     ("/", "c", "classic", iter([b"zzz"] * 600))], len)
    for _, _, _, recs in qs:
        list(recs)
    s = t.snapshot()
    assert (s.queues_done, s.records, s.bytes) == (3, 602, 1803)


def test_counted_records_keep_their_sources_length_hint():
    """The offline writer reads ``operator.length_hint`` of a queue's records (a quorum queue's count,
    known once its replay ran): the counting wrapper passes it on as the records go by."""
    import operator

    t = Tracker("import", "i")
    [(_, _, _, recs)] = counted(t, [("/", "a", "classic", iter([b"x"] * 5))], len)
    assert operator.length_hint(recs, -1) == 5
    next(recs), next(recs)
    assert operator.length_hint(recs, -1) == 3 and list(recs) == [b"x"] * 3
    assert operator.length_hint(recs, -1) == 0 and t.snapshot().records == 5
    [(_, _, _, gen)] = counted(t, [("/", "b", "classic", (r for r in [b"y"]))], len)
    assert operator.length_hint(gen, -1) == -1  # a generator tells nothing: none made up


def test_deleting_a_backup_takes_its_progress_records_but_no_other_runs():
    import datetime as dt

    from rbak.repo.immutable import delete_backup

    class Locked(MemoryStorage):
        def locked_until(self, key):
            return dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc) if key.endswith("-000002.json") else None

    st = Locked()
    st.put("p/b-1/manifest.json", b"{}")
    for seq in (1, 2):  # left by a killed run (or kept by write-once storage)
        st.put(progress_key("p", "backup", "b-1", seq, seq), record(run_id="b-1").to_json())
    st.put(progress_key("p", "backup", "b-10", 1, 1), record(run_id="b-10").to_json())
    st.put(progress_key("p", "restore", "b-1", 1, 1), record(kind="restore", run_id="b-1").to_json())
    assert delete_backup(st, "b-1", "p") is None
    assert list(st.list("p/")) == [
        progress_key("p", "backup", "b-1", 2, 2),  # still object-locked: left to the lifecycle rule
        progress_key("p", "backup", "b-10", 1, 1),
        progress_key("p", "restore", "b-1", 1, 1),
    ]
