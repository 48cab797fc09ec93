"""Quorum queues of a stopped node: ``quorum/<node>/<UId>/`` (``config``, segments, snapshots) + the shared WAL.

Each server directory is named by its Ra UId, which is also how the WAL
names the server's records. The queue's vhost and name come from its
``config`` (``queue_resource => {resource, <<VHost>>, queue, <<Name>>}``,
the Ra server config as text), else from the ``update_config`` command in its
log. ``meta.dets`` keeps each server's current term, vote and last applied
index (one ``{UId, Term, VotedFor, LastApplied}`` term per server).

The content is rebuilt as Ra recovers a server: from the newest snapshot
(its ``rabbit_fifo`` state decoded by ``fifo_snapshot``) or else the log's
first entry, then replaying every later entry (``rabbit_fifo.FifoReplay``).
A snapshot's messages are references; their bodies are read from the
entries at those indexes (Ra keeps them). A damaged newest snapshot is
reported with file and offset (``--skip-damaged`` skips the queue).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Iterator

from ...format.record import BackupRecord
from .damage import ImportContext
from .erlang_terms import Atom, binary_to_term, decode
from .stored_message import message_from_term, to_record
from . import ra_log
from .fifo_limits import Limits, dlx_target
from .fifo_snapshot import load_state
from .rabbit_fifo import FifoReplay
from ...errors import MessageFormatError, SnapshotStateError, TermError

_RESOURCE = re.compile(rb"queue_resource\s*=>\s*\{resource,\s*(<<.*?>>),\s*queue,\s*(<<.*?>>)\s*\}", re.S)
_MACVER = re.compile(rb"initial_machine_version\s*=>\s*(\d+)")
_TTL = re.compile(rb"msg_ttl\s*=>\s*(\d+|undefined)")
_LIMIT = re.compile(rb"delivery_limit\s*=>\s*(\d+|undefined)")
_MEMBERS = re.compile(rb"initial_members\s*=>\s*\[(.*?)\]", re.S)
_ID = re.compile(rb"\bid\s*=>\s*(\{[^}]*\})")
_DLX_PUBLISH = re.compile(rb"dead_letter_publish,\s*\[\s*(?:\{resource,\s*<<.*?>>,\s*exchange,\s*(<<.*?>>)\s*\}|(<<.*?>>))"
                          rb",\s*(?:(<<.*?>>)|undefined)", re.S)


def erlang_binary_literal(lit: bytes) -> bytes | None:
    """``<<"text">>``, ``<<"text"/utf8>>`` or ``<<1,2,3>>`` (as ``io_lib`` prints them) -> bytes."""
    m = re.fullmatch(rb'<<"(.*)"(?:/utf8)?>>', lit, re.S)
    if m:
        raw, out, i = m.group(1), bytearray(), 0
        while i < len(raw):
            c = raw[i]
            if c == 0x5C and i + 1 < len(raw):  # backslash escape
                nxt = raw[i + 1: i + 2]
                simple = {b"n": 10, b"t": 9, b"r": 13, b"\\": 92, b'"': 34, b"'": 39, b"s": 32, b"e": 27,
                          b"b": 8, b"f": 12, b"v": 11, b"d": 127}
                if nxt in simple:
                    out.append(simple[nxt])
                    i += 2
                    continue
                o = re.match(rb"[0-7]{1,3}", raw[i + 1:])
                if o:
                    out.append(int(o.group(0), 8) & 0xFF)
                    i += 1 + len(o.group(0))
                    continue
                x = re.match(rb"x(?:\{([0-9a-fA-F]+)\}|([0-9a-fA-F]{2}))", raw[i + 1:])
                if x:
                    out += chr(int(x.group(1) or x.group(2), 16)).encode("utf-8")
                    i += 1 + len(x.group(0))
                    continue
            out.append(c)
            i += 1
        return bytes(out)
    m = re.fullmatch(rb"<<\s*([\d,\s]*)>>", lit)
    if m:
        return bytes(int(x) for x in m.group(1).split(b",") if x.strip())
    return None


@dataclass
class QuorumServer:
    uid: str
    path: str
    vhost: str | None = None
    name: str | None = None
    machine_version: int = 0
    delivery_limit: int | None = None
    msg_ttl: int | None = None
    members: int = 1
    self_id: bytes = b""
    limits: Limits | None = None  # x-max-length(-bytes), overflow, dead-letter strategy at creation


def read_config(path: str, s: QuorumServer) -> None:
    try:
        with open(os.path.join(path, "config"), "rb") as f:
            text = f.read()
    except OSError:
        return
    m = _RESOURCE.search(text)
    if m:
        v, q = erlang_binary_literal(m.group(1)), erlang_binary_literal(m.group(2))
        if v is not None and q is not None:
            s.vhost, s.name = v.decode("utf-8", "surrogateescape"), q.decode("utf-8", "surrogateescape")
    if (mv := _MACVER.search(text)) is not None:
        s.machine_version = int(mv.group(1))
    lim = _LIMIT.search(text)
    if lim is not None and lim.group(1) != b"undefined":
        s.delivery_limit = int(lim.group(1))
    ttl = _TTL.search(text)
    if ttl is not None and ttl.group(1) != b"undefined":
        s.msg_ttl = int(ttl.group(1))
    s.limits = Limits.from_config_text(text)
    if (d := _DLX_PUBLISH.search(text)) is not None:  # at-most-once: where dropped messages went
        x = erlang_binary_literal(d.group(1) or d.group(2))
        s.limits.dlx_target = dlx_target(x, erlang_binary_literal(d.group(3)) if d.group(3) else None)
    mem = _MEMBERS.search(text)
    if mem is not None:
        s.members = max(1, mem.group(1).count(b"{"))
    if (i := _ID.search(text)) is not None:
        s.self_id = re.sub(rb"\s+", b"", i.group(1))


def read_meta(system_dir: str) -> dict[str, tuple[int, Any, int]]:
    """UId -> (current term, voted for, last applied) from ``meta.dets`` (each object one external term)."""
    out: dict[str, tuple[int, Any, int]] = {}
    try:
        with open(os.path.join(system_dir, "meta.dets"), "rb") as f:
            data = f.read()
    except OSError:
        return out
    i = data.find(b"\x83h\x04m")
    while i >= 0:
        try:
            t, _ = decode(data, i)
            if isinstance(t, tuple) and len(t) == 4 and isinstance(t[0], bytes) and isinstance(t[3], int):
                out[t[0].decode("utf-8", "surrogateescape")] = (t[1], t[2], t[3])
        except (TermError, ValueError, IndexError):
            pass
        i = data.find(b"\x83h\x04m", i + 1)
    return out


def _role(s: QuorumServer, meta: tuple[int, Any, int] | None) -> str:
    if s.members <= 1:
        return "leader (single member)"
    if meta is not None and isinstance(meta[1], tuple) and len(meta[1]) == 2:
        voted = f"{{'{meta[1][0]}','{meta[1][1]}'}}".encode()
        if s.self_id and re.sub(rb"'", b"", voted) == re.sub(rb"'", b"", s.self_id):
            return f"leader or candidate (voted for itself in term {meta[0]})"
        return f"follower (voted for {meta[1][0]} on {meta[1][1]} in term {meta[0]})"
    return "member (role unknown)"


def _from_log(entries: dict, s: QuorumServer) -> None:
    """Queue name and settings from the log's first ``update_config`` (when the config file lacks them)."""
    for idx in sorted(entries)[:8]:
        try:
            t = binary_to_term(entries[idx][1])
        except TermError:
            continue
        if isinstance(t, tuple) and len(t) >= 3 and t[0] == "$usr" and isinstance(t[2], tuple) \
                and t[2] and t[2][0] == "update_config" and isinstance(t[2][1], dict):
            res = t[2][1].get(Atom("queue_resource"))
            if isinstance(res, tuple) and len(res) == 4 and isinstance(res[1], bytes) and isinstance(res[3], bytes):
                s.vhost = s.vhost or res[1].decode("utf-8", "surrogateescape")
                s.name = s.name or res[3].decode("utf-8", "surrogateescape")
            return


@dataclass
class ImportedQuorum:
    """What the summary says about one quorum queue (shape of rabbitmq_dir.ImportedQueue)."""

    vhost: str
    name: str
    version: int
    path: str
    exported: int = 0
    kind: str = "quorum"
    detail: str = ""


def _system_dirs(node_dir: str) -> list[str]:
    root = os.path.join(node_dir, "quorum")
    if not os.path.isdir(root):
        return []
    return [os.path.join(root, d) for d in sorted(os.listdir(root)) if os.path.isdir(os.path.join(root, d))]


def iter_quorum_queues(node_dir: str, ctx: ImportContext, backed_up_at: int
                       ) -> Iterator[tuple[ImportedQuorum, Iterator[BackupRecord]]]:
    found = []
    for sysdir in _system_dirs(node_dir):
        logs = ra_log.read_server_logs(sysdir, ctx)
        meta = read_meta(sysdir)
        for uid in sorted(d for d in os.listdir(sysdir) if os.path.isdir(os.path.join(sysdir, d))):
            s = QuorumServer(uid, os.path.join(sysdir, uid))
            read_config(s.path, s)
            log = logs.get(uid) or ra_log.ServerLog(uid)
            if s.vhost is None or s.name is None:
                _from_log(log.entries, s)
            if s.vhost is None or s.name is None:
                ctx.damaged(s.path, None, "cannot tell which quorum queue this Ra server belongs to (no "
                            "queue_resource in its config or log)", then="skipped")
                continue
            found.append((s.vhost, s.name, s, log, meta.get(uid)))
    found.sort(key=lambda f: (f[0], f[1]))
    for vhost, name, s, log, m in found:
        iq = ImportedQuorum(vhost, name, 0, s.path)
        last = m[2] if m else (max(log.entries) if log.entries else 0)
        iq.detail = f"{_role(s, m)}, last applied index {last}"
        recs = QueueRecords()
        recs.source = _records(iq, s, log, ctx, backed_up_at, recs, m[2] if m else None)
        yield iq, recs


class QueueRecords:
    """A quorum queue's records, which can tell how many are left (``__length_hint__``) once the
    replay has run (before the first record): the writer then hashes the queue's last segment as
    it writes it. The hint counts messages whose body may still turn out damaged (skipped), so it
    is an upper bound; a wrong one only costs that speed-up."""

    __slots__ = ("source", "left")

    def __init__(self) -> None:
        self.source: Iterator[BackupRecord] = iter(())
        self.left = 0

    def __iter__(self) -> "QueueRecords":
        return self

    def __next__(self) -> BackupRecord:
        r = next(self.source)
        self.left -= 1
        return r

    def __length_hint__(self) -> int:
        return max(self.left, 0)


def log_shortfall(entries: dict, snap_index: int, last_applied: int | None) -> tuple[int, int] | None:
    """(last index the files hold, last applied) when the member had applied entries the files no
    longer hold: a WAL or segment cut short or lost. Ra applies an entry only once it is written, so
    ``meta.dets``'s last applied index is a floor for the log's end (a node killed mid-write loses
    only entries never applied, whose torn tail stays a note)."""
    end = max(max(entries, default=0), snap_index)
    return (end, last_applied) if last_applied is not None and end < last_applied else None


def _records(iq: ImportedQuorum, s: QuorumServer, log: ra_log.ServerLog, ctx: ImportContext,
             backed_up_at: int, counter: QueueRecords | None = None,
             last_applied: int | None = None) -> Iterator[BackupRecord]:
    ctx.reading("quorum queue", iq.vhost, iq.name)
    try:
        entries = log.entries
        snap, usable = _pick_snapshot(s, entries, ctx)
        if not usable:
            return
        if (short := log_shortfall(entries, snap.index if snap else 0, last_applied)) is not None:
            end, applied = short
            ctx.damaged(s.path, None, f"its Ra log ends at index {end}, below the last applied index {applied} "
                        f"that meta.dets records for this member: {applied - end} log entr"
                        f"{'y' if applied - end == 1 else 'ies'} (indexes {end + 1}-{applied}) cannot be "
                        "recovered (a WAL or segment file cut short or lost); the messages they enqueued, and "
                        "the acks and returns they recorded, are not known",
                        then="exported what the log holds")
        if not entries and snap is None:
            return
        start = snap.index + 1 if snap else 1
        idxs = sorted(i for i in entries if i >= start)
        if (idxs[0] if idxs else start) > start:
            where = snap.path if snap else s.path
            ctx.damaged(where, None, f"the log starts at index {idxs[0]}, not {start} (after "
                        f"{'the snapshot' if snap else 'the beginning'}): entries are missing", then="queue skipped")
            return
        gaps = [b for a, b in zip(idxs, idxs[1:]) if b != a + 1]
        if gaps:
            term, _data, path, pos = entries[gaps[0]]
            ctx.damaged(path, pos, f"Ra log of server {s.uid} misses entries before index {gaps[0]}",
                        then="queue skipped")
            return
        cache: dict[int, Any] = {}

        def decoded(idx: int, msg: Any):
            m = cache.get(idx)
            if m is None:
                try:
                    m = cache[idx] = message_from_term(msg)
                except MessageFormatError as e:
                    _t, _d, path, pos = entries[idx]
                    ctx.damaged(path, pos, f"index {idx}: {e}")
                    m = cache[idx] = False
            return m

        def priority(idx: int, msg: Any) -> int:
            m = decoded(idx, msg) if s.machine_version >= 4 or replay.mv >= 4 else None
            p = m.properties.priority if m else None
            return p if isinstance(p, int) else 4

        def size(idx: int, msg: Any) -> int:
            m = decoded(idx, msg)
            return len(m.body) if m else 0

        def ttl(idx: int, msg: Any) -> int | None:
            m = decoded(idx, msg)
            e = m.properties.expiration if m else None
            return int(e) if isinstance(e, str) and e.isdigit() else None

        started = _start(s, snap, priority, ttl, size, ctx)
        if started is None:
            return
        replay = started
        bodies: dict[int, Any] = {}
        for idx in idxs:
            _term, data, path, pos = entries[idx]
            try:
                cmd = binary_to_term(data)
            except TermError as e:
                ctx.damaged(path, pos, f"index {idx}: not an Erlang term ({e})", then="entry skipped")
                continue
            msg = _message_of(cmd)
            if msg is not None:
                bodies[idx] = msg
            replay.apply(idx, cmd)
        if replay.unknown:
            ctx.note(f"{ctx.queue}: commands not replayed: "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(replay.unknown.items())))
        rest = replay.remaining()  # the restart replay may drop more (limits): note after it
        _limit_notes(replay, ctx)
        if counter is not None:
            counter.left = len(rest)
        for m in rest:
            body = bodies.get(m.body_idx)
            if body is None:  # a message the snapshot refers to: its body is a live entry before it
                body = _body_before(m.body_idx, entries, snap, ctx)
                if body is None:
                    continue
            sm = decoded(m.body_idx, body)
            if not sm:
                continue
            iq.exported += 1
            yield to_record(sm, iq.vhost, iq.name, m.idx, backed_up_at)
    finally:
        ctx.done_reading()


def _follows(entries: dict, idx: int) -> bool:
    """Whether the log holds every entry after ``idx`` (none at all counts)."""
    after = sorted(i for i in entries if i > idx)
    return not after or (after[0] == idx + 1 and after[-1] - after[0] + 1 == len(after))


def _pick_snapshot(s: QuorumServer, entries: dict, ctx: ImportContext) -> tuple[ra_log.Snapshot | None, bool]:
    """The snapshot to start from, as ``ra_snapshot:find_snapshots`` picks it: the newest that
    validates. An older one stands in only while the log after it is complete (a node killed while
    writing a new snapshot: Ra drops the log only once the new one is written). Else the newest's
    damage is reported; ``(None, False)``: skip the queue."""
    files = ra_log.snapshot_files(s.path)
    problem = None
    for i, f in enumerate(files):
        probe = ImportContext(skip_damaged=True)
        snap = ra_log.read_snapshot(f, probe)
        if snap is None:
            problem = problem or probe.skipped[0]
            continue
        if i and not _follows(entries, snap.index):
            break
        if problem is not None:
            ctx.note(f"{ctx.queue}: {problem}; recovered from the older snapshot {f}, as Ra's recovery does")
        return snap, True
    if problem is None:
        return None, True
    ctx.damaged(problem.path, problem.offset, problem.reason)
    ctx.note(f"{ctx.queue}: skipped (its newest Ra snapshot is damaged)")
    return None, False


def _limit_notes(replay: FifoReplay, ctx: ImportContext) -> None:
    """What the queue's limits and dead-lettering took out of it, said per queue."""
    pending = replay.dlx.pending()
    if pending:
        ctx.note(f"{ctx.queue}: {len(pending)} message(s) awaiting at-least-once dead-lettering to "
                 f"{replay.limits.describe()} were not exported (the source queue no longer delivers them; "
                 f"the restarted node's dead-letter worker would publish them); Raft indexes "
                 + ", ".join(str(m.idx) for m in pending[:10]) + (" ..." if len(pending) > 10 else ""))
    if replay.maxlen_dropped:
        ctx.note(f"{ctx.queue}: {replay.maxlen_dropped} message(s) had been dropped from the head by its length "
                 "limit (x-max-length / x-max-length-bytes, drop-head) and are not exported")
    if replay.dead_lettered:
        ctx.note(f"{ctx.queue}: {replay.dead_lettered} message(s) had left it for {replay.limits.describe()} "
                 "(at-most-once dead-lettering: the broker published them there) and are not exported")
    if replay.restart_dropped:
        ctx.note(f"{ctx.queue}: {replay.restart_dropped} message(s) consumers held at the stop are past the delivery "
                 "limit once a restart returns them (a dead consumer's messages count as failed deliveries) and "
                 "are not exported")
    if replay.delayed_at_stop:
        ctx.note(f"{ctx.queue}: {replay.delayed_at_stop} delayed-retry message(s) held back at the stop are exported "
                 "after the returned ones, in the order they come due")
    if (expiry := replay.expiry_note()) is not None:
        ctx.note(f"{ctx.queue}: {expiry}")
    if replay.dlx_lost:
        ctx.note(f"{ctx.queue}: {replay.dlx_lost} message(s) awaiting at-least-once dead-lettering were deleted "
                 "when its dead-letter strategy changed (as the broker deletes them)")


def _start(s: QuorumServer, snap: ra_log.Snapshot | None, priority, ttl, size,
           ctx: ImportContext) -> FifoReplay | None:
    """A replay at the log's start, or at the snapshot with its machine state loaded."""
    if snap is None:
        return FifoReplay(s.machine_version, priority, s.delivery_limit, ttl, s.msg_ttl, s.limits, size)
    try:
        state = binary_to_term(snap.state_bytes)
        replay, notes = load_state(state, snap.machine_version, s.delivery_limit, priority, ttl, size)
    except TermError as e:
        ctx.damaged(snap.path, snap.state_at + e.offset, f"snapshot machine state: {e}",
                    then="queue skipped")
        return None
    except SnapshotStateError as e:
        ctx.damaged(snap.path, snap.state_at, f"snapshot machine state (machine version "
                    f"{snap.machine_version}): {e}", then="queue skipped")
        return None
    for n in notes:
        ctx.note(f"{ctx.queue}: {n}")
    return replay


def _body_before(idx: int, entries: dict, snap: ra_log.Snapshot | None, ctx: ImportContext) -> Any:
    e = entries.get(idx)
    if e is None:
        ctx.damaged(snap.path if snap else "", None, f"index {idx}: a message the snapshot holds, but no "
                    "segment or WAL file has its entry", then="message skipped")
        return None
    _t, data, path, pos = e
    try:
        body = _message_of(binary_to_term(data))
    except TermError as err:
        ctx.damaged(path, pos, f"index {idx}: not an Erlang term ({err})", then="message skipped")
        return None
    if body is None:
        ctx.damaged(path, pos, f"index {idx}: the snapshot names it as a message, but the entry is no "
                    "enqueue", then="message skipped")
    return body


def _message_of(cmd: Any) -> Any:
    """The message term an enqueue/requeue command carries (None for other commands)."""
    if not (isinstance(cmd, tuple) and len(cmd) >= 3 and cmd[0] == "$usr" and isinstance(cmd[2], tuple)):
        return None
    c = cmd[2]
    if not c:
        return None
    if c[0] == "enqueue" and len(c) == 4:
        return c[3]
    if c[0] == "e" and len(c) >= 3:
        return c[2]
    if c[0] == "requeue" and len(c) >= 6:
        return c[5]
    return None
