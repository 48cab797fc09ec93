"""Walk a RabbitMQ node's data directory and read every classic queue in it.

Layout: ``<node dir>/msg_stores/vhosts/<VHOSTDIR>/`` with ``.vhost`` (the
name), ``.config`` (``{segment_entry_count, N}.``), ``msg_store_persistent/``
and ``queues/<QDIR>/`` (``.queue_name``: ``VHOST: v\\nQUEUE: q\\n`` plus
``INDEX: v2\\n`` for v2). Directory names are the MD5 of the name as a
base-36 number (``rabbit_vhost:dir/1``, ``queue_name_to_dir_name/1``), so a
name read from a file is checked against its directory, and when a name file
is missing the name is recovered by hashing candidates: names found in the
node's Mnesia tables and logs (``#resource{}`` terms in ``*.DCD``, ``*.DCL``, ``*.LOG``), in the
other queues' name files and in the messages themselves.

Everything is opened read-only; nothing under PATH is ever written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from ...errors import ImportFormatError
from ...format.manifest import BackupManifest
from ...format.record import BackupRecord
from . import cqv1, cqv2
from .damage import ImportContext
from .msg_store import MessageStore
from .recovery_terms import QueueTerms, read_recovery_terms
from .stored_message import StoredMessage, to_record

log = logging.getLogger(__name__)

_B36 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_CONFIG_RE = re.compile(rb"\{\s*segment_entry_count\s*,\s*(\d+)\s*\}\s*\.")


def base36_md5(data: bytes) -> str:
    n = int.from_bytes(hashlib.md5(data).digest(), "big")
    if n == 0:
        return "0"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(_B36[r])
    return "".join(reversed(out))


def vhost_dir_name(vhost: str) -> str:
    return base36_md5(vhost.encode("utf-8"))


def queue_dir_name(vhost: str, queue: str) -> str:
    return base36_md5(b"queue" + vhost.encode("utf-8") + queue.encode("utf-8"))


def find_vhosts_dir(path: str) -> str:
    """``msg_stores/vhosts`` of a node dir, given the node dir, its mnesia base or the vhosts dir."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise ImportFormatError(f"{path}: not a directory")
    for cand in (os.path.join(path, "msg_stores", "vhosts"), path if os.path.basename(path) == "vhosts" else None):
        if cand and os.path.isdir(cand):
            return cand
    nodes = [d for d in sorted(os.listdir(path)) if os.path.isdir(os.path.join(path, d, "msg_stores", "vhosts"))]
    if len(nodes) == 1:
        return os.path.join(path, nodes[0], "msg_stores", "vhosts")
    if len(nodes) > 1:
        raise ImportFormatError(f"{path}: holds several node directories ({', '.join(nodes)}); pass one of them")
    raise ImportFormatError(f"{path}: no msg_stores/vhosts here; pass a RabbitMQ node data directory")


@dataclass
class QueueDir:
    path: str
    vhost: str | None
    name: str | None
    version: int  # 1 or 2


@dataclass
class VhostDir:
    path: str
    name: str | None
    segment_entry_count: int
    queues: list[QueueDir] = field(default_factory=list)
    recovery: dict[str, QueueTerms] = field(default_factory=dict)  # by queue dir name (clean shutdown only)


def _read_small(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except FileNotFoundError:
        return None


def parse_queue_name_file(raw: bytes, dirname: str) -> tuple[str, str] | None:
    """(vhost, queue) from a ``.queue_name`` file, the split confirmed by the dir hash."""
    text = raw.decode("utf-8", errors="surrogateescape")
    if text.endswith("INDEX: v2\n"):
        text = text[: -len("INDEX: v2\n")]
    if not (text.startswith("VHOST: ") and text.endswith("\n")):
        return None
    body = text[len("VHOST: ") : -1]
    sep = "\nQUEUE: "
    i = body.find(sep)
    while i >= 0:
        v, q = body[:i], body[i + len(sep) :]
        if queue_dir_name(v, q) == dirname:
            return v, q
        i = body.find(sep, i + 1)
    return None


def mnesia_resources(node_dir: str) -> set[tuple[str, str]]:
    """(vhost, queue) of every ``#resource{kind = queue}`` in the node's Mnesia files."""
    found: set[tuple[str, str]] = set()
    if not os.path.isdir(node_dir):
        return found
    from .names import queue_resources_in

    for name in os.listdir(node_dir):
        if not name.endswith((".DCD", ".DCL", ".LOG", ".DAT")):
            continue
        queue_resources_in(_read_small(os.path.join(node_dir, name)) or b"", found)
    return found


def scan(path: str, ctx: ImportContext) -> tuple[str, list[VhostDir]]:
    """Find every vhost and queue directory; names resolved where the files allow."""
    vhosts_dir = find_vhosts_dir(path)
    node_dir = os.path.dirname(os.path.dirname(vhosts_dir))
    out = []
    for vd in sorted(os.listdir(vhosts_dir)):
        vpath = os.path.join(vhosts_dir, vd)
        if not os.path.isdir(vpath):
            continue
        raw = _read_small(os.path.join(vpath, ".vhost"))
        vname = raw.decode("utf-8", "surrogateescape") if raw is not None else None
        if vname is not None and vhost_dir_name(vname) != vd:
            ctx.damaged(os.path.join(vpath, ".vhost"), None, f"names vhost {vname!r}, whose directory would be "
                        f"{vhost_dir_name(vname)}, not {vd}", then="ignoring it")
            vname = None
        cfg = _read_small(os.path.join(vpath, ".config"))
        count = cqv1.LEGACY_SEGMENT_ENTRY_COUNT
        if cfg is not None:
            m = _CONFIG_RE.search(cfg)
            if m:
                count = int(m.group(1))
            elif cfg.strip():
                ctx.damaged(os.path.join(vpath, ".config"), None, "no {segment_entry_count, N}. term")
        if not 0 < count <= 16384:
            ctx.damaged(os.path.join(vpath, ".config"), None, f"segment_entry_count {count} out of range")
            count = cqv1.LEGACY_SEGMENT_ENTRY_COUNT
        v = VhostDir(vpath, vname, count)
        v.recovery, why = read_recovery_terms(vpath)
        if why:
            ctx.note(why)
        qroot = os.path.join(vpath, "queues")
        if os.path.isdir(qroot):
            for qd in sorted(os.listdir(qroot)):
                qpath = os.path.join(qroot, qd)
                if not os.path.isdir(qpath):
                    continue
                qraw = _read_small(os.path.join(qpath, ".queue_name"))
                qv = qn = None
                if qraw is not None:
                    parsed = parse_queue_name_file(qraw, qd)
                    if parsed is None:
                        ctx.damaged(os.path.join(qpath, ".queue_name"), None,
                                    "unreadable or does not match its directory name",
                                    then="recovering the name otherwise")
                    else:
                        qv, qn = parsed
                version = 2 if cqv2.has_v2_files(qpath) or (qraw or b"").endswith(b"INDEX: v2\n") else 1
                v.queues.append(QueueDir(qpath, qv, qn, version))
        # The queues' name files name their vhost too.
        if v.name is None:
            for q in v.queues:
                if q.vhost is not None and vhost_dir_name(q.vhost) == vd:
                    v.name = q.vhost
                    break
        out.append(v)
    # Last resort for missing names: hash what Mnesia knows.
    if any(v.name is None or any(q.name is None for q in v.queues) for v in out):
        res = mnesia_resources(node_dir)
        by_vdir = {vhost_dir_name(vh): vh for vh, _ in res}
        by_qdir = {queue_dir_name(vh, q): (vh, q) for vh, q in res}
        for v in out:
            if v.name is None:
                v.name = by_vdir.get(os.path.basename(v.path))
            for q in v.queues:
                if q.name is None and os.path.basename(q.path) in by_qdir:
                    q.vhost, q.name = by_qdir[os.path.basename(q.path)]
    return node_dir, out


def _guess_from_messages(v: VhostDir, q: QueueDir, first: StoredMessage | None) -> None:
    """Fill missing names from a message's own vhost and default-exchange routing key."""
    if first is None:
        return
    qd = os.path.basename(q.path)
    vcands = [v.name] if v.name else []
    if first.vhost and first.vhost not in vcands:
        vcands.append(first.vhost)
    if v.name is None:
        for c in vcands:
            if vhost_dir_name(c) == os.path.basename(v.path):
                v.name = c
                break
    if q.name is None and v.name is not None:
        for rk in first.routing_keys:
            if queue_dir_name(v.name, rk) == qd:
                q.vhost, q.name = v.name, rk
                return


def _store_for(v: VhostDir, stores: dict[str, MessageStore], ctx: ImportContext) -> MessageStore:
    s = stores.get(v.path)
    if s is None:
        s = stores[v.path] = MessageStore(os.path.join(v.path, "msg_store_persistent"), ctx)
    return s


def _iter_queue(v: VhostDir, q: QueueDir, store: MessageStore, ctx: ImportContext) -> Iterator[tuple[int, StoredMessage]]:
    where = f"queue directory {q.path}"
    if q.version == 2:
        if any(n.endswith(".idx") or n == cqv1.JOURNAL for n in os.listdir(q.path)):
            ctx.note(f"{q.path}: holds both v1 and v2 index files (an interrupted conversion); reading the v2 files")
        return cqv2.iter_messages(q.path, store, ctx, where)
    terms = v.recovery.get(os.path.basename(q.path))
    return cqv1.iter_messages(q.path, v.segment_entry_count, store, ctx, where, terms.segments if terms else None)


@dataclass
class ImportedQueue:
    vhost: str
    name: str
    version: int  # classic queue index version; 0 for quorum queues and streams
    path: str
    exported: int = 0
    kind: str = "classic"  # classic | quorum | stream
    detail: str = ""  # e.g. a stream's offsets, a quorum member's role and last applied index


def iter_queues(
    path: str,
    ctx: ImportContext,
    backed_up_at: int,
    vhosts: set[str] | None = None,
    queues: set[str] | None = None,
) -> Iterator[tuple[ImportedQueue, Iterator[BackupRecord]]]:
    """(queue, records) for every classic queue directory, vhost then queue name order.

    Each queue's record iterator must be consumed before asking for the next.
    """
    node_dir, vdirs = scan(path, ctx)
    stores: dict[str, MessageStore] = {}
    todo: list[tuple[str, str, VhostDir, QueueDir, Iterator | None, StoredMessage | None]] = []  # names first
    try:
        for v in vdirs:
            for q in v.queues:
                it = None
                first = None
                if v.name is None or q.name is None:
                    # Peek at the first message for name candidates.
                    it = _iter_queue(v, q, _store_for(v, stores, ctx), ctx)
                    first_pair = next(it, None)
                    first = first_pair[1] if first_pair else None
                    _guess_from_messages(v, q, first)
                    if first_pair is not None:
                        it = _chain(first_pair, it)
                if v.name is None or q.name is None:
                    ctx.damaged(q.path, None, "cannot tell which vhost/queue this directory belongs to "
                                "(no .vhost/.queue_name and no known name hashes to it)", then="skipped")
                    continue
                if q.vhost is not None and q.vhost != v.name:
                    ctx.damaged(q.path, None, f".queue_name says vhost {q.vhost!r} but the directory is vhost {v.name!r}")
                    continue
                todo.append((v.name, q.name, v, q, it, first))
        todo.sort(key=lambda t: (t[0], t[1]))
        for vname, qname, v, q, it, _ in todo:
            if vhosts and vname not in vhosts:
                continue
            if queues and qname not in queues:
                continue
            iq = ImportedQueue(vname, qname, q.version, q.path)
            if it is None:
                it = _iter_queue(v, q, _store_for(v, stores, ctx), ctx)
            yield iq, _records(iq, it, backed_up_at, ctx)
    finally:
        for s in stores.values():
            s.close()


def _chain(first: Any, rest: Iterable[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _records(
    iq: ImportedQueue, it: Iterator[tuple[int, StoredMessage]], backed_up_at: int, ctx: ImportContext
) -> Iterator[BackupRecord]:
    ctx.reading("queue", iq.vhost, iq.name)  # named in any problem found meanwhile
    try:
        for seq_id, m in it:
            iq.exported += 1
            yield to_record(m, iq.vhost, iq.name, seq_id, backed_up_at)
    finally:
        ctx.done_reading()


@dataclass
class ImportResult:
    manifest: BackupManifest
    queues: list[ImportedQueue]
    ctx: ImportContext


def _subdirs(path: str) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir())
    except OSError:
        return []


QUEUE_TYPES = ("classic", "quorum", "stream")


def unread_queue_data(node_dir: str, types: frozenset[str] | set[str] = frozenset(QUEUE_TYPES)) -> list[str]:
    """Say what this import leaves behind: quorum queues (one Ra server
    directory each under ``quorum/<node>/``) and streams (one directory each
    under ``stream/``) of a kind not asked for with ``--types``."""
    quorum = os.path.join(node_dir, "quorum")
    found = {
        "quorum": [d for node in _subdirs(quorum) for d in _subdirs(os.path.join(quorum, node))],
        "stream": _subdirs(os.path.join(node_dir, "stream")),
    }
    out = []
    for kind, dirs in found.items():
        if dirs and kind not in types:
            shown = ", ".join(dirs[:5]) + (f" and {len(dirs) - 5} more" if len(dirs) > 5 else "")
            label = "quorum queue" if kind == "quorum" else kind
            out.append(
                f"{len(dirs)} {label}(s) on this node ({shown}) are NOT in this backup: --types leaves "
                f"{kind} out"
            )
    return out


def running_node(node_dir: str) -> tuple[bool, str] | None:
    """Whether the node that owns ``node_dir`` is running: ``(True, why)`` when it is, ``(False, why)``
    when it may be (its pid is an Erlang VM whose open files rbak may not see), None otherwise.

    RabbitMQ writes its pid to ``<node dir>.pid`` beside the data directory. A killed node leaves the
    file behind and a copy has none, so the pid alone proves nothing: the node is running when that
    pid is a ``beam.smp`` holding files of this directory open (a node in a chroot counts too)."""
    pidfile = node_dir.rstrip("/") + ".pid"
    try:
        with open(pidfile, "rb") as f:
            pid = int(f.read(32).strip() or b"0")
        with open(f"/proc/{pid}/comm", "rb") as f:
            comm = f.read().strip().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None  # no pid file, no such process, or not a pid: a stopped node or a copy
    if not comm.startswith("beam"):
        return None  # the pid was reused by something else
    real = os.path.realpath(node_dir)
    try:
        root = os.readlink(f"/proc/{pid}/root").rstrip("/")
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            # The kernel shows a path from the reader's root when it can, else from the process's own.
            for cand in (target, root + target) if target.startswith("/") else ():
                if os.path.realpath(cand).startswith(real + os.sep):
                    return True, f"the node is running: pid {pid} (from {pidfile}) is {comm} with {cand} open"
    except PermissionError:
        return False, (f"pid {pid} (from {pidfile}) is a running Erlang VM ({comm}); rbak may not see its open "
                       "files, so it cannot tell whether it is this node")
    except OSError:
        return None
    return None


def import_rabbitmq_dir(
    path: str,
    storage_url,
    backup_id: str,
    prefix: str = "",
    compression="zstd",
    skip_damaged: bool = False,
    vhosts: set[str] | None = None,
    queues: set[str] | None = None,
    types: set[str] | None = None,
    from_offset: int | None = None,
    codec=None,
    progress=None,
) -> ImportResult:
    """Read a stopped node's data directory into a new RBAK backup.

    ``types`` picks among classic queues, quorum queues and streams (default
    all); ``from_offset`` starts every stream there instead of at its first offset."""
    from . import streams
    from ..writer import now_ms, write_backup

    types = set(QUEUE_TYPES) if not types else set(types)
    bad = types - set(QUEUE_TYPES)
    if bad:
        raise ImportFormatError(f"--types: unknown queue type(s) {', '.join(sorted(bad))} "
                                f"(choose from {', '.join(QUEUE_TYPES)})")
    ctx = ImportContext(skip_damaged=skip_damaged)
    started = now_ms()
    node_dir = os.path.dirname(os.path.dirname(find_vhosts_dir(path)))
    live = running_node(node_dir)
    if live is not None and live[0]:  # its files change under the import: what it reads would not hang together
        raise ImportFormatError(f"{node_dir}: {live[1]}; stop the node first, or import a copy of its data "
                                "directory")
    if live is not None:
        log.warning("%s: %s", node_dir, live[1])
        ctx.note(f"{node_dir}: {live[1]}; if the node is running, stop it or import a copy")
    for text in unread_queue_data(node_dir, types):
        log.warning("%s", text)
        ctx.note(text)
    done: list[ImportedQueue] = []

    def wanted(vhost: str, name: str) -> bool:
        return (not vhosts or vhost in vhosts) and (not queues or name in queues)

    def gen() -> Iterator[tuple[str, str, str, Any]]:
        if "classic" in types:
            for iq, recs in iter_queues(path, ctx, started, vhosts, queues):
                done.append(iq)
                yield iq.vhost, iq.name, "classic", recs
        if "quorum" in types:
            from . import quorum

            for qq, recs in quorum.iter_quorum_queues(node_dir, ctx, started):
                if wanted(qq.vhost, qq.name):
                    done.append(qq)  # type: ignore[arg-type]  # an ImportedQueue look-alike (kind "quorum")
                    yield qq.vhost, qq.name, "quorum", recs
        if "stream" in types:
            for sd in streams.stream_dirs(node_dir, ctx):
                if not wanted(sd.vhost, sd.name):
                    continue
                iq = ImportedQueue(sd.vhost, sd.name, 0, sd.path, kind="stream")
                done.append(iq)
                yield sd.vhost, sd.name, "stream", _stream_records(iq, sd, ctx, started, from_offset)

    manifest = write_backup(
        storage_url, backup_id, gen(), prefix=prefix, compression=compression,
        source_cluster=os.path.basename(node_dir) or None, codec=codec, progress=progress,
        statuses=ctx.queue_statuses,
    )
    return ImportResult(manifest, done, ctx)


def _stream_records(iq: ImportedQueue, sd, ctx: ImportContext, started: int, from_offset: int | None):
    from .streams import stream_records

    yield from stream_records(sd, ctx, started, from_offset)
    iq.exported = sd.exported
    iq.detail = (f"offsets {sd.first_offset}-{sd.last_offset}" if sd.exported else "no messages"
                 ) + (f" (from --from-offset {from_offset})" if from_offset is not None else "")
