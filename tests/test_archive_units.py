"""``rbak archive`` without a broker: its configuration, its ticks, and how readers see an open generation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rbak.repo.catalog import list_backups, load_manifest
from rbak.config import Config
from rbak.errors import ConfigError
from rbak.format.archive import Tick, TickStream, tick_key
from rbak.format.manifest import BackupManifest, SegmentMetadata, StreamGap, StreamInfo
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
