"""``broker.deliveries.receive`` on a ``wire`` connection fed by hand (a socket pair, no broker): order,
what a reader leaves untaken, idle ticks, the broker's cancel and close, a lost connection."""

from __future__ import annotations

import socket
import struct

import pika.frame
import pika.spec
import pytest

from rbak.broker.deliveries import KeptProperties, receive
from rbak.broker.wire import Channel, Connection, Params
from rbak.errors import ChannelClosedByBroker, ConnectionLost

RAW = b"".join(pika.spec.BasicProperties(message_id="m", delivery_mode=2).encode())


def _open() -> tuple[Connection, Channel, socket.socket]:
    ours, broker = socket.socketpair()
    conn = Connection(ours, Params(host="fake", port=0, heartbeat=0))
    conn.is_open = True
    ch = conn.channels[1] = Channel(conn, 1)
    ch.is_open = True
    return conn, ch, broker


def _method(m) -> bytes:
    return pika.frame.Method(1, m).marshal()


def _deliver(tag: int, body: bytes, redelivered: bool = False) -> bytes:
    header = struct.pack(">HHQ", 60, 0, len(body)) + RAW
    return (_method(pika.spec.Basic.Deliver(consumer_tag="c1", delivery_tag=tag, redelivered=redelivered,
                                            exchange="ex", routing_key="rk"))
            + struct.pack(">BHI", 2, 1, len(header)) + header + b"\xce"
            + (struct.pack(">BHI", 3, 1, len(body)) + body + b"\xce" if body else b""))


def test_in_order_and_what_is_not_taken_stays_first():
    conn, ch, broker = _open()
    broker.sendall(b"".join(_deliver(i, b"m-%d" % i) for i in range(1, 6)))
    got = []
    for method, props, body in receive(conn, ch, "c1", 5.0):
        got.append((method.delivery_tag, body))
        assert isinstance(props, KeptProperties) and props.raw == RAW and props.message_id == "m"
        assert (method.exchange, method.routing_key, method.redelivered) == ("ex", "rk", False)
        if len(got) == 2:
            break
    assert got == [(1, b"m-1"), (2, b"m-2")]
    broker.sendall(_deliver(6, b"m-6", redelivered=True) + _deliver(7, b""))
    rest = []
    for method, _props, body in receive(conn, ch, "c1", 5.0):
        rest.append((method.delivery_tag, body, method.redelivered))
        if len(rest) == 5:
            break
    assert rest == [(3, b"m-3", False), (4, b"m-4", False), (5, b"m-5", False), (6, b"m-6", True), (7, b"", False)]


def test_idle_ticks_then_the_brokers_cancel_ends_it():
    conn, ch, broker = _open()
    it = receive(conn, ch, "c1", 0.05)
    assert next(it) == (None, None, None)
    broker.sendall(_deliver(1, b"last") + _method(pika.spec.Basic.Cancel(consumer_tag="c1")))
    method, _p, body = next(it)
    assert (method.delivery_tag, body) == (1, b"last")
    assert list(it) == []  # cancelled: what arrived before the cancel came first
    assert "c1" in ch.cancelled


def test_a_channel_the_broker_closes_raises_its_code():
    conn, ch, broker = _open()
    broker.sendall(_method(pika.spec.Channel.Close(reply_code=406, reply_text="PRECONDITION_FAILED - timeout",
                                                   class_id=0, method_id=0)))
    with pytest.raises(ChannelClosedByBroker) as e:
        next(receive(conn, ch, "c1", 5.0))
    assert (e.value.code, e.value.text) == (406, "PRECONDITION_FAILED - timeout")
    assert conn.is_open and not ch.is_open
    assert broker.recv(64).startswith(b"\x01\x00\x01")  # the Close-Ok went back on channel 1


def test_a_lost_connection_raises_connection_lost():
    conn, ch, broker = _open()
    broker.sendall(_deliver(1, b"one"))
    broker.close()
    it = receive(conn, ch, "c1", 5.0)
    assert next(it)[2] == b"one"
    with pytest.raises(ConnectionLost, match="closed the connection"):
        next(it)
    assert not conn.is_open


def test_a_frame_pika_cannot_decode_drops_the_connection():
    conn, ch, broker = _open()
    bad = struct.pack(">BHI", 1, 1, 4) + b"\x00\x3c\x7f\x7f" + b"\xce"  # Basic, method 32639: no such method
    broker.sendall(bad)
    with pytest.raises(ConnectionLost, match="cannot be decoded"):
        next(receive(conn, ch, "c1", 5.0))
