"""A backup holds one source's messages (issue 44): its manifest records the cluster, the vhost scope
and the owner, and a run of another source never resumes, completes or replaces it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rbak.backup import BackupEngine
from rbak.errors import RbakError

from support.backups import backup_config, load, records


def _cli(broker, vhosts: list[str], url_vhost: str, store: Path, state: Path, backup_id: str,
         tmp: Path, **backup) -> subprocess.CompletedProcess:
    cfg = tmp / f"{backup_id}-{broker.name}-{len(vhosts)}.yaml"
    cfg.write_text(yaml.safe_dump({
        "mode": "backup",
        "source": {"amqp_url": broker.amqp_url(url_vhost), "management_url": broker.management_url,
                   "stream_port": broker.stream_port, "queues": {"vhosts": vhosts}},
        "storage": {"backend": "filesystem", "path": str(store)},
        "backup": {"include_definitions": False, **backup},
        "offset_storage": {"path": str(state)},
    }))
    return subprocess.run([sys.executable, "-m", "rbak", "backup", "--config", str(cfg), "--backup-id", backup_id,
                           "--json"], capture_output=True, text=True, env=dict(os.environ), timeout=300)


class _Stop(Exception):
    pass


def test_rerun_from_another_source_is_refused(rmq310, rmq40, vhost_factory, tmp_path):
    va, vb = vhost_factory(rmq310), vhost_factory(rmq310)
    vc = vhost_factory(rmq40)
    rmq310.publish(va, "q", [b"a-%d" % i for i in range(6)], declare={})
    rmq310.publish(vb, "q", [b"b-%d" % i for i in range(3)], declare={})
    rmq40.publish(vc, "q", [b"c-%d" % i for i in range(4)], declare={})
    store, state = tmp_path / "store", tmp_path / "state.db"

    # a run of rmq310/va whose read failed after its first message: a partial backup of that source
    seen = []

    def stop(n: int) -> None:
        seen.append(n)
        raise _Stop()

    with pytest.raises((_Stop, RbakError)):
        BackupEngine(backup_config(rmq310, va, store, "o-1", state), throttle=stop).run()
    first = load(store, "o-1")
    assert first.is_partial and first.origin is not None
    assert (first.origin.cluster, first.origin.vhosts, first.origin.owner) == (first.source_cluster, (va,), None)
    before = sorted(p.relative_to(store) for p in store.rglob("*") if p.is_file())

    # the same id from another broker: refused in one line naming both, nothing written
    r = _cli(rmq40, [vc], vc, store, tmp_path / "other.db", "o-1", tmp_path)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "backup_id:" in err[0] and "partial backup 'o-1'" in err[0], r.stderr
    cluster40 = rmq40.api("GET", "/api/overview")["cluster_name"]
    assert repr(first.source_cluster) in err[0] and repr(cluster40) in err[0] and va in err[0] and vc in err[0]
    assert sorted(p.relative_to(store) for p in store.rglob("*") if p.is_file()) == before

    # the same broker with another vhost set: refused as well
    r = _cli(rmq310, [va, vb], va, store, state, "o-1", tmp_path)
    both = ", ".join(sorted([va, vb]))  # the scope is printed sorted; the names are random
    assert r.returncode == 2 and f"vhosts {both}" in r.stderr and f"vhosts {va};" in r.stderr, r.stderr
    assert sorted(p.relative_to(store) for p in store.rglob("*") if p.is_file()) == before

    # the same source resumes it: exactly its own messages, the vhosts read in the summary
    r = _cli(rmq310, [va], va, store, state, "o-1", tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["vhosts"] == [va] and out["vhost_scope"] == [va] and out["total_messages"] == 6
    done = load(store, "o-1")
    assert done.is_complete and done.origin == first.origin
    assert [x.body for x in records(store, done, va, "q")] == [b"a-%d" % i for i in range(6)]

    # complete: even backup.overwrite never replaces it with another source's messages
    r = _cli(rmq40, [vc], vc, store, tmp_path / "other.db", "o-1", tmp_path, overwrite=True)
    assert r.returncode == 2 and "complete backup 'o-1'" in r.stderr and repr(cluster40) in r.stderr, r.stderr
    assert load(store, "o-1").to_json() == done.to_json()


def test_origin_is_an_extension_old_readers_skip(rmq310, vhost_factory, tmp_path):
    """The manifest keeps the spec's fields in the spec's order; ``origin`` comes last, with the owner."""
    v = vhost_factory(rmq310)
    rmq310.publish(v, "q", [b"x"], declare={})
    store = tmp_path / "store"
    cfg = backup_config(rmq310, v, store, "own-1", tmp_path / "s.db")
    from rbak.config import OwnerConfig

    cfg.backup.owner = OwnerConfig(namespace="team-a", name="twin", uid="u-1")
    BackupEngine(cfg).run()
    raw = json.loads((store / "own-1" / "manifest.json").read_text())
    assert list(raw)[:11] == ["backup_id", "created_at", "completed_at", "source_cluster", "rabbitmq_version",
                              "backup_tool_version", "definitions", "queues", "total_messages", "total_bytes",
                              "total_segments"]
    assert list(raw)[-1] == "origin"
    assert raw["origin"] == {"cluster": raw["source_cluster"], "vhosts": [v],
                             "owner": {"namespace": "team-a", "name": "twin", "uid": "u-1"}}
    # another owner of the same source: refused too (two objects never share one backup)
    cfg2 = backup_config(rmq310, v, store, "own-1", tmp_path / "s.db", overwrite=True)
    cfg2.backup.owner = OwnerConfig(namespace="team-b", name="twin", uid="u-2")
    with pytest.raises(RbakError, match="made by team-a/twin .uid u-1.; this run is of .*made by team-b/twin"):
        BackupEngine(cfg2).run()
