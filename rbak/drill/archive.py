"""Restore drills of a continuous archive (``rbak drill --archive NAME``): prove the recovery point.

A backup drill proves that a backup restores as it was stored; an archive's promise is different (every
record is archived seconds after the broker took it), so its drill checks the archive against the
stream it follows, which is still on the broker:

1. the archive's newest generation and its recoverable-until ``R`` are read from the storage at the
   drill's start ``T``; the restore point is ``P = min(T - lookback, R)`` (``drill.lookback_secs``,
   default 300: the state of a few minutes ago, which the live streams still hold);
2. every stream of the archive is restored up to ``P`` (the generation's whole chain, the PITR window of
   ``rbak restore --pitr-end``) into streams of ONE fresh scratch vhost ``rbak-drill-<generation>-<id>``,
   through the restore engine; the wall time of that restore is the drill's RTO;
3. each scratch stream is read back, and the LIVE source stream is read over the same offsets (from the
   archive's first offset to the last one restored, by offset: a stream consumer takes nothing away), and
   the two are compared record by record (SHA-256 over body, content type, message id, correlation id).
   A record missing, extra, reordered or with another hash fails the drill, naming the stream and offset;
4. the scratch vhost is deleted in a ``finally``; the report (``DrillReport`` with its ``archive``
   object: the recovery point achieved, ``T - R``, the point restored and the RTO) is stored next to the
   generation (``drills/<ts>-<id>.json``), signed as a backup drill's is, and ``rbak drill verify``
   checks it.

Offsets: an archive's records carry no offset of their own; a generation's records are its stream's
offsets ``first_offset..last_offset`` in order, which the chain's links check (each continues exactly
where the one before ended). A generation whose record count does not fill its offsets is a failure of
the drill, not a guess.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..broker.connect import connect
from ..broker.stream_reader import read_stream
from ..config import ConnectionConfig
from .backup import (
    DrillOptions,
    DrillReport,
    RecordHash,
    in_scratch_vhost,
    new_drill_id,
    scratch_queue_names,
    scratch_vhost_name,
    without_credentials,
)
from ..errors import AmqpError, ConfigError, DrillError, RbakError
from ..format.layout import BACKUP_ID_RE
from ..format.manifest import BackupManifest, QueueBackup
from ..repo.catalog import archive_generations
from ..repo.evidence import scratch_words
from ..restore.chain import stream_chain
from ..restore.engine import load_complete_manifest
from ..restore.options import RestoreOptions
from ..restore.plan import plan_restore, record_in_window
from ..restore.queue_restore import plan_codec, restore_queue_segments
from ..restore.source import BackupSource
from ..storage.base import Storage

log = logging.getLogger(__name__)

DEFAULT_LOOKBACK_SECS = 300.0


# --------------------------------------------------------------------------
# On-wire structures (the report's ``archive`` object).
# --------------------------------------------------------------------------


@dataclass
class StreamCheck:
    """One archived stream: what was restored up to the point, what the scratch stream gave back, and
    what the live stream holds over the same offsets."""

    vhost: str
    stream: str
    scratch_queue: str
    first_offset: int | None = None  # the first offset compared (the archive's, or the live stream's when retention trimmed it)
    last_offset: int | None = None  # the last offset restored (the restore point's)
    restored_count: int = 0  # records the archive holds up to the restore point (published into the scratch stream)
    read_back_count: int | None = None
    live_count: int | None = None  # records the live stream holds over first_offset..last_offset
    restored_hash: str | None = None  # over the records compared, in order
    live_hash: str | None = None
    mismatch_offset: int | None = None
    note: str | None = None
    passed: bool = False
    error: str | None = None


@dataclass
class ArchiveDrill:
    """What an archive drill proves (``DrillReport.archive``)."""

    name: str
    generation: str
    drilled_at: int  # epoch ms: "now" when the drill read the archive's state
    recoverable_until: int  # epoch ms: the archive's, at drilled_at
    recovery_point_secs: float  # drilled_at - recoverable_until: the recovery point achieved
    lookback_secs: float
    restore_point: int  # epoch ms: every stream restored up to here
    restore_secs: float | None = None  # RTO: wall time of the restore into the scratch vhost
    live_target: str = ""  # management URL of the broker the live streams were read from
    streams: list[StreamCheck] = field(default_factory=list)

    @property
    def recoverable_until_utc(self) -> str:
        return utc(self.recoverable_until)

    @property
    def restore_point_utc(self) -> str:
        return utc(self.restore_point)

    def to_json_obj(self) -> dict[str, Any]:
        d = asdict(self)
        d["recovery_point_secs"] = round(self.recovery_point_secs, 3)
        d["restore_secs"] = None if self.restore_secs is None else round(self.restore_secs, 3)
        d["recoverable_until_utc"], d["restore_point_utc"] = self.recoverable_until_utc, self.restore_point_utc
        d["records_compared"] = sum(s.restored_count for s in self.streams)
        return d


def utc(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


# --------------------------------------------------------------------------
# Pure decisions.
# --------------------------------------------------------------------------


def restore_point(now_ms: int, recoverable_until: int, lookback_secs: float) -> int:
    """``now - lookback``, never past the recoverable-until (a later point is not archived for every stream)."""
    return min(now_ms - int(lookback_secs * 1000), recoverable_until)


def record_digest(body: bytes, content_type: str | None, message_id: str | None, correlation_id: str | None) -> bytes:
    """One record's SHA-256 over the fields the drill compares (length-prefixed, as ``RecordHash``)."""
    h = hashlib.sha256()
    for part in (bytes(body), *((s or "").encode("utf-8") for s in (content_type, message_id, correlation_id))):
        h.update(struct.pack(">I", len(part)))
        h.update(part)
    return h.digest()


def first_mismatch(restored: list[tuple[int, bytes]], live: list[tuple[int, bytes]]) -> tuple[int | None, str] | None:
    """(offset, what) of the first difference between the records restored (each with the offset the
    archive says it had) and the live stream's records over the same offsets; None when they agree."""
    if restored and not live:
        return restored[0][0], (f"the live stream holds none of offsets {restored[0][0]}..{restored[-1][0]} "
                                "(trimmed by its retention, or deleted): nothing to compare the restore with")
    for k in range(max(len(restored), len(live))):
        if k >= len(live):
            off = restored[k][0]
            return off, (f"{len(restored) - len(live)} extra record(s) restored after the live stream's last "
                         f"offset {live[-1][0] if live else '-'} (from archived offset {off})")
        want_off, want = live[k]
        if k >= len(restored):
            return want_off, (f"record at offset {want_off} missing from the restore ({len(live) - len(restored)} "
                              f"record(s) missing from there)")
        got_off, got = restored[k]
        if got == want and got_off == want_off:
            continue
        if got == want:  # the right record under another offset: the archive's offsets are off
            return want_off, f"record at offset {want_off} was archived as offset {got_off}"
        want_later = any(d == want for _, d in restored[k + 1:])  # the live record is restored further on
        elsewhere = [o for o, d in live if d == got and o != want_off]  # the restored one is live elsewhere
        if elsewhere and not want_later:
            return want_off, f"record at offset {want_off} missing from the restore"
        if want_later and not elsewhere:
            return want_off, f"an extra record restored before offset {want_off}"
        if elsewhere:
            return want_off, (f"records reordered: the restore holds the record of offset {elsewhere[0]} where "
                              f"offset {want_off} belongs")
        return want_off, f"record at offset {want_off} restored with another hash than the live stream's"
    return None


def judge(check: StreamCheck, restored: list[tuple[int, bytes]], read_back: list[bytes],
          live: list[tuple[int, bytes]]) -> StreamCheck:
    """Set ``passed``/``error`` of a stream (an earlier error stands): the scratch stream gave back what was
    restored, and what was restored is what the live stream holds over the same offsets."""
    where = f"stream {check.stream!r} in vhost {check.vhost!r}"
    if check.error is None:
        back = [d for _, d in restored]
        if read_back != back:
            k = next((i for i, (a, b) in enumerate(zip(read_back, back)) if a != b), min(len(read_back), len(back)))
            off = restored[k][0] if k < len(restored) else None
            check.mismatch_offset = off
            check.error = (f"{where}: the scratch stream gave back {len(read_back)} record(s), {len(back)} were "
                           f"restored; they differ from record {k} (archived offset {off})")
        else:
            found = first_mismatch(restored, live)
            if found is not None:
                check.mismatch_offset, what = found
                check.error = f"{where}: {what}"
    check.passed = check.error is None
    return check


# --------------------------------------------------------------------------
# The drill.
# --------------------------------------------------------------------------


def generation_ids(storage: Storage, prefix: str, name: str) -> list[str]:
    """The backup ids ``<name>.<UTC time>`` of archive ``name``'s generations, oldest first (one LIST)."""
    base = prefix + "/" if prefix else ""
    return sorted(d for d in storage.list_dirs(base)
                  if d.startswith(name + ".") and BACKUP_ID_RE.match(d) and d[len(name) + 1:][:1].isdigit())


def generations(storage: Storage, prefix: str, name: str) -> list[BackupManifest]:
    """Archive ``name``'s generations, oldest first (an open one as its ticks assemble it). None is an error
    that names the archives the storage holds: a typo'd name is then plain."""
    return archive_generations(storage, name, prefix, "--archive")


def newest_generation(storage: Storage, prefix: str, name: str) -> BackupManifest:
    """The newest generation of archive ``name`` (an open one as its ticks assemble it)."""
    return generations(storage, prefix, name)[-1]


def archived_offsets(manifest: BackupManifest, q: QueueBackup, load: Callable[[str], BackupManifest]
                     ) -> dict[str, int]:
    """The stream offset of each segment's first record, along the stream's chain (segment key -> offset).

    Raises ``DrillError`` when a generation's records do not fill its offsets (the drill cannot say
    which record is which offset)."""
    first_of: dict[str, int] = {}
    for bid, lq in stream_chain(manifest, q, load):
        info = lq.stream
        count = sum(s.record_count for s in lq.segments)
        if not count:
            continue
        if info is None or info.first_offset is None or info.last_offset is None:
            raise DrillError(f"stream {q.name!r} in vhost {q.vhost!r}: generation {bid!r} holds {count} record(s) "
                             "but no offsets")
        if info.last_offset - info.first_offset + 1 != count:
            raise DrillError(f"stream {q.name!r} in vhost {q.vhost!r}: generation {bid!r} holds {count} record(s) "
                             f"for offsets {info.first_offset}..{info.last_offset}")
        at = info.first_offset
        for s in sorted(lq.segments, key=lambda s: s.sequence):
            first_of[s.key] = at
            at += s.record_count
    return first_of


def run_archive_drill(storage: Storage, options: DrillOptions, archive: str,
                      lookback_secs: float = DEFAULT_LOOKBACK_SECS, live: ConnectionConfig | None = None,
                      on_scratch_created: Callable[[str], None] | None = None) -> DrillReport:
    """Restore archive ``archive`` up to a few minutes ago into a scratch vhost, compare each stream with
    the live one (on ``live``, default the drill target), delete the vhost. Never raises for a failed
    check (the report says why); raises only for what stops the drill before a vhost exists."""
    t0 = time.monotonic()
    drill_id = options.drill_id or new_drill_id()
    now_ms = int(time.time() * 1000)
    gens = generations(storage, options.prefix, archive)
    gen, first = gens[-1], gens[0]
    assert gen.archive is not None  # generations keeps an archive's generations only
    ru = gen.archive.recoverable_until
    if ru is None:
        raise DrillError(f"archive {archive!r}: generation {gen.backup_id!r} holds no recoverable-until yet (no "
                         "tick names every stream): nothing to drill")
    point = restore_point(now_ms, ru, lookback_secs)
    if point < first.created_at:  # no record is stamped that early: a drill comparing nothing would pass
        raise ConfigError(f"--lookback {lookback_secs:g} (drill.lookback_secs): the restore point {utc(point)} is "
                          f"before archive {archive!r} began ({utc(first.created_at)}, its first generation "
                          f"{first.backup_id!r}): the drill would compare no record; the archive is "
                          f"{max(0.0, (now_ms - first.created_at) / 1000):.0f} s old: give a shorter lookback")
    live = live or options.target
    info = ArchiveDrill(archive, gen.backup_id, now_ms, ru, (now_ms - ru) / 1000, lookback_secs,
                        point, live_target=without_credentials(live.management_url))
    report = DrillReport(drill_id, gen.backup_id, without_credentials(options.target.management_url),
                         started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def work(make_scratch: Callable[[set[str]], str]) -> list[str]:
        ropts = RestoreOptions(backup_id=gen.backup_id, prefix=options.prefix, target=options.target,
                               produce_batch_size=options.produce_batch_size, keys=options.keys,
                               kms_region=options.kms_region, kms_endpoint_url=options.kms_endpoint_url,
                               window_end_ms=info.restore_point)
        source = BackupSource(storage, options.prefix)
        manifest = load_complete_manifest(source, ropts)
        report.scratch_vhost = scratch_vhost_name(gen.backup_id, drill_id, options.scratch_prefix)
        scratch = make_scratch({q.vhost for q in manifest.queues})
        _drill_streams(storage, source, gen, manifest, ropts, options, info, scratch, live)
        return [s.error or "failed" for s in info.streams if not s.passed]

    def finish() -> None:
        report.archive = info.to_json_obj()

    return in_scratch_vhost(storage, options, report, t0, f"archive {archive!r}", "stream", work,
                            on_scratch_created, finish)


def _drill_streams(storage: Storage, source: BackupSource, gen: BackupManifest, manifest: BackupManifest,
                   ropts: RestoreOptions, options: DrillOptions, info: ArchiveDrill, scratch: str,
                   live: ConnectionConfig) -> None:
    """Restore every stream into ``scratch`` (timed: the RTO), then read each back and compare it with the
    live stream."""
    names = scratch_queue_names(manifest.queues)
    vmap = tuple(sorted({(q.vhost, scratch) for q in manifest.queues}))
    # every stream mapped, even to its own name: a queue tap's stream is then restored as a stream (compared with
    # the live tap), not into the queue it taps (restore.plan.tap_target)
    qmap = tuple(sorted((f"{v}/{n}", s) for (v, n), s in names.items()))
    ropts = dataclasses.replace(ropts, vhost_mapping=vmap, queue_mapping=qmap).with_data_key(source, manifest)
    plans = {(p.source_vhost, p.source_queue): p for p in plan_restore(manifest, ropts)}
    restored: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
    t_restore = time.monotonic()
    conn = connect(options.target, scratch, "target")
    try:
        for q in manifest.queues:
            check = StreamCheck(q.vhost, q.name, names[(q.vhost, q.name)])
            info.streams.append(check)
            try:
                plan = plans[(q.vhost, q.name)]
                first_of = archived_offsets(gen, gen.find_queue(q.vhost, q.name) or q, source.manifest)
                codec = plan_codec(plan, ropts)
                recs: list[tuple[int, bytes]] = []
                for seg in plan.segments:
                    if seg.key not in first_of:
                        raise DrillError(f"segment {seg.key} is in no generation of the chain as the drill read it")
                    for i, r in source.records(seg, True, codec=codec):
                        if record_in_window(r.backed_up_at, None, info.restore_point):
                            p = r.properties
                            recs.append((first_of[seg.key] + i, record_digest(r.body, p.content_type, p.message_id,
                                                                            p.correlation_id)))
                restored[(q.vhost, q.name)] = recs
                check.restored_count = len(recs)
                ch = conn.channel()
                ch.declare(check.scratch_queue, durable=True, arguments={"x-queue-type": "stream"})
                ch.close()
                res = restore_queue_segments(source, plan, ropts, None, connection=conn)
                if res.error or res.status == "failed":
                    raise DrillError(f"the restore into the scratch vhost failed: {res.error or res.status}")
            except RbakError as e:
                check.error = f"stream {q.name!r} in vhost {q.vhost!r}: {e.args[0] if e.args else e}"
            if not conn.is_open:
                conn = connect(options.target, scratch, "target")
        info.restore_secs = time.monotonic() - t_restore
        for check in info.streams:
            recs = restored.get((check.vhost, check.stream), [])
            back: list[bytes] = []
            live_recs: list[tuple[int, bytes]] = []
            if check.error is None:
                try:
                    back = _read_all(conn, scratch, check.scratch_queue, 0, None, options.read_timeout_secs)
                    check.read_back_count = len(back)
                    if recs:
                        live_recs = _read_live(live, check, recs, options.read_timeout_secs)
                        if live_recs and live_recs[0][0] > recs[0][0]:  # retention trimmed the live stream
                            check.note = (f"the live stream starts at offset {live_recs[0][0]}: the archive's "
                                          f"offsets {recs[0][0]}..{live_recs[0][0] - 1} are compared with nothing")
                            cut = next(i for i, (o, _) in enumerate(recs) if o >= live_recs[0][0])
                            back, recs = back[cut:], recs[cut:]
                    else:
                        check.note = "no record archived up to the restore point"
                    check.first_offset = recs[0][0] if recs else None
                    check.last_offset = recs[-1][0] if recs else None
                    check.live_count = len(live_recs)
                    check.restored_hash = _hash_of(recs)
                    check.live_hash = _hash_of(live_recs)
                except RbakError as e:
                    check.error = f"stream {check.stream!r} in vhost {check.vhost!r}: {e.args[0] if e.args else e}"
                if not conn.is_open:
                    conn = connect(options.target, scratch, "target")
            judge(check, recs, back, live_recs)
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - closing after a failure: the vhost goes anyway
            pass


def _hash_of(recs: list[tuple[int, bytes]]) -> str:
    h = hashlib.sha256()
    for _, d in recs:
        h.update(d)
    return h.hexdigest()


def _read_all(conn: Any, vhost: str, queue: str, start: int, end: int | None, timeout: float) -> list[bytes]:
    """Digests of a stream's records from ``start`` (to ``end`` when given; else until 2 s without a
    delivery), in offset order; a stream consumer removes nothing."""
    out: list[bytes] = []

    def sink(_method: Any, props: Any, body: bytes, _off: int) -> None:
        out.append(record_digest(body, props.content_type, props.message_id, props.correlation_id))

    read_stream(conn, vhost, queue, start, sink, prefetch=500, idle_secs=min(timeout, 2.0), end_offset=end,
                stall_secs=timeout)
    return out


def _read_live(live: ConnectionConfig, check: StreamCheck, recs: list[tuple[int, bytes]], timeout: float
               ) -> list[tuple[int, bytes]]:
    """(offset, digest) of the live stream's records over the restored offsets."""
    out: list[tuple[int, bytes]] = []

    def sink(_method: Any, props: Any, body: bytes, off: int) -> None:
        out.append((off, record_digest(body, props.content_type, props.message_id, props.correlation_id)))

    conn = connect(live, check.vhost, "source", name=f"rbak-drill {check.vhost}")
    try:
        read_stream(conn, check.vhost, check.stream, recs[0][0], sink, prefetch=500, end_offset=recs[-1][0],
                    stall_secs=timeout)
    except AmqpError as e:
        raise DrillError(f"reading the live stream over offsets {recs[0][0]}..{recs[-1][0]}: "
                         f"{e.args[0] if e.args else e}") from None
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - closing a read connection: nothing to keep
            pass
    return out


def report_lines(report: DrillReport) -> list[str]:
    """What ``rbak drill --archive`` prints."""
    a = report.archive or {}
    out = []
    for s in a.get("streams") or []:
        state = "ok" if s.get("passed") else f"FAILED: {s.get('error')}"
        span = "no offsets" if s.get("first_offset") is None else f"offsets {s['first_offset']}..{s.get('last_offset')}"
        out.append(f"{s['vhost']}/{s['stream']}: {span}: "
                   f"{s.get('restored_count')} restored, {s.get('read_back_count')} read back, "
                   f"{s.get('live_count')} in the live stream; {state}" + (f" ({s['note']})" if s.get("note") else ""))
    verdict = "PASSED" if report.passed else f"FAILED: {report.reason}"
    rto = a.get("restore_secs")
    out.append(f"drill {report.drill_id} of archive {a.get('name')} (generation {a.get('generation')}): recovery "
               f"point achieved {a.get('recovery_point_secs')} s (recoverable until {a.get('recoverable_until_utc')}), "
               + (f"restored up to {a.get('restore_point_utc')} in {rto} s (RTO) into " if rto is not None
                  else f"nothing restored (restore point {a.get('restore_point_utc')}), ")
               + f"{scratch_words(report.scratch_vhost, report.scratch_vhost_removed)}: {verdict}")
    if report.signature is not None:
        out.append(f"report {report.report_key or '(not stored)'} signed by key {report.signature['key_fingerprint']}")
    return out


__all__ = ["DEFAULT_LOOKBACK_SECS", "ArchiveDrill", "RecordHash", "StreamCheck", "first_mismatch", "judge",
           "generations", "record_digest", "report_lines", "restore_point", "run_archive_drill"]
