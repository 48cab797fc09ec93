"""What a new user of ``rbak drill --archive`` and an archive restore trips on, refused or said plainly (the
trial of docs/archive.md on 4.3.6): a look-back older than the archive, a typo'd archive name, a drill user
without the administrator tag, ``--definitions`` for a generation (which stores none)."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from support.brokers import wait_until
from support.archives import Archiver, archive_config, declare_stream, fs_storage, generations
from test_archive_drill import publish, signing_key


def rbak(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300, env=env)


def utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@pytest.fixture
def archived(rmq43, vhost_factory, tmp_path):
    """Archive 'orders' of two streams (70 + 30 records) on 4.3.6, stopped once its recoverable-until passed them."""
    vhost = vhost_factory(rmq43)
    for s, n in (("events.a", 70), ("events.b", 30)):
        declare_stream(rmq43, vhost, s)
        publish(rmq43, vhost, s, s, n)
    priv, pub = signing_key(tmp_path)
    cfg = archive_config(tmp_path, rmq43, vhost, fs_storage(tmp_path), name="orders",
                         sections={"drill": {"signing_key_file": priv}})
    path = str(tmp_path / "store")
    at = int(time.time() * 1000)
    arc = Archiver(cfg, tmp_path / "archiver.log").running()
    try:
        wait_until(lambda: bool(generations(path, "orders")) and (generations(path, "orders")[-1]["archive"]["recoverable_until"] or 0)
                   > at + 500, timeout=120, what="the records archived")
    finally:
        arc.stop()
    return vhost, cfg, path, pub


def test_a_lookback_before_the_archive_began_is_refused_not_passed(archived):
    """Default look-back (300 s) on a young archive: the restore point lies before any record; the drill compared
    nothing and PASSED (exit 0). Refused now, as restore refuses such a --pitr-end."""
    _vhost, cfg, path, _pub = archived
    first = generations(path, "orders")[0]
    r = rbak("drill", "--config", str(cfg), "--archive", "orders")
    assert r.returncode == 2, r.stdout + r.stderr[-2000:]
    m = re.search(r"rbak: Configuration error: --lookback 300 \(drill\.lookback_secs\): the restore point (\S+) is "
                  r"before archive 'orders' began \((\S+), its first generation '(\S+)'\): the drill would compare no "
                  r"record; the archive is (\d+) s old: give a shorter lookback\n", r.stderr)
    assert m, r.stderr
    assert (m[2], m[3]) == (utc(first["created_at"]), first["backup_id"])
    assert not list((Path(path) / first["backup_id"]).glob("drills/*")), "no report stored"


def test_a_typo_in_the_archive_name_lists_the_archives_there(archived):
    _vhost, cfg, path, _pub = archived
    r = rbak("drill", "--config", str(cfg), "--archive", "ordres")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (f"rbak: Storage error: --archive ordres: no generation of archive "
                                                 f"'ordres' at file://{path}; archives there: 'orders'")


def test_a_drill_user_without_the_administrator_tag_is_named_and_no_vhost_claimed(archived, rmq43, tmp_path):
    """A management-only user: was '401 ... (check target.management_username/password)' and 'scratch vhost
    None (removed)' / '... (removed)' for a vhost never made."""
    vhost, cfg, path, pub = archived
    user = f"hedrill-{secrets.token_hex(3)}"
    rmq43.api("PUT", f"/api/users/{user}", json={"password": "pw", "tags": "management"})
    try:
        doc = json.loads(cfg.read_text())
        doc["drill"]["target"] = {"amqp_url": rmq43.amqp_url(vhost).replace(f"{rmq43.user}:{rmq43.password}@",
                                                                             f"{user}:pw@"),
                                  "management_url": rmq43.management_url, "stream_port": rmq43.stream_port}
        cfg2 = tmp_path / "drill-user.yaml"
        cfg2.write_text(json.dumps(doc))
        r = rbak("drill", "--config", str(cfg2), "--archive", "orders", "--lookback", "0", "--json")
        no_tag = rbak("drill", "--config", str(cfg2), "--archive", "orders", "--lookback", "0")
    finally:
        rmq43.api("DELETE", f"/api/users/{user}", ok=(404,))
    assert r.returncode == 1, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    want = (f"archive 'orders': drill.target: user {user!r} has the tags management; a drill needs the administrator "
            "tag (it creates and deletes the scratch vhost); no scratch vhost was created")
    assert rep["reason"] == want and rep["passed"] is False
    assert rep["scratch_vhost"] is None and rep["archive"]["streams"] == [] and rep["archive"]["restore_secs"] is None
    assert r.stderr.strip().splitlines()[-1] == f"rbak: Restore drill: FAILED: {want}"
    assert no_tag.returncode == 1
    assert "(generation " in no_tag.stdout and f"nothing restored (restore point {rep['archive']['restore_point_utc']}), " \
        f"no scratch vhost (none was created): FAILED: {want}\n" in no_tag.stdout, no_tag.stdout
    stored = path + "/" + rep["report_key"]
    v = rbak("drill", "verify", stored, "--public-key", pub)
    assert v.returncode == 0, v.stderr
    assert "), no scratch vhost (none was created)\n" in v.stdout
    assert f"nothing restored (restore point {rep['archive']['restore_point_utc']})\n" in v.stdout
    assert (f"proves: archive orders up to {rep['archive']['restore_point_utc']} was NOT compared with the live "
            "streams (the drill failed before it), as reported by") in v.stdout


def test_restore_of_a_generation_refuses_definitions_and_names_recoverable_until_in_utc(archived, rmq43,
                                                                                        vhost_factory):
    vhost, _cfg, path, _pub = archived
    fresh = vhost_factory(rmq43)
    gen = generations(path, "orders")[-1]
    common = ["restore", "--path", path, "--archive", "orders", "--target-url", rmq43.amqp_url(fresh),
              "--management-url", rmq43.management_url]
    r = rbak(*common, "--definitions")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"rbak: Configuration error: --definitions: backup {gen['backup_id']!r} is a generation of archive 'orders', "
        "which stores no definitions: declare its streams in the target first (or import a definitions export taken "
        "by rbak backup or rbak definitions-export), then restore without it")
    assert rmq43.list_queues(fresh) == [], "nothing declared"
    d = rbak(*common, "--pitr-end", "recoverable", "--dry-run")
    ru = gen["archive"]["recoverable_until"]
    assert f"rbak: restoring up to the archive's recoverable-until {utc(ru)} ({ru} ms)\n" in d.stderr
    # the dry run fails as the real run would: the streams are not declared in the target
    assert d.returncode == 1 and f"queue 'events.a' in vhost {fresh!r} does not exist" in d.stderr, d.stderr


def test_a_drill_target_stream_port_of_another_cluster_is_said(archived, rmq43, rmq310, tmp_path):
    """source.stream_port forgotten on 4.3.6 (its stream port is not 5552; 3.10.8 answers there): the drill still
    judges right, but each scratch stream's end became a quiet period and the RTO was inflated, silently."""
    _vhost, cfg, _path, _pub = archived
    assert rmq43.stream_port != 5552 and rmq310.stream_port == 5552, "the CI brokers' ports"
    doc = json.loads(cfg.read_text())
    del doc["source"]["stream_port"]
    cfg2 = tmp_path / "no-stream-port.yaml"
    cfg2.write_text(json.dumps(doc))
    r = rbak("drill", "--config", str(cfg2), "--archive", "orders", "--lookback", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    c310, c43 = (b.api("GET", "/api/overview")["cluster_name"] for b in (rmq310, rmq43))
    want = (f"WARNING rbak.drill.backup: source.stream_port: {rmq43.host}:5552 answers for cluster "
            f"{c310!r}, but {rmq43.management_url} is cluster {c43!r}: each scratch "
            "stream's end is found by a quiet period and the RTO reported is inflated; set source.stream_port to this "
            "broker's stream port\n")
    assert want in r.stderr, r.stderr[-2000:]
    assert " proton: " not in r.stderr, "qpid-proton's connect/disconnect lines at INFO are noise"


def test_describe_shows_each_streams_committed_end_beside_what_is_archived(archived):
    """The broker's committed end as last probed was in --format json only; the text now says it too."""
    _vhost, _cfg, path, _pub = archived
    gen = generations(path, "orders")[-1]
    r = rbak("describe", "--path", path, "--backup-id", gen["backup_id"])
    assert r.returncode == 0, r.stderr
    committed = gen["archive"]["committed"]
    for s, last in (("events.a", 69), ("events.b", 29)):
        key = next(k for k in committed if k.endswith("/" + s))
        at = datetime.fromtimestamp(committed[key]["at"] / 1000, timezone.utc)
        at_text = at.strftime("%Y-%m-%d %H:%M:%S.") + f"{committed[key]['at'] % 1000:03d} UTC"
        assert committed[key]["offset"] == last
        assert (f"  committed  {key}: broker's end offset {last} at {at_text}, archived up to {last}, 0 behind\n"
                in r.stdout), r.stdout
