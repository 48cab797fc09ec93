"""A backup whose management URL answers for another broker than its AMQP URL is refused before
anything is written (a new user's trial of issue 49: ``source.amqp_url`` on the 4.0.5 broker, :5673,
``source.management_url`` on the 3.10.8 one, :15672; the queue listed by one was missing on the other,
and the run exited 0 with a "complete" empty backup)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _config(tmp_path, amqp_port: int, management_url: str, vhost: str):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
mode: backup
source:
  amqp_url: amqp://guest:guest@127.0.0.1:{amqp_port}/%2f
  management_url: {management_url}
  queues: {{vhosts: ["{vhost}"]}}
storage: {{backend: filesystem, path: "{tmp_path / 'store'}"}}
offset_storage: {{path: "{tmp_path / 'state.db'}"}}
""")
    return cfg


def _backup(cfg, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", "backup", "--config", str(cfg), "--backup-id", "b1", *extra],
                          capture_output=True, text=True, env=dict(os.environ), timeout=120)


def test_a_management_url_of_another_broker_refuses_the_backup_naming_both(rmq40, rmq310, vhost_factory, tmp_path):
    vhost = vhost_factory(rmq40)
    rmq310.create_vhost(vhost)  # the same vhost and queue on the broker the management URL reads
    try:
        rmq310.publish(vhost, "trial49-q", [b"other"], declare={})
        rmq40.publish(vhost, "q", [b"m1", b"m2"], declare={})
        amqp_cluster = rmq40.api("GET", "/api/overview")["cluster_name"]
        mgmt_cluster = rmq310.api("GET", "/api/overview")["cluster_name"]
        assert amqp_cluster != mgmt_cluster

        r = _backup(_config(tmp_path, rmq40.amqp_port, rmq310.management_url, vhost))
        assert r.returncode == 2, r.stderr
        line = f"source.management_url {rmq310.management_url} answers for cluster {mgmt_cluster!r}, but " \
               f"source.amqp_url amqp://guest:***@127.0.0.1:{rmq40.amqp_port}/%2f is cluster {amqp_cluster!r}"
        assert line in r.stderr, r.stderr
        assert "nothing was backed up" in r.stderr
        assert "guest:guest" not in r.stderr
        assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())
        assert rmq40.message_count(vhost, "q") == 2 and rmq310.message_count(vhost, "trial49-q") == 1
    finally:
        rmq310.delete_vhost(vhost)


def test_a_matching_pair_still_backs_up(rmq40, vhost_factory, tmp_path):
    vhost = vhost_factory(rmq40)
    rmq40.publish(vhost, "q", [b"m1", b"m2"], declare={})
    r = _backup(_config(tmp_path, rmq40.amqp_port, rmq40.management_url, vhost), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["completed"] and out["total_messages"] == 2


def test_rbak_archive_takes_the_same_check(rmq40, rmq310, vhost_factory, tmp_path):
    vhost = vhost_factory(rmq40)
    rmq40.declare_queue(vhost, "s", arguments={"x-queue-type": "stream"})
    cfg = tmp_path / "archive.yaml"
    cfg.write_text(json.dumps({
        "mode": "archive",
        "source": {"amqp_url": f"amqp://guest:guest@127.0.0.1:{rmq40.amqp_port}/%2f",
                   "management_url": rmq310.management_url, "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
        "archive": {"name": "arc"}}))
    r = subprocess.run([sys.executable, "-m", "rbak", "archive", "--config", str(cfg)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"source.management_url {rmq310.management_url} answers for cluster" in r.stderr, r.stderr
    assert "nothing was archived" in r.stderr
    assert not (tmp_path / "store").exists()


def test_rbak_drill_takes_the_same_check_before_making_a_scratch_vhost(rmq40, rmq310, vhost_factory, tmp_path):
    vhost = vhost_factory(rmq40)
    rmq40.publish(vhost, "q", [b"m1"], declare={})
    assert _backup(_config(tmp_path, rmq40.amqp_port, rmq40.management_url, vhost)).returncode == 0
    mgmt_cluster = rmq310.api("GET", "/api/overview")["cluster_name"]
    cfg = _config(tmp_path, rmq40.amqp_port, rmq310.management_url, vhost)
    r = subprocess.run([sys.executable, "-m", "rbak", "drill", "--config", str(cfg), "--backup-id", "b1", "--json",
                        "--drill-id", "split1"], capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    amqp_cluster = rmq40.api("GET", "/api/overview")["cluster_name"]
    assert rep["passed"] is False and rep["scratch_vhost"] is None
    assert rep["reason"] == (
        f"backup 'b1': source.management_url {rmq310.management_url} answers for cluster {mgmt_cluster!r}, but "
        f"source.amqp_url amqp://guest:***@127.0.0.1:{rmq40.amqp_port}/%2f is cluster {amqp_cluster!r}: point "
        "source.management_url at the broker source.amqp_url names; no scratch vhost was created")
    for b in (rmq40, rmq310):
        assert not [v for v in b.api("GET", "/api/vhosts") if "split1" in v["name"]]
