"""Restore: publish an RBAK backup's records (and optionally its definitions) into a broker.

``options`` (what to do), ``plan`` (pure: which segments, where to), ``record_publisher``
(a queue's records over 0-9-1 or 1.0, through ``broker.publisher.Publisher``: confirms + mandatory),
``checkpoint`` (resumable), ``definitions`` (import with rollback snapshot),
``queue_restore`` (one queue: ``restore_queue_segments``, the reusable unit), ``engine`` (orchestration).
"""

from ..errors import RestoreError
from .engine import RestoreSummary, run_restore
from .queue_restore import QueueResult, restore_queue_segments
from .options import RestoreOptions, options_from_config
from .plan import QueuePlan, plan_restore

__all__ = [
    "QueuePlan", "QueueResult", "RestoreError", "RestoreOptions", "RestoreSummary",
    "options_from_config", "plan_restore", "restore_queue_segments", "run_restore",
]
