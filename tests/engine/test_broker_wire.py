"""rbak's own AMQP 0-9-1 connection (``rbak.broker.wire``) against the three real brokers: login and its
refusals, passive declares and their refusals, in-order consumption and give-back, basic.get, publishes
with confirms and returns, a broker-closed connection and heartbeats."""

from __future__ import annotations

import time

import pytest
from support.brokers import unique_name

from rbak.broker.wire import Connection, Params
from rbak.errors import ChannelClosedByBroker, ConnectionLost
from rbak.errors import AmqpAuthenticationError, AmqpConnectionError


def _params(broker, vhost, **kw) -> Params:
    return Params(host=broker.host, port=broker.amqp_port, vhost=vhost, username=broker.user,
                  password=broker.password, client_properties={"connection_name": kw.pop("name", "rbak-wire-test")},
                  **kw)


def _drain_until(conn, ch, n, timeout=30.0):
    assert conn.pump(lambda: len(ch.deliveries) >= n, timeout=timeout), (len(ch.deliveries), n)
    return ch.deliveries


def test_login_refusals_name_user_and_vhost(broker, vhost):
    with pytest.raises(AmqpAuthenticationError, match="authentication failed for user 'guest'"):
        Connection.open(Params(host=broker.host, port=broker.amqp_port, vhost=vhost, password="wrong"))
    with pytest.raises(AmqpAuthenticationError, match="access to the vhost was refused"):
        Connection.open(_params(broker, "no-such-vhost-" + unique_name("v")))
    with pytest.raises(AmqpConnectionError, match="cannot connect"):
        Connection.open(Params(host="127.0.0.1", port=1, vhost=vhost))


def test_declare_consume_in_order_and_give_back(broker, vhost):
    broker.declare_queue(vhost, "q", arguments={"x-queue-type": "quorum"})
    bodies = broker.publish_n(vhost, "q", 300)
    with Connection.open(_params(broker, vhost)) as conn:
        ch = conn.channel()
        assert ch.declare_passive("q") == (300, 0)
        ch.qos(300)
        tag = ch.consume("q")
        got = _drain_until(conn, ch, 300)
        assert [d[5] for d in got] == bodies
        assert [d[0] for d in got] == list(range(1, 301))
        assert got[0][1] is False and got[0][3] == "q"
        assert ch.declare_passive("q") == (0, 1)
        ch.cancel(tag)
        ch.nack(0, multiple=True, requeue=True)
        deadline = time.monotonic() + 30
        while ch.declare_passive("q")[0] != 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ChannelClosedByBroker) as e:
            ch.declare_passive("missing")
        assert e.value.code == 404 and "missing" in e.value.text
        assert not ch.is_open and conn.is_open
        other = conn.channel()
        assert other.declare_passive("q") == (300, 0)
    assert broker.read_bodies(vhost, "q") == bodies


def test_basic_get_keeps_raw_properties(broker, vhost):
    import pika

    broker.publish(vhost, "g", [b"one", b"two"], properties=pika.BasicProperties(
        delivery_mode=2, headers={"n": -7}, message_id="m"), declare={})
    with Connection.open(_params(broker, vhost)) as conn:
        ch = conn.channel()
        first = ch.get("g")
        assert first is not None and first.body == b"one" and first.method.message_count == 1
        props = pika.spec.BasicProperties()
        props.decode(first.raw_properties)
        assert props.message_id == "m" and props.headers["n"] == -7
        assert ch.get("g").body == b"two"
        assert ch.get("g") is None
    assert broker.read_bodies(vhost, "g") == [b"one", b"two"]


def test_publish_with_confirms_and_a_return(broker, vhost):
    broker.declare_queue(vhost, "p")
    import pika

    raw = b"".join(pika.BasicProperties(delivery_mode=2, headers={"i": 1}).encode())
    big = bytes(range(256)) * 2000  # 512 KB: spread over several body frames
    with Connection.open(_params(broker, vhost)) as conn:
        ch = conn.channel()
        ch.select_confirms()
        tags = [ch.publish("", "p", raw, f"m{i}".encode(), mandatory=True, flush=False) for i in range(100)]
        tags.append(ch.publish("", "p", raw, big, mandatory=True))
        tags.append(ch.publish("", "nowhere", raw, b"lost", mandatory=True))
        assert tags == list(range(1, 103))
        assert conn.pump(lambda: any(t >= 102 for _, t, _ in ch.acks), timeout=30)
        assert all(ok for ok, _, _ in ch.acks)
        assert [r.body for r in ch.returns] == [b"lost"]
        assert ch.returns[0].method.reply_code == 312
    assert broker.read_bodies(vhost, "p") == [f"m{i}".encode() for i in range(100)] + [big]


def test_a_connection_the_broker_closes_is_lost_with_its_reason(broker, vhost):
    name = unique_name("wire")
    broker.declare_queue(vhost, "c")
    with Connection.open(_params(broker, vhost, name=name)) as conn:
        ch = conn.channel()
        ch.consume("c")

        def listed():
            return [c["name"] for c in broker.api("GET", "/api/connections")
                    if (c.get("client_properties") or {}).get("connection_name") == name]
        deadline = time.monotonic() + 30
        while not listed() and time.monotonic() < deadline:
            time.sleep(0.2)
        for cname in listed():
            broker.api("DELETE", f"/api/connections/{cname}", headers={"X-Reason": "test-close"}, ok=(404,))
        with pytest.raises(ConnectionLost) as e:
            conn.pump(lambda: False, timeout=30)
        assert e.value.code == 320 and "test-close" in str(e.value)
        with pytest.raises(ConnectionLost):
            ch.declare_passive("c")


def test_heartbeats_keep_an_idle_connection(broker, vhost):
    broker.declare_queue(vhost, "h")
    with Connection.open(_params(broker, vhost, heartbeat=1)) as conn:
        assert conn.heartbeat == 1
        ch = conn.channel()
        ch.consume("h")
        t0 = time.monotonic()
        assert not conn.pump(lambda: False, timeout=4.0)  # four heartbeat periods with nothing to read
        assert time.monotonic() - t0 >= 4.0
        broker.publish(vhost, "h", [b"after"])
        assert [d[5] for d in _drain_until(conn, ch, 1)] == [b"after"]


def test_tls_reads_and_refuses_a_server_it_cannot_verify(rmq310, vhost_factory):
    import ssl

    from support.tls import tls_files

    tls = tls_files()
    vh = vhost_factory(rmq310)
    rmq310.declare_queue(vh, "t", arguments={"x-queue-type": "quorum"})
    big = bytes(range(256)) * 1024  # 256 KiB: TLS records split it; the parser gets it whole
    bodies = [f"t{i}".encode() for i in range(500)] + [big]
    rmq310.publish(vh, "t", bodies)
    ctx = ssl.create_default_context(cafile=str(tls.ca_cert))
    params = _params(rmq310, vh, ssl_context=ctx, server_hostname="localhost")
    params.port = rmq310.amqps_port
    with Connection.open(params) as conn:
        ch = conn.channel()
        ch.qos(0)
        ch.consume("t")
        assert [d[5] for d in _drain_until(conn, ch, len(bodies))] == bodies
    wrong = ssl.create_default_context(cafile=str(tls.wrong_ca_cert))
    with pytest.raises(AmqpConnectionError, match="TLS certificate verification failed"):
        Connection.open(Params(host=rmq310.host, port=rmq310.amqps_port, vhost=vh, ssl_context=wrong,
                               server_hostname="localhost"))
    assert rmq310.read_bodies(vh, "t") == bodies
