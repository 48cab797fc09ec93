"""`rbak restore` of an archive: which archive, and which points in time it stands for (TRIAL.md, hD).

Two archives with similar names in one storage: the default pick is refused, `--archive NAME` takes that
archive's newest generation; a `--pitr-end` past the recoverable-until or before the archive began is
refused (exit 2), as the operator refuses a pointInTime past it.
"""

from __future__ import annotations

import datetime as _dt
import json

from support.backups import fast_publish
from support.brokers import wait_until
from support.archives import Archiver, archive_config, bodies, declare_stream, fs_storage, generations, rbak


def utc(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_restore_picks_the_named_archive_and_refuses_times_it_cannot_stand_for(broker, vhost_factory, tmp_path):
    v1, v2, fresh = vhost_factory(broker), vhost_factory(broker), vhost_factory(broker)
    for v in (v1, v2, fresh):
        declare_stream(broker, v, "s")
    store, path = fs_storage(tmp_path), str(tmp_path / "store")
    # one vhost each: the archive lease is per vhost
    a = Archiver(archive_config(tmp_path, broker, v1, store, name="orders"), tmp_path / "a.log").running()
    fast_publish(broker, v1, "s", [b"orders-%d" % i for i in range(30)])
    wait_until(lambda: sum(g["total_messages"] for g in generations(path, "orders")) == 30, timeout=120,
               what="orders archived")
    a.stop()
    b = Archiver(archive_config(tmp_path, broker, v2, store, name="orders-eu"), tmp_path / "b.log").running()
    fast_publish(broker, v2, "s", [b"eu-%d" % i for i in range(5)])
    wait_until(lambda: sum(g["total_messages"] for g in generations(path, "orders-eu")) == 5, timeout=120,
               what="orders-eu archived")
    b.stop()
    (gen,) = [g for g in generations(path, "orders") if g["archive"]["name"] == "orders"]
    (eu,) = generations(path, "orders-eu")
    target = ["--path", path, "--target-url", broker.amqp_url(fresh), "--management-url", broker.management_url]

    r = rbak("restore", *target, "--pitr-end", "recoverable", "--dry-run", check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"rbak: Configuration error: file://{path} holds the archives 'orders', 'orders-eu'; the newest complete "
        f"backup {eu['backup_id']!r} is archive 'orders-eu''s: pass --archive NAME (or --backup-id) to say which "
        "one to restore")

    r = rbak("restore", *target, "--archive", "order", check=False)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1] == (f"rbak: Storage error: --archive order: no generation of archive 'order' "
                                         f"at file://{path}; archives there: 'orders', 'orders-eu'")

    ru = gen["archive"]["recoverable_until"]
    r = rbak("restore", *target, "--archive", "orders", "--pitr-end", str(ru + 1), check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"rbak: Configuration error: --pitr-end: {utc(ru + 1)} is after the archive's recoverable-until {utc(ru)} "
        f"(generation {gen['backup_id']!r} of archive 'orders'): records after it are not known complete across "
        "streams; restore the newest generation (--archive orders), 'recoverable', or an earlier time")
    cfg = tmp_path / "restore.yaml"
    cfg.write_text(json.dumps({"mode": "restore", "backup_id": gen["backup_id"], "storage": json.loads(store),
                               "target": {"amqp_url": broker.amqp_url(fresh), "management_url": broker.management_url},
                               "restore": {"time_window_end": ru + 1}}))
    r = rbak("restore", "--config", str(cfg), check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1].startswith(
        f"rbak: Configuration error: restore.time_window_end: {utc(ru + 1)} is after the archive's recoverable-until "
        f"{utc(ru)} (generation {gen['backup_id']!r} of archive 'orders')"), r.stderr
    before = gen["created_at"] - 1
    r = rbak("restore", *target, "--backup-id", gen["backup_id"], "--pitr-end", utc(before), check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"rbak: Configuration error: --pitr-end: {utc(before)} is before archive 'orders' began "
        f"({utc(gen['created_at'])}, its first generation {gen['backup_id']!r}): no record is stamped that early, "
        "nothing would be restored")
    assert bodies(broker, fresh, "s") == []  # nothing published by a refusal

    r = rbak("restore", *target, "--archive", "orders", "--json")
    assert (f"rbak: restoring archive 'orders' from its newest generation {gen['backup_id']!r} (1 generation(s))"
            in r.stderr.splitlines())
    out = json.loads(r.stdout)
    assert out["ok"] and out["backup_id"] == gen["backup_id"], out
    assert out["confirmed"] == 30 and [q["target_vhost"] for q in out["queues"]] == [fresh], out
    want = [b"orders-%d" % i for i in range(30)]
    wait_until(lambda: bodies(broker, fresh, "s") == want, timeout=30, what="the restored stream read back")
