"""State an executor's Python worker keeps between tasks.

Spark reuses Python workers (``spark.python.worker.reuse``), so one opened
storage client per URL per worker saves a boto3 client (and its connection
pool) per task.
"""

from __future__ import annotations

import threading

from rbak.base.logsafe import install
from rbak.sealing.crypto import load_keyring
from rbak.sealing.envelope import with_data_key
from rbak.storage import open_storage

_lock = threading.Lock()
_storages: dict = {}


def storage_for(url: str):
    """The worker's storage for ``url``, opened on first use."""
    install()  # this worker's records (botocore's headers at DEBUG, queue names) filtered like the driver's
    with _lock:
        s = _storages.get(url)
        if s is None:
            s = _storages[url] = open_storage(url)
        return s


_data_keys: dict = {}


def keyring_for(storage, url: str, prefix: str, backup_id: str, info):
    """The worker's ``RBAK_ENCRYPTION_KEYS``, plus an envelope backup's data key (``info``: its
    ``EncryptionInfo``), unwrapped once per worker: one KMS call per worker, not one per segment.
    ``None`` for the data key when no key-encryption key the worker has opens it."""
    ring = load_keyring()
    if info is None or not info.envelope:
        return ring
    k = (url, prefix, backup_id, info.key_id)
    with _lock:
        dek = _data_keys.get(k)
    if dek is None:
        dek = with_data_key(storage, prefix, backup_id, info, ring, required=False).get(info.key_id)
        if dek is not None:
            with _lock:
                _data_keys[k] = dek
    if dek is not None:
        ring[info.key_id] = dek
    return ring
