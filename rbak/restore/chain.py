"""Incremental stream chains: a stream restored from an incremental backup needs every earlier link.

An incremental stream backup holds only the offsets after the backup it
continues (``stream.previous_backup`` in its manifest). Restoring it alone
would bring back the newest increment and silently leave out the rest, so by
default a restore walks the chain back to the full backup of the stream and
publishes base through the chosen backup, every offset once, in order. Each
link is checked before anything is published: the earlier backup exists, is
complete, holds the stream, and stopped exactly where the next one continued;
otherwise the restore fails naming the link. ``increment_only`` restores the
chosen backup's own segments.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from ..errors import ChainError, ManifestError, NotFoundError
from ..format.manifest import BackupManifest, QueueBackup, SegmentMetadata

log = logging.getLogger(__name__)


Loader = Callable[[str], BackupManifest]


def stream_chain(manifest: BackupManifest, q: QueueBackup, load: Loader) -> list[tuple[str, QueueBackup]]:
    """(backup id, that backup's entry for the stream), oldest first, ending with ``manifest``'s own."""
    links = [(manifest.backup_id, q)]
    seen = {manifest.backup_id}
    cur_id, cur = manifest.backup_id, q
    where = f"stream {q.name!r} in vhost {q.vhost!r}"
    while cur.stream is not None and cur.stream.previous_backup:
        prev_id = cur.stream.previous_backup
        if prev_id in seen:
            raise ChainError(f"{where}: backup {cur_id!r} continues {prev_id!r}, which is already in its chain (a loop)")
        seen.add(prev_id)
        try:
            pm = load(prev_id)
        except NotFoundError:
            raise ChainError(f"{where}: backup {cur_id!r} continues backup {prev_id!r}, which is missing; its "
                             f"earlier messages cannot be restored (restore with --increment-only to take "
                             f"{cur_id!r}'s own messages only)") from None
        except ManifestError as e:
            raise ChainError(f"{where}: backup {cur_id!r} continues backup {prev_id!r}, whose manifest is not "
                             f"usable: {e}") from None
        if not pm.is_complete:
            raise ChainError(f"{where}: backup {cur_id!r} continues backup {prev_id!r}, which is incomplete")
        pq = pm.find_queue(q.vhost, q.name)
        if pq is None or pq.queue_type != "stream":
            raise ChainError(f"{where}: backup {cur_id!r} continues backup {prev_id!r}, which does not hold the stream")
        want = cur.stream.previous_last_offset
        have = pq.stream.last_offset if pq.stream is not None else None
        if want is not None and have is not None and want != have:
            raise ChainError(f"{where}: backup {cur_id!r} continues backup {prev_id!r} after offset {want}, but "
                             f"{prev_id!r} ends at offset {have}")
        links.insert(0, (prev_id, pq))
        cur_id, cur = prev_id, pq
    return links


def partial_warning(m: BackupManifest) -> str:
    names = ", ".join(f"{s.vhost}/{s.name} ({s.status})" for s in m.queue_status[:10])
    more = f" and {len(m.queue_status) - 10} more" if len(m.queue_status) > 10 else ""
    return f"backup {m.backup_id!r} is PARTIAL: not in it: {names}{more}"


def gap_warnings(q: QueueBackup, backup_id: str) -> list[str]:
    if q.stream is None:
        return []
    return [f"stream {q.name!r} in vhost {q.vhost!r}: offsets {g.from_offset}..{g.to_offset} (at most {g.count} message(s)) "
            f"were removed by the stream's retention before backup {backup_id!r} and are in no backup"
            for g in q.stream.gaps]


def expand_chains(manifest: BackupManifest, load: Loader, follow: bool = True,
                  size_of: Callable[[str], int | None] | None = None) -> tuple[BackupManifest, list[str]]:
    """A copy of ``manifest`` whose incremental streams hold their whole chain's segments, and warnings.

    Segments keep their storage keys; their sequence numbers are renumbered
    1..n along the chain so a plan and the restore checkpoint see one ordered
    run. ``QueueBackup.chain`` names the backups used, oldest first. ``size_of(key)`` (the storage's
    size, None when absent) checks the earlier links' segments before anything is published.
    """
    cache: dict[str, BackupManifest] = {}

    def cached(bid: str) -> BackupManifest:
        if bid not in cache:
            cache[bid] = load(bid)
        return cache[bid]

    warnings: list[str] = []
    if manifest.is_partial:
        warnings.append(partial_warning(manifest))
    queues = []
    for q in manifest.queues:
        if q.queue_type != "stream" or q.stream is None:
            queues.append(q)
            continue
        if not follow or not q.stream.previous_backup:
            queues.append(q)
            warnings.extend(gap_warnings(q, manifest.backup_id))
            if q.stream.previous_backup:
                warnings.append(f"stream {q.name!r} in vhost {q.vhost!r}: restoring only backup "
                                f"{manifest.backup_id!r}'s increment (offsets after {q.stream.previous_last_offset}); "
                                f"the earlier ones are in backup {q.stream.previous_backup!r} and its chain")
            continue
        links = stream_chain(manifest, q, cached)
        segs: list[SegmentMetadata] = []
        for bid, lq in links:
            for s in sorted(lq.segments, key=lambda s: s.sequence):
                if size_of is not None and bid != manifest.backup_id and size_of(s.key) != s.size_bytes:
                    raise ChainError(f"stream {q.name!r} in vhost {q.vhost!r}: backup {bid!r} in the chain of "
                                     f"{manifest.backup_id!r} lacks segment {s.key} (missing or of another size)")
                segs.append(dataclasses.replace(s, sequence=len(segs) + 1))
        nq = QueueBackup(q.vhost, q.name, q.queue_type, stream=q.stream)
        for s in segs:
            nq.add_segment(s)
        nq.chain = tuple(bid for bid, _ in links)
        nq.link_of = {s.key: bid for bid, lq in links if bid != manifest.backup_id for s in lq.segments}
        nq.link_encryption = {bid: cached(bid).encryption for bid, _ in links if bid != manifest.backup_id}
        queues.append(nq)
        for bid, lq in links:
            warnings.extend(gap_warnings(lq, bid))
            if bid != manifest.backup_id and cached(bid).is_partial:
                warnings.append(f"backup {bid!r} in the chain of stream {q.name!r} is partial (some queues were not "
                                f"backed up)")
    out = dataclasses.replace(manifest, queues=queues)
    out.recompute_totals()
    return out, warnings
