"""Queue taps (``archive.taps``) without a broker: their configuration, the manifest field that names the
tapped queue, and where a restore sends a tap's records."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rbak.archive.state import ArchiveSummary
from rbak.archive.status import archive_status
from rbak.archive.taps import leftover_taps
from rbak.broker.management import QueueInfo
from rbak.config import Config
from rbak.errors import ConfigError
from rbak.format.archive import Tick, TickStream, assemble
from rbak.format.manifest import BackupManifest, QueueBackup, StreamInfo, TapOf
from rbak.repo.catalog import list_backups
from rbak.repo.report import list_notes, list_obj
from rbak.restore.options import RestoreOptions
from rbak.restore.plan import check_selection, plan_restore
from rbak.storage import open_storage
from test_archive_units import archive_dict


def test_a_taps_section_without_include_or_with_a_bad_max_age_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as e:
        Config.from_dict(archive_dict(taps={}), env={})
    assert "archive.taps.include: name at least one classic or quorum queue" in str(e.value)
    with pytest.raises(ConfigError) as e:
        Config.from_dict(archive_dict(taps={"include": ["q"], "max_age": "7 days"}), env={})
    assert "archive.taps.max_age: '7 days' is not a stream max-age" in str(e.value)
    with pytest.raises(ConfigError) as e:
        Config.from_dict(archive_dict(taps={"include": ["q"], "max_length_byte": 5}), env={})
    assert "archive.taps.max_length_byte" in str(e.value)
    cfg = Config.from_dict(archive_dict(taps={"include": ["orders"]}), env={})
    assert cfg.archive.taps is not None
    assert (cfg.archive.taps.max_age, cfg.archive.taps.max_length_bytes) == ("7D", 10 * 1024 ** 3)
    assert Config.from_dict(archive_dict(), env={}).archive.taps is None


def test_the_cli_exits_2_on_a_taps_section_without_include(tmp_path):
    cfg = tmp_path / "a.yaml"
    cfg.write_text(json.dumps(archive_dict(taps={"exclude": ["x"]})))
    r = subprocess.run([sys.executable, "-m", "rbak", "archive", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "archive.taps.include" in r.stderr, r.stderr


def tap_manifest() -> BackupManifest:
    info = StreamInfo(first_offset=0, last_offset=2, tap=TapOf("orders", "quorum"))
    tick = Tick("arc", "arc.20261206T000000.000Z", 0, 1_000, 1_000, 900,
                [TickStream("v", "rbak.tap.orders", info, 1, 900, True, []),
                 TickStream("v", "events", StreamInfo(first_offset=0, last_offset=1), 1, 900, True, [])],
                "rabbit@x", "4.3.6", "t")
    return BackupManifest.from_json(assemble([Tick.from_json(tick.to_json(), "tick")], open_=False).to_json())


def test_the_tapped_queue_rides_in_the_stream_entry_and_old_entries_keep_their_bytes():
    m = tap_manifest()
    tap_q, plain = m.find_queue("v", "rbak.tap.orders"), m.find_queue("v", "events")
    assert tap_q is not None and tap_q.stream is not None and tap_q.stream.tap == TapOf("orders", "quorum")
    assert m.to_json_obj()["queues"][1]["stream"]["tap"] == {"queue": "orders", "queue_type": "quorum"}
    assert plain is not None and plain.stream is not None and "tap" not in plain.stream.to_json_obj()
    assert "1 queue tap(s): v/orders" in list_notes(m)


def opts(**kw) -> RestoreOptions:
    return RestoreOptions(backup_id="arc.20261206T000000.000Z", **kw)


def targets(m: BackupManifest, **kw) -> dict[str, tuple[str, str]]:
    return {p.source_queue: (p.target_queue, p.queue_type) for p in plan_restore(m, opts(**kw))}


def test_a_restore_sends_a_tap_into_its_queue_unless_a_mapping_says_otherwise():
    m = tap_manifest()
    assert targets(m) == {"rbak.tap.orders": ("orders", "quorum"), "events": ("events", "stream")}
    # the mapping of the stream's own name: restored as the stream it is archived as
    assert targets(m, queue_mapping=(("v/rbak.tap.orders", "rbak.tap.orders"),))["rbak.tap.orders"] == \
        ("rbak.tap.orders", "stream")
    # the tapped queue's name mapped: the tap follows it
    check_selection(m, opts(queue_mapping=(("orders", "orders-restored"),)))
    assert targets(m, queue_mapping=(("orders", "orders-restored"),))["rbak.tap.orders"] == \
        ("orders-restored", "quorum")
    with pytest.raises(ConfigError, match="restore.queue_mapping: key 'ordres' names no queue"):
        check_selection(m, opts(queue_mapping=(("ordres", "x"),)))


def test_list_shows_the_taps_of_a_generation(tmp_path):
    st = open_storage(str(tmp_path / "store"))
    m = tap_manifest()
    st.put(f"p/{m.backup_id}/manifest.json", m.to_json())
    (obj,) = list_obj(list_backups(st, "p"))
    assert obj["taps"] == [{"vhost": "v", "stream": "rbak.tap.orders", "queue": "orders", "queue_type": "quorum"}]
    # the archive's status names the tapped queue as list does, and its --json summary a storage to paste
    status = archive_status(st, "arc", "p").to_json_obj()
    assert [(s["name"], s["tap"]) for s in status["streams"]] == [
        ("events", None), ("rbak.tap.orders", {"queue": "orders", "queue_type": "quorum"})]
    summary = ArchiveSummary("arc", st.url, "p").to_json_obj()
    assert (summary["state"], summary["storage"], summary["prefix"]) == ("starting", st.url, "p")
    assert [b.backup_id for b in list_backups(open_storage(summary["storage"]), summary["prefix"])] == [m.backup_id]


def test_queue_backup_without_stream_is_no_tap():
    assert targets(BackupManifest("b", 1, 2, queues=[QueueBackup("v", "q", "classic")])) == {"q": ("q", "classic")}


def test_a_left_over_tap_stream_is_a_tap_while_its_queue_exists_and_is_said_either_way(caplog):
    """Without any archive.taps too: a tap stream taken out of the taps restores into its queue if it exists."""
    s = [QueueInfo("v", n, "stream", 0) for n in ("rbak.tap.cq", "rbak.tap.gone", "rbak.tap.st", "events")]
    queues = s + [QueueInfo("v", "cq", "classic", 0), QueueInfo("v", "st", "stream", 0)]
    with caplog.at_level("WARNING", logger="rbak.archive.taps"):
        assert leftover_taps("arc", s, queues, None) == {("v", "rbak.tap.cq"): TapOf("cq", "classic")}
    assert caplog.messages[1:] == [
        f"archive arc: stream 'rbak.tap.{q}' in vhost 'v' is named as a tap stream but archive.taps does not tap "
        f"queue {q!r} ({why}): archived through source.queues as a plain stream; exclude 'rbak.tap.{q}' in "
        "source.queues.exclude to leave it out" for q, why in (("gone", "no such queue"), ("st", "a stream queue"))]
    assert caplog.messages[0].startswith("archive arc: stream 'rbak.tap.cq' in vhost 'v' is the tap stream of "
                                         "classic queue 'cq', which archive.taps does not tap")
