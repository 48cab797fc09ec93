"""Pure ``rabbit_fifo`` replay rules the real-node tests (test_import_quorum_restart.py) cannot reach
every branch of: delayed-retry bookkeeping, AMQP 1.0 credit and drain, single active consumer order,
snapshot loading of delayed messages and waiting consumers, the x-expires note."""

from __future__ import annotations

from rbak.offline.rabbitmq.erlang_terms import Atom as A
from rbak.offline.rabbitmq.erlang_terms import ImproperList, Opaque
from rbak.offline.rabbitmq.fifo_delayed import RetryConfig
from rbak.offline.rabbitmq.fifo_limits import Limits, expiry_note
from rbak.offline.rabbitmq.rabbit_fifo import FifoReplay

T = A("true")
F = A("false")


def _usr(cmd, ts=1000):
    return (A("$usr"), {A("ts"): ts}, cmd, A("noreply"))


def _pid(n: int) -> Opaque:
    return Opaque(88, A("n@h"), n.to_bytes(4, "big") + bytes(8))


def _replay(mv=8, **limits) -> FifoReplay:
    return FifoReplay(mv, lambda i, m: 4, None, limits=Limits(**limits))


def _fill(r: FifoReplay, n: int, start: int = 1, ts: int = 1000) -> None:
    for idx in range(start, start + n):
        r.apply(idx, _usr((A("e"), idx, b"m", (0, 1)), ts))


def _prefetch(n):
    return (A("auto"), (A("simple_prefetch"), n))


def test_delayed_retry_ties_leave_in_delay_order_then_key_order():
    """``take_next_delayed`` takes the cached ``next`` first: equal ReadyAt, the first delayed wins."""
    r = _replay(delayed_retry=RetryConfig("returned", 100, 100))
    _fill(r, 4)
    r.apply(10, _usr((A("checkout"), (b"c", _pid(1)), _prefetch(4), {})))
    r.apply(11, _usr((A("return"), 10, [3, 1]), 2000))  # msg ids 3 then 1 (indexes 4 and 2), ready at 2100
    assert [m.idx for m in r.delayed.take_due(2099)] == []
    r.apply(12, _usr((A("timeout"), A("expire_msgs")), 2100))  # due: joins the returns, the consumer takes them
    c = r.consumers[10]
    assert [c.checked_out[i].idx for i in (4, 5)] == [4, 2]


def test_delayed_retry_kinds_delivery_time_retry_and_deferred_tokens():
    r = _replay(delayed_retry=RetryConfig("failed", 100, 250))
    _fill(r, 5)
    r.apply(10, _usr((A("checkout"), (b"c", _pid(1)), _prefetch(5), {})))
    r.apply(11, _usr((A("return"), 10, [0])))  # not failed: straight back (and redelivered as msg id 5)
    assert len(r.delayed) == 0 and 5 in r.consumers[10].checked_out
    r.apply(12, _usr((A("modify"), 10, [1], T, F, {}), 2000))  # failed once: 100 ms
    r.apply(13, _usr((A("modify"), 10, [2], T, F, {b"x-opt-delivery-time": 9000}), 2000))
    r.apply(14, _usr((A("modify"), 10, [3], F, F, {b"x-opt-deferral-token": b"tok"}), 2000))  # not delayed
    assert [(a, i) for a, i, _m in r.delayed.items] == [(2100, 2), (9000, 3)]
    r.apply(15, _usr((A("delayed_cmd"), (A("retry"), 1)), 2001))  # the first one, though not due
    assert [(a, i) for a, i, _m in r.delayed.items] == [(9000, 3)]
    r2 = _replay(delayed_retry=RetryConfig("all", 100, 100))
    _fill(r2, 2)
    r2.apply(10, _usr((A("checkout"), (b"c", _pid(1)), _prefetch(2), {})))
    r2.apply(11, _usr((A("modify"), 10, [0], F, F, {b"x-opt-deferral-token": b"tok"}), 2000))
    r2.apply(12, _usr((A("delayed_cmd"), (A("assign_deferred"), 10, [b"tok", b"unknown"])), 2001))
    assert len(r2.delayed) == 0 and [m.idx for m in r2.consumers[10].checked_out.values()] == [2, 1]
    r2.apply(13, _usr((A("purge"),)))
    assert r2.remaining() and r2.dropped == 0  # purge keeps checked-out messages


def test_delayed_count_toward_the_length_limit_and_purge_deletes_them():
    r = _replay(delayed_retry=RetryConfig("all", 100, 100), max_length=3)
    _fill(r, 3)
    r.apply(10, _usr((A("checkout"), (b"c", _pid(1)), _prefetch(1), {})))
    r.apply(11, _usr((A("return"), 10, [0])))  # delayed; the consumer takes 2
    _fill(r, 1, start=12)  # 4 messages: delayed 1, held 1 (not counted), ready 1 + 1 -> 3: no drop
    assert r.maxlen_dropped == 0
    _fill(r, 1, start=13)
    assert r.maxlen_dropped == 1
    r.apply(14, _usr((A("purge"),)))
    assert len(r.delayed) == 0


def test_credited_consumer_credit_drain_and_delivery_count():
    """``{credit, Key, Credit, DeliveryCount, Drain}``: link credit = their count + credit - ours (floor 0)."""
    r = _replay(mv=5)
    _fill(r, 6)
    r.apply(10, _usr((A("checkout"), (b"c", _pid(1)), (A("auto"), (A("credited"), 100)), {})))
    assert r.consumers[10].credit == 0
    r.apply(11, _usr((A("credit"), 10, 2, 100, F)))
    c = r.consumers[10]
    assert len(c.checked_out) == 2 and c.delivery_count == 102
    r.apply(12, _usr((A("settle"), 10, [0])))  # credited: a settle gives no credit back
    assert len(c.checked_out) == 1
    r.apply(13, _usr((A("credit"), 10, 3, 101, F)))  # stale delivery count: 101 + 3 - 102 = 2
    assert len(c.checked_out) == 3
    r.apply(14, _usr((A("credit"), 10, 50, 104, T)))  # drain: takes the 2 left, the rest is consumed
    assert len(c.checked_out) == 5 and c.credit == 0 and c.delivery_count == 154
    r.apply(15, _usr((A("credit"), 10, 1, 2**32 - 1, F)))  # serial numbers: wraps, still behind: floor 0
    assert c.credit == 0


def test_single_active_consumer_waiting_order_by_version():
    """4.x: priority, then more credit, then key; 3.x: arrival order. Only the active one gets messages; at
    the restart a waiting consumer whose pid is not found dead yet becomes active and takes messages."""
    for mv, first, taken, order in ((5, 12, 3, [3, 4, 5, 1, 2, 6]),
                                    (2, (b"c", _pid(3)), 2, [1, 2, 3, 4, 5, 6])):
        r = _replay(mv=mv, single_active=True)
        _fill(r, 6)
        spec = _prefetch(2) if mv >= 4 else (A("auto"), 2, A("simple_prefetch"))
        big = _prefetch(3) if mv >= 4 else (A("auto"), 3, A("simple_prefetch"))
        r.apply(10, _usr((A("checkout"), (b"a", _pid(1)), spec, {})))
        r.apply(11, _usr((A("checkout"), (b"c", _pid(3)), spec, {})))
        r.apply(12, _usr((A("checkout"), (b"b", _pid(2)), big, {})))
        assert r.waiting[0].key == first and len(r.consumers) == 1
        active = next(iter(r.consumers.values()))
        assert len(active.checked_out) == 2
        r.apply(13, _usr((A("checkout"), active.cid, A("cancel"), {})))  # keeps its two, the next one starts
        assert active.cancelled and len(r.consumers[first].checked_out) == taken
        assert [m.idx for m in r.remaining()] == order, mv


def test_sac_priority_quiesces_a_busy_consumer_and_4_3_keeps_it_after_its_down():
    for mv, order in ((5, [1, 2, 3, 4, 5, 6]), (8, [4, 1, 2, 3, 5, 6])):
        r = _replay(mv=mv, single_active=True)
        _fill(r, 6)
        r.apply(10, _usr((A("checkout"), (b"a", _pid(1)), _prefetch(3), {})))
        r.apply(11, _usr((A("checkout"), (b"b", _pid(2)), _prefetch(4), {A("priority"): 5})))
        assert r.consumers[10].quiescing and [w.key for w in r.waiting] == [11]
        assert [m.idx for m in r.remaining()] == order, mv


def test_snapshot_delayed_tree_next_and_waiting_consumers():
    from rbak.offline.rabbitmq.fifo_snapshot import load_state

    def con(tag, pid, prio, credit, status=None):
        cfg = (A("consumer_cfg"), {}, pid, tag, (A("simple_prefetch"), 2), A("auto"), prio, 0)
        return (A("consumer"), cfg, status or A("up"), 0, {}, credit, 0, F, [])

    def key(at, idx):
        return ImproperList([at], idx)

    tree = (2, (key(500, 7), 7, (key(500, 3), 3, None, None), None))  # gb_tree: 3 then 7 by key
    delayed = (A("delayed"), tree, (500, 7, 7), {b"tok": key(500, 3)})
    cfg = (A("cfg"), A("n"), None, A("nil"), None, None, A("drop_head"), None, None, A("single_active"),
           None, 60000, None, 60000, (A("all"), 10, 20))
    state = [A("rabbit_fifo"), cfg, (A("pq"), {}, 0, 0), 0, (0, [], []), 0, {}, 1234, A("infinity"), {},
             (A("queue"), [], [], 0), (A("rabbit_fifo_dlx"), None, (0, [], []), A("nil"), 0, 0), 0, 0,
             [(20, con(b"w", _pid(5), 0, 2))], 999, None, delayed]
    r, _notes = load_state(tuple(state), 8, None, lambda i, m: 4)
    assert r.limits.single_active and r.limits.delayed_retry == RetryConfig("all", 10, 20)
    assert r.limits.expires == 60000 and r.last_active == 999 and r.ts == 1234
    assert [w.key for w in r.waiting] == [20] and r.delayed.tokens == {b"tok": (500, 3)}
    assert [m.idx for m in r.remaining()] == [7, 3]  # the cached next leaves first


def test_expiry_note_cases():
    assert expiry_note(None, 1, 2, False) is None
    assert "first tick of any restart" in expiry_note(1000, 0, 5000, False)
    assert "restart after 1970-01-01T00:00:01.000Z (unused since 1970-01-01T00:00:00.000Z)" in expiry_note(1000, 0, 500, False)
    assert "1000 ms after a restart unless a consumer attaches" in expiry_note(1000, 0, 500, True)


def test_4_3_consumer_timeout_returns_expired_locks_and_pauses_the_consumer():
    """``{timeout, evaluate_consumer_timeout}``: messages held past the consumer's timeout (checkout meta) go
    back, not as failures; the consumer gets nothing until it has settled those ids."""
    r = _replay(mv=8)
    _fill(r, 4)
    r.apply(10, _usr((A("checkout"), (b"a", _pid(1)), _prefetch(2), {A("timeout"): 500}), 1000))
    r.apply(11, _usr((A("checkout"), (b"b", _pid(2)), _prefetch(1), {}), 1000))
    r.apply(12, _usr((A("timeout"), A("evaluate_consumer_timeout")), 1400))  # not yet
    assert len(r.consumers[10].checked_out) == 2
    r.apply(13, _usr((A("timeout"), A("evaluate_consumer_timeout")), 1500))
    a = r.consumers[10]
    assert not a.checked_out and a.timed_out == {0, 1} and [m.idx for m in r.returns] == [1, 2]
    assert [m.failed for m in r.returns] == [0, 0]
    r.apply(14, _usr((A("settle"), 11, [0]), 1600))  # b takes the first returned one, not a
    assert [m.idx for m in r.consumers[11].checked_out.values()] == [1] and not a.checked_out
    r.apply(15, _usr((A("settle"), 10, [0, 1]), 1700))  # late acks of the timed-out ids: a is up again
    assert a.up and [m.idx for m in a.checked_out.values()] == [2, 4]
