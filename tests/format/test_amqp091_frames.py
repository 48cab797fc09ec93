"""scan_deliveries (C and pure Python) against frames pika itself encodes and decodes.

Every buffer here is built with pika's own encoder (``pika.frame.*.marshal``), and the
expected values come from pika's own decoder (``pika.frame.decode_frame``), so the fast
path is checked against what pika would have handed the queue reader. Each case runs
on both implementations, which must agree exactly (``scan`` below).
"""

from __future__ import annotations

import datetime
import decimal
import random
import struct

import pika.frame
import pika.spec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbak.format import backend
from rbak.format.amqp091_frames import BROKEN, INCOMPLETE, OTHER, Delivery, scan_deliveries, scan_deliveries_py

from support.require import unavailable

FRAME_MAX = 131072  # RabbitMQ's and pika's default: a body frame carries at most FRAME_MAX - 8 bytes

HEADERS = {
    "str": "héllo ✓", "bytes": b"\x00\xff", "int": 7, "big": 2**40, "neg": -5, "bool": True, "none": None,
    "dec": decimal.Decimal("123.45"), "ts": datetime.datetime(2024, 1, 2, 3, 4, 5),
    "table": {"a": [1, "two", {"deep": False}], "empty": {}}, "list": [],
}
PROPS = pika.spec.BasicProperties(content_type="application/json", content_encoding="gzip", headers=HEADERS,
                                  delivery_mode=2, priority=9, correlation_id="c-1", reply_to="r", expiration="60000",
                                  message_id="m-1", timestamp=1_700_000_000, type="t", user_id="guest",
                                  app_id="app", cluster_id="cl")


def c_scan():
    """The C scanner: skipped when RBAK_SPEEDUPS=0 chose pure Python, unavailable when never built
    (the pure-Python half runs everywhere)."""
    fn = getattr(backend.speedups, "scan_deliveries", None)
    if fn is None:
        if backend.speedups is None and backend.BUILT:
            pytest.skip("RBAK_SPEEDUPS=0: only scan_deliveries_py is under test")
        unavailable("the C helper is not built, or built before _amqp091.c: scan_deliveries is pure Python here")
    return fn


IMPLS = [pytest.param("py", id="py"), pytest.param("c", id="c")]


def impl(name: str):
    return scan_deliveries_py if name == "py" else c_scan()


def both(buf, pos: int, channel: int):
    """The one result both implementations give (the C one only where it is built)."""
    want = scan_deliveries_py(buf, pos, channel)
    fn = getattr(backend.speedups, "scan_deliveries", None)
    if fn is not None:
        got = fn(buf, pos, channel)
        assert got == want, (pos, channel)
        assert [type(x) for d in got[1] for x in d] == [type(x) for d in want[1] for x in d]
    return want


def method(channel: int, m) -> bytes:
    return pika.frame.Method(channel, m).marshal()


def message(channel: int, tag: int, body: bytes, props: pika.spec.BasicProperties | None = None, *,
            exchange: str | bytes = "ex", routing_key: str | bytes = "rk", redelivered: bool = False,
            frame_max: int = FRAME_MAX, consumer_tag: str = "ctag-1") -> bytes:
    """One Basic.Deliver + content header + body frames, as a broker writes them (body split at frame_max)."""
    step = frame_max - 8
    frames = [method(channel, pika.spec.Basic.Deliver(consumer_tag, tag, redelivered, exchange, routing_key)),
              pika.frame.Header(channel, len(body), props or pika.spec.BasicProperties()).marshal()]
    frames += [pika.frame.Body(channel, body[i:i + step]).marshal() for i in range(0, len(body), step)]
    return b"".join(frames)


def pika_decode(buf: bytes) -> list[tuple]:
    """The deliveries of ``buf`` as pika decodes them, in scan_deliveries' tuple shape."""
    out, pos, cur = [], 0, None
    while pos < len(buf):
        n, f = pika.frame.decode_frame(buf[pos:])
        assert f is not None
        if isinstance(f, pika.frame.Method):
            m = f.method
            cur = [m.delivery_tag, m.redelivered, m.exchange, m.routing_key, None, b""]
        elif isinstance(f, pika.frame.Header):
            hdr = buf[pos:pos + n]
            cur[4] = hdr[7 + 12:-1]  # the property bytes, from the flags on
            if f.body_size == 0:
                out.append(tuple(cur))
            size = f.body_size
        else:
            cur[5] += f.fragment
            if len(cur[5]) == size:
                out.append(tuple(cur))
        pos += n
    return out


def props_of(raw: bytes) -> pika.spec.BasicProperties:
    p = pika.spec.BasicProperties()
    p.decode(raw)
    return p


MESSAGES = [
    message(1, 1, b"hello", PROPS),
    message(1, 2, b"", PROPS),  # empty body: no body frame at all
    message(1, 3, bytes(range(256)) * 1200, redelivered=True),  # 300 KiB: three body frames
    message(1, 4, b"x" * (FRAME_MAX - 8)),  # exactly one full body frame
    message(1, 5, b"y" * (FRAME_MAX - 7)),  # one byte over: a second frame of one byte
    message(1, 6, b"\x00\xce" * 50, exchange=b"\xff\xfe", routing_key=b"k\xc3"),  # not UTF-8: pika gives bytes
    message(1, 7, b"unicode", exchange="éx", routing_key="clé.ü.✓"),
    message(1, 2**64 - 1, b"max tag", exchange="", routing_key=""),
]


@pytest.mark.parametrize("name", IMPLS)
def test_messages_are_parsed_as_pika_decodes_them(name):
    scan = impl(name)
    buf = b"".join(MESSAGES)
    end, got, status = scan(buf, 0, 1)
    assert (end, status) == (len(buf), OTHER)
    assert got == pika_decode(buf)
    assert len(got) == len(MESSAGES)
    d = [Delivery(*t) for t in got]
    assert d[0].body == b"hello" and props_of(d[0].raw_properties).headers["int"] == 7
    assert d[1].body == b"" and props_of(d[1].raw_properties).message_id == "m-1"
    assert d[2].body == bytes(range(256)) * 1200 and d[2].redelivered is True
    assert d[4].body == b"y" * (FRAME_MAX - 7)
    assert (d[5].exchange, d[5].routing_key) == (b"\xff\xfe", b"k\xc3")
    assert (d[6].exchange, d[6].routing_key) == ("éx", "clé.ü.✓")
    assert d[7].delivery_tag == 2**64 - 1 and (d[7].exchange, d[7].routing_key) == ("", "")
    assert all(isinstance(t[4], bytes) and isinstance(t[5], bytes) for t in got)


def test_properties_are_the_raw_bytes_pika_decodes_back():
    _end, got, _status = both(message(3, 9, b"b", PROPS), 0, 3)
    p = props_of(got[0][4])
    assert (p.content_type, p.message_id, p.priority, p.timestamp, p.cluster_id) == ("application/json", "m-1", 9,
                                                                                    1_700_000_000, "cl")
    assert p.headers["str"] == "héllo ✓" and p.headers["table"] == {"a": [1, "two", {"deep": False}], "empty": {}}
    assert p.headers["dec"] == decimal.Decimal("123.45") and p.headers["none"] is None
    assert both(message(3, 9, b"b"), 0, 3)[1][0][4] == b"\x00\x00"  # no property at all: just the flags


@pytest.mark.parametrize("frame_max", [4096, 8192, FRAME_MAX])
def test_bodies_split_over_many_frames(frame_max):
    body = random.Random(frame_max).randbytes(1024 * 1024 + 17)
    buf = message(2, 1, body, PROPS, frame_max=frame_max) + message(2, 2, b"after", frame_max=frame_max)
    end, got, status = both(buf, 0, 2)
    assert (end, status) == (len(buf), OTHER)
    assert [t[5] for t in got] == [body, b"after"]


def test_every_split_point_and_resume():
    msgs = [message(1, 1, b"a" * 10, PROPS), message(1, 2, b""), message(1, 3, b"c" * 300, frame_max=64),
            message(1, 4, b"d", exchange=b"\xfe")]
    buf = b"".join(msgs)
    bounds = [0]
    for m in msgs:
        bounds.append(bounds[-1] + len(m))
    full = both(buf, 0, 1)[1]
    assert len(full) == 4
    for cut in range(len(buf) + 1):
        end, got, status = both(buf[:cut], 0, 1)
        whole = max(i for i, b in enumerate(bounds) if b <= cut)  # messages entirely inside the cut
        assert end == bounds[whole] and got == full[:whole], cut
        assert status == (OTHER if cut == end else INCOMPLETE), cut
        # more bytes arrive: scanning on from `end` gives the rest, so the total is the same
        end2, rest, status2 = both(buf, end, 1)
        assert (end2, status2) == (len(buf), OTHER) and got + rest == full, cut


OTHER_FRAMES = {
    "other channel": message(2, 1, b"x"),
    "heartbeat": pika.frame.Heartbeat().marshal(),
    "basic.cancel": method(1, pika.spec.Basic.Cancel("ctag-1")),
    "channel.close": method(1, pika.spec.Channel.Close(406, "PRECONDITION_FAILED", 60, 80)),
    "basic.consume-ok": method(1, pika.spec.Basic.ConsumeOk("ctag-1")),
    "basic.get-ok": method(1, pika.spec.Basic.GetOk(1, False, "", "q", 0)),
    "basic.return": method(1, pika.spec.Basic.Return(312, "NO_ROUTE", "", "q")),
    "connection.close": method(0, pika.spec.Connection.Close(320, "CONNECTION_FORCED", 0, 0)),
}


@pytest.mark.parametrize("frame", list(OTHER_FRAMES.values()), ids=list(OTHER_FRAMES))
def test_other_frames_stop_the_scan_exactly_there(frame):
    a, b = message(1, 1, b"first", PROPS), message(1, 2, b"second")
    buf = a + frame + b
    assert both(buf, 0, 1) == (len(a), [pika_decode(a)[0]], OTHER)
    # pika takes that one frame; the scan goes on after it
    assert both(buf, len(a) + len(frame), 1) == (len(buf), pika_decode(b), OTHER)
    # first thing in the buffer: nothing taken
    assert both(frame + b, 0, 1) == (0, [], OTHER)
    # an incomplete frame after a delivery: the delivery is taken, the rest waits for more bytes
    assert both(a + frame[:7], 0, 1) == (len(a), [pika_decode(a)[0]], INCOMPLETE)


def _with_end(frame: bytes, end: int) -> bytes:
    return frame[:-1] + bytes([end])


def test_interleaved_or_damaged_delivery_is_broken():
    good = message(1, 1, b"ok")
    m = method(1, pika.spec.Basic.Deliver("c", 2, False, "ex", "rk"))
    h = pika.frame.Header(1, 6, PROPS).marshal()
    b1, b2 = pika.frame.Body(1, b"abc").marshal(), pika.frame.Body(1, b"def").marshal()
    hb = pika.frame.Heartbeat().marshal()
    other = pika.frame.Body(2, b"abc").marshal()
    cases = {
        "heartbeat before the header": m + hb + h + b1 + b2,
        "heartbeat between the bodies": m + h + b1 + hb + b2,
        "another channel's body frame": m + h + other + b2,
        "header of another channel": m + pika.frame.Header(2, 6, PROPS).marshal() + b1 + b2,
        "a method instead of the header": m + method(1, pika.spec.Basic.Cancel("c")) + h + b1 + b2,
        "a body frame where the header belongs": m + b1 + h + b2,
        "next delivery before the body": m + h + good,
        "header frame end wrong": m + _with_end(h, 0) + b1 + b2,
        "body frame end wrong": m + h + _with_end(b1, 0xCD) + b2,
        "second body frame end wrong": m + h + b1 + _with_end(b2, 0),
        "more body than the header says": m + h + b1 + pika.frame.Body(1, b"defg").marshal(),
        "header of another class": m + pika.frame.Header(1, 6, PROPS).marshal()[:7] + b"\x00\x3d"
                                   + pika.frame.Header(1, 6, PROPS).marshal()[9:] + b1 + b2,
        "header too short": m + struct.pack(">BHI", 2, 1, 13) + b"\x00\x3c" + b"\x00" * 11 + b"\xce" + b1 + b2,
    }
    for name, bad in cases.items():
        for scan in _impls():
            assert scan(good + bad + good, 0, 1) == (len(good), pika_decode(good), BROKEN), (name, scan)
            assert scan(bad, 0, 1) == (0, [], BROKEN), (name, scan)
    # an intact delivery with nothing after it is complete; one byte less is incomplete, not broken
    whole = m + h + b1 + b2
    assert both(whole, 0, 1)[2] == OTHER and both(whole[:-1], 0, 1) == (0, [], INCOMPLETE)


def test_truncated_deliver_method_is_broken():
    m = method(1, pika.spec.Basic.Deliver("ctag", 1, False, "ex", "rk"))
    payload = m[7:-1]
    rest = pika.frame.Header(1, 0, PROPS).marshal()
    for n in range(4, len(payload)):  # the Deliver's arguments cut short inside a well-formed frame
        short = struct.pack(">BHI", 1, 1, n) + payload[:n] + b"\xce"
        assert both(short + rest, 0, 1) == (0, [], BROKEN), n
    # not even class and method: not a delivery, pika's business
    assert both(struct.pack(">BHI", 1, 1, 2) + b"\x00\x3c\xce", 0, 1) == (0, [], OTHER)


def test_method_frame_with_wrong_end_is_left_to_pika():
    """A broken frame at the head is pika's to report (its decoder raises InvalidFrameError)."""
    m = message(1, 1, b"x")
    n = len(method(1, pika.spec.Basic.Deliver("ctag-1", 1, False, "ex", "rk")))
    damaged = _with_end(m[:n], 0) + m[n:]
    assert both(damaged, 0, 1) == (0, [], OTHER)
    assert both(m + damaged, 0, 1) == (len(m), pika_decode(m), OTHER)
    with pytest.raises(pika.exceptions.InvalidFrameError):
        pika.frame.decode_frame(damaged)


def _impls():
    out = [scan_deliveries_py]
    fn = getattr(backend.speedups, "scan_deliveries", None)
    if fn is not None:
        out.append(fn)
    return out


@pytest.mark.parametrize("name", IMPLS)
def test_pos_outside_the_buffer(name):
    scan = impl(name)
    buf = message(1, 1, b"x")
    for pos in (-1, len(buf) + 1, 10**9, -(10**9)):
        with pytest.raises(ValueError, match="pos outside the buffer"):
            scan(buf, pos, 1)
    assert scan(buf, len(buf), 1) == (len(buf), [], OTHER)
    assert scan(b"", 0, 1) == (0, [], OTHER)


@pytest.mark.parametrize("name", IMPLS)
def test_any_bytes_like_buffer(name):
    scan = impl(name)
    buf = b"".join(MESSAGES[:3])
    want = scan(buf, 0, 1)
    assert scan(bytearray(buf), 0, 1) == want
    assert scan(memoryview(buf), 0, 1) == want
    # a scan from a later position (the fast path resumes where pika left off)
    assert scan(buf, len(MESSAGES[0]), 1) == (len(buf), want[1][1:], OTHER)


def test_the_module_uses_c_when_built():
    fn = getattr(backend.speedups, "scan_deliveries", None)
    assert scan_deliveries is (fn or scan_deliveries_py)


# -- random message sequences: C and Python agree on every one, at every cut ---------------------------

short_str = st.one_of(st.text(max_size=12), st.binary(max_size=12))
props_st = st.builds(
    pika.spec.BasicProperties,
    content_type=st.none() | st.text(max_size=10), message_id=st.none() | st.text(max_size=10),
    priority=st.none() | st.integers(0, 9), timestamp=st.none() | st.integers(0, 2**40),
    headers=st.none() | st.dictionaries(st.text(max_size=5), st.one_of(
        st.text(max_size=10), st.integers(-(2**63), 2**63 - 1), st.booleans(), st.none(), st.binary(max_size=8),
        st.lists(st.integers(0, 100), max_size=3)), max_size=4),
)
OTHERS = [pika.frame.Heartbeat().marshal(), method(1, pika.spec.Basic.Cancel("ctag-1")),
          method(1, pika.spec.Channel.Close(406, "x", 0, 0)), method(3, pika.spec.Basic.Ack(5, False))]


@st.composite
def streams(draw) -> list[tuple[int | None, bytes, int]]:
    """Bytes as a broker might write them, as parts (delivery's channel or None, bytes, first frame's length):
    deliveries on channels 1-3 with body frames of any size, and other single frames."""
    parts = []
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.integers(0, 4)) == 0:
            f = draw(st.sampled_from(OTHERS))
            parts.append((None, f, len(f)))
            continue
        ch = draw(st.sampled_from([1, 1, 1, 2, 3]))
        ex, rk = draw(short_str), draw(short_str)
        data = message(ch, draw(st.integers(0, 2**64 - 1)), draw(st.binary(max_size=400)), draw(props_st),
                       exchange=ex, routing_key=rk, redelivered=draw(st.booleans()), frame_max=draw(st.integers(9, 300)))
        first = len(method(ch, pika.spec.Basic.Deliver("ctag-1", 0, False, ex, rk)))
        parts.append((ch, data, first))
    return parts


def expected(parts, cut: int, channel: int) -> tuple[int, list, int]:
    """What a scan of the first ``cut`` bytes must return, from how the parts were built."""
    pos, out = 0, []
    for ch, data, first in parts:
        if pos == cut:
            break
        if ch != channel:
            return pos, out, OTHER if pos + first <= cut else INCOMPLETE
        if pos + len(data) > cut:
            return pos, out, INCOMPLETE
        out += pika_decode(data)
        pos += len(data)
    return pos, out, OTHER


@settings(max_examples=300, deadline=None)
@given(streams(), st.data())
def test_c_and_python_agree_on_random_streams(parts, data):
    buf = b"".join(p[1] for p in parts)
    channel = data.draw(st.sampled_from([1, 2, 3]))
    for cut in [len(buf), *data.draw(st.lists(st.integers(0, len(buf)), max_size=8))]:
        assert both(buf[:cut], 0, channel) == expected(parts, cut, channel), cut
    # any start position at all, even inside a frame: both agree and neither fails
    for pos in data.draw(st.lists(st.integers(0, len(buf)), max_size=6)):
        both(buf, pos, channel)
    # the whole stream as the fast path takes it: the deliveries of `channel` here, every other frame to pika
    taken, pos = [], 0
    while True:
        end, got, status = both(buf, pos, channel)
        taken += got
        assert status == OTHER
        if end == len(buf):
            break
        n, _frame = pika.frame.decode_frame(buf[end:])
        pos = end + n
    assert taken == [d for ch, p, _ in parts if ch == channel for d in pika_decode(p)]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 3))
def test_c_and_python_agree_on_garbage(junk, channel):
    m = message(1, 1, b"x")
    for buf in (junk, m + junk, m[:20] + junk, junk + m):
        for pos in range(0, len(buf) + 1, max(1, len(buf) // 12)):
            both(buf, pos, channel)
