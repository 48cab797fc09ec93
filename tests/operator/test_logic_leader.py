"""Leader election on a Lease (leader.py): the pure decision, and two electors sharing one Lease store
that behaves like the API server's (resourceVersion checked on every write, 409 on a stale one)."""

from __future__ import annotations

import copy
import threading

import pytest

from rbak_operator.runtime import leader
from rbak_operator.runtime.leader import CREATE, RENEW, TAKE, WAIT, Elector, LeaseConfig, Record, Seen, decide


def rec(holder: str, renew: str = "t1", duration: int = 15, transitions: int = 0) -> Record:
    return Record(holder, duration, renew, transitions)


def test_no_lease_is_created_and_our_own_is_renewed():
    assert decide("a", None, None, 0.0) == (CREATE, None)
    assert decide("a", rec("a"), None, 5.0) == (RENEW, Seen(rec("a"), 5.0))


def test_another_holders_lease_expires_by_our_own_observation_not_its_timestamps():
    other = rec("b")
    action, seen = decide("a", other, None, 100.0)
    assert action == WAIT and seen == Seen(other, 100.0)
    assert decide("a", other, seen, 114.9)[0] == WAIT
    assert decide("a", other, seen, 115.0) == (TAKE, seen)


def test_a_renewal_restarts_the_observation_clock():
    action, seen = decide("a", rec("b", "t1"), None, 100.0)
    action, seen = decide("a", rec("b", "t2"), seen, 114.0)  # renewed just before expiry
    assert action == WAIT and seen == Seen(rec("b", "t2"), 114.0)
    assert decide("a", rec("b", "t2"), seen, 128.0)[0] == WAIT
    assert decide("a", rec("b", "t2"), seen, 129.0)[0] == TAKE


def test_a_released_lease_is_taken_at_once():
    assert decide("a", rec("", duration=1), None, 0.0)[0] == TAKE


class FakeLeases:
    """One Lease, written only with the resourceVersion last read (as the API server does)."""

    def __init__(self) -> None:
        self.lease: dict | None = None
        self.version = 0
        self.lock = threading.Lock()
        self.fail = False

    def _check(self) -> None:
        if self.fail:
            raise leader.ApiError(503, "unavailable", "GET", "/leases")

    def get_lease(self, namespace: str, name: str) -> dict | None:
        self._check()
        with self.lock:
            return copy.deepcopy(self.lease)

    def create_lease(self, body: dict) -> dict | None:
        self._check()
        with self.lock:
            if self.lease is not None:
                return None
            return self._store(body)

    def update_lease(self, body: dict) -> dict | None:
        self._check()
        with self.lock:
            if self.lease is None or body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
                return None
            return self._store(body)

    def _store(self, body: dict) -> dict:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(store: FakeLeases, clock: Clock, me: str) -> Elector:
    return Elector(store, LeaseConfig("ns", "rbak-operator", me, 15), clock)  # type: ignore[arg-type]


def test_one_of_two_electors_holds_the_lease_and_the_other_takes_it_only_once_it_expires():
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_once() and not b.try_once()
    assert store.lease["spec"]["holderIdentity"] == "a" and store.lease["spec"]["leaseTransitions"] == 0
    clock.t += 10
    assert a.try_once()  # a renews: b's observation starts again
    assert not b.try_once()
    clock.t += 14
    assert not b.try_once()
    clock.t += 1  # 15 s without a change b saw
    assert b.try_once()
    spec = store.lease["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert not a.try_once()  # a's next round sees b: it no longer leads


def test_two_standbys_racing_for_an_expired_lease_cannot_both_win():
    store, clock = FakeLeases(), Clock()
    assert elector(store, clock, "old").try_once()
    b, c = elector(store, clock, "b"), elector(store, clock, "c")
    assert not b.try_once() and not c.try_once()
    clock.t += 15
    stale = store.get_lease("ns", "rbak-operator")
    assert b.try_once()
    # c decided on the same expired record, but its write carries the old resourceVersion: 409.
    store.get_lease = lambda ns, name: copy.deepcopy(stale)  # type: ignore[method-assign]
    assert not c.try_once()
    assert FakeLeases.get_lease(store, "ns", "rbak-operator")["spec"]["holderIdentity"] == "b"


def test_release_empties_the_holder_so_a_standby_takes_over_at_once():
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_once() and not b.try_once()
    a.release()
    assert store.lease["spec"]["holderIdentity"] is None
    assert b.try_once()  # no waiting for the 15 s
    a.release()  # no longer ours: untouched
    assert store.lease["spec"]["holderIdentity"] == "b"


def test_the_holder_stops_when_it_cannot_renew_before_the_deadline():
    store, clock = FakeLeases(), Clock()
    a = elector(store, clock, "a")
    assert a.try_once()
    a.retry = 0.01
    store.fail = True
    stop = threading.Event()

    def advance() -> None:
        while not stop.is_set():
            clock.t += 1
            stop.wait(0.005)

    threading.Thread(target=advance, daemon=True).start()
    a.hold(stop)  # returns once the 10 s renew deadline has passed without a renewal
    assert a.lost and stop.is_set()


def test_the_holder_stops_when_another_replica_took_the_lease():
    store, clock = FakeLeases(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_once() and not b.try_once()
    clock.t += 15
    assert b.try_once()
    a.retry = 0.01
    stop = threading.Event()
    a.hold(stop)
    assert a.lost and stop.is_set()


@pytest.mark.parametrize("env,message", [
    ({"RBAK_LEASE_SECONDS": "ten"}, "RBAK_LEASE_SECONDS: not a whole number of seconds: 'ten'"),
    ({"RBAK_LEASE_SECONDS": "2"}, "RBAK_LEASE_SECONDS: 2 is too short (at least 3)"),
])
def test_a_bad_lease_duration_is_named(env, message):
    with pytest.raises(ValueError) as e:
        LeaseConfig.from_env({"RBAK_LEASE_NAMESPACE": "ns", **env})
    assert str(e.value) == message


def test_the_lease_config_comes_from_the_pod_downward_api():
    cfg = LeaseConfig.from_env({"POD_NAMESPACE": "ops", "POD_NAME": "rbak-7f9-abc", "RBAK_LEASE_NAME": "rbak"})
    assert cfg == LeaseConfig("ops", "rbak", "rbak-7f9-abc", 15)
