"""The pure half of the lossy-target check (rbak.restore.target_limits): how arguments, policies and
operator policies combine, and where the line between "keeps everything" and "may lose" is."""

from __future__ import annotations

from rbak.restore.target_limits import effective_limits, lossy_reasons, matching_definition, policy_applies


def limits(args=None, pol=None, op=None, qtype="classic"):
    return effective_limits(qtype, args or {}, pol or {}, "p", op or {}, "op")


def test_numeric_limits_take_the_lowest_and_name_where_it_comes_from():
    lim = limits({"x-max-length": 30}, {"max-length": 20, "message-ttl": 5000}, {"max-length": 25, "message-ttl": 100})
    assert (lim.get("max-length").value, lim.get("max-length").source) == (20, "policy 'p'")
    assert (lim.get("message-ttl").value, lim.get("message-ttl").source) == (100, "operator policy 'op'")


def test_overflow_and_dead_lettering_come_from_the_argument_first():
    lim = limits({"x-overflow": "drop-head"}, {"overflow": "reject-publish", "dead-letter-exchange": "dlx"})
    assert lim.get("overflow").value == "drop-head" and lim.get("overflow").source == "queue argument x-overflow"
    assert lim.get("dead-letter-exchange").source == "policy 'p'"


def test_room_is_judged_exactly():
    lim = limits({"x-max-length": 10})
    assert lossy_reasons(lim, depth=4, incoming=6, depth_bytes=0) == []
    (r,) = lossy_reasons(lim, depth=4, incoming=7, depth_bytes=0)
    assert r.startswith("max-length 10 (queue argument x-max-length) leaves room for 6 of the 7 message(s)")
    assert "overflow drop-head (the default)" in r
    # the bound is refined by the exact count (a PITR window) before refusing
    assert lossy_reasons(lim, depth=4, incoming=7, depth_bytes=0, exact_incoming=lambda: 6) == []
    b = limits({"x-max-length-bytes": 100})
    assert lossy_reasons(b, 1, 1, depth_bytes=40, incoming_bytes=lambda: 60) == []
    assert lossy_reasons(b, 1, 1, depth_bytes=41, incoming_bytes=lambda: 60)[0].startswith(
        "max-length-bytes 100 (queue argument x-max-length-bytes) leaves room for 59 of the 60 body bytes")
    assert "unknown total size" in lossy_reasons(b, 1, 1, depth_bytes=None)[0]


def test_ttl_and_expires_always_count_dead_lettering_and_delivery_limit_alone_never():
    assert len(lossy_reasons(limits({"x-message-ttl": 86_400_000, "x-expires": 10}), 0, 1, 0)) == 2
    assert lossy_reasons(limits({"x-dead-letter-exchange": "d", "x-delivery-limit": 1}), 0, 10**6, 0) == []
    assert lossy_reasons(limits({"x-message-ttl": 1}, qtype="stream"), 0, 1, 0) == []  # streams are not judged


def test_policy_matching_as_the_broker_does():
    pols = [{"name": "low", "pattern": "^q", "apply-to": "queues", "priority": 0, "definition": {"max-length": 5}},
            {"name": "high", "pattern": "^q$", "apply-to": "all", "priority": 2, "definition": {"message-ttl": 9}},
            {"name": "tie", "pattern": "q", "apply-to": "quorum_queues", "priority": 2, "definition": {"message-ttl": 3}},
            {"name": "ex", "pattern": "^q$", "apply-to": "exchanges", "priority": 9, "definition": {"max-length": 1}}]
    assert matching_definition(pols, "q", "classic") == ({"message-ttl": 9}, "high")
    assert matching_definition(pols, "q", "quorum") == ({"message-ttl": 3}, "high / tie")  # a tie: the stricter
    assert matching_definition(pols, "qq", "classic") == ({"max-length": 5}, "low")
    assert matching_definition(pols, "other", "classic") == ({}, "")
    assert policy_applies({"pattern": "(", "apply-to": "queues"}, "q", "classic")  # unreadable: assume it applies
