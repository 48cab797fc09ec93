"""Data directories written by real RabbitMQ nodes, with what each queue must export.

Each scenario starts a private node (see rabbitmq_private.py), publishes,
consumes/acks some messages, holds some unacked, stops (or kills) the node and
returns ``Scenario(data_dir, expected)`` where ``expected[(vhost, queue)]`` is
the list of messages the importer must produce, in order. Built once per test
session and shared between xdist workers through a file lock.
"""

from __future__ import annotations

import fcntl
import pickle
import shutil
import uuid
import time
from dataclasses import dataclass, field
from pathlib import Path

import pika

from rbak.format.record import (
    VOID, Array, BackupProperties, Bool, Bytes, Double, Float, Long, LongString, Short, Table, Timestamp,
    decimal_header,
)
from rbak.offline.rabbitmq.rabbitmq_dir import queue_dir_name, vhost_dir_name
from support.private_node import PrivateNode, chroot_for, raw, raw_bytes, rawable

VHOST2 = "imp-vh-ü"


@dataclass
class Msg:
    body: bytes
    exchange: str
    routing_key: str
    properties: BackupProperties
    headers: tuple


@dataclass
class Scenario:
    name: str
    data_dir: Path
    expected: dict = field(default_factory=dict)  # (vhost, queue) -> list[Msg] (None: checked separately)
    versions: dict = field(default_factory=dict)  # (vhost, queue) -> 1 | 2
    published: dict = field(default_factory=dict)  # (vhost, queue) -> every message published
    dlx: bool = False


# Every AMQP field type RabbitMQ parses, as (published value, expected rbak value).
ALL_TYPES = [
    ("S-utf8", "héllo ✓", LongString("héllo ✓")),
    ("S-bin", raw_bytes("S", b"\xff\xfe"), Bytes(b"\xff\xfe")),
    ("x", b"\x00\x01\x02", Bytes(b"\x00\x01\x02")),
    ("b", raw("b", "b", -5), Short(-5)),
    ("B", raw("B", "B", 200), Short(200)),
    ("s", raw("s", "h", -300), Short(-300)),
    ("u", raw("u", "H", 60000), Long(60000)),
    ("I", raw("I", "i", -70000), Long(-70000)),
    ("i", raw("i", "I", 4_000_000_000), Long(4_000_000_000)),
    ("l", raw("l", "q", -(2**40)), Long(-(2**40))),
    ("L", raw("L", "q", 2**50), Long(2**50)),
    ("f", raw("f", "f", 1.5), Float(1.5)),
    ("d", raw("d", "d", -2.25), Double(-2.25)),
    ("D", raw("D", "BI", 2, 12345), decimal_header(2, 12345)),
    ("t", True, Bool(True)),
    ("t0", False, Bool(False)),
    ("T", raw("T", "Q", 1_700_000_000), Timestamp(1_700_000_000)),
    ("V", None, VOID),
    ("F", {"inner": "v", "n": 7}, Table((("inner", LongString("v")), ("n", Long(7))))),
    ("A", [1, "two", raw("d", "d", 3.5), {"k": True}, [raw("b", "b", 1)]],
     Array((Long(1), LongString("two"), Double(3.5), Table((("k", Bool(True)),)), Array((Short(1),))))),
    ("ünï", "key", LongString("key")),
]
ALL_HEADERS_PUB = {k: v for k, v, _ in ALL_TYPES}
ALL_HEADERS_EXP = tuple((k, e) for k, _, e in ALL_TYPES)


def rich_props(i: int) -> tuple[pika.BasicProperties, BackupProperties]:
    pub = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", headers=ALL_HEADERS_PUB,
        delivery_mode=2, priority=7, correlation_id="corr-ü", reply_to="reply.q", expiration="86400000",
        message_id=f"m{i}", timestamp=1_700_000_000 + i, type="ty", user_id="guest", app_id="app",
        cluster_id="cl",
    )
    exp = BackupProperties(
        content_type="application/json", content_encoding="utf-8", delivery_mode=2, priority=7,
        correlation_id="corr-ü", reply_to="reply.q", expiration="86400000", message_id=f"m{i}",
        timestamp=1_700_000_000 + i, type_field="ty", user_id="guest", app_id="app", cluster_id="cl",
    )
    return pub, exp


def plain_props(i: int) -> tuple[pika.BasicProperties, BackupProperties]:
    return (pika.BasicProperties(delivery_mode=2, message_id=f"m{i}"),
            BackupProperties(delivery_mode=2, message_id=f"m{i}"))


def pattern(tag: str, n: int) -> bytes:
    unit = f"<{tag}>".encode()
    return (unit * (n // len(unit) + 1))[:n]


def mixed_messages(queue: str) -> list[tuple[str, str, bytes, pika.BasicProperties, Msg]]:
    """12 messages: embedded and stored, empty and multi-frame bodies, every header type."""
    out = []
    for i in range(12):
        if i in (0, 1):
            pub, exp = rich_props(i)
            headers = ALL_HEADERS_EXP
        else:
            pub, exp = plain_props(i)
            headers = ()
        body = {
            0: "small-0 ü".encode(),
            1: pattern("big-1", 6000),
            3: b"",
            4: pattern("huge-4", 300_000),  # several body frames
        }.get(i, pattern(f"m{i}", 6000) if i % 2 else f"small-{i}".encode())
        exchange, rk = ("amq.direct", f"rk-{queue}") if i == 5 else ("", queue)
        out.append((exchange, rk, body, pub, Msg(body, exchange, rk, exp, headers)))
    return out


def publish(ch, msgs) -> None:
    for exchange, rk, body, props, _ in msgs:
        ch.basic_publish(exchange, rk, body, rawable(props), mandatory=True)


def ack_and_hold(ch, queue: str, ack: int, hold: int) -> None:
    """basic.get ``ack`` messages and ack them; get ``hold`` more and keep them unacked."""
    for _ in range(ack):
        m, _, _ = ch.basic_get(queue, auto_ack=False)
        assert m is not None
        ch.basic_ack(m.delivery_tag)
    for _ in range(hold):
        m, _, _ = ch.basic_get(queue, auto_ack=False)
        assert m is not None


def bulk(ch, queue: str, n: int) -> list[Msg]:
    out = []
    for i in range(n):
        body = b"n-%05d" % i
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, message_id=str(i)))
        out.append(Msg(body, "", queue, BackupProperties(delivery_mode=2, message_id=str(i)), ()))
    return out


def _declare(ch, queue: str, version: int, **args) -> None:
    if version == 2:
        args["x-queue-version"] = 2
    ch.queue_declare(queue, durable=True, arguments=args or None)


def build_main(version: str, base: Path) -> Scenario:
    """Clean stop: mixed queues (v1 + v2 on 3.10, v2 on 4.0), a dead-lettered message, bulk queues."""
    node = PrivateNode(version, base).start()
    sc = Scenario(f"main-{version}", node.data_dir, dlx=True)
    try:
        node.add_vhost(VHOST2)
        conn = node.connect("/")
        ch = conn.channel()
        ch.confirm_delivery()
        holders = []
        versions = (1, 2) if version.startswith("3") else (2,)
        for v in versions:
            q = f"v{v}-mixed"
            _declare(ch, q, v)
            ch.queue_bind(q, "amq.direct", f"rk-{q}")
            msgs = mixed_messages(q)
            publish(ch, msgs)
            hold_conn = node.connect("/")
            hch = hold_conn.channel()
            ack_and_hold(hch, q, ack=3, hold=2)
            holders.append(hold_conn)
            sc.expected[("/", q)] = [m[4] for m in msgs[3:]]
            sc.published[("/", q)] = [m[4] for m in msgs]
            sc.versions[("/", q)] = v
        # Dead-lettering: 3.10 stores the re-encoded properties as a 'P_basic' record; 4.0 keeps deaths
        # as annotations. Checked by its own assertions (times are not predictable).
        ch.queue_declare("dlx-target", durable=True)
        ch.queue_declare("dlx-src", durable=True,
                         arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlx-target"})
        ch.basic_publish("", "dlx-src", b"dead", rawable(pika.BasicProperties(
            delivery_mode=2, expiration="1", headers=ALL_HEADERS_PUB)))
        sc.expected[("/", "dlx-src")] = []
        sc.expected[("/", "dlx-target")] = None
        conn2 = node.connect(VHOST2)
        ch2 = conn2.channel()
        bulk_specs = [("q-ünï-✓", 1 if version.startswith("3") else 2, 2100, 10), ("many-v2", 2, 4200, 5)]
        for q, v, n, ack in bulk_specs:
            _declare(ch2, q, v)
            msgs = bulk(ch2, q, n)
            deadline = time.time() + 60
            while (got := ch2.queue_declare(q, durable=True, passive=True).method.message_count) < n:
                assert time.time() < deadline, (q, got, n)
                time.sleep(0.1)
            assert got == n, (q, got, n)
            ack_and_hold(ch2, q, ack=ack, hold=0)
            sc.expected[(VHOST2, q)] = msgs[ack:]
            sc.published[(VHOST2, q)] = msgs
            sc.versions[(VHOST2, q)] = v
        _declare(ch2, "empty", 1 if version.startswith("3") else 2)
        sc.expected[(VHOST2, "empty")] = []
        # A quorum queue and a stream: not classic queue files, so not exported, but the import must say so.
        for q, qtype in (("qq-left-behind", "quorum"), ("stream-left-behind", "stream")):
            ch2.queue_declare(q, durable=True, arguments={"x-queue-type": qtype})
            ch2.basic_publish("", q, b"not exported", pika.BasicProperties(delivery_mode=2))
        deadline = time.time() + 30
        while ch.queue_declare("dlx-target", durable=True, passive=True).method.message_count < 1:
            assert time.time() < deadline, "message was not dead-lettered"
            time.sleep(0.2)
        if version.startswith("3"):
            # The tests look at a v1 queue spanning 0.idx and 1.idx. A v1 queue writes its
            # journal out into .idx segments when it goes idle (hibernates) or stops cleanly;
            # under load a stop can come first, so wait (bounded) for the idle flush.
            seg_dir = (node.data_dir / "msg_stores" / "vhosts" / vhost_dir_name(VHOST2) / "queues"
                       / queue_dir_name(VHOST2, "q-ünï-✓"))
            deadline = time.time() + 90
            while not ((seg_dir / "0.idx").exists() and (seg_dir / "1.idx").exists()):
                assert time.time() < deadline, f"the v1 journal of {seg_dir} was never written out"
                time.sleep(0.5)
        conn2.close()
        conn.close()
        node.stop()  # the holders still have 2 unacked deliveries per mixed queue
        for h in holders:
            try:
                h.close()
            except Exception:  # noqa: BLE001 - the node is gone
                pass
    except BaseException:
        node.cleanup()
        raise
    return sc


def build_store_only(base: Path) -> Scenario:
    """3.10 with queue_index_embed_msgs_below = 0: even small messages go to the .rdq store."""
    node = PrivateNode("3.10", base, conf=["queue_index_embed_msgs_below = 0"]).start()
    sc = Scenario("store-only", node.data_dir)
    try:
        conn = node.connect("/")
        ch = conn.channel()
        ch.confirm_delivery()
        for v in (1, 2):
            q = f"v{v}-store"
            _declare(ch, q, v)
            ch.queue_bind(q, "amq.direct", f"rk-{q}")
            msgs = mixed_messages(q)
            publish(ch, msgs)
            ack_and_hold(ch, q, ack=4, hold=0)
            sc.expected[("/", q)] = [m[4] for m in msgs[4:]]
            sc.published[("/", q)] = [m[4] for m in msgs]
            sc.versions[("/", q)] = v
        conn.close()
        node.stop()
    except BaseException:
        node.cleanup()
        raise
    return sc


def build_crash(base: Path) -> Scenario:
    """3.10 killed with SIGKILL; a tiny journal limit so entries are split between segments and journal."""
    node = PrivateNode("3.10", base, advanced="[{rabbit, [{queue_index_max_journal_entries, 64}]}].\n").start()
    sc = Scenario("crash", node.data_dir)
    try:
        conn = node.connect("/")
        ch = conn.channel()
        ch.confirm_delivery()
        for v in (1, 2):
            q = f"v{v}-crash"
            _declare(ch, q, v)
            msgs = []
            for i in range(300):
                pub, exp = rich_props(i) if i % 50 == 0 else plain_props(i)
                body = pattern(f"c{i}", 5000) if i % 7 == 0 else b"crash-%d" % i
                ch.basic_publish("", q, body, rawable(pub))  # confirmed: on disk when this returns
                msgs.append(Msg(body, "", q, exp, ALL_HEADERS_EXP if i % 50 == 0 else ()))
            ack_and_hold(ch, q, ack=100, hold=0)
            sc.expected[("/", q)] = msgs[100:]
            sc.published[("/", q)] = msgs
            sc.versions[("/", q)] = v
        # Idle queues hibernate and write their journals out (acks are not confirmed): at least 3 s, and
        # until each queue's directory shows a write after the acks (a loaded node hibernates later).
        acked = time.time()
        time.sleep(3)
        qdirs = [node.data_dir / "msg_stores" / "vhosts" / vhost_dir_name("/") / "queues" / queue_dir_name("/", f"v{v}-crash")
                 for v in (1, 2)]

        def written_after_acks() -> bool:
            return all(any(f.stat().st_mtime > acked for f in d.rglob("*") if f.is_file()) for d in qdirs)

        deadline = time.monotonic() + 60
        while not written_after_acks() and time.monotonic() < deadline:  # no write at all: the test says so
            time.sleep(0.5)
        for v in (1, 2):
            # Confirmed publishes right before the crash stay in the v1 journal.
            q = f"v{v}-crash"
            for i in range(300, 330):
                body = pattern(f"c{i}", 5000) if i % 7 == 0 else b"crash-%d" % i
                pub, exp = plain_props(i)
                ch.basic_publish("", q, body, pub)
                sc.expected[("/", q)].append(Msg(body, "", q, exp, ()))
                sc.published[("/", q)].append(sc.expected[("/", q)][-1])
        node.kill()
    except BaseException:
        node.cleanup()
        raise
    return sc


BUILDERS = {
    "main-3.10": lambda base: build_main("3.10", base),
    "store-only": build_store_only,
    "crash": build_crash,
    "main-4.0": lambda base: build_main("4.0", base),
}
#: The version a scenario's node runs (4.x ones run in a chroot); 3.10 when not listed.
VERSIONS = {"main-4.0": "4.0"}


def _register_qs() -> None:
    """Quorum queue and stream scenarios (rabbitmq_qs_scenarios.py, imported when built: it imports this module)."""

    def build_qs(*args):
        from support.node_qs_scenarios import build

        return build(*args)

    for version in ("3.10", "4.0", "4.3"):
        for kill in (False, True):
            name = f"qs-{'kill-' if kill else ''}{version}"
            BUILDERS[name] = lambda base, n=name, v=version, k=kill: build_qs(n, v, base, k)
            VERSIONS[name] = version


_register_qs()


def get_scenario(name: str, shared_root: Path) -> Scenario:
    """Build a scenario once per test run (shared by xdist workers)."""
    root = shared_root / "rbak-import"
    root.mkdir(parents=True, exist_ok=True)
    result = root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if result.exists():
            return pickle.loads(result.read_bytes())
        chroot = chroot_for(VERSIONS.get(name, "3.10"))
        if chroot is not None:
            # The node runs inside the chroot; keep a copy of its data dir here, remove the original.
            base = chroot / "tmp" / f"rbak-import-{uuid.uuid4().hex[:8]}"
            try:
                sc = BUILDERS[name](base)
                copy = root / name / "mnesia" / sc.data_dir.name
                shutil.copytree(sc.data_dir, copy, symlinks=True)
                sc.data_dir = copy
            finally:
                shutil.rmtree(base, ignore_errors=True)
        else:
            sc = BUILDERS[name](root / name)
        result.write_bytes(pickle.dumps(sc))
        return sc
