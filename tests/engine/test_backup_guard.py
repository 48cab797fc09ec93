"""Issue 13: a backup never destroys what it backs up (all three brokers, real outcomes).

Every test ends by checking the source's exact content: a passive declare count, then a
drain comparing bodies in order. On 4.3 quorum messages go back by basic.nack, which
counts no delivery (measured in test_nack_on_43_leaves_no_delivery_count); on 3.10 and
4.0 every return counts, so the delivery guard is what protects the messages.
"""

from __future__ import annotations

import json
import time

import pika
import pytest

from rbak.backup import BackupEngine
from rbak.format.layout import guard_key
from rbak.storage import open_storage

from support.backups import backup_config, drain, fast_publish, load, records
from rbak.errors import BackupError


def nack_returns(broker) -> bool:
    """Whether this broker returns a nacked quorum message without counting it (4.3+)."""
    return broker.name == "rmq43"


def assert_source(broker, vhost: str, queue: str, bodies: list[bytes]) -> list:
    """The queue holds exactly ``bodies``, in that order (passive declare, then a drain)."""
    assert broker.message_count(vhost, queue) == len(bodies), queue
    got = drain(broker, vhost, queue)
    assert [x[0] for x in got] == bodies, queue
    return got


def run(broker, vhost, store, backup_id, state, **kw):
    """One backup: ("ok", summary) or ("refused", error text)."""
    try:
        return "ok", BackupEngine(backup_config(broker, vhost, store, backup_id, state, **kw)).run()
    except BackupError as e:
        return "refused", str(e)


def test_five_runs_then_fresh_dir_and_new_storage(broker, vhost, tmp_path):
    """Issue 13 scenario 1: x-delivery-limit 5, 100 messages, 5 runs from one directory, then
    new pods: the stored guard refuses; a new storage loses nothing (< 4.3): the read stops at the
    head message, which goes back one below the limit (issue 27: the margin keeps that delivery)."""
    bodies = [b"s1-%03d" % i for i in range(100)]
    fast_publish(broker, vhost, "lim5", bodies, declare={"x-queue-type": "quorum", "x-delivery-limit": 5})
    store, state = tmp_path / "store", tmp_path / "st.db"
    outcomes = [run(broker, vhost, store, f"r{i}", state)[0] for i in range(5)]
    # < 4.3: runs 1-3 leave x-delivery-count 3; a 4th would leave 4 = limit 5 - margin 1
    assert outcomes == ["ok"] * 5 if nack_returns(broker) else ["ok"] * 3 + ["refused"] * 2
    assert broker.message_count(vhost, "lim5") == 100
    # a new pod (fresh working dir), same storage, new backup id: the guard beside the backups
    kind, out = run(broker, vhost, store, "pod2", tmp_path / "fresh1.db")
    if nack_returns(broker):
        assert kind == "ok" and out.total_messages == 100
    else:
        assert kind == "refused" and "refused before reading" in out and "delivery limit is 5" in out
        assert "x-delivery-count 3" in out
    assert broker.message_count(vhost, "lim5") == 100
    # a new laptop: fresh dir AND a new storage (nothing known about earlier backups)
    kind, out = run(broker, vhost, tmp_path / "store2", "laptop", tmp_path / "fresh2.db")
    if nack_returns(broker):
        assert kind == "ok"
        got = assert_source(broker, vhost, "lim5", bodies)
        assert {(x[1].headers or {}).get("x-delivery-count", 0) for x in got} == {0}
        return
    # the head message was at 3: the read took it alone (window of 1) and stopped; its return left
    # it at 4, within the limit; the other 99 were never taken
    assert kind == "refused" and "message #1" in out and "goes back at x-delivery-count 4" in out, out
    kind, out = run(broker, vhost, tmp_path / "store2", "laptop2", tmp_path / "fresh3.db")
    assert kind == "refused" and "refused before reading" in out  # that storage knows now
    # nothing lost. The one message taken went back behind the other 99: they sit in rabbit_fifo's
    # returns queue since the earlier backups, and a return joins its tail (every version, measured;
    # docs/backup.md "When a read stops early"). A store with the guard never takes it.
    got = assert_source(broker, vhost, "lim5", bodies[1:] + bodies[:1])
    assert [(x[1].headers or {}).get("x-delivery-count") for x in got] == [3] * 99 + [4]


@pytest.mark.parametrize("kind", ["policy", "operator-policy"])
def test_limit_from_policy_declared_right_after(broker, vhost, tmp_path, kind):
    """Issue 13 scenario 2: {"delivery-limit": 3} by (operator) policy, the queue declared right after."""
    path = "policies" if kind == "policy" else "operator-policies"
    broker.api("PUT", f"/api/{path}/{vhost}/lim2", json={
        "pattern": "^pol", "definition": {"delivery-limit": 3}, "apply-to": "queues", "priority": 1})
    if kind == "operator-policy":  # a laxer user policy: the operator's stricter value wins
        broker.api("PUT", f"/api/policies/{vhost}/lax", json={
            "pattern": "^pol", "definition": {"delivery-limit": 50}, "apply-to": "queues"})
    bodies = [b"p-%02d" % i for i in range(30)]
    fast_publish(broker, vhost, "polq", bodies, declare={"x-queue-type": "quorum"})
    store = tmp_path / "store"
    outcomes = []
    for i in range(3):
        kind_, out = run(broker, vhost, store, f"p{i}", tmp_path / "st.db")
        outcomes.append(kind_)
        assert broker.message_count(vhost, "polq") == 30
    s = open_storage(str(store))
    guard = json.loads(s.get(guard_key("", load(store, "p0").source_cluster, vhost, "polq")))
    assert guard["delivery_limit"] == 3
    if nack_returns(broker):
        assert outcomes == ["ok", "ok", "ok"]
    else:  # run 1 leaves 1; run 2 would leave 2 = limit 3 - margin 1
        assert outcomes == ["ok", "refused", "refused"]
        assert "delivery limit is 3" in out
    assert_source(broker, vhost, "polq", bodies)


def test_auto_delete_queue_is_never_deleted(broker, vhost, tmp_path):
    """Issue 13 scenario 3: an auto-delete queue that never had a consumer survives a backup, in order."""
    bodies = [b"ad-%02d" % i for i in range(50)]
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        try:
            ch.queue_declare("ad", durable=False, auto_delete=True)
        except pika.exceptions.ChannelClosedByBroker:  # 4.3 refuses transient non-exclusive queues
            ch = conn.channel()
            ch.queue_declare("ad", durable=True, auto_delete=True)
    fast_publish(broker, vhost, "ad", bodies)
    kind, s = run(broker, vhost, tmp_path / "store", "ad", tmp_path / "st.db")
    assert kind == "ok" and s.completed
    assert [r.body for r in records(tmp_path / "store", load(tmp_path / "store", "ad"), vhost, "ad")] == bodies
    assert broker.queue_info(vhost, "ad") is not None
    # drain with a consumer: the queue is deleted once it goes, as it would be for its own consumers
    assert broker.message_count(vhost, "ad") == 50
    assert [x[0] for x in drain(broker, vhost, "ad")] == bodies


def test_exclusive_queue_is_skipped_and_noted(broker, vhost, tmp_path):
    bodies = [b"ex-%02d" % i for i in range(10)]
    fast_publish(broker, vhost, "plain", bodies, declare={})
    with broker.connect(vhost) as owner:
        ch = owner.channel()
        ch.queue_declare("excl", exclusive=True)
        ch.confirm_delivery()
        for b in bodies:
            ch.basic_publish("", "excl", b)
        kind, s = run(broker, vhost, tmp_path / "store", "ex", tmp_path / "st.db")
        assert kind == "ok" and s.completed, s
        m = load(tmp_path / "store", "ex")
        assert m.completed_at is not None and m.find_queue(vhost, "plain").message_count == 10
        skipped = [x for x in m.queue_status if x.status == "skipped"]
        assert [(x.vhost, x.name) for x in skipped] == [(vhost, "excl")]
        assert "exclusive" in skipped[0].reason and not m.is_partial
        assert {q.name: q.status for q in s.queues} == {"plain": "done", "excl": "skipped"}
        assert ch.queue_declare("excl", passive=True).method.message_count == 10
        got = []
        for method, _p, body in ch.consume("excl", auto_ack=True, inactivity_timeout=1):
            if method is None:
                break
            got.append(body)
        assert got == bodies
    assert_source(broker, vhost, "plain", bodies)


@pytest.mark.parametrize("dlx", [True, False])
def test_delivery_limit_with_and_without_dead_letter_exchange(broker, vhost, tmp_path, dlx):
    bodies = [b"dl-%02d" % i for i in range(20)]
    args = {"x-queue-type": "quorum", "x-delivery-limit": 1}
    if dlx:
        fast_publish(broker, vhost, "dead", [], declare={})
        args |= {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    fast_publish(broker, vhost, "lim1", bodies, declare=args)
    got = [run(broker, vhost, tmp_path / "store", f"d{i}", tmp_path / "st.db") for i in range(3)]
    outcomes = [g[0] for g in got]
    # < 4.3: limit 1 - margin 1 = 0: even the first return would use the application's budget, so
    # every backup is refused before taking anything
    assert outcomes == (["ok"] * 3 if nack_returns(broker) else ["refused"] * 3)
    if not nack_returns(broker):
        assert "refused before reading" in got[0][1] and "even a message never delivered before" in got[0][1]
    assert_source(broker, vhost, "lim1", bodies)
    if dlx:
        assert broker.message_count(vhost, "dead") == 0  # nothing was dead-lettered


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_live_consumer(broker, vhost, tmp_path, qtype):
    """A consumer holding a message: skipped on request (order untouched), read by default."""
    bodies = [b"lc-%02d" % i for i in range(20)]
    fast_publish(broker, vhost, "live", bodies, declare={"x-queue-type": qtype})
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        held = []
        ch.basic_consume("live", lambda c, m, p, b: held.append(b))
        while not held:
            conn.process_data_events(0.1)
        kind, s = run(broker, vhost, tmp_path / "store", "skip", tmp_path / "st.db", skip_queues_with_consumers=True)
        assert kind == "ok" and s.completed
        m = load(tmp_path / "store", "skip")
        assert m.find_queue(vhost, "live") is None
        skipped = [x for x in m.queue_status if x.status == "skipped"]
        assert [x.name for x in skipped] == ["live"] and "consumer" in skipped[0].reason
        kind, s = run(broker, vhost, tmp_path / "store", "read", tmp_path / "st.db")
        assert kind == "ok" and s.completed
        # the held message is not in the queue's depth, so not in the backup
        assert [r.body for r in records(tmp_path / "store", load(tmp_path / "store", "read"), vhost, "live")] == \
            bodies[1:]
        assert held == bodies[:1]
    if qtype == "classic":
        assert_source(broker, vhost, "live", bodies)
    else:
        # quorum: returned messages queue up in the order they come back; the consumer's
        # message came back after the backup's (docs/backup.md, "Live consumers")
        assert broker.message_count(vhost, "live") == 20
        assert [x[0] for x in drain(broker, vhost, "live")] == bodies[1:] + bodies[:1]


def test_six_of_six_on_43(rmq43, vhost_factory, tmp_path):
    """Issue 17: 6 of 6 consecutive backups of an x-delivery-limit 3 quorum queue on 4.3, nothing counted."""
    vhost = vhost_factory(rmq43)
    bodies = [b"six-%03d" % i for i in range(200)]
    fast_publish(rmq43, vhost, "q3", bodies, declare={"x-queue-type": "quorum", "x-delivery-limit": 3})
    for i in range(6):
        kind, s = run(rmq43, vhost, tmp_path / "store", f"six{i}", tmp_path / "st.db")
        assert kind == "ok" and s.completed and s.total_messages == 200, (i, s)
        assert [r.body for r in records(tmp_path / "store", load(tmp_path / "store", f"six{i}"), vhost, "q3")] == \
            bodies
        assert rmq43.message_count(vhost, "q3") == 200
    got = assert_source(rmq43, vhost, "q3", bodies)
    assert {(x[1].headers or {}).get("x-delivery-count", 0) for x in got} == {0}
    assert {(x[1].headers or {}).get("x-acquired-count") for x in got} == {6}  # what consumers still see


@pytest.mark.parametrize("where", ["argument", "policy"])
@pytest.mark.parametrize("retry", ["returned", "all", "failed"])
def test_delayed_retry_on_43(rmq43, vhost_factory, tmp_path, retry, where):
    """4.3 delayed retries: a return the setting would delay is refused before anything is taken."""
    vhost = vhost_factory(rmq43)
    args = {"x-queue-type": "quorum"}
    if where == "argument":
        args |= {"x-delayed-retry-type": retry, "x-delayed-retry-min": 60000, "x-delayed-retry-max": 60000}
    else:
        rmq43.api("PUT", f"/api/policies/{vhost}/retry", json={
            "pattern": "^dr", "apply-to": "queues",
            "definition": {"delayed-retry-type": retry, "delayed-retry-min": 60000, "delayed-retry-max": 60000}})
    bodies = [b"dr-%02d" % i for i in range(20)]
    fast_publish(rmq43, vhost, "drq", bodies, declare=args)
    kind, out = run(rmq43, vhost, tmp_path / "store", "dr", tmp_path / "st.db")
    if retry == "failed":  # nack is a plain return: not delayed
        assert kind == "ok" and out.total_messages == 20
    else:
        assert kind == "refused" and "drq" in out and f"delayed-retry-type {retry!r}" in out
        assert ("policy 'retry'" if where == "policy" else "x-delayed-retry-type") in out
    # nothing delayed: every message is deliverable right now, in order
    assert_source(rmq43, vhost, "drq", bodies)


def test_consumer_timeout_on_43(rmq43, vhost_factory, tmp_path):
    """4.3 cancels a consumer whose message outlives x-consumer-timeout (no channel close) and returns
    its messages: the backup's own consumer timeout prevents it; nothing is lost, delayed or reordered."""
    vhost = vhost_factory(rmq43)
    bodies = [b"ct-%02d" % i for i in range(30)]
    fast_publish(rmq43, vhost, "ctq", bodies, declare={"x-queue-type": "quorum", "x-consumer-timeout": 1000})

    def stall(n: int) -> None:
        if n == 3:  # 4.3 evaluates consumer timeouts on a timer: measured 1-5 s after the timeout here
            time.sleep(10)

    cfg = backup_config(rmq43, vhost, tmp_path / "store", "ct", tmp_path / "st.db")
    # The backup's consumers carry their own x-consumer-timeout (it overrides the queue's): the broker's
    # timer never takes messages back early, so the read completes. Before, it cancelled the consumer and
    # returned the timed-out messages ahead of the rest about 1 run in 7 (ct-00 came back behind ct-04).
    s = BackupEngine(cfg, throttle=stall).run()
    assert [r.body for r in records(tmp_path / "store", load(tmp_path / "store", "ct"), vhost, "ctq")] == bodies
    assert s.completed
    # nothing lost, counted, delayed or reordered
    got = assert_source(rmq43, vhost, "ctq", bodies)
    assert {(x[1].headers or {}).get("x-delivery-count", 0) for x in got} == {0}


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_single_active_consumer_queue_skipped_up_front(broker, vhost, tmp_path, qtype):
    """Issue 27: a single-active-consumer queue with an application consumer attached cannot be read
    (the broker delivers only to the active consumer). It is skipped before anything is taken, with a
    note saying why, instead of waiting out read_timeout_secs for an error that never said why."""
    bodies = [b"sac-%02d" % i for i in range(20)]
    fast_publish(broker, vhost, "sac", bodies, declare={"x-queue-type": qtype, "x-single-active-consumer": True})
    fast_publish(broker, vhost, "plain", bodies, declare={})
    read_timeout = 60.0
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        held = []
        ch.basic_consume("sac", lambda c, m, p, b: held.append(b))
        while not held:
            conn.process_data_events(0.1)
        started = time.monotonic()
        kind, s = run(broker, vhost, tmp_path / "store", "sac", tmp_path / "st.db", read_timeout_secs=read_timeout)
        took = time.monotonic() - started
        assert kind == "ok" and s.completed, s
        # decided before reading: far from the read timeout (the management API's arguments of a fresh
        # queue may take a few seconds; the wait for them is bounded at 15 s)
        assert took < read_timeout / 2, took
        m = load(tmp_path / "store", "sac")
        assert m.find_queue(vhost, "sac") is None and m.find_queue(vhost, "plain").message_count == 20
        skipped = [x for x in m.queue_status if x.status == "skipped"]
        assert [x.name for x in skipped] == ["sac"]
        assert "single active consumer" in skipped[0].reason and "1 consumer(s)" in skipped[0].reason
        assert {q.name: q.status for q in s.queues}["sac"] == "skipped"
        assert "single active consumer" in next(q.error for q in s.queues if q.name == "sac")
        conn.process_data_events(0.1)
    # the application's consumer went away (its held message went back): now the backup reads it
    kind, s = run(broker, vhost, tmp_path / "store", "sac2", tmp_path / "st.db")
    assert kind == "ok" and s.completed, s
    assert [r.body for r in records(tmp_path / "store", load(tmp_path / "store", "sac2"), vhost, "sac")] == bodies
    assert_source(broker, vhost, "sac", bodies)
