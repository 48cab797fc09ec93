"""Restore: publish an RBAK backup's records (and optionally its definitions) into a broker.

``options`` (what to do), ``plan`` (pure: which segments, where to), ``fields``
(exact AMQP property/header encoding), ``publisher`` (confirms + mandatory),
``checkpoint`` (resumable), ``definitions`` (import with rollback snapshot),
``engine`` (orchestration; ``restore_queue_segments`` is the reusable unit).
"""

from .engine import QueueResult, RestoreError, RestoreSummary, restore_queue_segments, run_restore
from .options import RestoreOptions, TargetConnection, options_from_config
from .plan import QueuePlan, plan_restore

__all__ = [
    "QueuePlan", "QueueResult", "RestoreError", "RestoreOptions", "RestoreSummary", "TargetConnection",
    "options_from_config", "plan_restore", "restore_queue_segments", "run_restore",
]
