"""State an executor's Python worker keeps between tasks.

Spark reuses Python workers (``spark.python.worker.reuse``), so one opened
storage client per URL per worker saves a boto3 client (and its connection
pool) per task.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_storages: dict = {}


def storage_for(url: str):
    """The worker's storage for ``url``, opened on first use."""
    from rbak.logsafe import install
    from rbak.storage import open_storage

    install()  # this worker's records (botocore's headers at DEBUG, queue names) filtered like the driver's
    with _lock:
        s = _storages.get(url)
        if s is None:
            s = _storages[url] = open_storage(url)
        return s
