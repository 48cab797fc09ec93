"""The backup engine: classic/quorum queues (never acked), streams by offset, definitions, checkpoint."""

from .engine import BackupEngine, BackupSummary, run_backup
from ..errors import BackupError

__all__ = ["BackupEngine", "BackupError", "BackupSummary", "run_backup"]
