"""The delivery guard beside the backups: one small JSON object per source queue.

The local checkpoint (``checkpoint.delivery_guard``) only helps the machine that
wrote it, and the copy inside a backup's ``state/offsets.db`` only helps a
backup that finds that backup. A new backup id, a new Job pod or a run after a
failed one must still know what earlier backups left behind, so every guard is
also written to ``{prefix}/_guards/{cluster}/{vhost}/{queue}.json`` as soon as
a read returns its messages, and read back (merged with the local state,
newest first) before the next read of that queue. On write-once storage (S3
Object Lock) no key may be put twice, so each save is a new object under
``{queue}/{updated_at}-{backup_id}.json`` and the newest one counts.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

from ..errors import NotFoundError, StorageError
from ..format.layout import guard_key
from ..storage.base import Storage
from .checkpoint import Guard

log = logging.getLogger(__name__)


@dataclass(slots=True)
class GuardRecord:
    """On-storage form (field names are the JSON keys)."""

    source_cluster: str
    vhost: str
    queue: str
    max_count: int
    delivery_limit: int | None
    message: str
    backup_id: str
    updated_at: int  # ms since the epoch

    def to_guard(self) -> Guard:
        return Guard(self.max_count, self.delivery_limit, self.message, self.updated_at)


class GuardStore:
    def __init__(self, storage: Storage, prefix: str | None, source_cluster: str):
        self.storage, self.prefix, self.cluster = storage, prefix, source_cluster

    def key(self, vhost: str, queue: str) -> str:
        return guard_key(self.prefix, self.cluster, vhost, queue)

    def versions(self, vhost: str, queue: str) -> str:
        """Where write-once storage keeps one object per save."""
        return self.key(vhost, queue)[: -len(".json")] + "/"

    def load(self, vhost: str, queue: str) -> Guard | None:
        """The newest stored guard; a damaged object is an error (never read as 'no guard')."""
        newest = max(self.storage.list(self.versions(vhost, queue)), default=None)  # zero-padded: newest last
        found = [self._read(k) for k in (self.key(vhost, queue), newest) if k is not None]
        result = None
        for g in found:
            result = merge(result, g)
        return result

    def _read(self, key: str) -> Guard | None:
        try:
            data = self.storage.get(key)
        except NotFoundError:
            return None
        try:
            d = json.loads(data)
            rec = GuardRecord(**{k: d[k] for k in GuardRecord.__dataclass_fields__})
            if not isinstance(rec.max_count, int) or not isinstance(rec.updated_at, int):
                raise ValueError("max_count/updated_at must be integers")
        except (ValueError, KeyError, TypeError) as e:
            raise StorageError(f"{key}: not a delivery guard ({e}); delete it only once you know the queue's "
                               "x-delivery-count") from None
        return rec.to_guard()

    def save(self, vhost: str, queue: str, g: Guard, backup_id: str) -> None:
        rec = GuardRecord(self.cluster, vhost, queue, g.max_count, g.delivery_limit, g.message, backup_id,
                          g.updated_at)
        key = self.key(vhost, queue)
        if self.storage.write_once:
            key = f"{self.versions(vhost, queue)}{g.updated_at:015d}-{backup_id}.json"
        self.storage.put(key, json.dumps(asdict(rec), indent=2).encode())


def merge(local: Guard | None, stored: Guard | None) -> Guard | None:
    """The newer of the two (a guard is replaced by each read of the queue); equal times: the higher count."""
    if local is None or stored is None:
        return local or stored
    if local.updated_at != stored.updated_at:
        return local if local.updated_at > stored.updated_at else stored
    return local if local.max_count >= stored.max_count else stored
