"""``rbak archive`` without a broker: its configuration, its ticks, and how readers see an open generation."""

from __future__ import annotations

import datetime as _dt
import json
import subprocess
import sys

import pytest

from rbak.archive.tick_clock import READ_MARGIN_SECS, TickClock
from rbak.repo.catalog import list_backups, load_manifest
from rbak.config import Config
from rbak.errors import ConfigError
from rbak.format.archive import Tick, TickStream, assemble, tick_key
from rbak.format.manifest import BackupManifest, SegmentMetadata, StreamGap, StreamInfo
from rbak.repo.retention import RetentionPolicy, plan_retention, stored_backups
from rbak.storage import open_storage


def archive_dict(**archive) -> dict:
    return {"mode": "archive",
            "source": {"amqp_url": "amqp://guest:guest@localhost:5672/%2f", "queues": {"vhosts": ["v"]}},
            "storage": {"backend": "filesystem", "path": "/tmp/x"}, "archive": archive}


def test_a_typo_in_the_archive_section_is_refused_with_its_key_path():
    with pytest.raises(ConfigError) as e:
        Config.from_dict(archive_dict(max_delay_sec=1), env={})
    assert "archive.max_delay_sec" in str(e.value)
    with pytest.raises(ConfigError) as e:
        Config.from_dict(archive_dict(max_delay_secs=0.01), env={})
    assert "archive.max_delay_secs" in str(e.value)
    with pytest.raises(ConfigError) as e:
        Config.from_dict(archive_dict(name="no/slash"), env={})
    assert "archive.name" in str(e.value)
    d = archive_dict()
    del d["source"]
    with pytest.raises(ConfigError) as e:
        Config.from_dict(d, env={})
    assert "source: required when mode is archive" in str(e.value)
    cfg = Config.from_dict(archive_dict(), env={})
    assert (cfg.archive.name, cfg.archive.max_delay_secs, cfg.archive.idle_tick_secs) == ("archive", 5.0, 30.0)


def test_the_cli_exits_2_on_a_configuration_error(tmp_path):
    cfg = tmp_path / "a.yaml"
    cfg.write_text(json.dumps(archive_dict(max_delay_sec=1)))
    r = subprocess.run([sys.executable, "-m", "rbak", "archive", "--config", str(cfg)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "archive.max_delay_sec" in r.stderr, r.stderr


def seg(key: str, seq: int, n: int, t0: int) -> SegmentMetadata:
    return SegmentMetadata(key, seq, n, 100 + n, 10 * n, t0, t0 + n, "ab" * 32)


def tick(gen: str, seq: int, w: int, segs: list[SegmentMetadata], last: int | None, gaps=()) -> Tick:
    info = StreamInfo(first_offset=0 if last is not None else None, last_offset=last, gaps=list(gaps))
    return Tick("arc", gen, seq, 1_000 + seq, 1_000, w, [TickStream("v", "s", info, 1, w, True, segs),
                                                         TickStream("v", "idle", StreamInfo(), 1, w, True, [])],
                "rabbit@x", "4.3.6", "t")


def test_an_open_generation_is_read_from_its_ticks(tmp_path):
    st = open_storage(str(tmp_path / "store"))
    gen = "arc.20261206T000000.000Z"
    root = f"p/{gen}"
    s1, s2 = seg(f"{root}/queues/v/s/segment-0001.zst", 1, 5, 10), seg(f"{root}/queues/v/s/segment-0002.zst", 2, 3, 20)
    gap = StreamGap(5, 9, 15, 19)
    for t in (tick(gen, 0, 5, [], None), tick(gen, 1, 15, [s1], 4), tick(gen, 2, 25, [s2], 12, [gap])):
        st.put(tick_key(root, t.sequence), t.to_json())
    (entry,) = list_backups(st, "p")
    m = entry.manifest
    assert entry.status == "complete" and m is not None and m.archive is not None
    assert (m.archive.name, m.archive.open, m.archive.ticks, m.archive.recoverable_until) == ("arc", True, 3, 25)
    q = m.find_queue("v", "s")
    assert q is not None and [x.sequence for x in q.segments] == [1, 2] and q.message_count == 8
    assert q.stream is not None and q.stream.last_offset == 12 and q.stream.gaps == [gap]
    assert m.find_queue("v", "idle") is not None and m.total_messages == 8
    loaded = load_manifest(st, gen, "p")
    assert loaded.to_json_obj() == m.to_json_obj()
    # round trip of the extension fields; a closed manifest is an ordinary one plus `archive`
    back = BackupManifest.from_json(loaded.to_json())
    assert back.archive == loaded.archive and back.find_queue("v", "s").stream.gaps[0] == gap  # type: ignore[union-attr]
    # a tick missing in the middle: the generation is unreadable, never silently short
    st.delete(tick_key(root, 1))
    (entry,) = list_backups(st, "p")
    assert entry.status == "unreadable" and "tick 1 is missing" in (entry.error or "")


def test_manifests_without_archive_fields_keep_the_spec_bytes():
    m = BackupManifest("b", 1, 2, queues=[])
    assert "archive" not in m.to_json_obj()
    assert StreamGap(1, 5).to_json_obj() == {"from_offset": 1, "to_offset": 5, "count": 5}


def test_prune_never_deletes_the_open_generation_nor_the_newest_one(tmp_path):
    """An archive of three generations: the first two closed (the first holds the data, the second is
    idle and found a gap), the third open and idle. No rule of ``rbak prune`` deletes the open one
    (rbak archive is writing it), the newest one, or what they link to; other backups are pruned as
    before."""
    st = open_storage(str(tmp_path / "store"))
    gens = [f"arc.20261206T00000{i}.000Z" for i in range(3)]
    s1 = seg(f"{gens[0]}/queues/v/s/segment-0001.zst", 1, 5, 10)

    def gen_ticks(i: int, segs, last, gaps=()) -> list[Tick]:
        out = [tick(gens[i], 0, 10 * i, [], last), tick(gens[i], 1, 10 * i + 5, segs, last, gaps)]
        for t in out:
            t.created_at = t.written_at = 1_000 * (i + 1) + t.sequence
            for ts in t.streams:
                ts.info.previous_backup = gens[i - 1] if i else None
        return out

    closed = [gen_ticks(0, [s1], 4), gen_ticks(1, [], 4, [StreamGap(5, 9, 15, 19)])]
    for g, ticks in zip(gens, closed):
        st.put(f"{g}/manifest.json", assemble(ticks, open_=False).to_json())
    for t in gen_ticks(2, [], 4):
        st.put(tick_key(gens[2], t.sequence), t.to_json())
    old = BackupManifest("old.20261205T000000.000Z", 1, 2, queues=[])  # an ordinary backup, older
    st.put(f"{old.backup_id}/manifest.json", old.to_json())
    stored = stored_backups(list_backups(st, ""))
    assert [(b.backup_id, b.archive, b.archive_open) for b in stored][1:] == [
        (gens[0], "arc", False), (gens[1], "arc", False), (gens[2], "arc", True)]
    now = _dt.datetime(2027, 1, 1, tzinfo=_dt.timezone.utc)
    for policy in (RetentionPolicy(max_age=_dt.timedelta(seconds=1)), RetentionPolicy(keep_last=1),
                   RetentionPolicy(keep_daily=0, max_age=_dt.timedelta(seconds=1))):
        plan = plan_retention(stored, policy, now)
        assert plan.delete == [old.backup_id] or plan.delete == [], (policy, plan.lines())
        assert plan.keep[-3:] == gens, (policy, plan.lines())
        why = dict(zip(plan.keep, [v.reasons for v in plan.verdicts if v.keep]))
        assert any("open generation of archive arc" in r for r in why[gens[2]]), why
        assert any(f"base of {gens[2]}" in r for r in why[gens[1]]), why
    # once the open generation is closed by the next start, the closed newest one is what is kept
    st.put(f"{gens[2]}/manifest.json", assemble(gen_ticks(2, [], 4), open_=False).to_json())
    plan = plan_retention(stored_backups(list_backups(st, "")), RetentionPolicy(max_age=_dt.timedelta(seconds=1)), now)
    assert plan.keep == gens and plan.delete == [old.backup_id], plan.lines()
    assert "the newest generation of archive arc" in " ".join(plan.verdicts[-1].reasons)


def test_the_offset_split_from_the_header_bytes_gives_the_same_records():
    """The archive's fast path (``split_offset``) takes the offset out of the content header bytes: the
    records it builds are byte for byte those of pika's full decode, and any other header falls back."""
    import pika

    from rbak.backup.convert import BROKER_HEADERS, to_record
    from rbak.broker.deliveries import Deliver, properties
    from rbak.broker.stream_reader import split_offset
    from rbak.format.record import encode_record

    def raw(**kw) -> bytes:
        return b"".join(pika.BasicProperties(**kw).encode())

    def offset_raw(offset: int, **kw) -> bytes:
        """As the broker sends it: x-stream-offset a signed 64-bit int ('l'), whatever its value."""
        big = 0x0102030405060708
        r = raw(headers={"x-stream-offset": big}, **kw)
        return r.replace(big.to_bytes(8, "big"), offset.to_bytes(8, "big"))

    cases = [offset_raw(7), offset_raw(2 ** 40 + 3, delivery_mode=2),
             offset_raw(0, content_type="application/json", content_encoding="gzip", message_id="m-1",
                        timestamp=1_700_000_000, app_id="app")]
    method = Deliver(5, False, "ex", "rk")
    for r in cases:
        split = split_offset(r)
        assert split is not None, r
        full = properties(r)
        assert split[0] == full.headers["x-stream-offset"]
        slow = to_record(method, full, b"body", "v", "s", 1, BROKER_HEADERS, stream_offset=split[0])
        fast = to_record(method, properties(split[1]), b"body", "v", "s", 1, BROKER_HEADERS, stream_offset=split[0])
        assert encode_record(fast) == encode_record(slow)
    for other in (raw(headers={"x-stream-offset": 2 ** 40, "user": "x"}), raw(headers={"x-stream-offset": 7}), raw(headers={"user": 1}), raw(delivery_mode=2),
                  raw(headers={"x-stream-offsex": 7}), b"", b"\x20"):
        assert split_offset(other) is None


def test_archive_status_reads_recoverable_until_lag_and_gaps_from_the_storage(tmp_path):
    """What the operator's RabbitMQArchive status reads: the newest generation (open here), its
    recoverable-until and the lag from it, every gap of every generation, the records archived."""
    from rbak.archive.status import archive_status

    st = open_storage(str(tmp_path / "store"))
    g0, g1 = "arc.20261206T000000.000Z", "arc.20261206T000100.000Z"
    s1 = seg(f"{g0}/queues/v/s/segment-0001.zst", 1, 5, 10)
    closed = [tick(g0, 0, 5, [], None), tick(g0, 1, 15, [s1], 4)]
    st.put(f"{g0}/manifest.json", assemble(closed, open_=False).to_json())
    gap = StreamGap(5, 9, 15, 19)
    for t in (tick(g1, 0, 15, [], 4), tick(g1, 1, 60_000, [], 4, [gap])):
        t.created_at = 2_000
        st.put(tick_key(g1, t.sequence), t.to_json())
    other = BackupManifest("other.20261206T000000.000Z", 1, 2, queues=[])
    st.put(f"{other.backup_id}/manifest.json", other.to_json())
    s = archive_status(st, "arc")
    assert (s.generations, s.newest, s.open, s.ticks, s.records) == (2, g1, True, 2, 5)
    assert s.recoverable_until == 60_000 and s.recoverable_until_utc == "1970-01-01T00:01:00.000+00:00"
    assert s.lag_seconds(now=90.5) == 30.5
    assert [(g.vhost, g.stream, g.generation, g.from_offset, g.to_offset, g.count) for g in s.gaps] == [
        ("v", "s", g1, 5, 9, 5)]
    assert s.to_json_obj(now=90.5)["gaps"][0]["before_timestamp"] == 19
    assert archive_status(st, "nothing").to_json_obj()["newest"] is None


def test_the_committed_end_rides_in_ticks_and_manifests_and_archive_status_reads_it(tmp_path):
    """Each tick records every stream's committed end as probed (an rbak extension: old readers ignore it);
    the manifest assembled from the ticks keeps the newest, and ``archive_status`` shows it beside the
    archived offset. A tick without it (an older archiver) reads as before."""
    from rbak.archive.status import archive_status
    from rbak.format.manifest_archive import CommittedEnd

    st = open_storage(str(tmp_path / "store"))
    g = "arc.20261206T000000.000Z"
    t0, t1 = tick(g, 0, 5, [], None), tick(g, 1, 15, [seg(f"{g}/queues/v/s/segment-0001.zst", 1, 5, 10)], 4)
    t1.streams[0].committed = CommittedEnd(9, 14)  # the broker had 0-9 at 14 ms; the archive holds 0-4
    t1.streams[1].committed = CommittedEnd(-1, 14)  # empty
    raw = json.loads(t1.to_json())
    assert raw["streams"][0]["committed"] == {"offset": 9, "at": 14}
    assert "committed" not in json.loads(t0.to_json())["streams"][0]  # an older tick's bytes, unchanged
    for t in (t0, t1):
        st.put(tick_key(g, t.sequence), t.to_json())
    back = Tick.from_json(t1.to_json(), "t1")
    assert [s.committed for s in back.streams] == [CommittedEnd(9, 14), CommittedEnd(-1, 14)]
    m = load_manifest(st, g)
    assert m.archive is not None and m.archive.committed == {"v/s": CommittedEnd(9, 14), "v/idle": CommittedEnd(-1, 14)}
    assert BackupManifest.from_json(m.to_json(), "m").archive.committed == m.archive.committed  # type: ignore[union-attr]
    s = archive_status(st, "arc")
    assert [(p.vhost, p.stream, p.archived_offset, p.committed_offset, p.committed_at, p.behind) for p in s.streams] == [
        ("v", "idle", None, -1, 14, 0), ("v", "s", 4, 9, 14, 5)]
    assert s.to_json_obj()["streams"][1] == {"vhost": "v", "name": "s", "archived_offset": 4, "committed_offset": 9,
                                             "committed_at": 14, "behind": 5, "tap": None}


def test_a_stop_stuck_past_its_report_time_logs_every_threads_stack(capfd, caplog):
    """What the pod's log shows when a SIGTERM's stop has run ``STOP_REPORT_SECS``: every thread's stack."""
    from rbak.commands.archive import STOP_REPORT_SECS, stuck

    with caplog.at_level("ERROR", logger="rbak.archive"):
        stuck("SIGTERM")
    assert caplog.messages == [f"archive: still stopping {STOP_REPORT_SECS:.0f} s after SIGTERM; what each thread "
                               "is doing:"]
    err = capfd.readouterr().err
    assert "Current thread 0x" in err and "in test_a_stop_stuck_past_its_report_time_logs_every_threads_stack" in err


def test_the_tick_clock_waits_for_the_measured_stores_and_starts_ticks_that_much_earlier():
    c = TickClock(10.0)
    assert c.wait_secs() == 1.0 and c.headroom() == 1.0 + 0.1 + READ_MARGIN_SECS  # nothing measured yet
    c.settled(0.05)
    assert c.wait_secs() == 0.2  # MIN_WAIT_SECS
    c.settled(2.0)
    c.put(0.4)
    assert c.wait_secs() == 1.25 * 2.0 + 0.1 and c.headroom() == 2.6 + 0.4 + READ_MARGIN_SECS
    assert c.next_tick(None, 100.0) == 100.0 + 10.0 - c.headroom()
    assert c.next_tick(100.0, 101.0) == 100.0 + 10.0 - c.headroom()  # from when the last one was due ...
    assert c.next_tick(90.0, 101.0) == 101.0 + 10.0 / 4  # ... but never sooner than a quarter of max_delay_secs
    c.settled(30.0)
    assert c.wait_secs() == 5.0 and c.headroom() == 5.0  # at most half of max_delay_secs
