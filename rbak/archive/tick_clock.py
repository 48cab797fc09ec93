"""When a tick starts and how long it waits for its segments, from the measured store times.

Why the head-room: a record read just after one tick's flush must be durable and named by the next
tick within ``max_delay_secs``. The next tick therefore starts ``max_delay_secs`` minus what a tick
itself takes (its wait for the segments, its PUT, a read margin) after the last one.
"""

from __future__ import annotations

from collections import deque

MIN_WAIT_SECS = 0.2  # a tick waits at least this long for the segments it asked for, else 1.25x (+0.1 s) ...
READ_MARGIN_SECS = 0.5  # head-room for the publish -> delivery time and a tick slower than the last ones
SETTLE_TICKS = 20  # ... the slowest of the last this many ticks' flush-to-durable times (each tick's 90th percentile)
PUT_TICKS = 20  # the head-room counts the slowest of the last this many tick PUTs


class TickClock:
    """The tick timing of one archiver: a tick's wait (``wait_secs``) and how much earlier than
    ``max_delay_secs`` after the last one the next tick starts (``headroom``), so that a record read
    just after a tick's flush is durable and named by the next tick within ``max_delay_secs``."""

    def __init__(self, max_delay_secs: float):
        self.max_delay_secs = max_delay_secs
        self._settle: deque[float] = deque(maxlen=SETTLE_TICKS)  # per tick: flush request -> segments durable (s)
        self._puts: deque[float] = deque(maxlen=PUT_TICKS)  # tick PUTs (s)

    def settled(self, secs: float) -> None:
        """A tick's flush-to-durable time (the 90th percentile over its streams)."""
        self._settle.append(secs)

    def put(self, secs: float) -> None:
        """How long a tick object's PUT took."""
        self._puts.append(secs)

    def next_tick(self, last: float | None, now: float) -> float:
        """When the next tick starts (``time.monotonic``): ``max_delay_secs`` minus the head-room after the
        last one (``last``; None: the first, from ``now``), so a record read just after this tick's flush is
        durable and named by the next one within ``max_delay_secs``; never sooner than a quarter of it."""
        delay = self.max_delay_secs
        if last is None:
            return now + delay - self.headroom()
        return max(now + delay / 4, min(last, now) + delay - self.headroom())

    def wait_secs(self) -> float:
        """How long a tick waits for the segments it asked for: 1.25x (+0.1 s) the slowest of the last
        ``SETTLE_TICKS`` ticks' flush-to-durable times, each tick's the 90th percentile over its streams
        (so one stalled stream among many does not stretch it); at least ``MIN_WAIT_SECS``, at most half
        of ``max_delay_secs``. A segment missing a tick costs its records one tick interval more."""
        half = self.max_delay_secs / 2
        if not self._settle:
            return min(half, 1.0)
        return min(half, max(MIN_WAIT_SECS, 1.25 * max(self._settle) + 0.1))

    def headroom(self) -> float:
        """How much earlier than ``max_delay_secs`` after the last one a tick starts: its wait, its PUT
        (the slowest of the last ``PUT_TICKS``) and ``READ_MARGIN_SECS``, at most half of ``max_delay_secs``."""
        put = max(self._puts) if self._puts else 0.1
        return min(self.max_delay_secs / 2, self.wait_secs() + put + READ_MARGIN_SECS)
