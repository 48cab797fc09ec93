"""Restores into targets that drop, expire, reject or dead-letter what they are given (issue 27).

Before publishing, a restore reads each target's effective arguments and policies and refuses one that
may lose restored messages, naming the queue and the setting; with ``allow_lossy_target`` it publishes
and then compares the target's depth with what the broker confirmed, failing on any difference. Run as
users run it: ``rbak restore --config`` (``restore.protocol`` picks AMQP 0-9-1 or 1.0), its exit code,
stderr and JSON summary, and the target's exact contents.
"""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import quote

import pytest
import yaml
from support.brokers import wait_until
from support.restores import build_backup, declare, make_records, storage_for

N = 100
BODIES = [b"m-%d" % i for i in range(N)]


def rbak(*args):
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300)


def backup(tmp_path, vhost, qtype="classic", bodies=BODIES, queue="q"):
    build_backup(storage_for(tmp_path), "b1", [(vhost, queue, qtype, make_records(vhost, queue, bodies, every_type=False))])


def restore(broker, tmp_path, protocol="amqp091", **restore_opts):
    """``rbak restore --config c.yaml --json``: (process, JSON summary or None)."""
    cfg = {"mode": "restore", "backup_id": "b1",
           "target": {"amqp_url": broker.server_url(), "management_url": broker.management_url},
           "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
           "restore": {"publish_mode": "queue", "protocol": protocol, **restore_opts}}
    path = tmp_path / "restore.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = rbak("restore", "--config", str(path), "--json")
    return r, (json.loads(r.stdout) if r.stdout.strip() else None)


def contents(broker, vhost, queue):
    """The queue's messages, in order (consumed: the test owns the vhost)."""
    return [m.body for m in broker.drain_queue(vhost, queue)]


# Every broker over AMQP 0-9-1, and the 4.x ones (native AMQP 1.0) over 1.0 too: pairs, not a skip.
BROKER_PROTOCOLS = pytest.mark.parametrize(
    ("broker", "protocol"),
    [("rmq310", "amqp091"), ("rmq40", "amqp091"), ("rmq40", "amqp10"), ("rmq43", "amqp091"), ("rmq43", "amqp10")],
    indirect=["broker"])


def put_policy(broker, vhost, name, definition, pattern="^q$", operator=False):
    kind = "operator-policies" if operator else "policies"
    broker.api("PUT", f"/api/{kind}/{quote(vhost, safe='')}/{name}",
               {"pattern": pattern, "definition": definition, "apply-to": "queues", "priority": 1})


def assert_refused(r, out, vhost, *parts):
    assert r.returncode == 1, (r.returncode, r.stderr)
    line = r.stderr.strip().splitlines()[-1]
    # refused before a summary: nothing was published; --json says so in one object (issue 45)
    assert out == {"ok": False, "exit_code": 1, "error": {"class": "RestoreError", "message": line.removeprefix("rbak: ")}}
    assert line.startswith(f"rbak: Restore error: queue 'q' in vhost '{vhost}' may drop, expire or dead-letter "
                           "restored messages: "), line
    for p in parts:
        assert p in line, (p, line)
    assert "Nothing was published" in line and "restore.allow_lossy_target: true" in line


def assert_reported(r, out, vhost, expected, found, *parts):
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert out["ok"] is False and out["confirmed"] == N
    (q,) = out["queues"]
    assert (q["status"], q["confirmed"], q["expected_depth"], q["found_depth"]) == ("failed", N, expected, found)
    assert q["error"].startswith(f"Restore error: queue 'q' in vhost '{vhost}' holds {found} message(s) after the "
                                 f"restore, expected {expected} (0 before + {N} confirmed): "
                                 f"{expected - found} restored message(s) are missing"), q["error"]
    for p in parts:
        assert any(p in s for s in q["lossy_settings"]), (p, q["lossy_settings"])
    return q


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
@BROKER_PROTOCOLS
def test_drop_head_max_length_argument(broker, vhost, tmp_path, qtype, protocol):
    """x-max-length 10, drop-head, 100 to restore: refused; allowed, the restore fails: 10 of 100 kept."""
    backup(tmp_path, vhost, qtype)
    declare(broker, vhost, "q", qtype, {"x-max-length": 10, "x-overflow": "drop-head"})
    r, out = restore(broker, tmp_path, protocol)
    assert_refused(r, out, vhost, "max-length 10 (queue argument x-max-length) leaves room for 10 of the 100 "
                   "message(s) to restore (it holds 0); with overflow drop-head (queue argument x-overflow) "
                   "the queue drops the oldest messages")
    assert broker.message_count(vhost, "q") == 0
    r, out = restore(broker, tmp_path, protocol, allow_lossy_target=True)
    q = assert_reported(r, out, vhost, N, 10, "max-length 10")
    assert q["protocol"] == protocol
    assert contents(broker, vhost, "q") == BODIES[-10:]


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
@BROKER_PROTOCOLS
def test_one_millisecond_message_ttl(broker, vhost, tmp_path, qtype, protocol):
    """x-message-ttl 1: refused; allowed, everything expires and the restore says so."""
    backup(tmp_path, vhost, qtype)
    declare(broker, vhost, "q", qtype, {"x-message-ttl": 1})
    r, out = restore(broker, tmp_path, protocol)
    assert_refused(r, out, vhost, "message-ttl 1 (queue argument x-message-ttl): restored messages not consumed "
                   "within 1 ms expire")
    r, out = restore(broker, tmp_path, protocol, allow_lossy_target=True)
    assert_reported(r, out, vhost, N, 0, "message-ttl 1")
    assert contents(broker, vhost, "q") == []


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_limits_set_by_policy_and_operator_policy(broker, vhost, tmp_path, qtype):
    """A policy's max-length and an operator policy's lower one: the effective (lower) one is named,
    whether or not the management API already shows the queue's effective policy."""
    backup(tmp_path, vhost, qtype)
    put_policy(broker, vhost, "lim", {"max-length": 50})
    put_policy(broker, vhost, "op-lim", {"max-length": 20}, operator=True)
    declare(broker, vhost, "q", qtype)
    r, out = restore(broker, tmp_path)
    assert_refused(r, out, vhost, "max-length 20 (operator policy 'op-lim') leaves room for 20 of the 100")
    r, out = restore(broker, tmp_path, allow_lossy_target=True)
    assert_reported(r, out, vhost, N, 20, "operator policy 'op-lim'")
    assert contents(broker, vhost, "q") == BODIES[-20:]


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_dead_lettering_target(broker, vhost, tmp_path, qtype):
    """max-length 10 by policy, dead-lettering to a queue: named as dead-lettering; allowed, the 90
    oldest end up in the dead-letter queue and the restore fails naming 10 of 100."""
    backup(tmp_path, vhost, qtype)
    declare(broker, vhost, "dlq", "classic")
    put_policy(broker, vhost, "dl", {"max-length": 10, "dead-letter-exchange": "", "dead-letter-routing-key": "dlq"})
    declare(broker, vhost, "q", qtype)
    r, out = restore(broker, tmp_path)
    assert_refused(r, out, vhost, "max-length 10 (policy 'dl')", "dead-lettered to exchange '' (policy 'dl')")
    r, out = restore(broker, tmp_path, allow_lossy_target=True)
    assert_reported(r, out, vhost, N, 10, "dead-lettered to exchange ''")
    assert contents(broker, vhost, "q") == BODIES[-10:]
    wait_until(lambda: broker.message_count(vhost, "dlq") == 90, what="90 dead-lettered messages")
    assert contents(broker, vhost, "dlq") == BODIES[:90]


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_reject_publish_is_refused_before_publishing(broker, vhost, tmp_path, qtype):
    """reject-publish: refused up front (before, the nack stopped it after 10); allowed, the nack still fails it."""
    backup(tmp_path, vhost, qtype)
    declare(broker, vhost, "q", qtype, {"x-max-length": 10, "x-overflow": "reject-publish"})
    r, out = restore(broker, tmp_path)
    assert_refused(r, out, vhost, "max-length 10 (queue argument x-max-length) leaves room for 10 of the 100",
                   "with overflow reject-publish (queue argument x-overflow) the queue rejects (nacks)")
    assert broker.message_count(vhost, "q") == 0
    r, out = restore(broker, tmp_path, allow_lossy_target=True)
    (q,) = out["queues"]
    if r.returncode == 0:  # a quorum queue takes what was in flight when it reached the limit (3.10.8: all 100)
        assert qtype == "quorum" and out["ok"] and (q["confirmed"], q["found_depth"]) == (N, N)
        assert contents(broker, vhost, "q") == BODIES
        return
    assert r.returncode == 1 and out["ok"] is False
    assert q["status"] == "failed" and "the broker rejected (nack) a message for" in q["error"], q["error"]
    assert q["confirmed"] < N
    assert contents(broker, vhost, "q")[:q["confirmed"]] == BODIES[:q["confirmed"]]


def test_max_length_bytes(broker, vhost, tmp_path):
    """max-length-bytes is judged on the bodies still to restore: 390 bytes fit in 390, not in 389."""
    backup(tmp_path, vhost)
    assert sum(map(len, BODIES)) == 390
    declare(broker, vhost, "q", "classic", {"x-max-length-bytes": 389})
    r, out = restore(broker, tmp_path)
    assert_refused(r, out, vhost, "max-length-bytes 389 (queue argument x-max-length-bytes) leaves room for 389 of "
                   "the 390 body bytes to restore")
    broker.delete_queue(vhost, "q")
    declare(broker, vhost, "q", "classic", {"x-max-length-bytes": 390})
    r, out = restore(broker, tmp_path)
    assert r.returncode == 0 and out["ok"], r.stderr
    assert contents(broker, vhost, "q") == BODIES


@BROKER_PROTOCOLS
def test_limits_with_room_are_not_lossy(broker, vhost, tmp_path, protocol):
    """A max-length with room for what it holds plus every restored message, a dead-letter exchange and
    a delivery limit alone: restored, and the depth check confirms it."""
    backup(tmp_path, vhost, "quorum")
    declare(broker, vhost, "q", "quorum", {"x-max-length": 105, "x-dead-letter-exchange": "dlx",
                                            "x-delivery-limit": 3})
    broker.publish(vhost, "q", [b"old-%d" % i for i in range(5)])
    r, out = restore(broker, tmp_path, protocol, allow_non_empty=True)
    assert r.returncode == 0, r.stderr
    (q,) = out["queues"]
    assert out["ok"] and (q["status"], q["confirmed"]) == ("restored", N)
    assert (q["initial_depth"], q["expected_depth"], q["found_depth"], q["lossy_settings"]) == (5, 105, 105, [])
    assert contents(broker, vhost, "q") == [b"old-%d" % i for i in range(5)] + BODIES


def test_expires_target_and_an_unknown_backlog(broker, vhost, tmp_path):
    """x-expires is refused; with the setting off, a plain queue restores and is verified."""
    backup(tmp_path, vhost)
    declare(broker, vhost, "q", "classic", {"x-expires": 3_600_000})
    r, out = restore(broker, tmp_path)
    assert_refused(r, out, vhost, "expires 3600000 (queue argument x-expires): the queue is deleted with every "
                   "message in it after 3600000 ms")
    broker.delete_queue(vhost, "q")
    declare(broker, vhost, "q", "classic")
    r, out = restore(broker, tmp_path)
    assert r.returncode == 0 and out["queues"][0]["found_depth"] == N
    assert contents(broker, vhost, "q") == BODIES


def test_queues_declared_by_the_definitions_import_are_judged_too(broker, vhost, vhost_factory, tmp_path):
    """A real backup with definitions: a capped queue holding what fits (not lossy) and a TTL queue. The
    restore declares both in a fresh vhost from the backup's definitions, then refuses before publishing,
    naming only the TTL queue; allowed, both are restored and verified, the TTL queue's setting listed."""
    from support.backups import backup_config

    from rbak.backup import BackupEngine

    declare(broker, vhost, "capped", "classic", {"x-max-length": 10})
    declare(broker, vhost, "ttl", "classic", {"x-message-ttl": 600_000})
    broker.publish(vhost, "capped", [b"c-%d" % i for i in range(15)])  # keeps the newest 10
    broker.publish(vhost, "ttl", [b"t-%d" % i for i in range(5)])
    summary = BackupEngine(backup_config(broker, vhost, tmp_path / "store", "b1", tmp_path / "state.db",
                                         include_definitions=True)).run()
    assert summary.completed
    target = vhost_factory(broker)
    r, out = restore(broker, tmp_path, restore_definitions=True, vhost_mapping={vhost: target})
    line = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and out["ok"] is False and "rbak: " + out["error"]["message"] == line, r.stderr
    assert set(out) == {"ok", "exit_code", "error"}  # refused before a summary: nothing was published
    assert line.startswith(f"rbak: Restore error: queue 'ttl' in vhost '{target}' may drop, expire or dead-letter "
                           "restored messages: message-ttl 600000 (queue argument x-message-ttl)"), line
    assert "capped" not in line
    assert (broker.message_count(target, "capped"), broker.message_count(target, "ttl")) == (0, 0)  # declared, empty
    r, out = restore(broker, tmp_path, restore_definitions=True, vhost_mapping={vhost: target}, allow_lossy_target=True)
    assert r.returncode == 0 and out["ok"], r.stderr
    by = {q["target_queue"]: q for q in out["queues"]}
    assert (by["capped"]["status"], by["capped"]["expected_depth"], by["capped"]["found_depth"]) == ("restored", 10, 10)
    assert by["capped"]["lossy_settings"] == []
    assert (by["ttl"]["status"], by["ttl"]["found_depth"]) == ("restored", 5)
    assert by["ttl"]["lossy_settings"][0].startswith("message-ttl 600000 (queue argument x-message-ttl)")
    assert contents(broker, target, "capped") == [b"c-%d" % i for i in range(5, 15)]
    assert contents(broker, target, "ttl") == [b"t-%d" % i for i in range(5)]


def test_a_target_with_a_consumer_is_not_depth_checked_and_says_so(broker, vhost, tmp_path):
    """A consumer takes messages while the restore runs, so the depth proves nothing: the summary says why
    it was not checked, instead of failing or claiming it was verified."""
    backup(tmp_path, vhost)
    declare(broker, vhost, "q", "classic")
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        ch.basic_consume("q", lambda *a: None)  # attached, holds one unacked message, never acks
        r, out = restore(broker, tmp_path)
        assert r.returncode == 0 and out["ok"], r.stderr
        (q,) = out["queues"]
        assert (q["status"], q["confirmed"], q["found_depth"]) == ("restored", N, None)
        assert q["depth_check"] == "not checked: 1 consumer(s) attached to the target"
    assert contents(broker, vhost, "q") == BODIES  # the unacked one went back at the head


def test_a_rerun_with_the_checkpoint_reports_the_loss_again(broker, vhost, tmp_path):
    """The checkpoint does not mark a queue whose depth check failed as done: resuming publishes nothing
    more (every record was confirmed) and fails again with the same numbers, never ``already-done``."""
    from support.restores import options_for

    from rbak.restore import run_restore

    backup(tmp_path, vhost)
    declare(broker, vhost, "q", "classic", {"x-max-length": 10})
    opts = options_for(broker, "b1", allow_lossy_target=True, checkpoint_state=str(tmp_path / "cp.db"))
    for _ in range(2):
        s = run_restore(storage_for(tmp_path), opts)
        (q,) = s.queues
        assert not s.ok and (q.status, q.confirmed, q.expected_depth, q.found_depth) == ("failed", N, N, 10)
    assert q.published == 0 and q.resumed_from is not None
    assert contents(broker, vhost, "q") == BODIES[-10:]
