"""Issue 27 scenario 5: a publisher and an acking consumer at work while three backups run.

What the application sees is measured in ``benchmarks/live_consumer.py`` (docs/backup.md, *Live
consumers*); this test holds the invariants that make the documentation true on every run,
however fast the machine is: the consumer receives every message exactly once; it receives a
message out of order (after a higher sequence number) or ``redelivered`` only if a backup held
it (what it recorded, or what was published while it read: a consumer read may be sent those, and
gives them back); each backup holds the queue in order and says complete only when it read all it
expected.
"""

from __future__ import annotations

import threading
import time

import pytest

from rbak.backup import BackupEngine
from rbak.errors import PartialBackupError

from support.backups import backup_config, load, records

N = 3_000
BACKLOG = 1_000  # published before the consumer starts: the first backup always finds messages
RATE = 1_000  # messages a second after that
CONSUMER_PAUSE = 0.002  # a consumer slower than the publisher, so later backups find a backlog too


def _publisher(broker, vhost: str, sent: list, failures: list) -> None:
    try:
        with broker.connect(vhost) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            start = time.monotonic()
            for i in range(BACKLOG, N):
                ch.basic_publish("", "live", b"%08d" % i)
                sent[0] = i + 1
                ahead = start + (i - BACKLOG) / RATE - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
    except Exception as e:  # noqa: BLE001 - reported by the test
        failures.append(e)


def _consumer(broker, vhost: str, got: list, stop: threading.Event, failures: list) -> None:
    try:
        with broker.connect(vhost) as conn:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)

            def on(c, m, _p, body) -> None:
                got.append((int(body), m.redelivered))
                time.sleep(CONSUMER_PAUSE)
                c.basic_ack(m.delivery_tag)

            ch.basic_consume("live", on)
            while not stop.is_set() and len(got) < N:
                conn.process_data_events(0.1)
    except Exception as e:  # noqa: BLE001
        failures.append(e)


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_a_live_consumer_gets_every_message_once_and_only_held_ones_late(broker, vhost, tmp_path, qtype):
    broker.publish_n(vhost, "live", 0, declare={"x-queue-type": qtype})
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(BACKLOG):
            ch.basic_publish("", "live", b"%08d" % i)
    got: list = []
    sent = [BACKLOG]
    failures: list = []
    stop = threading.Event()
    threads = [threading.Thread(target=_publisher, args=(broker, vhost, sent, failures), daemon=True),
               threading.Thread(target=_consumer, args=(broker, vhost, got, stop, failures), daemon=True)]

    def start_the_application(n: int) -> None:
        """Once the first backup holds a message (however slow the machine), the application starts:
        then at least one backup held something while the consumer and publisher ran."""
        if n == 1 and not threads[0].is_alive() and not threads[0].ident:
            for t in threads:
                t.start()
    held: set[int] = set()
    windows: list[tuple[int, int]] = []  # per backup: what it may have held, in sequence numbers
    store = tmp_path / "store"
    try:
        for i in range(3):
            bid = f"live{i}"
            seen = {s for s, _ in list(got)}
            lo = next(s for s in range(N + 1) if s not in seen)  # everything below was acked already
            eng = BackupEngine(backup_config(broker, vhost, store, bid, tmp_path / "st.db"),
                               throttle=start_the_application if i == 0 else None)
            try:
                summary = eng.run()
            except PartialBackupError as e:  # a consumer took messages the read expected: said, not hidden
                summary = e.summary
            m = load(store, bid)
            qb = m.find_queue(vhost, "live")
            seqs = [int(r.body) for r in records(store, m, vhost, "live")] if qb else []
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"{bid} holds the queue out of order"
            # complete means it read every message it expected; a consumer may make a read short (partial)
            assert summary.partial == (m.state == "partial") and m.state in ("complete", "partial"), (bid, m.state)
            windows.append((lo, sent[0]))  # a consumer read may also hold, and give back, what arrived meanwhile
            if m.state == "complete" and qb is not None:
                assert qb.message_count == qb.expected_messages == len(seqs), bid
            held.update(seqs)
        deadline = time.monotonic() + 120
        while len(got) < N and not failures and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            if t.ident:
                t.join(30)
    assert not failures, failures
    seqs = [s for s, _ in got]
    assert sorted(seqs) == list(range(N)), "lost or duplicated"  # every message exactly once
    assert held, "no backup held anything: the scenario did not happen"
    high, late = -1, set()
    for s in seqs:
        if s < high:
            late.add(s)
        high = max(high, s)
    redelivered = {s for s, r in got if r}
    def outside(xs: set[int]) -> list[int]:
        return sorted(x for x in xs if x not in held and not any(lo <= x < hi for lo, hi in windows))[:10]

    assert not outside(late), f"out of order but no backup could have held them: {outside(late)}"
    assert not outside(redelivered), f"redelivered but no backup could have held them: {outside(redelivered)}"
