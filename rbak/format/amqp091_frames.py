"""Complete ``Basic.Deliver`` messages of one channel, parsed straight off AMQP 0-9-1 bytes.

rbak's connection (``rbak.broker.wire``) hands its received bytes here first: per
message a backup needs only the delivery tag, the redelivered bit, exchange, routing
key, the raw property bytes and the body, and generic decoding of the same frames was
most of the reading thread's time (issue 20). Whatever is not the start of a complete
delivery on the channel is left where it is, for the connection's frame decoder, in order.

``scan_deliveries`` is the C helper's (``_amqp091.c``) when it is built and
enabled, else ``scan_deliveries_py``: the same results (the tests compare them).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .backend import speedups

FRAME_METHOD, FRAME_HEADER, FRAME_BODY = 1, 2, 3
FRAME_END = 0xCE
BASIC_CLASS, BASIC_DELIVER = 60, 60

OTHER = 0  #: the frame at ``end`` is not a Basic.Deliver of the channel (or ``end`` is the end of the bytes)
INCOMPLETE = 1  #: the bytes at ``end`` are not yet a whole frame / a whole delivery of the channel
BROKEN = 2  #: a delivery of the channel starts at ``end`` and a frame that is not part of it follows

_HEAD = struct.Struct(">BHI")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


class Delivery(NamedTuple):
    """One parsed ``Basic.Deliver`` + content header + body (what ``scan_deliveries`` lists)."""

    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    raw_properties: bytes  # the content header from the property flags on (what pika's decode reads)
    body: bytes


def _short_str(b: bytes) -> str | bytes:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b  # pika's decode_short_string gives the bytes too


def _frame(buf, pos: int) -> tuple[int, int, int, int] | int:
    """(type, channel, payload start, payload size) of the frame at ``pos``, or INCOMPLETE / BROKEN."""
    if len(buf) - pos < 7:
        return INCOMPLETE
    ftype, chan, size = _HEAD.unpack_from(buf, pos)
    if len(buf) - pos - 8 < size:
        return INCOMPLETE
    if buf[pos + 7 + size] != FRAME_END:
        return BROKEN
    return ftype, chan, pos + 7, size


def scan_deliveries_py(buf, pos: int, channel: int) -> tuple[int, list[tuple], int]:
    """(end, deliveries as 6-tuples in ``Delivery`` order, status): see the module docstring."""
    out: list[tuple] = []
    n = len(buf)
    if not 0 <= pos <= n:
        raise ValueError("pos outside the buffer")
    while pos < n:
        f = _frame(buf, pos)
        if f == INCOMPLETE:
            return pos, out, INCOMPLETE
        if isinstance(f, int):  # BROKEN (the only other int _frame returns)
            return pos, out, OTHER  # not ours to judge: pika's decoder reports it
        ftype, chan, pl, size = f
        if ftype != FRAME_METHOD or chan != channel or size < 4 or _U16.unpack_from(buf, pl)[0] != BASIC_CLASS \
                or _U16.unpack_from(buf, pl + 2)[0] != BASIC_DELIVER:
            return pos, out, OTHER
        end = pl + size
        m = pl + 4
        if m + 1 > end or m + 1 + buf[m] > end:
            return pos, out, BROKEN
        m += 1 + buf[m]
        if m + 10 > end:
            return pos, out, BROKEN
        tag = _U64.unpack_from(buf, m)[0]
        redelivered = bool(buf[m + 8] & 1)
        m += 9
        exn = buf[m]
        if m + 1 + exn + 1 > end:
            return pos, out, BROKEN
        exchange = bytes(buf[m + 1:m + 1 + exn])
        m += 1 + exn
        rkn = buf[m]
        if m + 1 + rkn > end:
            return pos, out, BROKEN
        routing_key = bytes(buf[m + 1:m + 1 + rkn])
        q = pos + 8 + size
        h = _frame(buf, q)
        if h == INCOMPLETE:
            return pos, out, INCOMPLETE
        # past INCOMPLETE the only int _frame returns is BROKEN
        if isinstance(h, int) or h[0] != FRAME_HEADER or h[1] != channel or h[3] < 14 \
                or _U16.unpack_from(buf, h[2])[0] != BASIC_CLASS:
            return pos, out, BROKEN
        body_size = _U64.unpack_from(buf, h[2] + 4)[0]
        props = bytes(buf[h[2] + 12:h[2] + h[3]])
        q = h[2] + h[3] + 1
        parts = []
        got = 0
        while got < body_size:
            b = _frame(buf, q)
            if b == INCOMPLETE:
                return pos, out, INCOMPLETE
            if isinstance(b, int) or b[0] != FRAME_BODY or b[1] != channel or got + b[3] > body_size:  # int: BROKEN
                return pos, out, BROKEN
            parts.append(bytes(buf[b[2]:b[2] + b[3]]))
            got += b[3]
            q = b[2] + b[3] + 1
        out.append((tag, redelivered, _short_str(exchange), _short_str(routing_key), props, b"".join(parts)))
        pos = q
    return pos, out, OTHER


scan_deliveries = getattr(speedups, "scan_deliveries", None) or scan_deliveries_py
