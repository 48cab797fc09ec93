"""What a restore publishes: pure functions over the manifest and the options.

No I/O here, so the CLI engine, the dry run and the Spark job agree on the
same plan. Segment skipping uses the manifest's first/last timestamps (or a
segment header's, which hold the same numbers): a backup stamps
``backed_up_at`` as it reads a queue, so within one queue's segments the
timestamps never go backwards and a segment whose [first, last] range misses
the window holds no record inside it. Only the segments that straddle a
window edge are filtered record by record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator, Mapping

from ..base.suggest import closest
from ..config import QueueSelection, queue_selected
from ..sealing.crypto import EncryptionInfo
from ..errors import ConfigError
from ..format.manifest import BackupManifest, QueueBackup, SegmentMetadata
from ..format.record import BackupRecord
from .options import RestoreOptions


@dataclass(frozen=True)
class QueuePlan:
    """One backed-up queue and where its records go."""

    source_vhost: str
    source_queue: str
    queue_type: str
    target_vhost: str
    target_queue: str
    segments: tuple[SegmentMetadata, ...]  # in sequence order, window-overlapping only
    skipped_segments: int  # wholly outside the PITR window
    skipped_records: int  # records in those skipped segments
    encryption: EncryptionInfo | None = None  # the backup's (segments are sealed with this key id)
    # an incremental stream's earlier links: segment key -> its backup, and each such backup's encryption
    link_of: Mapping[str, str] = field(default_factory=dict)
    link_encryption: Mapping[str, EncryptionInfo | None] = field(default_factory=dict)
    archive: str | None = None  # the archive the backup is a generation of: it stores no definitions to restore
    tap_of: tuple[str, str] | None = None  # a queue tap's (tapped queue, its type as the tap recorded it)

    @property
    def candidate_records(self) -> int:
        """Records in the kept segments (boundary segments may filter some out)."""
        return sum(s.record_count for s in self.segments)

    @property
    def label(self) -> str:
        return f"queue {self.source_queue!r} in vhost {self.source_vhost!r}"

    @property
    def target_label(self) -> str:
        return f"queue {self.target_queue!r} in vhost {self.target_vhost!r}"


def map_vhost(vhost: str, vhost_mapping: Mapping[str, str]) -> str:
    return vhost_mapping.get(vhost, vhost)


def map_queue(vhost: str, queue: str, queue_mapping: Mapping[str, str]) -> str:
    """``queue_mapping`` keys are ``vhost/queue`` (source vhost) or a bare queue name; the first wins."""
    qualified = f"{vhost}/{queue}"
    if qualified in queue_mapping:
        return queue_mapping[qualified]
    return queue_mapping.get(queue, queue)


def segment_in_window(first_ts: int | None, last_ts: int | None, record_count: int,
                      start_ms: int | None, end_ms: int | None) -> bool:
    """Whether a segment may hold a record in [start, end]; unknown timestamps mean maybe."""
    if record_count == 0:
        return False
    if start_ms is not None and last_ts is not None and last_ts < start_ms:
        return False
    if end_ms is not None and first_ts is not None and first_ts > end_ms:
        return False
    return True


def segment_fully_inside(first_ts: int | None, last_ts: int | None, start_ms: int | None, end_ms: int | None) -> bool:
    """Whether every record of a segment is in the window (no per-record filtering needed)."""
    if start_ms is None and end_ms is None:
        return True
    if first_ts is None or last_ts is None:
        return False
    return (start_ms is None or first_ts >= start_ms) and (end_ms is None or last_ts <= end_ms)


def record_in_window(backed_up_at: int, start_ms: int | None, end_ms: int | None) -> bool:
    return (start_ms is None or backed_up_at >= start_ms) and (end_ms is None or backed_up_at <= end_ms)


def filter_records(records: Iterable[BackupRecord], start_ms: int | None, end_ms: int | None) -> Iterator[tuple[int, BackupRecord]]:
    """(index in segment, record) of the records inside the window, in order."""
    for i, r in enumerate(records):
        if record_in_window(r.backed_up_at, start_ms, end_ms):
            yield i, r


def tap_target(q: QueueBackup, queue_mapping: Mapping[str, str]) -> tuple[str, str]:
    """(target queue, its type): a queue tap's stream (``rbak archive``'s ``archive.taps``) goes into the queue
    it tapped, unless ``queue_mapping`` maps the stream's name or the tapped queue's; any other queue into its
    own (mapped) name."""
    tap = q.stream.tap if q.stream is not None else None
    if tap is None or f"{q.vhost}/{q.name}" in queue_mapping or q.name in queue_mapping:
        return map_queue(q.vhost, q.name, queue_mapping), q.queue_type
    return map_queue(q.vhost, tap.queue, queue_mapping), tap.queue_type


def plan_queue(q: QueueBackup, options: RestoreOptions, encryption: EncryptionInfo | None = None) -> QueuePlan:
    start, end = options.window_start_ms, options.window_end_ms
    kept, skipped, skipped_records = [], 0, 0
    for seg in sorted(q.segments, key=lambda s: s.sequence):
        if segment_in_window(seg.first_timestamp, seg.last_timestamp, seg.record_count, start, end):
            kept.append(seg)
        else:
            skipped += 1
            skipped_records += seg.record_count
    target, queue_type = tap_target(q, options.queue_map)
    return QueuePlan(
        source_vhost=q.vhost,
        source_queue=q.name,
        queue_type=queue_type,
        target_vhost=map_vhost(q.vhost, options.vhost_map),
        target_queue=target,
        segments=tuple(kept),
        skipped_segments=skipped,
        skipped_records=skipped_records,
        encryption=encryption,
        link_of=dict(q.link_of),
        link_encryption=dict(q.link_encryption),
        tap_of=(q.stream.tap.queue, q.stream.tap.queue_type) if q.stream is not None and q.stream.tap else None,
    )



def _some(names: Iterable[str], n: int = 10) -> str:
    names = sorted(set(names))
    return ", ".join(map(repr, names[:n])) + (f", ... ({len(names)} in all)" if len(names) > n else "")


def check_selection(manifest: BackupManifest, options: RestoreOptions, definition_vhosts: Iterable[str] = ()) -> None:
    """Refuse (``ConfigError``, exit 2) every mapping key and selection that names nothing in the backup.

    A typo in ``restore.vhost_mapping``/``queue_mapping`` would otherwise map nothing and restore
    into the original place; an ``include`` that matches nothing would publish nothing and "succeed".
    Names are the backup's: its queues, the queues it lists as skipped, and ``definition_vhosts`` (the
    vhosts of its definitions, when a restore imports them)."""
    bid = manifest.backup_id
    pairs = {(q.vhost, q.name, q.queue_type) for q in manifest.queues}
    vhosts = {v for v, _, _ in pairs} | {s.vhost for s in manifest.queue_status} | set(definition_vhosts)
    if vhosts:  # a backup without queues (definitions only) has no vhost names in its manifest
        for key in sorted(options.vhost_map):
            if key not in vhosts:
                raise ConfigError(f"restore.vhost_mapping: key {key!r} names no vhost of backup {bid!r}"
                                  f"{closest(key, vhosts)}; its vhosts: {_some(vhosts)}")
    names = {f"{v}/{n}" for v, n, _ in pairs} | {n for _, n, _ in pairs}
    taps = [(q.vhost, q.stream.tap.queue) for q in manifest.queues if q.stream is not None and q.stream.tap]
    names |= {f"{v}/{n}" for v, n in taps} | {n for _, n in taps}  # a tapped queue's name maps its tap too
    for q in manifest.queues:  # a tap mapped by both names: which one wins would be a silent choice
        tap = q.stream.tap if q.stream is not None else None
        if tap is not None:
            both = [[k for k in (f"{q.vhost}/{n}", n) if k in options.queue_map] for n in (q.name, tap.queue)]
            if all(both) and len({options.queue_map[k] for k in both[0] + both[1]}) > 1:
                raise ConfigError(f"restore.queue_mapping: keys {both[0][0]!r} and {both[1][0]!r} both map the tap "
                                  f"'{q.vhost}/{q.name}' of queue {tap.queue!r}, to {options.queue_map[both[0][0]]!r} "
                                  f"and {options.queue_map[both[1][0]]!r}: keep one")
    for key in sorted(options.queue_map):
        if key not in names:
            raise ConfigError(f"restore.queue_mapping: key {key!r} names no queue of backup {bid!r} (keys are "
                              f"'vhost/queue' or 'queue'){closest(key, names)}; its queues: "
                              f"{_some(f'{v}/{n}' for v, n, _ in pairs)}")
    sel = options.queues
    if not options.restore_messages or sel == QueueSelection():
        return
    for v in sel.vhosts:
        if v not in vhosts:
            raise ConfigError(f"restore.queues.vhosts: {v!r} names no vhost of backup {bid!r}{closest(v, vhosts)}; "
                              f"its vhosts: {_some(vhosts)}")
    for key_name, pats in (("include", sel.include), ("exclude", sel.exclude)):  # a mistyped exclude would restore
        for pat in pats:                                                   # the very queue meant to be left out
            if not any(queue_selected(v, n, None, [pat], [], [], []) for v, n, _ in pairs):
                tapped = [f"{q.vhost}/{q.name}" for q in manifest.queues if q.stream is not None and q.stream.tap
                          and queue_selected(q.vhost, q.stream.tap.queue, None, [pat], [], [], [])]
                why = (f"; it names the queue a tap recorded: select the tap by its archived name ({_some(tapped)})"
                       if tapped else closest(pat, names))
                raise ConfigError(f"restore.queues.{key_name}: {pat!r} matches no queue of backup {bid!r}{why}; "
                                  f"its queues: {_some(f'{v}/{n}' for v, n, _ in pairs)}")
    if pairs and not any(sel.matches(q.vhost, q.name, q.queue_type, q.message_count) for q in manifest.queues):
        typed = [f"{q.name!r} taps {q.stream.tap.queue_type} queue {q.stream.tap.queue!r}" for q in manifest.queues
                 if q.stream is not None and q.stream.tap and q.stream.tap.queue_type in sel.types]
        why = (f"; taps are archived as streams: {', '.join(typed[:3])}{', ...' if len(typed) > 3 else ''}; select them by name or "
               "with types: [stream]" if typed and "stream" not in sel.types else "")
        raise ConfigError(f"restore.queues: selects none of the {len(pairs)} queue(s) of backup {bid!r} "
                          f"(types {sel.types}, min_messages {sel.min_messages}, exclude {sel.exclude}){why}; "
                          f"its queues: {_some(f'{v}/{n}' for v, n, _ in pairs)}")


@dataclass(frozen=True)
class TargetVhosts:
    """Where each source vhost of a restore goes, and why (printed before publishing, and in the summary)."""

    pairs: tuple[tuple[str, str, str], ...]  # (source vhost, target vhost, why)

    def lines(self) -> list[str]:
        return [f"vhost {s!r} -> {t!r} ({why})" for s, t, why in self.pairs]


def resolve_target_vhosts(manifest: BackupManifest, options: RestoreOptions,
                          definition_vhosts: Iterable[str] = ()) -> tuple[RestoreOptions, TargetVhosts]:
    """The options with the target URL's vhost applied, and where each source vhost goes.

    - A URL without a vhost (``amqp://host:5672``): every vhost goes where ``vhost_mapping`` says, else
      to its own name.
    - A URL naming a vhost and a single-vhost restore: that vhost is the target. A ``vhost_mapping``
      of the same source vhost to another vhost is a conflict, refused naming both.
    - A URL naming a vhost and several source vhosts: refused (which one would go there?); the URL
      must then name no vhost and ``vhost_mapping`` says where each goes.

    ``definition_vhosts``: the vhosts of the definitions the restore imports (they move the same way).
    """
    sel = options.queues
    if options.restore_messages:
        srcs = {q.vhost for q in manifest.queues if sel.matches(q.vhost, q.name, q.queue_type, q.message_count)}
    else:
        srcs = {q.vhost for q in manifest.queues}
    srcs |= set(definition_vhosts)
    vmap = options.vhost_map
    named = options.target.named_vhost
    url = options.target.safe_amqp_url
    if named is not None and len(srcs) > 1:
        raise ConfigError(f"the target URL {url} names vhost {named!r}, but backup {manifest.backup_id!r} restores "
                          f"{len(srcs)} vhosts ({_some(srcs)}): a URL's vhost is the target of a single-vhost "
                          f"restore only; remove it from the URL (amqp://host:port) and say where each vhost goes "
                          f"with restore.vhost_mapping (a config file's restore section), or select one vhost with restore.queues.vhosts")
    if named is not None and len(srcs) == 1:
        (src,) = srcs
        if src in vmap and vmap[src] != named:
            raise ConfigError(f"the target URL {url} names vhost {named!r} but restore.vhost_mapping maps "
                              f"{src!r} to {vmap[src]!r}: make them agree, or drop one")
        if vmap.get(src, src) != named:  # an identity entry would only change a resumed run's fingerprint
            options = replace(options, vhost_mapping=tuple(sorted({**vmap, src: named}.items())))
        why = "the vhost of the target URL"
        return options, TargetVhosts(((src, named, why),))
    pairs = tuple((s, vmap.get(s, s), "restore.vhost_mapping" if s in vmap else "its own name, the URL names no vhost")
                  for s in sorted(srcs))
    return options, TargetVhosts(pairs)


def plan_restore(manifest: BackupManifest, options: RestoreOptions) -> list[QueuePlan]:
    """Every selected queue of the backup, mapped; refuses two queues landing on one target.

    Two backed-up queues mapped onto the same target queue would interleave
    unpredictably under concurrency, so that is a configuration error.
    """
    archive = manifest.archive.name if manifest.archive is not None else None
    plans = [replace(plan_queue(q, options, manifest.encryption), archive=archive) for q in manifest.queues
             if options.queues.matches(q.vhost, q.name, q.queue_type, q.message_count)]
    seen: dict[tuple[str, str], QueuePlan] = {}
    for p in plans:
        key = (p.target_vhost, p.target_queue)
        if key in seen:
            other = seen[key]
            raise ConfigError(
                f"restore.queue_mapping: {other.label} and {p.label} would both be restored into "
                f"queue {p.target_queue!r} in vhost {p.target_vhost!r}"
            )
        seen[key] = p
    return plans


def publish_address(record: BackupRecord, plan: QueuePlan, publish_mode: str) -> tuple[str, str]:
    """(exchange, routing key) a record is published with.

    ``queue`` mode: the default exchange with the (remapped) queue name.
    ``exchange`` mode: the record's exchange and routing key; a record that
    arrived through the default exchange (exchange ``""``) is sent to the
    remapped queue, since its routing key was the old queue name. Stream
    records and records without a known exchange are always sent to the queue.
    """
    if publish_mode == "queue" or not record.exchange:
        return "", plan.target_queue
    return record.exchange, record.routing_key
