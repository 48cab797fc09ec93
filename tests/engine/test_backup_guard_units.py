"""Pure decisions of the backup guard: limits as RabbitMQ resolves them, windows, guard merging."""

from __future__ import annotations

import pytest

from rbak.backup.checkpoint import Guard
from rbak.backup.guard_store import GuardStore, merge
from rbak.backup.limits import (matching_policies, refuse_delayed_retry, resolve_delayed_retry,
                                resolve_delivery_limit, resolve_settings)
from rbak.backup.management import QueueInfo
from rbak.backup.preflight import PolicyCache, quorum_settings
from rbak.backup.queue_reader import NEAR_LIMIT_WINDOW, QUORUM_PREFETCH, next_window
from rbak.errors import ManagementApiError, QueueRefused, StorageError
from rbak.storage import open_storage


def pol(name, definition, pattern=".*", priority=0, apply_to="all"):
    return {"name": name, "pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to}


@pytest.mark.parametrize("version,arg,policy,op,expected", [
    ("3.10.8", None, None, None, None),  # 3.x: no default
    ("4.0.5", None, None, None, 20),  # 4.x default
    ("4.3.6", None, None, None, 20),
    ("3.10.8", 5, 3, None, 3),  # the stricter wins
    ("4.0.5", 5, None, 2, 2),  # operator policy
    ("4.0.5", None, 10, 4, 4),  # policy vs operator policy: min
    ("4.0.5", -1, None, None, None),  # negative: unlimited on 4.x
    ("4.0.5", -1, 7, None, 7),  # 4.x: a negative argument does not beat a limited policy
    ("4.0.5", None, -1, 6, 6),
    ("3.10.8", None, 2, None, 2),
])
def test_resolve_delivery_limit(version, arg, policy, op, expected):
    args = {} if arg is None else {"x-delivery-limit": arg}
    pols = [] if policy is None else [pol("p", {"delivery-limit": policy})]
    ops = [] if op is None else [pol("o", {"delivery-limit": op})]
    assert resolve_delivery_limit(args, pols, ops, version).value == expected


def test_policy_matching_priority_apply_to_and_ties():
    ps = [pol("low", {"delivery-limit": 1}, "^q", 0), pol("high", {"delivery-limit": 9}, "^q", 5),
          pol("classic", {"delivery-limit": 0}, "^q", 9, "classic_queues"),
          pol("other", {"delivery-limit": 0}, "^zz", 99)]
    assert [p["name"] for p in matching_policies(ps, "q1", "quorum")] == ["high"]
    tied = ps + [pol("tie", {"delivery-limit": 3}, "q", 5)]
    s = resolve_settings({}, "q1", "quorum", tied, [], "4.0.5")
    assert s.delivery_limit.value == 3 and "tie" in s.delivery_limit.source
    # what the management API reports is added (it can only make the limit stricter)
    s = resolve_settings({}, "q1", "quorum", ps, [], "4.0.5", reported_policy="low")
    assert s.delivery_limit.value == 1


def test_delayed_retry_resolution_and_refusal():
    assert resolve_delayed_retry({"x-delayed-retry-type": "all"}, [], []) is None  # no min: disabled
    r = resolve_delayed_retry({"x-delayed-retry-type": "failed", "x-delayed-retry-min": 10}, [], [])
    assert r.value == "failed"
    r = resolve_delayed_retry({"x-delayed-retry-type": "failed", "x-delayed-retry-min": 10},
                              [pol("p", {"delayed-retry-type": "returned"})], [])
    assert r.value == "returned" and "policy 'p'" in r.source  # the policy has precedence
    assert refuse_delayed_retry(r, nack_return=True)
    assert refuse_delayed_retry(r, nack_return=False) is None
    failed = resolve_delayed_retry({"x-delayed-retry-type": "failed", "x-delayed-retry-min": 10}, [], [])
    assert refuse_delayed_retry(failed, nack_return=True) is None and refuse_delayed_retry(failed, False)
    # delayed retries exist from 4.3 on
    args = {"x-delayed-retry-type": "all", "x-delayed-retry-min": 10}
    assert resolve_settings(args, "q", "quorum", [], [], "4.0.5").delayed_retry is None
    assert resolve_settings(args, "q", "quorum", [], [], "4.3.6").delayed_retry.value == "all"


def test_windows_start_at_one_and_stay_small_near_the_limit():
    assert next_window(0, 0, None, 100_000, 0) == QUORUM_PREFETCH
    assert next_window(0, 0, 5, 100, 0) == 1
    assert next_window(1, 0, 5, 100, 1) == 4 and next_window(4, 0, 5, 100, 2) == 16
    assert next_window(64, 4, 5, 1000, 4) == NEAR_LIMIT_WINDOW  # a message seen will be at its limit
    assert next_window(1, 4, 5, 100, 4) == 1
    assert next_window(16, 0, 5, 10, 3) == 10  # never more than what is left
    assert next_window(1, 4, 5, 100_000, 990) >= 100_000 // 10  # never run out of channels


def test_guard_merge_newest_wins():
    old, new = Guard(3, 5, "m", 1000), Guard(0, 5, "", 2000)
    assert merge(old, new) is new and merge(new, old) is new
    assert merge(None, old) is old and merge(old, None) is old and merge(None, None) is None
    assert merge(Guard(2, 5, "", 7), Guard(4, 5, "", 7)).max_count == 4


def test_guard_store_roundtrip_and_damage(tmp_path):
    storage = open_storage(str(tmp_path))
    gs = GuardStore(storage, "pre/fix", "rabbit@node/1")
    assert gs.load("/", "q") is None
    gs.save("/", "q", Guard(2, 5, "message #1", 1234), "b1")
    assert gs.key("/", "q") == "pre/fix/_guards/rabbit%40node%2F1/_default/q.json"
    assert gs.load("/", "q") == Guard(2, 5, "message #1", 1234)
    storage.put(gs.key("/", "q"), b"{not json")
    with pytest.raises(StorageError, match="not a delivery guard"):
        gs.load("/", "q")


class FakeClient:
    """What a ManagementClient answers: fresh queue objects in turn, and the policy lists."""

    def __init__(self, fresh, policies=(), op=(), op_error=False):
        self.fresh, self._pol, self._op, self.op_error = list(fresh), list(policies), list(op), op_error

    def queue(self, vhost, name):
        return self.fresh.pop(0) if self.fresh else QueueInfo(vhost, name, "quorum", None, reported=frozenset({"name"}))

    def policies(self, vhost):
        return self._pol

    def request(self, method, path, **kw):
        if self.op_error:
            raise ManagementApiError(f"{method} /api/{path}: HTTP 401")
        return self._op


def test_quorum_settings_wait_for_arguments_then_refuse():
    bare = QueueInfo("v", "q", "quorum", None, reported=frozenset({"name"}))
    later = QueueInfo("v", "q", "quorum", 3, {"x-delivery-limit": 4}, reported=frozenset({"name", "type", "arguments"}))
    c = FakeClient([later], policies=[pol("p", {"delivery-limit": 2}, "^q")])
    s = quorum_settings(bare, c, PolicyCache(c), "4.0.5", wait_secs=5, sleep=lambda _s: None)
    assert s.delivery_limit.value == 2 and "policy 'p'" in s.delivery_limit.source
    c = FakeClient([])
    with pytest.raises(QueueRefused, match="has not reported its arguments"):
        quorum_settings(bare, c, PolicyCache(c), "4.0.5", wait_secs=0.01, sleep=lambda _s: None)


def test_operator_policies_not_listable_is_never_no_operator_policy():
    known = QueueInfo("v", "q", "quorum", 3, {}, reported=frozenset({"name", "type", "arguments"}))
    c = FakeClient([], op_error=True)
    with pytest.raises(QueueRefused, match="operator policies"):
        quorum_settings(known, c, PolicyCache(c), "3.10.8")
    reported = QueueInfo("v", "q", "quorum", 3, {}, effective_policy={"delivery-limit": 3},
                         reported=frozenset({"name", "type", "arguments", "effective_policy_definition"}))
    assert quorum_settings(reported, c, PolicyCache(c), "3.10.8").delivery_limit.value == 3
