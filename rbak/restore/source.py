"""One backup's objects in storage, as a restore reads them (and writes beside them).

The restore's one door to storage: ``run_restore`` opens a ``BackupSource`` on the storage it
is given and every restore module works on the source, never on the storage itself. So a
storage argument goes down one path (this class, then validate, the catalog, the envelope,
crypto, the segment reader, the storage) instead of climbing through the engine, the plan,
the definitions import and each queue's run (issue 32's "walks"; ``tests/test_walks.py``).

Thread-safe as far as the storage is: queue runs read segments from their own threads.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterable, Iterator, Mapping

from ..repo.catalog import load_manifest
from ..sealing.crypto import ObjectCodec
from ..sealing.envelope import KmsSettings, with_data_key
from ..errors import NotFoundError, StorageError
from ..format.manifest import BackupManifest, EncryptionInfo, SegmentMetadata
from ..format.reader import read_segment
from ..format.record import BackupRecord
from ..storage.base import Storage
from ..repo.validate import preflight_problems

log = logging.getLogger(__name__)


class BackupSource:
    """The backups under ``prefix`` of ``storage``: manifests, segments, definitions, reports."""

    def __init__(self, storage: Storage, prefix: str = "", write_dir: str | None = None):
        self._storage = storage
        self.prefix = prefix
        self.write_dir = write_dir  # where writes go when the storage refuses them (None: fail)

    def problems(self, manifest: BackupManifest, segments: Iterable[SegmentMetadata], need_checksums: bool) -> list[str]:
        """Validate's checks before anything is published (``validate.preflight_problems``)."""
        return preflight_problems(self._storage, manifest, segments, need_checksums)

    def manifest(self, backup_id: str) -> BackupManifest:
        return load_manifest(self._storage, backup_id, self.prefix)

    def size(self, key: str) -> int | None:
        return self._storage.size(key)

    def data_key(self, backup_id: str, info: EncryptionInfo, ring: Mapping[str, bytes],
                 kms: KmsSettings) -> dict[str, bytes]:
        """``ring`` with the envelope-encrypted backup's data key unwrapped into it."""
        return with_data_key(self._storage, self.prefix, backup_id, info, ring, kms)

    def get(self, codec: ObjectCodec, key: str) -> bytes:
        """An object of the backup, opened with its codec (plain, or sealed with the backup's key)."""
        return codec.get(self._storage, key)

    def put(self, codec: ObjectCodec, key: str, data: bytes) -> str:
        """An object stored beside the backup, sealed as the backup is (a definitions rollback snapshot);
        returns where it went (``_beside``)."""
        return self._beside(key, lambda st: codec.put(st, key, data))

    def put_report(self, key: str, data: bytes) -> str:
        """A plain report beside the backup (``restore/report-<ts>.json``); returns where it went."""
        return self._beside(key, lambda st: st.put(key, data))

    def _beside(self, key: str, write: Callable[[Storage], object]) -> str:
        """``key`` in the backup storage; when that refuses the write (a read-only mount, read-only
        credentials: the least privilege a restore needs) and ``write_dir`` is set, the same key under
        that local directory instead, said in a warning. Returns the key, or the local file's path."""
        try:
            write(self._storage)
            return key
        except NotFoundError:
            raise
        except StorageError as e:
            if not self.write_dir:
                raise
            from ..storage import open_storage

            root = os.path.abspath(os.path.expanduser(self.write_dir))
            os.makedirs(root, exist_ok=True)
            write(open_storage("file://" + root))
            where = os.path.join(root, key)
            log.warning("the backup storage refused a write (%s): stored %s locally instead (restore.write_dir)",
                        e, where)
            return where

    def records(self, seg: SegmentMetadata, verify_checksum: bool = True, start: int = 0,
                codec: ObjectCodec | None = None) -> Iterator[tuple[int, BackupRecord]]:
        """(index, record) of one segment from ``start`` (``format.reader.read_segment``)."""
        return read_segment(self._storage, seg, verify_checksum, start, codec=codec)
