"""A single-channel quorum read gives its messages back before it returns (issue 46, after issue 42).

A Close-Ok does not mean the quorum queue took the returns: the channel process hands them over on its
own. A backup that returned before they landed left the next reader (the next backup's depth, a cut
backup's windows) a queue short of what it had held: under load the next backup of a 100,000-message
queue read a queue whose returns were still landing."""

from __future__ import annotations

from rbak.backup.queue_reader import CLOSE, NACK, ReadOptions, read_queue

from support.backups import fast_publish

N = 100_000


def test_a_single_channel_quorum_read_returns_once_the_queue_holds_every_message(broker, vhost):
    """Read whole on one channel (its windows are consumers of that channel), returned by close, by
    nack, by close again; asked at once from another connection after each read, the queue already
    holds all N ready again. Without the wait 3.10.8 answered 0 after the first close."""
    bodies = [b"g-%06d" % i for i in range(N)]
    fast_publish(broker, vhost, "gq", bodies, declare={"x-queue-type": "quorum"})
    seen = []
    with broker.wire(vhost) as conn, broker.connect(vhost) as other:
        ch = other.channel()
        for mode in (CLOSE, NACK, CLOSE):
            got: list[bytes] = []
            res = read_queue(conn, vhost, "gq", "quorum", N, lambda m, p, body: got.append(body),
                             ReadOptions(return_mode=mode))
            seen.append(ch.queue_declare("gq", passive=True).method.message_count)
            assert res.channels == 1 and got == bodies, mode
    assert seen == [N, N, N]
