"""A read held on several channels gives them back one at a time, each only once the queue has its
messages back (issue 42). A Close-Ok does not mean the quorum queue took the returns: each channel
process hands them over on its own, and under load a later channel's landed first, leaving the
queue out of order (3.10.8, a cut repair's check read over three channels in a parallel suite)."""

from __future__ import annotations

from rbak.backup.read_return import return_in_order


class Queue:
    """A quorum queue whose returns land late: channel ``slow``'s after ``lag`` depth queries."""

    def __init__(self, ready: int, slow: int, lag: int):
        self.ready, self.slow, self.lag = ready, slow, lag
        self.pending: list[list[int]] = []  # [channel, messages, queries left]
        self.landed: list[int] = []  # channel numbers, in the order their returns reached the queue

    def give_back(self, number: int, held: int) -> None:
        self.pending.append([number, held, self.lag if number == self.slow else 0])
        self.tick()

    def tick(self) -> None:
        for p in list(self.pending):
            if p[2] <= 0:
                self.pending.remove(p)
                self.ready += p[1]
                self.landed.append(p[0])
            p[2] -= 1


class Conn:
    is_open = True

    def __init__(self, queue: Queue):
        self.queue, self.opened = queue, 0

    def channel(self) -> "Chan":
        self.opened += 1
        return Chan(self, 100 + self.opened, 0)


class Chan:
    def __init__(self, conn: Conn, number: int, held: int):
        self.conn, self.number, self.held, self.is_open = conn, number, held, True

    def cancel(self, tag: str) -> None:
        pass

    def nack(self, *a, **k) -> None:
        pass

    def close(self) -> None:
        self.is_open = False
        if self.held:
            self.conn.queue.give_back(self.number, self.held)

    def declare_passive(self, queue: str) -> tuple[int, int]:
        self.conn.queue.tick()
        return self.conn.queue.ready, 0


def give_back(settle: str | None) -> tuple[list[int], Conn]:
    conn = Conn(Queue(ready=0, slow=1, lag=5))
    channels = [Chan(conn, n, 2000) for n in (1, 2, 3)]
    ends = {n: [1000, 2000] for n in (1, 2, 3)}
    return_in_order(channels, {}, "queue 'q'", nack=False, quiet=False, ends=ends, settle=settle)  # type: ignore[arg-type]
    conn.queue.tick()
    for _ in range(10):
        conn.queue.tick()
    return conn.queue.landed, conn


def test_each_channel_waits_for_the_one_before_it_to_land():
    landed, conn = give_back(settle="q")
    assert landed == [1, 2, 3]
    assert conn.opened == 1  # the probe for the last one: the connection's kept control channel


def test_without_the_wait_a_slow_return_lands_behind_a_later_one():
    """The check above can fail: the same slow broker, given back without waiting."""
    landed, conn = give_back(settle=None)
    assert landed == [2, 3, 1] and conn.opened == 0
