"""Quorum queues Ra compacted into a snapshot import exactly what a live consumer read (4.0.5, 4.3.6).

The scenarios (rabbitmq_snap_scenarios.py) make real nodes take a Ra snapshot
and drop the log before it, then ack, return and hold messages on top of it;
the node is stopped cleanly or killed. Each test first checks that the data
directory really holds a snapshot and that the log alone could not rebuild
the queue (entries before the snapshot are gone), so none can pass by
replaying a complete log.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import support.node_snap_scenarios  # noqa: F401 - registers the qsnap-* scenarios
from support.node_qs_scenarios import DELIVERY_HEADERS
from support.node_qs_scenarios import assert_same_records as _same
from support.node_qs_scenarios import versioned_scenario as scenario
from support.node_dirs import read_backup, shared_root, snapshot  # noqa: F401

from rbak.cli import main as rbak_main
from rbak.errors import ImportFormatError, SnapshotStateError
from rbak.offline.rabbitmq.damage import ImportContext
from rbak.offline.rabbitmq import ra_log
from rbak.offline.rabbitmq.rabbitmq_dir import import_rabbitmq_dir

KEY = ("/", "qq-snap")


def server_dir(data_dir: Path) -> Path:
    """The qq-snap Ra server directory (its config names the queue)."""
    for sysdir in (data_dir / "quorum").iterdir():
        for d in sysdir.iterdir():
            if (d / "config").is_file() and b"qq-snap" in (d / "config").read_bytes():
                return d
    raise AssertionError(f"no Ra server for qq-snap under {data_dir}")


def assert_compacted(data_dir: Path) -> ra_log.Snapshot:
    sdir = server_dir(data_dir)
    snap = ra_log.latest_snapshot(str(sdir), ImportContext())
    assert snap is not None and snap.index > 1000, f"no Ra snapshot in {sdir}"
    logs = ra_log.read_server_logs(str(sdir.parent), ImportContext())
    before = [i for i in logs[sdir.name].entries if i <= snap.index]
    assert len(before) < snap.index // 2, "the log before the snapshot is still there: not compacted"
    return snap


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qsnap-3.10", "qsnap-4.0", "qsnap-kill-4.0", "qsnap-4.3",
                                  "qsnap-kill-4.3"])
def test_snapshotted_quorum_queue_imports_what_a_consumer_read(name, shared_root, tmp_path, capsys):
    sc = scenario(name, shared_root)
    snap = assert_compacted(sc.data_dir)
    assert snap.machine_version == {"3.10": 2, "4.0": 5, "4.3": 8}[sc.version]
    before = snapshot(sc.data_dir)
    url = f"file://{tmp_path}/b"
    rc = rbak_main(["import", "rabbitmq-dir", str(sc.data_dir), "--to", url, "--backup-id", "s1",
                    "--types", "quorum"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert snapshot(sc.data_dir) == before, "the importer changed the node's files"
    _m, got = read_backup(url, "s1")
    refs = sc.quorum[KEY]
    assert len(refs) == 55 + 20 + (30 if sc.version.startswith("4.3") else 0)
    _same(got[KEY], refs, KEY)


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.parametrize("name", ["qsnap-4.0", "qsnap-kill-4.3"])
def test_snapshotted_quorum_queue_restores_into_a_live_broker(name, shared_root, tmp_path, broker, vhost):
    from support.restores import consume_all, declare, expected_after_restore, headers_equal, options_for

    from rbak.restore import run_restore
    from rbak.storage import open_storage

    sc = scenario(name, shared_root)
    assert_compacted(sc.data_dir)
    url = f"file://{tmp_path}/b"
    assert rbak_main(["import", "rabbitmq-dir", str(sc.data_dir), "--to", url, "--backup-id", "e2e",
                      "--types", "quorum", "--vhost", "/", "--queue", KEY[1]]) == 0
    declare(broker, vhost, KEY[1], "classic")  # FIFO target: the backup's order is what comes out
    summary = run_restore(open_storage(url), options_for(broker, "e2e", vhost_mapping=(("/", vhost),)))
    assert summary.ok, summary.to_json_obj()
    refs = sc.quorum[KEY]
    got = consume_all(broker, vhost, KEY[1], len(refs))
    assert [d.body for d in got] == [r.body for r in refs]
    for d, r in zip(got, refs):
        assert d.properties == r.properties
        want = tuple((k, v) for k, v in r.headers if k not in DELIVERY_HEADERS)
        assert headers_equal(d.headers, expected_after_restore(want)), (d.headers, r.headers)


@pytest.mark.slow
def test_damaged_snapshot_names_file_and_offset(shared_root, tmp_path):
    sc = scenario("qsnap-4.3", shared_root)
    copy = tmp_path / "node"
    shutil.copytree(sc.data_dir, copy)
    snap = assert_compacted(copy)
    data = Path(snap.path).read_bytes()
    cases = {
        "flip": data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x40]) + data[len(data) // 2 + 1:],
        "cut": data[: len(data) - 7],
        "header": data[:10],
        "version": data[:4] + b"\x07" + data[5:],
    }
    for i, (what, bad) in enumerate(cases.items()):
        Path(snap.path).write_bytes(bad)
        with pytest.raises(ImportFormatError) as e:
            import_rabbitmq_dir(str(copy), f"file://{tmp_path}/b", f"d{i}", types={"quorum"})
        assert snap.path in str(e.value) and "byte" in str(e.value), (what, str(e.value))
        res = import_rabbitmq_dir(str(copy), f"file://{tmp_path}/b", f"s{i}", types={"quorum"},
                                  skip_damaged=True)
        assert [s.path for s in res.ctx.skipped] == [snap.path], (what, res.ctx.skipped)
        assert any("qq-snap" in n and "snapshot is damaged" in n for n in res.ctx.notes), res.ctx.notes
        _m, got = read_backup(f"file://{tmp_path}/b", f"s{i}")
        assert KEY not in got or not got[KEY]


def _v8_state(buckets: dict, returns: list, consumers: dict) -> tuple:
    from rbak.offline.rabbitmq.erlang_terms import Atom as A

    state = [A("rabbit_fifo"), (A("cfg"),) + (A("undefined"),) * 9 + (3, A("undefined"), A("undefined")),
             (A("pq"), buckets, 0, 0), 0, (len(returns), [], returns)] + [0] * 4
    state += [consumers, (A("queue"), [], [], 0), None, 0, 0, [], 0, A("undefined"),
              (A("delayed"), (0, A("nil")), A("undefined"), {})]
    return tuple(state)


def test_snapshot_state_v8_order_packed_refs_and_held_messages():
    """4.3's state: buckets 31 - priority, packed refs, returns first, then what a cancelled consumer held."""
    from rbak.offline.rabbitmq.erlang_terms import Atom as A
    from rbak.offline.rabbitmq.erlang_terms import ImproperList
    from rbak.offline.rabbitmq.fifo_snapshot import load_state

    def packed(idx: int, size: int) -> int:
        return idx ^ (size << 44)

    buckets = {31 - 4: (2, [packed(12, 50)], [packed(10, 7)]), 31 - 9: (1, [], [packed(11, 300)])}
    cfg = (A("consumer_cfg"), {}, "pid", b"ctag", (A("simple_prefetch"), 5), A("auto"), 0, 1000)
    held = {3: (99, ImproperList([5], {A("size"): 1, A("delivery_count"): 2})), 1: (99, packed(4, 1))}
    con = (A("consumer"), cfg, A("cancelled"), 4, held, 0, 0, A("false"), [])
    replay, notes = load_state(_v8_state(buckets, [packed(7, 1)], {40: con}), 8, None, lambda i, m: 4)
    assert replay.delivery_limit == 3 and not notes
    assert replay.consumers[40].checked_out[3].failed == 2 and replay.consumers[40].credit == 0
    assert [m.idx for m in replay.remaining()] == [7, 4, 5, 11, 10, 12]


def test_snapshot_state_refuses_what_it_does_not_know():
    from rbak.offline.rabbitmq.erlang_terms import Atom as A
    from rbak.offline.rabbitmq.fifo_snapshot import load_state

    with pytest.raises(SnapshotStateError):
        load_state((A("rabbit_fifo"), 1, 2), 8, None, lambda i, m: 4)
    bad = _v8_state({27: (1, [], [(A("not"), A("a"), A("ref"))])}, [], {})
    with pytest.raises(SnapshotStateError, match="messages"):
        load_state(bad, 8, None, lambda i, m: 4)


@pytest.mark.slow
def test_half_written_newer_snapshot_falls_back_as_ra_does(shared_root, tmp_path):
    """A node killed while writing a snapshot leaves a newer directory that does not validate: Ra
    recovers from the older one (its log is still there), and so does the import."""
    sc = scenario("qsnap-kill-4.3", shared_root)
    copy = tmp_path / "node"
    shutil.copytree(sc.data_dir, copy)
    snap = assert_compacted(copy)
    data = Path(snap.path).read_bytes()
    term_hex, idx_hex = Path(snap.path).parent.name.split("_")
    newer = Path(snap.path).parent.parent / f"{term_hex}_{int(idx_hex, 16) + 5:0{len(idx_hex)}X}"
    newer.mkdir()
    (newer / "snapshot.dat").write_bytes(data[: len(data) // 2])
    res = import_rabbitmq_dir(str(copy), f"file://{tmp_path}/b", "f1", types={"quorum"})
    assert not res.ctx.skipped
    assert any("recovered from the older snapshot" in n and str(newer) in n for n in res.ctx.notes), res.ctx.notes
    _m, got = read_backup(f"file://{tmp_path}/b", "f1")
    _same(got[KEY], sc.quorum[KEY], KEY)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qttl-3.10", "qttl-4.0", "qttl-4.3"])
def test_messages_the_broker_expired_stay_expired(name, shared_root, tmp_path):
    """x-message-ttl and per-message expiration: what rabbit_fifo dropped while the node ran (the
    log shows when) is not imported; a message shielded by a live one in front of it still is."""
    sc = scenario(name, shared_root)
    res = import_rabbitmq_dir(str(sc.data_dir), f"file://{tmp_path}/b", "t1", types={"quorum"})
    assert not res.ctx.skipped
    _m, got = read_backup(f"file://{tmp_path}/b", "t1")
    for key in (("/", "qq-ttl"), ("/", "qq-exp")):
        _same(got.get(key, []), sc.quorum[key], key)
    # Not vacuous: the broker really expired some and kept others.
    assert [r.body for r in sc.quorum[("/", "qq-ttl")]] == [f"kept-{i}".encode() for i in range(5)]
    exp = [r.body for r in sc.quorum[("/", "qq-exp")]]
    assert b"e-0" not in exp and b"e-1" in exp and b"e-late" in exp


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qttl-4.3"])
def test_expiry_does_not_depend_on_when_the_import_runs(name, shared_root, tmp_path):
    """The import judges expiry by the log's own timestamps: run two days later (a subprocess whose wall
    clock runs ahead), it exports exactly what it exports now, survivors with a 1 h TTL included."""
    import os
    import subprocess
    import sys

    sc = scenario(name, shared_root)
    now = f"file://{tmp_path}/now"
    import_rabbitmq_dir(str(sc.data_dir), now, "t1", types={"quorum"})
    later = f"file://{tmp_path}/later"
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, RBAK_TEST_CLOCK_AHEAD=str(2 * 86400), PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).parent / "data" / "clock_ahead"), str(repo), os.environ.get("PYTHONPATH", "")]))
    code = "import sys; from rbak.cli import main; sys.exit(main(sys.argv[1:]))"
    p = subprocess.run([sys.executable, "-c", code, "import", "rabbitmq-dir", str(sc.data_dir), "--to", later,
                        "--backup-id", "t1", "--types", "quorum"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    check = subprocess.run([sys.executable, "-c", "import time; print(time.time())"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert float(check.stdout) > time.time() + 86400, "the subprocess's clock is not ahead"
    _m, got_now = read_backup(now, "t1")
    _m, got_later = read_backup(later, "t1")
    assert [r.body for r in got_later[("/", "qq-ttl")]] == [f"kept-{i}".encode() for i in range(5)]
    for key in (("/", "qq-ttl"), ("/", "qq-exp")):
        assert [(r.body, r.properties) for r in got_later[key]] == [(r.body, r.properties) for r in got_now[key]]

