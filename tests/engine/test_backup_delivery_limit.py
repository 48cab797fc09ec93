"""A backup never uses the last ``delivery_limit_margin`` deliveries of a quorum message's budget.

3.10 and 4.0 count every return, so the delivery guard refuses in time (a backup never leaves a
message at ``limit - margin``); 4.3 returns by basic.nack, which counts nothing, so every backup
of the same queue succeeds. Measured per return in benchmarks/return_costs.py."""

from __future__ import annotations

import pytest

from rbak.backup import BackupEngine

from support.backups import backup_config, drain, fast_publish, load
from rbak.errors import BackupError


def test_repeated_backups_never_drop_messages(broker, vhost, tmp_path):
    bodies = [b"lim-%03d" % i for i in range(100)]
    fast_publish(broker, vhost, "limited", bodies, declare={"x-queue-type": "quorum", "x-delivery-limit": 4})
    fast_publish(broker, vhost, "free", bodies, declare={})
    store, state = tmp_path / "store", tmp_path / "st.db"
    outcomes = []
    for i in range(5):
        try:
            s = BackupEngine(backup_config(broker, vhost, store, f"b{i}", state)).run()
            outcomes.append(("ok", s.total_messages))
        except BackupError as e:
            outcomes.append(("refused", str(e)))
        assert broker.message_count(vhost, "limited") == 100, (i, outcomes)  # nothing dropped, ever
    if broker.name == "rmq43":  # nack returns: nothing counted, nothing refused
        assert [o[0] for o in outcomes] == ["ok"] * 5
        got = drain(broker, vhost, "limited")
        assert [x[0] for x in got] == bodies
        assert {(x[1].headers or {}).get("x-delivery-count", 0) for x in got} == {0}
        return
    # backup 1 leaves x-delivery-count 1, backup 2 leaves 2; a third would leave 3 = limit 4 - margin 1
    assert [o[0] for o in outcomes] == ["ok", "ok", "refused", "refused", "refused"]
    err = outcomes[2][1]
    assert "1 of 2 queue(s) failed" in err and f"{vhost}/limited" in err
    assert "delivery limit is 4" in err and "delivery_limit_margin is 1" in err and "message #1" in err
    assert "x-delivery-count 2" in err and "x-delivery-count 3 or more" in err
    # the other queue of the same run was backed up; the manifest says partial, naming the refused queue
    m = load(store, "b2")
    assert m.state == "partial" and m.find_queue(vhost, "free").message_count == 100
    assert [(s.name, s.status) for s in m.queue_status] == [("limited", "refused")]
    assert "delivery limit is 4" in m.queue_status[0].reason and m.find_queue(vhost, "limited") is None
    got = drain(broker, vhost, "limited")
    assert [x[0] for x in got] == bodies
    assert {(x[1].headers or {}).get("x-delivery-count") for x in got} == {2}


def test_guard_survives_a_new_machine(broker, vhost, tmp_path):
    """The refusal does not depend on the local state file: a new machine reads it from storage."""
    fast_publish(broker, vhost, "lim", [b"x"] * 10, declare={"x-queue-type": "quorum", "x-delivery-limit": 3})
    store = tmp_path / "store"
    BackupEngine(backup_config(broker, vhost, store, "g1", tmp_path / "a.db")).run()
    if broker.name == "rmq43":  # nack returns count nothing: the next backup is fine
        BackupEngine(backup_config(broker, vhost, store, "g2", tmp_path / "fresh.db")).run()
    else:
        with pytest.raises(BackupError, match="delivery limit is 3"):
            BackupEngine(backup_config(broker, vhost, store, "g2", tmp_path / "fresh.db")).run()
    assert broker.message_count(vhost, "lim") == 10
    assert [x[0] for x in drain(broker, vhost, "lim")] == [b"x"] * 10


def test_default_limit_25_nightly_backups_then_one_failure(broker, vhost, tmp_path):
    """Issue 27 scenario 3: an ordinary quorum queue (no x-delivery-limit, no policy), 100 messages,
    25 nightly backups, then ONE failed delivery by the application (a consumer that takes
    everything unacked and closes its channel). 4.0.5 applies its default limit of 20 and counts
    every return: backups 1-18 pass, 19-25 are refused (18 + 1 would reach 20 - margin 1), and the
    application's failure leaves all 100 at 19. 4.3.6 (nack returns) and 3.10.8 (no default
    limit) pass all 25; nothing is ever lost."""
    bodies = [b"n-%03d" % i for i in range(100)]
    fast_publish(broker, vhost, "nightly", bodies, declare={"x-queue-type": "quorum"})
    store, state = tmp_path / "store", tmp_path / "st.db"
    outcomes = []
    for i in range(25):
        try:
            BackupEngine(backup_config(broker, vhost, store, f"n{i:02d}", state)).run()
            outcomes.append("ok")
        except BackupError as e:
            outcomes.append(str(e))
    assert broker.message_count(vhost, "nightly") == 100
    if broker.name == "rmq40":
        assert outcomes[:18] == ["ok"] * 18 and all(o != "ok" for o in outcomes[18:]), outcomes
        err = outcomes[18]
        assert f"{vhost}/nightly" in err and "refused before reading" in err
        assert "delivery limit is 20" in err and "delivery_limit_margin is 1" in err
        assert "x-delivery-count 18" in err and "x-delivery-count 19 or more" in err
        m = load(store, "n18")
        assert [(s.name, s.status) for s in m.queue_status] == [("nightly", "refused")]
        expect_after = 19
    else:
        assert outcomes == ["ok"] * 25
        expect_after = 1 if broker.name == "rmq43" else 26
    # the application fails once: takes everything unacked, closes its channel
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=200)
        taken = 0
        for method, _p, _b in ch.consume("nightly", auto_ack=False, inactivity_timeout=5):
            if method is None:
                break
            taken += 1
            if taken == 100:
                break
        assert taken == 100
        ch.close()
    assert broker.message_count(vhost, "nightly") == 100  # nothing dropped, nothing dead-lettered
    got = drain(broker, vhost, "nightly")
    assert [x[0] for x in got] == bodies
    assert {(x[1].headers or {}).get("x-delivery-count") for x in got} == {expect_after}
