"""Deliveries as readers take them: ``(method, properties, body)`` from a ``wire`` channel.

``wire`` keeps each delivery as the tuple the frame parser produced (tag, redelivered,
exchange, routing key, raw content header, body). Readers want the method's fields and
the decoded properties; the header's raw bytes travel along (``KeptProperties.raw``)
because pika's table decoder truncates floats, folds the integer widths together and
fails on NaN, so records are built from the bytes (``backup.convert``).
"""

from __future__ import annotations

from typing import Any, Iterator

import pika.spec

from .wire import Channel, Connection

#: Properties objects kept by raw bytes (a queue's messages mostly carry the same few).
PROPS_CACHE = 512


class Deliver:
    """What a reader needs of a ``Basic.Deliver`` or ``Basic.GetOk``."""

    __slots__ = ("delivery_tag", "redelivered", "exchange", "routing_key")

    def __init__(self, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str):
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key


class KeptProperties(pika.spec.BasicProperties):
    """pika's properties of a content header, with the header's bytes (``raw``) for rbak's typed decode;
    ``undecodable``: pika could not decode them (a NaN header), and only ``raw`` tells the truth."""

    def __init__(self, raw: bytes):
        super().__init__()
        self.raw = raw
        self.undecodable = False
        try:
            self.decode(raw)
        except Exception:  # noqa: BLE001 - pika cannot decode it; rbak's decoder reads the raw bytes
            self.undecodable = True


_PROPS: dict[bytes, KeptProperties] = {}


def properties(raw: bytes) -> KeptProperties:
    """The properties of these raw content-header bytes, decoded once per distinct bytes.
    Shared objects: nothing mutates a delivery's properties."""
    p = _PROPS.get(raw)
    if p is None:
        p = KeptProperties(raw)
        if len(_PROPS) >= PROPS_CACHE:
            _PROPS.clear()
        _PROPS[raw] = p
    return p


def to_delivery(item: tuple) -> tuple[Deliver, KeptProperties, bytes]:
    """``(method, properties, body)`` of one parsed delivery tuple."""
    tag, redelivered, exchange, routing_key, raw, body = item
    return Deliver(tag, redelivered, exchange, routing_key), properties(raw), body


def receive(conn: Connection, ch: Channel, tag: str, idle: float) -> Iterator[tuple[Any, Any, Any]]:
    """The deliveries of consumer ``tag`` on ``ch`` as they arrive; ``(None, None, None)`` after
    ``idle`` s without one. Ends when the broker cancels the consumer (what arrived before the
    cancel is yielded first). One consumer receives on a channel at a time: a channel's
    deliveries are not told apart by consumer. What the caller does not take stays in
    ``ch.deliveries``, in order."""
    while True:
        if not ch.deliveries:
            if tag in ch.cancelled:
                return
            if not conn.pump(lambda: bool(ch.deliveries) or tag in ch.cancelled or not ch.is_open, timeout=idle):
                yield None, None, None
                continue
            ch.check_open()
            continue
        batch, ch.deliveries = ch.deliveries, []
        for i, item in enumerate(batch):
            try:
                yield to_delivery(item)
            except GeneratorExit:
                ch.deliveries[:0] = batch[i + 1:]  # not taken: kept, ahead of what arrived meanwhile
                raise
