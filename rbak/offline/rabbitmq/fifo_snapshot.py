"""Load a Ra snapshot of a ``rabbit_fifo`` machine into a :class:`FifoReplay`.

A snapshot's machine state is ``term_to_binary`` of the ``#rabbit_fifo{}``
record (``rabbit_fifo.hrl``) at the snapshot index; the log entries after it
are then replayed as usual. Only references live in the state: each message
is ``[RaftIdx | Header]`` (header: size, ``[Size | Expiry]`` or a map with
``delivery_count``/``acquired_count``/``expiry``), or on machine version 8+
(4.3) a packed integer ``Idx bxor (Size bsl 44)``. The body stays in the Ra
log entry at that index (Ra keeps live indexes when it compacts).

Record layouts read here (field positions, tag at 0):

- ``#rabbit_fifo``: cfg 1, messages 2, returns 4, consumers 9,
  service_queue 10, waiting_consumers 14; version 8 also delayed 17.
- ``#cfg``: dead_letter_handler 4, overflow_strategy 6, max_length 7,
  max_bytes 8, delivery_limit 10, msg_ttl 12 (``fifo_limits.Limits``).
- dlx 11: ``#rabbit_fifo_dlx{consumer, discards, _, msg_bytes,
  msg_bytes_checkout}``, ``consumer`` a ``#dlx_consumer{pid, prefetch,
  checked_out, next_msg_id}``; each entry ``{Reason, Msg}`` (3.x) or
  ``[Reason | Msg]`` (4.x): messages awaiting at-least-once dead-lettering.
- messages: an ``lqueue`` (versions 2-3: 3.10-3.13, FIFO),
  ``{rabbit_fifo_q, Hi, No, Len, DequeueCounter}`` (versions 4-7,
  ``Hi``/``No`` are ``{In, Out}``) or ``{pq, #{31 - Priority => {Count, In,
  Out}}, Len, Bitmap}`` (version 8+). A queue's order is ``Out ++ reverse(In)``.
- returns: ``lqueue`` ``{Len, In, Out}`` (older ``{Len, {In, Out}}``).
- ``#consumer{cfg, status, next_msg_id, checked_out, credit, ...}`` with
  ``#consumer_cfg{meta, pid, tag, credit_mode, lifetime, priority, ...}``;
  ``checked_out`` maps msg id to a message (version 8+: ``{LockExpiry, Msg}``);
  ``credit_mode`` is ``{simple_prefetch, Max}`` (4.x) or the bare atom
  (versions 2-3, where the consumer key is its ``{Tag, Pid}``).
- service_queue: ``priority_queue`` ``{queue, In, Out, Len}`` or
  ``{pqueue, [{-Priority, Queue}]}``.
"""

from __future__ import annotations

from typing import Any

from .erlang_terms import Atom, ImproperList
from .fifo_delayed import load_tree
from .fifo_limits import DeadLetters, Limits, SizedDeque
from .rabbit_fifo import Consumer, FifoReplay, Msg, Ready
from ...errors import SnapshotStateError

PACKED_IDX_MAX = (1 << 44) - 1


def _is(x: Any, name: str) -> bool:
    return isinstance(x, Atom) and x == name


def _queue_items(q: Any, what: str) -> list:
    """``{In, Out}`` (Erlang queue / rabbit_fifo_q half) -> items in delivery order."""
    if isinstance(q, tuple) and len(q) == 2 and isinstance(q[0], list) and isinstance(q[1], list):
        return q[1] + q[0][::-1]
    raise SnapshotStateError(f"{what}: not a queue {{In, Out}}")


def _lqueue_items(q: Any, what: str) -> list:
    if isinstance(q, tuple) and len(q) == 3 and isinstance(q[1], list) and isinstance(q[2], list):
        return q[2] + q[1][::-1]
    if isinstance(q, tuple) and len(q) == 2 and isinstance(q[0], int):
        return _queue_items(q[1], what)
    raise SnapshotStateError(f"{what}: not an lqueue")


def _pqueue_items(q: Any) -> list:
    """priority_queue -> items, highest priority first, FIFO within one."""
    if isinstance(q, tuple) and len(q) == 4 and _is(q[0], "queue"):
        return q[2] + q[1][::-1]
    if isinstance(q, tuple) and len(q) == 2 and _is(q[0], "pqueue") and isinstance(q[1], list):
        return [x for _p, sq in q[1] for x in _pqueue_items(sq)]
    raise SnapshotStateError("service_queue: not a priority_queue")


def msg_ref(m: Any, what: str, priority: int = 4) -> Msg:
    """A state's message -> Msg (raft index, failed deliveries so far, expiry)."""
    if isinstance(m, int) and not isinstance(m, bool):
        return Msg(m & PACKED_IDX_MAX, m & PACKED_IDX_MAX, priority, size=m >> 44)
    expiry, size = None, 0
    if isinstance(m, ImproperList) and m.items and isinstance(m.items[0], int):
        idx, header = m.items[0], m.tail
        if isinstance(header, int):
            size = header
        if len(m.items) == 2:  # [Idx, Size | Expiry]
            header, expiry, size = None, m.tail, m.items[1]
    elif isinstance(m, list) and m and isinstance(m[0], int):
        idx, header = m[0], None
    else:
        raise SnapshotStateError(f"{what}: not a message reference {m!r:.80}")
    failed = acquired = 0
    if isinstance(header, dict):
        failed = header.get(Atom("delivery_count"), 0)
        acquired = header.get(Atom("acquired_count"), 0)
        expiry = header.get(Atom("expiry"))
        size = header.get(Atom("size"), 0)
    return Msg(idx, idx, priority, failed if isinstance(failed, int) else 0,
               expiry if isinstance(expiry, int) else None, size if isinstance(size, int) else 0,
               acquired if isinstance(acquired, int) else 0)


def _dlx_msg(e: Any) -> Msg:
    """A dead-letter entry ``{Reason, Msg}`` (3.x) or ``[Reason | Msg]`` (4.x) -> its Msg."""
    if isinstance(e, tuple) and len(e) == 2:
        return msg_ref(e[1], "dlx")
    if isinstance(e, ImproperList) and e.items:
        return msg_ref(ImproperList(e.items[1:], e.tail) if len(e.items) > 1 else e.tail, "dlx")
    raise SnapshotStateError(f"dlx: not a dead-letter entry {e!r:.80}")


def _dead_letters(d: Any) -> DeadLetters:
    """``#rabbit_fifo_dlx{}`` -> the messages it holds (discards, and those checked out to the worker)."""
    out = DeadLetters()
    if not (isinstance(d, tuple) and len(d) >= 3 and _is(d[0], "rabbit_fifo_dlx")):
        return out
    out.discards = SizedDeque(_dlx_msg(e) for e in _lqueue_items(d[2], "dlx discards"))
    con = d[1]
    if isinstance(con, tuple) and len(con) >= 5 and _is(con[0], "dlx_consumer") and isinstance(con[3], dict):
        out.prefetch = con[2] if isinstance(con[2], int) else 0
        out.next_id = con[4] if isinstance(con[4], int) else 0
        out.checked = {k: _dlx_msg(v) for k, v in sorted(con[3].items()) if isinstance(k, int)}
    return out


def _ready(messages: Any, mv: int) -> Ready:
    ready = Ready(mv)
    if mv < 4 and isinstance(messages, tuple) and messages and isinstance(messages[0], int):
        ready.mode = "fifo"  # versions 2-3 (3.10-3.13): one lqueue
        for m in _lqueue_items(messages, "messages"):
            ready.push(msg_ref(m, "messages"), 0)
        return ready
    if isinstance(messages, tuple) and len(messages) == 5 and _is(messages[0], "rabbit_fifo_q"):
        ready.mode = "q"
        for level, half in ((1, messages[1]), (0, messages[2])):
            for m in _queue_items(half, "messages"):
                ready.push(msg_ref(m, "messages", 9 if level else 4), level)
        ready.counter = messages[4] if isinstance(messages[4], int) else 0
        return ready
    if isinstance(messages, tuple) and len(messages) == 4 and _is(messages[0], "pq") \
            and isinstance(messages[1], dict):
        ready.mode = "pq"
        for key in sorted(messages[1]):
            b = messages[1][key]
            if not (isinstance(key, int) and 0 <= key <= 31 and isinstance(b, tuple) and len(b) == 3):
                raise SnapshotStateError(f"messages: bucket {key!r} is not {{Count, In, Out}}")
            for m in _queue_items((b[1], b[2]), "messages"):
                ready.push(msg_ref(m, "messages", 31 - key), 31 - key)
        return ready
    raise SnapshotStateError("messages: neither a rabbit_fifo_q nor a rabbit_fifo_pq state")


def _consumer(key: Any, c: Any, mv: int) -> Consumer:
    if not (isinstance(c, tuple) and len(c) >= 6 and _is(c[0], "consumer")
            and isinstance(c[1], tuple) and len(c[1]) >= 7 and _is(c[1][0], "consumer_cfg")):
        raise SnapshotStateError(f"consumer {key!r:.60}: not a #consumer{{}} record")
    cfg, status, next_id, checked, credit = c[1], c[2], c[3], c[4], c[5]
    mode = cfg[4]
    prefetch = mode[1] if isinstance(mode, tuple) and len(mode) == 2 and _is(mode[0], "simple_prefetch") \
        else None
    if _is(mode, "simple_prefetch") and isinstance(credit, int) and isinstance(checked, dict):
        prefetch = credit + len(checked)  # versions 2-3: credit is refilled on each settle
    prio = cfg[6] if isinstance(cfg[6], int) else 0
    con = Consumer(key, (cfg[3], cfg[2]), prio, credit if isinstance(credit, int) else 0, prefetch)
    con.next_msg_id = next_id if isinstance(next_id, int) else 0
    con.once = _is(cfg[5], "once")
    if not isinstance(checked, dict):
        raise SnapshotStateError(f"consumer {key!r:.60}: checked_out is not a map")
    for mid in sorted(checked):
        m = checked[mid]
        if mv >= 8 and isinstance(m, tuple) and len(m) == 2:
            if isinstance(m[0], int):
                con.locks[mid] = m[0]
            m = m[1]  # {LockExpiry, Msg}
        con.checked_out[mid] = msg_ref(m, "checked_out")
    if len(cfg) > 7 and isinstance(cfg[7], int):
        con.timeout = cfg[7]
    if len(c) > 8 and isinstance(c[8], list) and isinstance(status, tuple) and _is(status[0], "timeout"):
        con.timed_out = {i for i in c[8] if isinstance(i, int)}
    if len(c) > 6 and isinstance(c[6], int):
        con.delivery_count = c[6]
    base = status[1] if isinstance(status, tuple) and len(status) == 2 else status
    if _is(base, "cancelled"):  # as a cancel in the replay: keeps what it holds, takes nothing new
        con.credit, con.once, con.cancelled = 0, True, True
    con.quiescing = _is(base, "quiescing")
    return con


def _key_order(k: Any) -> tuple:
    return (0, k, "") if isinstance(k, int) else (1, 0, repr(k))


def load_state(state: Any, machine_version: int, delivery_limit: int | None, priority_of,
               ttl_of=None, size_of=None) -> tuple[FifoReplay, list[str]]:
    """A replay positioned at the snapshot, plus notes on what the state held that is not exported."""
    if not (isinstance(state, tuple) and len(state) >= 15 and _is(state[0], "rabbit_fifo")):
        raise SnapshotStateError("machine state is not a #rabbit_fifo{} record")
    if machine_version < 2:
        raise SnapshotStateError(f"machine version {machine_version} snapshots (message bodies inside the "
                                 "state) are not supported")
    cfg, msg_ttl = state[1], None
    if isinstance(cfg, tuple) and len(cfg) > 12 and _is(cfg[0], "cfg"):
        delivery_limit = cfg[10] if isinstance(cfg[10], int) else delivery_limit
        msg_ttl = cfg[12] if isinstance(cfg[12], int) else None
    replay = FifoReplay(machine_version, priority_of, delivery_limit, ttl_of, msg_ttl, Limits.from_cfg(cfg), size_of)
    replay.ready = _ready(state[2], machine_version)
    replay.returns = SizedDeque(msg_ref(m, "returns") for m in _lqueue_items(state[4], "returns"))
    replay.dlx = _dead_letters(state[11])
    consumers = state[9]
    if not isinstance(consumers, dict):
        raise SnapshotStateError("consumers: not a map")
    for key in sorted(consumers, key=_key_order):
        c = _consumer(key, consumers[key], machine_version)
        replay.consumers[key] = c
        replay.by_cid[c.cid] = key
    replay.service = [k for k in _pqueue_items(state[10]) if k in replay.consumers]
    if isinstance(state[15], int):
        replay.last_active = state[15]
    notes: list[str] = []
    if machine_version >= 8 and len(state) > 17:
        replay.delayed = load_tree(state[17], msg_ref)
        if isinstance(state[7], int):  # last_command_time: the restart's stand-in when no command follows
            replay.ts = state[7]
    waiting = state[14]
    if not isinstance(waiting, list):
        raise SnapshotStateError("waiting_consumers: not a list")
    for w in waiting:  # single active consumer's waiting list, kept in its order
        if not (isinstance(w, tuple) and len(w) == 2):
            raise SnapshotStateError(f"waiting_consumers: not {{Key, Consumer}}: {w!r:.60}")
        replay.waiting.append(_consumer(w[0], w[1], machine_version))
        replay.by_cid[replay.waiting[-1].cid] = w[0]
    return replay, notes
