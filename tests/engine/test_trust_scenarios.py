"""Issue 14's scenarios as a user meets them: the CLI run twice from ONE working directory
(the default local state ``./.rbak-state/offsets.db``), on every broker version.

1. the same backup_id pointed at a new, empty storage;
2. a stream deleted and declared again; a stream whose retention removed messages between backups;
3. an incremental stream chain restored (base through the chosen backup; one increment on request);
4. retention (``rbak prune``) that keeps every chain a kept backup needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rbak.repo.catalog import load_manifest
from rbak.storage import open_storage

from support.brokers import wait_until

STREAM = {"x-queue-type": "stream"}


def cli(cwd: Path, *args: str, ok: bool | None = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "rbak", *args], cwd=cwd, capture_output=True, text=True,
                       env=dict(os.environ), timeout=240)
    if ok is True:
        assert r.returncode == 0, r.stderr + r.stdout
    elif ok is False:
        assert r.returncode != 0, r.stdout
    return r


def write_config(cwd: Path, broker, vhost: str, store: str, name: str = "c.yaml") -> Path:
    """A user's backup config: no offset_storage section (the default ./.rbak-state/offsets.db)."""
    p = cwd / name
    p.write_text(f"""
mode: backup
source:
  amqp_url: {broker.amqp_url(vhost)}
  management_url: {broker.management_url}
  queues: {{vhosts: ["{vhost}"]}}
storage: {{backend: filesystem, path: "{store}"}}
backup: {{include_definitions: false}}
""")
    return p


def backup(cwd: Path, cfg: Path, backup_id: str, ok: bool | None = True) -> subprocess.CompletedProcess:
    return cli(cwd, "backup", "--config", str(cfg), "--backup-id", backup_id, "--no-progress", ok=ok)


def restore(cwd: Path, broker, store: str, backup_id: str, *extra: str, ok: bool | None = True):
    return cli(cwd, "restore", "--path", store, "--backup-id", backup_id, "--target-url", broker.server_url(),
               "--management-url", broker.management_url, *extra, ok=ok)


def stream_bodies(broker, vhost: str, name: str) -> list[bytes]:
    return [m.body for m in broker.read_stream(vhost, name)]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The user's working directory, the same for every run of a test."""
    d = tmp_path / "work"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


def test_same_backup_id_to_a_new_storage(broker, vhost, home):
    """Scenario 1: state from storage A never makes storage B's manifest name A's segments."""
    broker.publish(vhost, "orders", [b"o-%d" % i for i in range(300)], declare={})
    broker.publish(vhost, "events", [b"e-%d" % i for i in range(200)], declare=STREAM)
    backup(home, write_config(home, broker, vhost, "store-a", "a.yaml"), "X")
    assert (home / ".rbak-state" / "offsets.db").exists()  # the state a user has, in the working directory
    r = backup(home, write_config(home, broker, vhost, "store-b", "b.yaml"), "X")
    assert "[resumed]" not in r.stdout + r.stderr
    b = open_storage(str(home / "store-b"))
    m = load_manifest(b, "X")
    assert m.find_queue(vhost, "orders").message_count == 300 and m.find_queue(vhost, "events").message_count == 200
    for q in m.queues:
        for s in q.segments:
            assert s.key.startswith("X/") and b.size(s.key) == s.size_bytes, s.key
    v = cli(home, "validate", "--path", "store-b", "--backup-id", "X", "--deep")
    assert "is valid" in v.stdout
    # the same id rerun against A is still refused as complete there; B's copy stays what it was
    r = backup(home, write_config(home, broker, vhost, "store-a", "a.yaml"), "X", ok=False)
    assert "already exists and is complete" in r.stderr


def test_kept_segment_missing_means_read_again(broker, vhost, home):
    """A checkpointed segment deleted from storage is never named by a manifest: the queue is read again."""
    broker.publish(vhost, "q", [b"q-%d" % i for i in range(100)], declare={})
    broker.publish(vhost, "s", [b"s-%d" % i for i in range(100)], declare=STREAM)
    cfg = write_config(home, broker, vhost, "store")
    st = open_storage(str(home / "store"))
    r = backup(home, cfg, "K", ok=None)
    assert r.returncode == 0, r.stderr
    m = load_manifest(st, "K")
    # make the backup look interrupted (manifest incomplete) and lose one stored segment of each queue
    m.completed_at = None
    st.put("K/manifest.json", m.to_json())
    lost = [m.find_queue(vhost, "q").segments[0].key, m.find_queue(vhost, "s").segments[0].key]
    for k in lost:
        st.delete(k)
    r = backup(home, cfg, "K")
    assert all(k in r.stderr for k in lost), r.stderr  # named in the warning
    m2 = load_manifest(st, "K")
    assert m2.is_complete and m2.find_queue(vhost, "q").message_count == 100
    assert m2.find_queue(vhost, "s").message_count == 100
    cli(home, "validate", "--path", "store", "--backup-id", "K", "--deep")


def test_recreated_stream_is_backed_up_from_its_first_offset(broker, vhost, home):
    """Scenario 2: delete + re-declare a stream between backups: the new messages are all in the next backup."""
    broker.publish(vhost, "st", [b"old-%d" % i for i in range(50)], declare=STREAM)
    cfg = write_config(home, broker, vhost, "store")
    backup(home, cfg, "r1")
    broker.delete_queue(vhost, "st")
    broker.publish(vhost, "st", [b"new-%d" % i for i in range(30)], declare=STREAM)
    r = backup(home, cfg, "r2")
    assert "'st'" in r.stderr and "declared again" in r.stderr
    m = load_manifest(open_storage(str(home / "store")), "r2")
    q = m.find_queue(vhost, "st")
    assert q.message_count == 30 and q.stream.recreated and q.stream.previous_backup is None
    assert m.depends_on == set()
    # a longer recreated stream (its offset 49 exists, but is not the record r1 stored) is caught too
    broker.delete_queue(vhost, "st")
    broker.publish(vhost, "st", [b"newer-%d" % i for i in range(80)], declare=STREAM)
    backup(home, cfg, "r3")
    q3 = load_manifest(open_storage(str(home / "store")), "r3").find_queue(vhost, "st")
    assert q3.message_count == 80 and q3.stream.recreated
    # restoring r3 restores exactly the new stream
    broker.delete_queue(vhost, "st")
    broker.declare_queue(vhost, "st", arguments=STREAM)
    restore(home, broker, "store", "r3")
    assert stream_bodies(broker, vhost, "st") == [b"newer-%d" % i for i in range(80)]


def test_retention_gap_is_recorded_and_shown(broker, vhost, home):
    """Scenario 2b: messages the stream's retention removed between two backups are a recorded gap."""
    args = {**STREAM, "x-max-length-bytes": 30_000, "x-stream-max-segment-size-bytes": 5_000}
    body = b"x" * 900
    broker.publish(vhost, "ret", [body + b"%04d" % i for i in range(10)], declare=args)
    cfg = write_config(home, broker, vhost, "store")
    backup(home, cfg, "g1")
    st = open_storage(str(home / "store"))
    last1 = load_manifest(st, "g1").find_queue(vhost, "ret").stream.last_offset
    assert last1 is not None and last1 >= 9
    for i in range(10, 300, 10):  # segments roll over: retention drops the oldest
        broker.publish(vhost, "ret", [body + b"%04d" % j for j in range(i, i + 10)])
    first = wait_until(lambda: (o := broker.read_stream(vhost, "ret")[0].headers["x-stream-offset"]) > last1 + 1 and o,
                       timeout=60, what="stream retention to remove the first segments")
    backup(home, cfg, "g2")
    q = load_manifest(st, "g2").find_queue(vhost, "ret")
    gaps = q.stream.gaps
    assert len(gaps) == 1 and gaps[0].from_offset == last1 + 1 and gaps[0].to_offset >= first - 1
    assert q.stream.previous_backup == "g1" and q.stream.first_offset == gaps[0].to_offset + 1
    d = json.loads(cli(home, "describe", "--path", "store", "--backup-id", "g2", "--format", "json").stdout)
    assert d["gaps"][0]["count"] == gaps[0].count > 0
    assert "gap" in cli(home, "describe", "--path", "store", "--backup-id", "g2").stdout
    v = cli(home, "validate", "--path", "store", "--backup-id", "g2")
    assert "valid, with gaps" in v.stdout
    # a restore of g2 follows the chain to g1 and warns about the gap
    broker.delete_queue(vhost, "ret")
    broker.declare_queue(vhost, "ret", arguments=STREAM)
    r = restore(home, broker, "store", "g2")
    assert "retention" in r.stderr and "g1 -> g2" in r.stdout


def test_incremental_chain_restores_everything(broker, vhost, home):
    """Scenario 3: restoring the newer incremental backup brings back all 70 messages, in order, once."""
    first = [b"a-%d" % i for i in range(50)]
    more = [b"b-%d" % i for i in range(20)]
    broker.publish(vhost, "st", first, declare=STREAM)
    cfg = write_config(home, broker, vhost, "store")
    backup(home, cfg, "c1")
    broker.publish(vhost, "st", more)
    backup(home, cfg, "c2")
    st = open_storage(str(home / "store"))
    q2 = load_manifest(st, "c2").find_queue(vhost, "st")
    assert q2.message_count == 20 and q2.stream.previous_backup == "c1" and q2.stream.previous_last_offset == 49
    backup(home, cfg, "c3")  # nothing new: still a link (c3 -> c2 -> c1)
    assert load_manifest(st, "c3").depends_on == {"c2"}

    broker.delete_vhost(vhost)  # lose the vhost
    broker.create_vhost(vhost)
    broker.declare_queue(vhost, "st", arguments=STREAM)
    dry = restore(home, broker, "store", "c3", "--dry-run")
    assert "c1 -> c2 -> c3" in dry.stdout and "would publish 70" in dry.stdout
    assert stream_bodies(broker, vhost, "st") == []
    restore(home, broker, "store", "c2")
    assert stream_bodies(broker, vhost, "st") == first + more

    # one increment on request
    broker.delete_queue(vhost, "st")
    broker.declare_queue(vhost, "st", arguments=STREAM)
    restore(home, broker, "store", "c2", "--increment-only")
    assert stream_bodies(broker, vhost, "st") == more

    # a missing link fails before anything is published, naming it: a lost segment of c1, then c1 itself
    broker.delete_queue(vhost, "st")
    broker.declare_queue(vhost, "st", arguments=STREAM)
    lost = load_manifest(st, "c1").find_queue(vhost, "st").segments[0].key
    data = st.get(lost)
    st.delete(lost)
    r = restore(home, broker, "store", "c2", ok=False)
    assert lost in r.stderr and "'c1'" in r.stderr
    assert stream_bodies(broker, vhost, "st") == []
    st.put(lost, data)
    st.delete("c1/manifest.json")
    r = restore(home, broker, "store", "c2", ok=False)
    assert "'c1'" in r.stderr and "missing" in r.stderr
    assert stream_bodies(broker, vhost, "st") == []


def test_prune_keeps_the_chain(broker, vhost, home):
    """Scenario 4: retention never deletes the base a kept incremental backup needs."""
    broker.publish(vhost, "st", [b"a-%d" % i for i in range(50)], declare=STREAM)
    broker.publish(vhost, "cq", [b"c"] * 5, declare={})
    cfg = write_config(home, broker, vhost, "store")
    backup(home, cfg, "p1")
    broker.publish(vhost, "st", [b"b-%d" % i for i in range(20)])
    backup(home, cfg, "p2")
    dry = cli(home, "prune", "--path", "store", "--keep-last", "1", "--dry-run")
    assert "keep   p1: base of p2" in dry.stdout, dry.stdout
    assert "would delete 0" in dry.stdout
    cli(home, "prune", "--path", "store", "--keep-last", "1")
    st = open_storage(str(home / "store"))
    assert load_manifest(st, "p1").is_complete and load_manifest(st, "p2").is_complete
    broker.delete_queue(vhost, "st")
    broker.declare_queue(vhost, "st", arguments=STREAM)
    broker.delete_queue(vhost, "cq")
    broker.declare_queue(vhost, "cq")
    restore(home, broker, "store", "p2")
    assert len(stream_bodies(broker, vhost, "st")) == 70

    # a full (non-incremental) backup ends the chain: then the old ones may go
    full = write_config(home, broker, vhost, "store", "full.yaml")
    full.write_text(full.read_text().replace("include_definitions: false", "include_definitions: false, "
                                                                           "stream_incremental: false"))
    backup(home, full, "p3")
    out = cli(home, "prune", "--path", "store", "--keep-last", "1").stdout
    assert "delete p1" in out and "delete p2" in out and "keep   p3: one of the last 1" in out, out
    assert sorted(d.name for d in (home / "store").iterdir()) == ["p3"]


@pytest.mark.parametrize("envelope", [False, True], ids=["direct-key", "envelope"])
def test_encrypted_incremental_chain_restores_everything(broker, vhost, home, envelope):
    """Each link of an encrypted chain is sealed for its own backup id (and, with an envelope, its own data
    key): a restore of the newest link opens every earlier link's segments with that link's key."""
    import base64

    keys = home / "keys.txt"
    keys.write_text(f"k1: {base64.b64encode(os.urandom(32)).decode()}\n")
    first = [b"a-%d" % i for i in range(40)]
    more = [b"b-%d" % i for i in range(15)]
    last = [b"c-%d" % i for i in range(5)]
    broker.publish(vhost, "st", first, declare=STREAM)
    cfg = write_config(home, broker, vhost, "store")
    cfg.write_text(cfg.read_text() + f"encryption: {{enabled: true, key_id: k1, keys_file: '{keys}', "
                                      f"envelope: {str(envelope).lower()}}}\n")
    backup(home, cfg, "ec1")
    broker.publish(vhost, "st", more)
    backup(home, cfg, "ec2")
    broker.publish(vhost, "st", last)
    backup(home, cfg, "ec3")
    st = open_storage(str(home / "store"))
    infos = [load_manifest(st, b).encryption for b in ("ec1", "ec2", "ec3")]
    assert all(i is not None for i in infos)
    if envelope:  # one data key per backup: a chain cannot be opened with the newest link's key alone
        assert len({i.key_id for i in infos}) == 3
    assert load_manifest(st, "ec3").find_queue(vhost, "st").stream.previous_backup == "ec2"

    broker.delete_queue(vhost, "st")
    broker.declare_queue(vhost, "st", arguments=STREAM)
    r = restore(home, broker, "store", "ec3", "--keys-file", str(keys))
    assert "ec1 -> ec2 -> ec3" in r.stdout + r.stderr
    assert stream_bodies(broker, vhost, "st") == first + more + last
    v = cli(home, "validate", "--path", "store", "--backup-id", "ec3", "--deep", "--keys-file", str(keys))
    assert "is valid" in v.stdout
    # a drill restores the whole chain into a scratch vhost and hashes it against every link's records
    d = json.loads(cli(home, "drill", "--config", str(cfg), "--backup-id", "ec3", "--json").stdout)
    assert d["passed"] is True, d
    (q,) = d["queues"]
    assert q["expected_count"] == q["actual_count"] == 60 and q["hash_match"], q
