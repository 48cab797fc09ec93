"""One queue's backup, of one shape for every queue type: a job on the run's ``QueueServices``.

``QueueJob`` (classic, quorum: ``queue_backup``) and ``StreamJob`` (``stream_backup``) take the
same inputs (the run's services, the queue, its checkpoint and the source's cluster and version)
and ``run(conn)`` one read on a connection of the queue's vhost into its ``QueueBackup``.
``pool.back_up_queue`` is the one entry point the run's worker threads and the reader processes
(``reader_process``) both call: it picks the job and lends it a pooled connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..broker.wire import Connection
from ..format.manifest import QueueBackup
from .checkpoint import Checkpoint, QueueProgress
from .management import QueueInfo

if TYPE_CHECKING:
    from .services import QueueServices


class Job:
    """One queue's read for one run; ``resumed``: it continues a read an earlier run began."""

    def __init__(self, svc: QueueServices, q: QueueInfo, ckpt: Checkpoint, cluster: str, version: str | None,
                 prog: QueueProgress | None):
        self.svc, self.q, self.ckpt, self.cluster, self.version, self.prog = svc, q, ckpt, cluster, version, prog
        self.vhost, self.name = q.vhost, q.name
        self.where = f"queue {q.name!r} in vhost {q.vhost!r}"
        self.resumed = False

    def run(self, conn: Connection) -> QueueBackup:
        raise NotImplementedError
