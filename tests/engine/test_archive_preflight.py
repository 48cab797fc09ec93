"""`rbak archive` refuses at start what it would otherwise live with for ever (TRIAL.md, hD): a vhost in
`amqp_url` that does not exist (the selection never used it), a `stream_port` of another cluster (the
5552 default on a host with several brokers); a stream port nobody listens on is a warning."""

from __future__ import annotations

import json
import subprocess
import sys

from support.brokers import BROKERS, unique_name
from support.s3 import free_port
from support.archives import Archiver, archive_config, declare_stream, fs_storage


def run_archive(cfg) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", "archive", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=120)


def edit(cfg, **source) -> None:
    d = json.loads(cfg.read_text())
    d["source"].update(source)
    cfg.write_text(json.dumps(d))


def test_a_vhost_in_the_url_that_does_not_exist_is_refused(broker, vhost, tmp_path):
    declare_stream(broker, vhost, "s")
    cfg = archive_config(tmp_path, broker, vhost, fs_storage(tmp_path))
    missing = unique_name("nope")
    edit(cfg, amqp_url=broker.amqp_url(missing))
    r = run_archive(cfg)
    assert r.returncode == 2, r.stderr
    line = r.stderr.splitlines()[-1]
    assert line.startswith(f"rbak: Configuration error: source.amqp_url: vhost {missing!r} does not exist on "
                           f"{broker.management_url} (vhosts user 'guest' can see: '/', "), line
    assert line.endswith("); nothing was archived"), line
    assert not (tmp_path / "store").exists()


def test_a_stream_port_of_another_cluster_is_refused(broker, vhost, tmp_path):
    other = next(b for b in BROKERS.values() if b.name != broker.name and not b.unreachable_reason())
    declare_stream(broker, vhost, "s")
    cfg = archive_config(tmp_path, broker, vhost, fs_storage(tmp_path))
    edit(cfg, stream_port=other.stream_port)
    mine, theirs = (b.api("GET", "/api/overview")["cluster_name"] for b in (broker, other))
    r = run_archive(cfg)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"rbak: Configuration error: source.stream_port: 127.0.0.1:{other.stream_port} answers for cluster "
        f"{theirs!r}, but {broker.management_url} is cluster {mine!r}: set source.stream_port to this broker's "
        "stream port (default 5552); nothing was archived")
    assert not (tmp_path / "store").exists()


def test_a_stream_port_nobody_listens_on_is_a_warning(broker, vhost, tmp_path):
    declare_stream(broker, vhost, "s")
    cfg = archive_config(tmp_path, broker, vhost, fs_storage(tmp_path))
    port = free_port()
    edit(cfg, stream_port=port)
    log = tmp_path / "a.log"
    Archiver(cfg, log).running().stop()
    assert (f"WARNING rbak.archive: source.stream_port: no stream listener answers on 127.0.0.1:{port} ([Errno 111] "
            "Connection refused): each stream's end is found by a quiet period instead of being asked "
            "(docs/archive.md)") in log.read_text()


def test_an_amqp_url_at_the_management_port_under_another_host_name_is_refused(broker, vhost, tmp_path):
    """The trial's F5: ``localhost:15674`` beside ``http://127.0.0.1:15674`` passes the config's same-port check,
    and the archiver took the HTTP answer for a broker away, retrying for ever. It answers in HTTP: refused at start."""
    declare_stream(broker, vhost, "s")
    cfg = archive_config(tmp_path, broker, vhost, fs_storage(tmp_path))
    edit(cfg, amqp_url=f"amqp://guest:guest@localhost:{broker.mgmt_port}/{vhost}")
    r = run_archive(cfg)
    assert r.returncode == 2, r.stderr
    line = r.stderr.splitlines()[-1]
    assert line.startswith(f"rbak: Configuration error: source.amqp_url: AMQP error: amqp://localhost:{broker.mgmt_port} "), line
    assert f"port {broker.mgmt_port} may not be an AMQP listener" in line, line
    assert line.endswith(" (it answers in HTTP); nothing was archived"), line
    assert not (tmp_path / "store").exists()
