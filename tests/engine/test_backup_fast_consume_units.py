"""FastConsume's data path without a broker: every received byte goes to exactly one of the fast
path or pika, in order, whatever the socket reads' sizes, and pika's byte count sees all of them."""

from __future__ import annotations

import pika.connection
import pika.frame
import pika.spec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbak.broker import fast_consume
from rbak.broker.declare import declare_ok_counts
from rbak.broker.fast_consume import FastConsume, to_delivery


class Transport:
    _MAX_RECV_BYTES = 4096  # pika's class attribute


class Impl:
    """The parts of pika's Connection the fast path uses; pika's own frame reading, frames recorded."""

    _read_frame = pika.connection.Connection._read_frame
    _trim_frame_buffer = pika.connection.Connection._trim_frame_buffer
    is_closed = False

    def __init__(self):
        self._frame_buffer = b""
        self.bytes_received = 0
        self._transport = Transport()
        self.frames: list = []

    def _on_data_available(self, data: bytes) -> None:  # pika's, unchanged (the class's)
        pika.connection.Connection._on_data_available(self, data)

    def _process_frame(self, frame) -> None:
        self.frames.append(frame)


class Conn:
    def __init__(self):
        self._impl = Impl()

    def _flush_output(self, *waiters):  # pragma: no cover - never called here
        raise AssertionError


def deliver(channel: int, tag: int, body: bytes, step: int = 131064, **props) -> list[bytes]:
    frames = [pika.frame.Method(channel, pika.spec.Basic.Deliver("c", tag, False, "ex", f"rk-{tag}")).marshal(),
              pika.frame.Header(channel, len(body), pika.spec.BasicProperties(**props)).marshal()]
    return frames + [pika.frame.Body(channel, body[i:i + step]).marshal() for i in range(0, len(body), step)]


OTHERS = [pika.frame.Heartbeat().marshal(), pika.frame.Method(1, pika.spec.Basic.Cancel("c")).marshal(),
          pika.frame.Method(0, pika.spec.Connection.Blocked("low")).marshal()]


@st.composite
def streams(draw):
    """(frames in order, each with the number of the channel-1 delivery it belongs to (1, 2, ...) or 0;
    those deliveries' bodies)."""
    frames, bodies = [], []
    for tag in range(1, draw(st.integers(0, 10)) + 1):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            frames.append((draw(st.sampled_from(OTHERS)), 0))
        else:
            ch = 1 if kind < 3 else 2
            body = draw(st.binary(max_size=300))
            fs = deliver(ch, tag, body, step=draw(st.integers(1, 400)), message_id=f"m{tag}")
            if ch == 1:
                bodies.append(body)
            frames += [(f, len(bodies) if ch == 1 else 0) for f in fs]
    return frames, bodies


def feed(fc: FastConsume, data: bytes, sizes: list[int]) -> None:
    pos, i = 0, 0
    while pos < len(data):
        n = sizes[i % len(sizes)] if sizes else len(data)
        fc.impl._on_data_available(data[pos:pos + n])
        pos += n
        i += 1


@settings(max_examples=200, deadline=None)
@given(streams(), st.lists(st.integers(1, 700), max_size=5))
def test_each_frame_goes_to_exactly_one_side_in_order(stream, sizes):
    frames, bodies = stream
    conn = Conn()
    fc = FastConsume.install(conn)
    assert fc is not None
    fc.channel = 1
    data = b"".join(f for f, _ in frames)
    feed(fc, data, sizes)
    got = [to_delivery(t) for t in fc.take()]
    assert [b for _m, _p, b in got] == bodies
    assert all(p.message_id == f"m{m.delivery_tag}" and m.routing_key == f"rk-{m.delivery_tag}" for m, p, _b in got)
    # pika saw every other frame, decoded, in order, once
    assert [f.marshal() for f in conn._impl.frames] == [f for f, ours in frames if not ours]
    assert conn._impl.bytes_received == len(data)  # its heartbeat checker counts the fast path's bytes too
    assert conn._impl._frame_buffer == b"" and fc.error is None


@settings(max_examples=50, deadline=None)
@given(streams(), st.lists(st.integers(1, 700), max_size=5))
def test_without_a_channel_everything_is_pikas(stream, sizes):
    frames, _bodies = stream
    conn = Conn()
    fc = FastConsume.install(conn)
    data = b"".join(f for f, _ in frames)
    feed(fc, data, sizes)
    assert fc.take() == []
    assert [f.marshal() for f in conn._impl.frames] == [f for f, _ in frames]
    assert conn._impl.bytes_received == len(data)


@settings(max_examples=200, deadline=None)
@given(streams(), st.lists(st.integers(1, 700), min_size=1, max_size=5), st.integers(0, 30), st.binary(max_size=20))
def test_install_and_uninstall_mid_stream_hand_over_every_byte(stream, sizes, switch, prefix_cut):
    """pika's partial frame at install, the fast path's unfinished bytes at uninstall: each side
    carries on from the other's bytes, every frame reaches exactly one of them once."""
    frames, bodies = stream
    data = b"".join(f for f, _ in frames)
    k = len(prefix_cut) % 8  # pika already holds the first k bytes (part of a frame) when the read starts
    conn = Conn()
    impl = conn._impl
    impl._on_data_available(data[:k])
    fc = FastConsume.install(conn)
    fc.channel = 1
    rest = data[k:]
    chunks = [rest[i:i + sizes[0]] for i in range(0, len(rest), sizes[0])]
    for c in chunks[:switch]:
        impl._on_data_available(c)
    fast = [t[5] for t in fc.take()]
    fc.uninstall()
    assert "_on_data_available" not in impl.__dict__
    for c in chunks[switch:]:
        impl._on_data_available(c)  # pika's own path from here
    # the fast path took the first deliveries of channel 1, whole; pika every other frame, in order, once
    assert fast == bodies[:len(fast)]
    assert [f.marshal() for f in impl.frames] == [f for f, d in frames if not 0 < d <= len(fast)]
    assert impl.bytes_received == len(data) and impl._frame_buffer == b""


def test_a_large_delivery_shows_activity_while_it_arrives():
    """pika's heartbeat checker watches bytes_received: it must grow with every socket read, also
    while the parser waits for the rest of a large delivery (pika counts each 128 KiB frame)."""
    body = bytes(range(256)) * (4 * 4096)  # 4 MiB: 33 body frames
    data = b"".join(deliver(1, 1, body) + deliver(1, 2, b"after"))
    conn = Conn()
    fc = FastConsume.install(conn)
    fc.channel = 1
    counts, buffers = [], set()
    scan = fast_consume.scan_deliveries

    def spy(buf, pos, ch):
        buffers.add(id(buf) if isinstance(buf, bytearray) else None)
        return scan(buf, pos, ch)

    fast_consume.scan_deliveries, saved = spy, fast_consume.scan_deliveries
    try:
        for i in range(0, len(data), 128 * 1024):
            conn._impl._on_data_available(data[i:i + 128 * 1024])
            counts.append(conn._impl.bytes_received)
    finally:
        fast_consume.scan_deliveries = saved
    assert [t[5] for t in fc.take()] == [body, b"after"]
    assert counts == sorted(set(counts)) and counts[-1] == len(data)  # up with every read
    # the unfinished delivery waits in one buffer each read appends to (no copy of it per read)
    assert len(buffers - {None}) == 1


def test_an_interleaved_delivery_stops_the_fast_path_and_pika_gets_the_rest():
    first = deliver(1, 1, b"one")
    broken = deliver(1, 2, b"two")
    broken.insert(1, pika.frame.Heartbeat().marshal())  # between the method and the content header
    after = deliver(1, 3, b"three")
    conn = Conn()
    fc = FastConsume.install(conn)
    fc.channel = 1
    data = b"".join(first + broken + after)
    conn._impl._on_data_available(data)
    assert [b for _m, _p, b in map(to_delivery, fc.take())] == [b"one"]
    assert fc.error is not None and "interleaved" in fc.error and fc.channel == 0
    assert [f.marshal() for f in conn._impl.frames] == broken + after  # nothing lost, nothing twice
    assert conn._impl.bytes_received == len(data)


def test_install_is_per_connection_and_uninstall_restores_pika():
    a, b = Conn(), Conn()
    fc = FastConsume.install(a)
    assert fc is not None
    assert a._impl.__dict__["_on_data_available"] == fc._on_data
    assert a._impl._transport.__dict__["_MAX_RECV_BYTES"] == fast_consume.RECV_BYTES
    assert "_on_data_available" not in b._impl.__dict__ and Transport._MAX_RECV_BYTES == 4096
    assert FastConsume.install(a) is None  # one read at a time on a connection
    fc.channel = 1
    a._impl._on_data_available(b"".join(deliver(1, 1, b"x"))[:10])  # a partial frame stays buffered
    fc.uninstall()
    assert "_on_data_available" not in a._impl.__dict__
    assert "_MAX_RECV_BYTES" not in a._impl._transport.__dict__
    assert fc.channel == 0 and fc.take() == []
    # pika's own path goes on from the bytes left in its buffer
    a._impl._on_data_available(b"".join(deliver(1, 1, b"x"))[10:])
    assert [type(f.method).__name__ if hasattr(f, "method") else type(f).__name__ for f in a._impl.frames] == [
        "Deliver", "Header", "Body"]
    a._impl._transport = None
    fc2 = FastConsume.install(a)
    fc2.uninstall()  # a connection whose transport is gone


def test_not_installed_when_disabled_or_pika_differs(monkeypatch):
    monkeypatch.setattr(fast_consume, "ENABLED", False)
    assert FastConsume.install(Conn()) is None
    monkeypatch.setattr(fast_consume, "ENABLED", True)
    c = Conn()
    del c._impl.__dict__["bytes_received"]
    assert FastConsume.install(c) is None and "_on_data_available" not in c._impl.__dict__


@pytest.mark.parametrize("value,enabled", [("0", False), ("1", True), (None, True), (" 0 ", False)])
def test_the_environment_switch(value, enabled):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RBAK_FAST_CONSUME"}
    if value is not None:
        env["RBAK_FAST_CONSUME"] = value
    out = subprocess.run([sys.executable, "-c", "import rbak.broker.fast_consume as f; print(f.ENABLED)"],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.stdout.split() == [str(enabled)], out.stderr


def test_a_new_consumer_never_sees_what_an_earlier_channel_left():
    """A quorum read opens a channel per window on one FastConsume: deliveries parsed for an earlier
    channel and not taken must not be handed to the next channel's consumer."""
    fc = FastConsume.install(Conn())
    fc.channel = 1
    feed(fc, b"".join(deliver(1, 1, b"old")), [4096])
    assert [d[5] for d in fc.pending] == [b"old"]

    cancel_callbacks: list = []

    class Impl:
        def add_on_cancel_callback(self, callback):
            cancel_callbacks.append(callback)

    class Channel:
        channel_number = 2
        _impl = Impl()

        def basic_consume(self, *a, **k):
            return "ctag"

    ch = Channel()
    assert fc.consume(ch, "q") == "ctag"
    assert fc.consume(ch, "q") == "ctag"
    assert len(cancel_callbacks) == 1  # one per channel, telling whichever read consumes on it now
    cancel_callbacks[0](None)
    assert fc.cancelled == {2}
    assert fc.pending == [] and fc.channel == 2
    feed(fc, b"".join(deliver(2, 1, b"new")), [4096])
    assert [d[5] for d in fc.take()] == [b"new"]


def _method(channel: int, method) -> bytes:
    return pika.frame.Method(channel, method).marshal()


@settings(max_examples=200, deadline=None)
@given(streams(), st.lists(st.integers(1, 700), max_size=5), st.lists(st.integers(0, 12), min_size=6, max_size=6))
def test_awaited_replies_and_raw_cancels_are_taken_and_nothing_else(stream, sizes, spots):
    """``call``'s reply and the broker's cancel of a raw consumer never reach pika (its blocking channel
    fails on a cancel of a consumer it does not know); look-alikes on other channels, with other tags
    or of other methods still do, in order."""
    frames, bodies = stream
    units: list[list] = []  # a channel-1 delivery's frames stay together (the broker never splits them)
    for f, ours in frames:
        if ours and units and units[-1][0][1] == ours:
            units[-1].append((f, ours))
        else:
            units.append([(f, ours)])
    reply = _method(3, pika.spec.Queue.DeclareOk("q", 7, 2))
    extra = [(reply, -1), (_method(1, pika.spec.Basic.Cancel("rbak.1.9")), -1),
             (_method(4, pika.spec.Queue.DeclareOk("q", 1, 1)), 0),  # a channel that awaits nothing
             (_method(3, pika.spec.Basic.CancelOk("x")), 0),  # channel 3 awaits a Declare-Ok, not this
             (_method(1, pika.spec.Basic.Cancel("rbak.1.99")), 0),  # not the raw consumer's tag
             (_method(2, pika.spec.Basic.Cancel("rbak.1.9")), 0)]  # the tag, on another channel
    for spot, unit in zip(spots, extra):
        units.insert(min(spot, len(units)), [unit])
    mixed = [fo for u in units for fo in u]
    conn = Conn()
    fc = FastConsume.install(conn)
    fc.channel = 1
    fc.awaiting[3] = fast_consume.DECLARE_OK
    fc.raw_tags[1] = [b"rbak.1.9"]
    data = b"".join(f for f, _ in mixed)
    feed(fc, data, sizes)
    assert [b for _m, _p, b in (to_delivery(t) for t in fc.take())] == bodies and fc.error is None
    assert [f.marshal() for f in conn._impl.frames] == [f for f, ours in mixed if ours == 0]
    assert fc.replies == {3: reply[11:-1]} and fc.awaiting == {} and fc.cancelled == {1}
    assert declare_ok_counts(fc.replies[3]) == (7, 2)
    assert conn._impl.bytes_received == len(data)
