"""``rbak archive``: every selected stream archived continuously, as generations of ordinary backups.

Storage layout (docs/archive.md): an archive ``NAME`` is a run of *generations*, each a backup
folder ``{prefix}/NAME.{UTC time}/`` holding segments as any backup does. Each stream's entry
continues the previous generation (``stream.previous_backup``, proven by re-reading the record at
the previous last offset, as an incremental backup does), so a restore walks the chain. While a
generation is open, every tick writes one small object naming the segments made durable since the
last tick and the archive's *recoverable-until* (``format.archive``); when it closes (after
``archive.generation_ticks`` ticks, on SIGTERM, or on any failure) its ``manifest.json`` is written
once, from the ticks. Nothing is ever overwritten or deleted, so Object Lock buckets work.

Resume lives in the storage: a starting archiver closes any open generation from its ticks (what
no tick names is not part of it) and continues every stream after the last offset the newest
generation holds. A crash at any moment therefore loses nothing the broker still holds and
duplicates nothing: the records of a segment stored after the last tick are read again into the
next generation, and the unnamed segment is never read.

The watermark: stream ``s`` is complete up to ``C_s`` when every record the broker had committed by
``C_s`` is in a segment named by a tick. At each tick the follower probes the stream's committed end
``E`` at instant ``P`` (over the stream protocol) before it closes its segment; once the stream's
durable offset reaches ``E`` and a tick names it, ``C_s`` moves to ``P``. Records are stamped when
read (after their commit), so every record stamped at or before ``C_s`` is archived too. Where the
stream protocol cannot answer, ``C_s`` falls back to the last durable record's read time (minus
1 ms), which overstates after a backlog (logged). ``recoverable_until`` = min of ``C_s`` over the
streams on the broker: one instant up to which every stream is complete, so a restore to it
(``--pitr-end``) is consistent across streams.

A tick waits for the segments it asked for only until a head-room deadline (measured store times):
what is durable by then is named, a slower store goes to the next tick, and no stream's
complete-until passes a segment no tick names. Ticks start ``max_delay_secs`` minus that head-room
apart, so a record read just after one tick is durable and named within ``max_delay_secs``.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from .. import __version__, metrics
from ..backup.lease import ARCHIVE_LEASE_QUEUE, Lease
from ..backup.lease import acquire as acquire_lease
from ..backup.pipeline import SegmentStore
from ..backup.stream_chain import ChainDecision, StreamBase, decide
from ..broker.cluster import split_broker
from ..broker.connect import connect
from ..broker.stream_reader import probe_offset
from ..repo.catalog import open_archive_manifest
from ..config import Config, ConnectionConfig
from ..sealing.envelope import write_wraps, writer_codec
from ..errors import AmqpError, BackupLeaseError, ConfigError, NotFoundError, RbakError
from ..format.archive import Tick, TickStream, assemble, stream_key, tick_key
from ..format.compression import Compression, check_level
from ..format.manifest import BackupManifest, SegmentMetadata, StreamGap, TapOf
from ..format.manifest_archive import CommittedEnd
from ..format.layout import BACKUP_ID_RE, BackupLayout, normalize_prefix
from ..broker.management import ManagementClient, QueueInfo
from ..storage.base import Storage
from .follower import Durable, FollowerGroup, StreamFollower, flushed, stored_one, stream_info
from .state import ArchiveSummary, Generation, StreamState, now_ms, utc_text
from .store_pool import StorePool, StreamSegments
from .taps import Taps, check_selection, leftover_taps, list_queues, select_streams
from .tick_clock import TickClock

log = logging.getLogger(__name__)

POLL_SECS = 0.05
GROUP_STREAMS = 50  # streams read on one AMQP connection by one thread
CREDIT_BUDGET = 20_000  # deliveries the reads may hold unacked, all streams together ...
MIN_PREFETCH = 50  # ... but never fewer than this per stream
MAX_ERRORS = 100  # the summary keeps the newest errors met (one per retry while a broker or storage is away)
TICK_POLL_SECS = 0.01  # a tick looks at its segments this often while it waits for them
MAX_PROBES = 256  # probes kept per stream while its read is behind them (older ones are dropped: a later claim)


class Archiver:
    def __init__(self, cfg: Config, storage: Storage | None = None):
        if cfg.mode != "archive":
            raise ConfigError(f"mode: this is a {cfg.mode!r} configuration; rbak archive needs mode: archive")
        if cfg.source is None:
            raise ConfigError("source: required for an archive")
        self.cfg = cfg
        self.source: ConnectionConfig = cfg.source
        self.opts = cfg.archive
        self.name = cfg.archive.name
        self.storage = storage or cfg.storage.open()
        self.prefix = normalize_prefix(cfg.storage.prefix or "")
        self.compression = Compression.parse(cfg.backup.compression)
        self.level = check_level(self.compression, cfg.backup.compression_level)
        self.stopping = threading.Event()
        self.summary = ArchiveSummary(self.name, self.storage.url, self.prefix)
        self.state = "starting"
        self._complete: dict[tuple[str, str], int] = {}  # (vhost, stream) -> complete-until (ms), for the lag
        self.clock = TickClock(cfg.archive.max_delay_secs)  # a tick's wait and the head-room before it
        self._unprobed: set[str] = set()  # streams whose complete-until fell back to read times (warned once)
        self.taps = Taps(cfg.archive.taps, cfg.source.queues.vhosts, self.name) if cfg.archive.taps else None
        self.leftover: dict[tuple[str, str], TapOf] = {}  # tap streams of queues archive.taps does not tap

    def stop(self) -> None:
        """Stop after flushing (SIGTERM): every record read is stored and named before the process ends."""
        self.stopping.set()

    # ------------------------------------------------------------------
    def _lag_loop(self) -> None:
        """The lag gauges grow every second while nothing is archived (a storage outage, a broker away)."""
        while not self.stopping.wait(1.0):
            now = now_ms()
            for (vhost, name), cu in list(self._complete.items()):
                metrics.archive_lag().labels(vhost=vhost, stream=name).set(max(0.0, (now - cu) / 1000))

    def run(self) -> ArchiveSummary:
        client = ManagementClient.for_connection(self.source, "source")
        lease: Lease | None = None
        threading.Thread(target=self._lag_loop, name="rbak-archive-lag", daemon=True).start()
        try:
            try:
                problem = split_broker("source", self.source, client.overview().get("cluster_name"),
                                       self.source.queues.vhosts)
            except AmqpError:  # a broker away (restarting): the loop below retries, naming it
                problem = None
            if problem:
                raise ConfigError(f"{problem}; nothing was archived")
            known = client.vhosts()
            missing = [v for v in self.source.queues.vhosts if v not in known]
            if missing:  # as rbak backup says it, not as the management API's 404 for one vhost's queues
                raise ConfigError(f"source.queues.vhosts: vhost {', '.join(map(repr, missing))} does not exist on "
                                  f"{self.source.management_url} (vhosts user {self.source.mgmt_username!r} can see: "
                                  f"{', '.join(map(repr, known[:10]))}{', ...' if len(known) > 10 else ''})")
            taps = self.taps.resolve(client, strict=True) if self.taps is not None else []
            check_selection(client, self.source.queues, taps if self.taps is not None else None,
                            self.source.management_url)
            if self.taps is not None:  # checked (exit 2), then each tap stream declared and bound
                self.taps.prepare(client, taps)
            queues = list_queues(client, self.source.queues, self.taps)
            streams = self._select(client, queues)
            self.leftover = leftover_taps(self.name, streams, queues, self.taps)  # said; a tap still if it can be
            vhosts = sorted({q.vhost for q in streams} | set(self.source.queues.vhosts))
            while not self.stopping.is_set():
                try:
                    if lease is None:  # a broker away (restarting) fails this too: retried below
                        lease = self._take_lease(client, vhosts)
                    if lease is None:
                        break
                    self._generation(client, lease, vhosts)
                except (RbakError, OSError) as e:
                    self.summary.errors = self.summary.errors[-(MAX_ERRORS - 1):] + [str(e)]  # bounded: an outage
                    metrics.errors().labels(error_type=metrics.error_type(e)).inc()
                    log.error("archive %s: %s; starting again from what the storage holds in %gs", self.name, e,
                              self.opts.retry_secs)
                    self.stopping.wait(self.opts.retry_secs)
                if lease is not None and (self.stopping.is_set() or set(lease.connections) != set(vhosts)):
                    lease.release()  # lost (or stopping): taken again, or waited for, by the next pass
                    lease = None
        finally:
            if lease is not None:
                lease.release()
            client.close()
        return self.summary

    def _select(self, client: ManagementClient, queues: list[QueueInfo] | None = None) -> list[QueueInfo]:
        return select_streams(client, self.source.queues, self.taps, queues)

    def _take_lease(self, client: ManagementClient, vhosts: list[str]) -> Lease | None:
        """The archive lease on every vhost (exclusive queue ``rbak.lease.archive``), waiting for as long as
        another archiver of this source holds it, and saying so."""
        name = f"rbak-archive {self.name} lease (pid {os.getpid()} on {socket.gethostname()})"
        said = False
        while not self.stopping.is_set():
            try:
                lease = acquire_lease(self.cfg, client, vhosts, lambda v, n: connect(self.source, v, name=n),
                                      queue=ARCHIVE_LEASE_QUEUE, name=name)
                if said:
                    log.warning("archive %s: the lease is ours now; archiving", self.name)
                return lease
            except BackupLeaseError as e:
                self.state = "waiting"
                if not self.summary.generations:  # stopped now, it never archived: the summary says so
                    self.summary.state = "waiting"
                if not said:
                    log.warning("archive %s: waiting: another archiver of this source holds the archive lease "
                                "(%s)", self.name, str(e).split(": ", 1)[-1].split("; nothing", 1)[0])
                    said = True
                metrics.archive_waiting().set(1)
                self.stopping.wait(self.opts.retry_secs)
        return None

    # ------------------------------------------------------------------
    def _generations(self) -> list[str]:
        base = self.prefix + "/" if self.prefix else ""
        return sorted(d for d in self.storage.list_dirs(base)
                      if d.startswith(self.name + ".") and BACKUP_ID_RE.match(d) and d[len(self.name) + 1:][:1].isdigit())

    def _recover(self) -> BackupManifest | None:
        """Close the open generations from their ticks; the newest generation's manifest (or None).

        Newest first, stopping at the first closed one: a start closes every open generation before it
        begins its own, so only the newest can be open (and ones that never named anything: skipped)."""
        newest: BackupManifest | None = None
        for gid in reversed(self._generations()):
            layout = BackupLayout(gid, self.prefix)
            try:
                m = BackupManifest.from_json(self.storage.get(layout.manifest), layout.manifest)
                closed = True
            except NotFoundError:
                found = open_archive_manifest(self.storage, layout.root)
                if found is None:
                    continue  # it never named anything
                m, closed = found, False
                assert m.archive is not None
                m.archive.open = False
                self.storage.put(layout.manifest, m.to_json())
                metrics.archive_uploads().labels(kind="manifest").inc()
                log.info("archive %s: closed generation %s from its %d tick(s)", self.name, gid, m.archive.ticks)
            if newest is None and m.archive is not None and m.archive.name == self.name:
                newest = m
            if closed:
                break
        return newest

    def _new_id(self) -> str:
        used = set(self._generations())
        while True:
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%f")[:-3] + "Z"
            gid = f"{self.name}.{stamp}"
            if gid not in used:
                return gid
            time.sleep(0.002)

    def _generation(self, client: ManagementClient, lease: Lease, vhosts: list[str]) -> None:
        newest = self._recover()
        gid = self._new_id()
        layout = BackupLayout(gid, self.prefix)
        ov = client.overview()
        cluster = ov.get("cluster_name") or ov.get("node") or self.source.host
        codec = writer_codec(gid, self.cfg.encryption)
        if codec.wraps:  # envelope: the wrapped data key is stored before anything it seals
            write_wraps(self.storage, layout, codec.wraps)
            codec.wraps = []
        prev_w = newest.archive.recoverable_until if newest is not None and newest.archive is not None else None
        g = Generation(gid, layout, now_ms(), cluster, ov.get("rabbitmq_version"), codec,
                       self._plan(client, newest, prev_w), prev_w)
        self.summary.generations.append(gid)
        self.summary.state = "archived"
        self._write_tick(g)  # tick 0: each stream's link and start
        failure: BaseException | None = None
        pool = StorePool()
        groups = self._groups(g, pool)
        try:
            for grp in groups:
                grp.start()
            self.state = "archiving"
            metrics.archive_waiting().set(0)
            log.info("archive %s: generation %s follows %d stream(s) on %d connection(s)", self.name, gid,
                     sum(len(grp.followers) for grp in groups), len(groups))
            self._follow(g, client, lease, vhosts)
        except BaseException as e:  # noqa: BLE001 - the generation is closed first, then it is raised
            failure = e
        for grp in groups:
            grp.stop()
        for grp in groups:
            for f in grp.followers if grp.started else ():
                f.done.wait(max(30.0, self.opts.max_delay_secs * 4))
        pool.close()
        try:
            self._close(g)
        except (RbakError, OSError) as e:
            if failure is None:
                raise
            log.error("archive %s: generation %s stays open (closed from its ticks by the next start): %s",
                      self.name, gid, e)
        if failure is not None:
            raise failure

    def _plan(self, client: ManagementClient, newest: BackupManifest | None, prev_w: int | None) -> dict[str, StreamState]:
        """Each stream's chain decision against the newest generation (``stream_chain.decide``): continue
        it, a gap retention made, or a stream deleted and declared again (a new epoch). Streams of the
        archive that are gone from the broker are carried on (their link), with no follower."""
        epochs = newest.archive.epochs if newest is not None and newest.archive is not None else {}
        bases = {} if newest is None else {(q.vhost, q.name): StreamBase(newest.backup_id, q.stream)
                                           for q in newest.queues if q.stream is not None}
        last_ts = {} if newest is None else {(q.vhost, q.name): q.last_message_timestamp for q in newest.queues}
        out: dict[str, StreamState] = {}
        conns: dict[str, Any] = {}
        try:
            for q in self._select(client):
                base = bases.get((q.vhost, q.name))
                probe = None
                if base is not None and base.info.last_offset is not None:
                    conn = conns.get(q.vhost) or conns.setdefault(q.vhost, connect(self.source, q.vhost))
                    probe = probe_offset(conn, q.vhost, q.name, base.info.last_offset)
                d = decide(q.name, q.vhost, base, probe)
                if d.warning:
                    log.warning("archive %s: %s", self.name, d.warning)
                if d.gaps:  # the lost records were stamped after the last one archived, before this probe
                    d.gaps = [StreamGap(gp.from_offset, gp.to_offset, last_ts.get((q.vhost, q.name)), now_ms())
                              for gp in d.gaps]
                epoch = epochs.get(stream_key(q.vhost, q.name), 1) + (1 if d.recreated else 0)
                cont = d.previous_backup is not None
                durable = Durable(d.previous_last_offset, d.previous_sha256, d.previous_chunk_timestamp,
                                  last_ts.get((q.vhost, q.name)) if cont else None)
                st = StreamState(q.vhost, q.name, d, durable, epoch, True, prev_w if cont else None,
                                 tap=(self.taps.of(q.vhost, q.name) if self.taps is not None else None)
                                 or self.leftover.get((q.vhost, q.name)))
                out[st.key] = st
        finally:
            for c in conns.values():
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass
        for (vhost, name), base in bases.items():
            key = stream_key(vhost, name)
            if key in out:
                continue
            info = base.info  # gone from the broker: its link is carried on, nothing to follow
            d = ChainDecision(info.last_offset + 1 if info.last_offset is not None else "first",
                              base.backup_id if info.last_offset is not None else None, info.last_offset,
                              previous_sha256=info.last_record_sha256,
                              previous_chunk_timestamp=info.last_chunk_timestamp)
            out[key] = StreamState(vhost, name, d, Durable(info.last_offset, info.last_record_sha256,
                                                           info.last_chunk_timestamp, None),
                                   epochs.get(key, 1), False, None, tap=info.tap)
        return out

    def _groups(self, g: Generation, pool: StorePool) -> list[FollowerGroup]:
        """A follower per stream on the broker, read ``GROUP_STREAMS`` to a connection and thread (per vhost).
        Each stream's credit shrinks as streams grow in number, so what the reads may hold in memory stays
        about ``CREDIT_BUDGET`` deliveries however many streams are followed."""
        by_vhost: dict[str, list[StreamFollower]] = {}
        for st in g.streams.values():
            if st.present:
                st.follower = self._follower(g, st, pool)
                by_vhost.setdefault(st.vhost, []).append(st.follower)
        n = sum(len(fs) for fs in by_vhost.values())
        prefetch = max(MIN_PREFETCH, min(self.cfg.backup.prefetch_count, CREDIT_BUDGET // max(n, 1)))
        groups = []
        for vhost, fs in sorted(by_vhost.items()):
            for i in range(0, len(fs), GROUP_STREAMS):
                groups.append(FollowerGroup(self.source, vhost, fs[i:i + GROUP_STREAMS], prefetch,
                                            f"rbak-archive {self.name} {vhost} #{i // GROUP_STREAMS + 1}"))
        return groups

    def _follower(self, g: Generation, st: StreamState, pool: StorePool) -> StreamFollower:
        b = self.cfg.backup
        records = metrics.archive_records().labels(vhost=st.vhost, stream=st.name)
        nbytes = metrics.archive_bytes().labels(vhost=st.vhost, stream=st.name)

        def count(n: int, size: int) -> None:
            records.inc(n)
            nbytes.inc(size)
            self.summary.records += n

        def writer(vhost: str, name: str, first: int, on_durable: Callable[[SegmentMetadata, Any], None]):
            store = SegmentStore(self.storage, g.layout, g.codec, self.compression, vhost, name, "stream")
            return StreamSegments(pool, store, self.compression, self.level, b.segment_max_bytes, first, on_durable)

        return StreamFollower(st.vhost, st.name, st.decision, st.durable, writer, count)

    # ------------------------------------------------------------------
    def _follow(self, g: Generation, client: ManagementClient, lease: Lease, vhosts: list[str]) -> None:
        """Ticks until stopped, a follower fails, the lease is lost, the selection changes or the
        generation is full; the caller closes the generation."""
        next_tick = self.clock.next_tick(None, time.monotonic())
        next_list = time.monotonic() + self.opts.relist_secs
        present = {k for k, st in g.streams.items() if st.present}
        if not self._listed(g, client, present):
            return
        while True:
            while time.monotonic() < next_tick or self.stopping.is_set():  # a stop met in a tick ends here too
                if self.stopping.is_set():  # what was read is named, with a fresh probe and listing
                    try:  # F12: the last busy tick's listing capped it, short of records that tick named
                        self._listed(g, client, present)  # a failed or changed listing keeps that cap
                    except (RbakError, OSError) as e:
                        log.warning("archive %s: no listing at the stop (%s)", self.name, e)
                    self._tick(g, final=True)
                    return
                failed = [st for st in g.streams.values() if st.follower is not None and st.follower.error is not None]
                if failed:
                    raise failed[0].follower.error  # type: ignore[union-attr,misc]
                if g.late and all(flushed(f, seq) for f, seq in g.late.values()):
                    self._name_late(g)
                    if len(g.ticks) >= self.opts.generation_ticks:
                        return
                self.stopping.wait(min(POLL_SECS, max(0.0, next_tick - time.monotonic())))
            now = time.monotonic()
            next_tick = self.clock.next_tick(next_tick, now)
            if set(lease.connections) != set(vhosts):
                log.warning("archive %s: the archive lease was lost; closing generation %s", self.name, g.backup_id)
                return
            busy = any(st.follower.pending() or st.unticked for st in g.streams.values() if st.follower is not None)
            due = busy or now - g.last_tick_mono >= self.opts.idle_tick_secs
            if due:  # every tick lists too (while its segments are stored): its recoverable-until covers new streams
                next_list = now + self.opts.relist_secs
                if not self._tick(g, lambda: self._listed(g, client, present)):
                    return
                if len(g.ticks) >= self.opts.generation_ticks:
                    return  # full: closed, and the next one starts
            elif now >= next_list:
                next_list = now + self.opts.relist_secs
                if not self._listed(g, client, present):
                    return

    def _listed(self, g: Generation, client: ManagementClient, present: set[str]) -> bool:
        """List the selection again: False when it changed (a new generation starts), else True and
        ``g.listed_ms`` moves to when the listing began."""
        began = now_ms()
        # one listing serves the taps' sync (each tap's bindings follow its queue's) and the selection, unless the
        # sync added a tap or declared a stream, which that listing cannot show: then the selection lists again
        queues: list[QueueInfo] | None = list_queues(client, self.source.queues, self.taps)
        if self.taps is not None and self.taps.sync(client, queues=queues):
            queues = None
        if {stream_key(q.vhost, q.name) for q in self._select(client, queues)} != present:
            log.info("archive %s: the selected streams changed; starting a new generation", self.name)
            return False
        g.listed_ms = began
        return True

    def _tick(self, g: Generation, listed: Callable[[], bool] | None = None, final: bool = False) -> bool:
        """Every follower probes its committed end and closes its segment; the segments durable by the
        head-room deadline (``wait_secs``) are named by one tick, slower ones by a later tick. ``listed``:
        the selection listed again while the segments are stored (False: it changed, no tick is written).
        ``final``: the last tick before stopping (SIGTERM), which waits for every segment."""
        g.flush_seq += 1
        seq = g.flush_seq
        began = time.monotonic()
        live = [st for st in g.streams.values() if st.follower is not None and not st.follower.done.is_set()]
        before: dict[str, int | None] = {}
        for st in live:
            assert st.follower is not None
            with st.follower.lock:
                before[st.key] = st.follower.durable.last_offset
            st.follower.flush_request = seq
        if listed is not None and not listed():
            return False
        wait = max(self.opts.max_delay_secs, 2.0) if final else self.clock.wait_secs()
        deadline = began + wait
        waiting = {st.key: st.follower for st in live if st.follower is not None}
        settled: list[float] = []
        unanswered = dict(waiting)
        answered = 0.0
        while waiting and (final or not self.stopping.is_set()):
            now = time.monotonic()
            for key, f in list(unanswered.items()):
                if f.answer is not None and f.answer.seq >= seq:
                    del unanswered[key]
                    answered = now - began
            for key, f in list(waiting.items()):
                if flushed(f, seq):
                    del waiting[key]
                    if f.error is None and stored_one(f, seq, before[key]):
                        settled.append(now - began)  # a segment was asked for and is durable
            if not waiting or now >= deadline:
                break
            time.sleep(TICK_POLL_SECS)
        for key, f in waiting.items():  # not durable by the deadline: named by a later tick, counted as slow
            if f.answer is None or f.answer.seq < seq or stored_one(f, seq, before[key]):
                settled.append(wait)
        if settled and not final:
            settled.sort()
            self.clock.settled(settled[int(0.9 * (len(settled) - 1))])
        named_at = time.monotonic()
        g.late = {key: (f, seq) for key, f in waiting.items()}
        self._collect(g, seq)
        self._write_tick(g)
        self.clock.put(time.monotonic() - named_at)
        log.debug("archive %s: tick %d took %.3f s (answers %.3f s, flush %.3f s, %d stream(s) left to the next "
                  "tick)", self.name, len(g.ticks) - 1, time.monotonic() - began, answered, named_at - began,
                  len(waiting))
        return True

    def _name_late(self, g: Generation) -> None:
        """The segments that missed the last tick's deadline are durable now: one tick names them (and
        whatever else became durable), with no new flush (no extra segment for the other streams)."""
        g.late = {}
        began = time.monotonic()
        self._collect(g, None)
        self._write_tick(g)
        log.debug("archive %s: tick %d named the segments late for the last one (%.3f s)", self.name,
                  len(g.ticks) - 1, time.monotonic() - began)

    def _collect(self, g: Generation, seq: int | None) -> None:
        """Take each follower's durable segments and move each stream's complete-until: to the newest
        probe whose committed end is durable (exact), or, for a flush the stream protocol could not
        probe, to the last durable record's read time."""
        for st in g.streams.values():
            f = st.follower
            if f is None:
                continue
            segs, durable = f.take()
            st.unticked.extend(segs)
            st.durable = durable
            a = f.answer if seq is not None else None
            if a is not None and a.seq != seq:
                a = None
            if a is not None and a.probe is not None:
                st.probes = (st.probes + [a.probe])[-MAX_PROBES:]
                st.committed = CommittedEnd(a.probe.end, a.probe.at)
            cu = st.claim(durable, f.received)
            if a is not None and a.probe is None and durable.last_ts is not None:
                if st.key not in self._unprobed:
                    self._unprobed.add(st.key)
                    log.warning("archive %s: %s: the stream protocol did not answer; its complete-until follows "
                                "the read times of its records (after a backlog they overstate it)", self.name,
                                st.key)
                cu = max(cu or 0, durable.last_ts - 1)
            if cu is not None:
                st.complete_until = max(st.complete_until or cu, cu)

    def _watermark(self, g: Generation) -> int | None:
        cus = [st.complete_until for st in g.streams.values() if st.present]
        if not cus:
            w: int | None = now_ms()
        elif any(c is None for c in cus):
            w = None
        else:
            w = min(c for c in cus if c is not None)
        if w is not None and g.listed_ms is not None:
            w = min(w, g.listed_ms)
        prev = g.recoverable_until
        if w is None:
            return prev
        return w if prev is None else max(w, prev)

    def _tick_object(self, g: Generation, sequence: int, w: int | None) -> Tick:
        return Tick(self.name, g.backup_id, sequence, now_ms(), g.created_at, w,
                    [TickStream(st.vhost, st.name, stream_info(st.decision, st.durable,
                                                               st.follower.lock if st.follower else None, st.tap),
                                st.epoch, st.complete_until, st.present, list(st.unticked), st.committed)
                     for st in sorted(g.streams.values(), key=lambda s: (s.vhost, s.name))],
                    g.cluster, g.version, __version__, g.codec.info)

    def _write_tick(self, g: Generation) -> None:
        w = self._watermark(g)
        tick = self._tick_object(g, len(g.ticks), w)
        self.storage.put(tick_key(g.layout.root, tick.sequence), tick.to_json())  # a new key: never overwritten
        g.ticks.append(tick)
        g.recoverable_until = w
        g.last_tick_mono = time.monotonic()
        self._account(g, tick)
        for st in g.streams.values():
            st.segments.extend(st.unticked)
            st.unticked = []

    def _account(self, g: Generation, tick: Tick) -> None:
        s = self.summary
        s.ticks += 1
        s.recoverable_until = tick.recoverable_until
        metrics.archive_uploads().labels(kind="tick").inc()
        now = now_ms()
        for ts in tick.streams:
            s.segments += len(ts.segments)
            metrics.archive_uploads().labels(kind="segment").inc(len(ts.segments))
            labels = dict(vhost=ts.vhost, stream=ts.name)
            metrics.archive_gaps().labels(**labels).set(len(ts.info.gaps))
            if ts.complete_until is not None and ts.present:
                self._complete[(ts.vhost, ts.name)] = ts.complete_until
                metrics.archive_recoverable().labels(**labels).set(ts.complete_until / 1000)
                metrics.archive_lag().labels(**labels).set(max(0.0, (now - ts.complete_until) / 1000))
        s.streams = [{"vhost": ts.vhost, "name": ts.name, "epoch": ts.epoch, "present": ts.present,
                      "last_offset": ts.info.last_offset, "complete_until": ts.complete_until,
                      "tap": ts.info.tap.to_json_obj() if ts.info.tap else None,
                      "gaps": [gp.to_json_obj() for gp in ts.info.gaps]} for ts in tick.streams]

    def _close(self, g: Generation) -> None:
        """The generation's manifest, written once: every tick's segments plus what the followers made
        durable since (they have stopped)."""
        self._collect(g, None)
        w = self._watermark(g)
        final = self._tick_object(g, len(g.ticks), w)
        m = assemble(g.ticks + [final], open_=False)
        m.archive.ticks = len(g.ticks)  # type: ignore[union-attr]  # tick objects stored; the final state is no tick
        self.storage.put(g.layout.manifest, m.to_json())
        metrics.archive_uploads().labels(kind="manifest").inc()
        self._account(g, final)
        self.summary.ticks -= 1  # the manifest, not a tick
        log.info("archive %s: generation %s closed (%d segment(s), recoverable until %s)", self.name, g.backup_id,
                 m.total_segments, utc_text(w))


def run_archive(cfg: Config, storage: Storage | None = None) -> ArchiveSummary:
    return Archiver(cfg, storage).run()
