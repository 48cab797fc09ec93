"""A backup never pushes a quorum message past its delivery limit.

3.10 and 4.0 count every return, so the delivery guard refuses in time; 4.3 returns by
basic.nack, which counts nothing, so every backup of the same queue succeeds."""

from __future__ import annotations

import pytest

from rbak.backup import BackupEngine, BackupError

from support.backups import backup_config, drain, fast_publish, load


def test_repeated_backups_never_drop_messages(broker, vhost, tmp_path):
    bodies = [b"lim-%03d" % i for i in range(100)]
    fast_publish(broker, vhost, "limited", bodies, declare={"x-queue-type": "quorum", "x-delivery-limit": 2})
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
    # backup 1 leaves x-delivery-count 1, backup 2 leaves 2 (= the limit): a third would drop them
    assert [o[0] for o in outcomes] == ["ok", "ok", "refused", "refused", "refused"]
    err = outcomes[2][1]
    assert "1 of 2 queue(s) failed" in err and f"{vhost}/limited" in err
    assert "delivery limit is 2" in err and "x-delivery-count 2" in err and "message #1" in err
    # the other queue of the same run was backed up; the manifest says partial, naming the refused queue
    m = load(store, "b2")
    assert m.state == "partial" and m.find_queue(vhost, "free").message_count == 100
    assert [(s.name, s.status) for s in m.queue_status] == [("limited", "refused")]
    assert "delivery limit is 2" in m.queue_status[0].reason and m.find_queue(vhost, "limited") is None
    got = drain(broker, vhost, "limited")
    assert [x[0] for x in got] == bodies
    assert {(x[1].headers or {}).get("x-delivery-count") for x in got} == {2}


def test_guard_survives_a_new_machine(broker, vhost, tmp_path):
    """The refusal does not depend on the local state file: a new machine reads it from storage."""
    fast_publish(broker, vhost, "lim", [b"x"] * 10, declare={"x-queue-type": "quorum", "x-delivery-limit": 1})
    store = tmp_path / "store"
    BackupEngine(backup_config(broker, vhost, store, "g1", tmp_path / "a.db")).run()
    if broker.name == "rmq43":  # nack returns count nothing: the next backup is fine
        BackupEngine(backup_config(broker, vhost, store, "g2", tmp_path / "fresh.db")).run()
    else:
        with pytest.raises(BackupError, match="delivery limit is 1"):
            BackupEngine(backup_config(broker, vhost, store, "g2", tmp_path / "fresh.db")).run()
    assert broker.message_count(vhost, "lim") == 10
    assert [x[0] for x in drain(broker, vhost, "lim")] == [b"x"] * 10
