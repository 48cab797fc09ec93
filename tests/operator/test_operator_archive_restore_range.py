"""A RabbitMQRestore of an archive whose ``pointInTime`` lies outside what the archive holds (issue 48) is refused
by the operator on reconcile, naming the field and the archive's range, with no Job: before, a point before the
first generation began was refused only by the restore Job. On the real API server, with an archive written by
``rbak archive`` from a real broker's stream (3.10.8) into moto S3."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest
from rbak.archive.status import archive_status
from rbak.repo.catalog import load_manifest
from support.backups import fast_publish
from support.op_e2e import API, bucket_root
from support.opcluster import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _archive_into_storage(env, name: str, tmp_path) -> tuple[int, int]:
    """``rbak archive`` of env's vhost into env's bucket until its records are recoverable, then SIGTERM:
    (when its first generation began, its recoverable-until), as the storage holds them."""
    broker = env.broker
    broker.declare_queue(env.vhost, "events", arguments={"x-queue-type": "stream"})
    fast_publish(broker, env.vhost, "events", [b"e-%d" % i for i in range(10)])
    published = int(time.time() * 1000)
    cfg = tmp_path / "archive.yaml"
    cfg.write_text(json.dumps({
        "mode": "archive",
        "source": {"amqp_url": broker.amqp_url(env.vhost), "management_url": broker.management_url,
                   "stream_port": broker.stream_port, "queues": {"vhosts": [env.vhost]}},
        "storage": {"backend": "s3", "bucket": env.bucket.bucket, "prefix": env.bucket.prefix,
                    "endpoint": env.bucket.endpoint, "path_style": True, "region": "us-east-1"},
        "archive": {"name": name, "max_delay_secs": 1.0, "idle_tick_secs": 1}}))
    log = tmp_path / "archiver.log"
    proc = subprocess.Popen([sys.executable, "-m", "rbak", "archive", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    storage = bucket_root(env)
    try:
        wait_for(lambda: (archive_status(storage, name, env.bucket.prefix).recoverable_until or 0) > published,
                 60, what="the records archived", diag=lambda: log.read_text()[-3000:])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    st = archive_status(storage, name, env.bucket.prefix)
    assert st.generations == 1 and not st.open and st.recoverable_until is not None
    began = load_manifest(storage, st.newest or "", env.bucket.prefix).created_at  # its first generation's
    return began, st.recoverable_until


def _restore(cluster, rname: str, spec: dict) -> dict:
    cluster.http.create(API, "rabbitmqrestores", {"apiVersion": API, "kind": "RabbitMQRestore",
                                                  "metadata": {"name": rname}, "spec": spec})
    return wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {})
                    .get("phase") in ("Succeeded", "Failed") and s, 120, what=rname, diag=cluster.logs)


def test_a_point_in_time_outside_the_archive_is_refused_on_reconcile(cluster, env, tmp_path):
    name = f"{env.tag}-arc"
    began, ru = _archive_into_storage(env, name, tmp_path)
    cluster.http.create(API, "rabbitmqarchives", {
        "apiVersion": API, "kind": "RabbitMQArchive", "metadata": {"name": name},
        "spec": {"broker": env.url_broker, "queues": {"vhosts": [env.vhost]}, "storage": env.storage,
                 "suspend": True}})  # its archiver stays stopped: the storage holds the archive already
    span = (f"; archive {name!r} can be restored to a point from {iso(began)} (its first generation began) to "
            f"{iso(ru)} (its recoverable-until)")
    for suffix, point, why in (
            ("early", iso(began - 1), f"is before archive {name!r} began: no record is stamped that early, nothing "
                                      "would be restored"),
            ("late", str(ru + 1), f"is after the archive's recoverable-until {iso(ru)}: not every stream is archived "
                                  "up to it")):
        rname = f"{env.tag}-{suffix}"
        st = _restore(cluster, rname, {"archiveRef": {"name": name, "pointInTime": point}, "dryRun": True})
        message = f"Configuration error: spec.archiveRef.pointInTime: {point} {why}{span}"
        assert (st["phase"], st["reason"], st["message"]) == ("Failed", "InvalidSpec", message), st
        (done,) = [c for c in st["conditions"] if c["type"] == "Completed"]
        assert (done["status"], done["reason"], done["message"]) == ("False", "InvalidSpec", message)
        assert "jobName" not in st and "backupId" not in st, st
        assert cluster.jobs(rname) == []  # its run would be f"{rname}-restore"
        ev = wait_for(lambda: [e for e in cluster.events(rname) if e["reason"] == "RestoreFailed"], 30, what="event")
        assert [(e["type"], e["message"]) for e in ev] == [("Warning", message)]

    # the range's own ends are accepted: a dry run of the archive up to when it began starts its Job
    rname = f"{env.tag}-first"
    st = _restore(cluster, rname, {"archiveRef": {"name": name, "pointInTime": iso(began)}, "dryRun": True})
    assert st["phase"] == "Succeeded" and st["pointInTime"] == iso(began) and st["jobName"] == f"{rname}-restore", st
