"""What each way of giving a quorum message back costs its delivery budget, per broker (issue 27).

Not a speed benchmark: a measurement. For every return (AMQP 0-9-1 channel close,
cancel + close, basic.nack requeue, basic.reject requeue; AMQP 1.0 ``released``,
``modified`` with delivery-failed false / true, a link detached with the message
unsettled) a fresh quorum queue gets one message, the message is taken and given
back ``ROUNDS`` times that way, then taken once more (auto-ack) and its
``x-delivery-count`` / ``x-acquired-count`` printed. A second part checks the
default delivery limit: an ordinary quorum queue (no argument, no policy) whose
message is returned by channel close 19, 20 and 21 times: is it still there?

    python benchmarks/return_costs.py [rmq310 rmq40 rmq43]
"""

from __future__ import annotations

import sys
import time
import uuid

import pika
from bench_common import BROKER_HELP, BROKERS, Broker

ROUNDS = 3


def _fresh(conn: pika.BlockingConnection, arguments: dict | None = None) -> str:
    name = "rc-" + uuid.uuid4().hex[:8]
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum", **(arguments or {})})
    ch.confirm_delivery()
    ch.basic_publish("", name, b"m", pika.BasicProperties(delivery_mode=2))
    ch.close()
    return name


def _take(ch, name: str):
    ch.basic_qos(prefetch_count=1)
    for method, props, _body in ch.consume(name, auto_ack=False, inactivity_timeout=10):
        return method, props
    raise RuntimeError("no message")


def ret_close(conn, name):
    ch = conn.channel()
    ch.basic_get(name, auto_ack=False)
    ch.close()


def ret_cancel_close(conn, name):
    ch = conn.channel()
    _take(ch, name)
    ch.cancel()
    ch.close()


def ret_nack(conn, name):
    ch = conn.channel()
    method, _ = _take(ch, name)
    ch.cancel()
    ch.basic_nack(method.delivery_tag, requeue=True)
    ch.close()


def ret_reject(conn, name):
    ch = conn.channel()
    method, _ = _take(ch, name)
    ch.cancel()
    ch.basic_reject(method.delivery_tag, requeue=True)
    ch.close()


def _amqp10(broker: Broker, vh: str, name: str, outcome: str) -> None:
    from proton import Delivery

    from rbak.config import ConnectionConfig
    from rbak.broker.amqp10_publisher import _Wire

    w = _Wire(ConnectionConfig(amqp_url=broker.amqp_url(vh)), vh)
    try:
        link = w.session.receiver("rc")
        link.source.address = "/queues/" + name
        link.open()
        link.flow(1)
        deadline = time.monotonic() + 10
        while link.current is None or link.current.partial:
            if time.monotonic() > deadline:
                raise RuntimeError(f"AMQP 1.0: nothing received ({w.problem(link)})")
            w.io(0.05)
        d = link.current
        link.recv(d.pending)
        link.advance()
        if outcome == "released":
            d.update(Delivery.RELEASED)
        elif outcome.startswith("modified"):
            d.local.failed = outcome.endswith("failed")
            d.local.undeliverable = False
            d.update(Delivery.MODIFIED)
        if outcome != "detach":
            d.settle()
        for _ in range(5):
            w.io(0.02)
        if outcome == "detach":
            link.close()
            for _ in range(5):
                w.io(0.02)
    finally:
        w.close()


def _counts(conn, name) -> tuple[int | None, int | None, int]:
    ch = conn.channel()
    left = ch.queue_declare(name, passive=True).method.message_count
    method, props, _ = ch.basic_get(name, auto_ack=True)
    ch.queue_delete(name)
    ch.close()
    if method is None:
        return None, None, left
    h = props.headers or {}
    return h.get("x-delivery-count"), h.get("x-acquired-count"), left


def main(ids: list[str]) -> None:
    for bid in ids:
        b = Broker(bid)
        version = b.version()
        with b.vhost() as vh:
            conn = pika.BlockingConnection(b.params(vh))
            ways = [("0-9-1 channel close (basic.get)", ret_close, None),
                    ("0-9-1 cancel, then close", ret_cancel_close, None),
                    ("0-9-1 basic.nack requeue", ret_nack, None),
                    ("0-9-1 basic.reject requeue", ret_reject, None)]
            if not version.startswith("3."):
                ways += [(f"1.0 {o}", None, o) for o in ("released", "modified", "modified-failed", "detach")]
            for label, fn, outcome in ways:
                name = _fresh(conn)
                try:
                    for _ in range(ROUNDS):
                        if fn is not None:
                            fn(conn, name)
                        else:
                            _amqp10(b, vh, name, outcome)
                    time.sleep(0.2)
                    dc, ac, left = _counts(conn, name)
                    print(f"{bid} {version}: {label:34s} x{ROUNDS}: x-delivery-count={dc} "
                          f"x-acquired-count={ac} (messages left {left})", flush=True)
                except Exception as e:  # noqa: BLE001 - a measurement: report and go on
                    print(f"{bid} {version}: {label:34s} failed: {e!r}", flush=True)
                    if conn.is_closed:
                        conn = pika.BlockingConnection(b.params(vh))
            # the default delivery limit: how many channel-close returns an ordinary quorum queue survives
            for n in (20, 21):
                name = _fresh(conn)
                for _ in range(n):
                    ret_close(conn, name)
                time.sleep(0.3)
                dc, _ac, left = _counts(conn, name)
                print(f"{bid} {version}: no limit set, {n} closes: messages left {left}, x-delivery-count={dc}",
                      flush=True)
            conn.close()


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]) or not all(a in BROKERS for a in sys.argv[1:]):
        print(__doc__.rstrip() + "\n\nBrokers: " + BROKER_HELP + ".")
        sys.exit(0 if any(a in ("-h", "--help") for a in sys.argv[1:]) else 2)
    main(sys.argv[1:] or ["rmq310", "rmq40", "rmq43"])
