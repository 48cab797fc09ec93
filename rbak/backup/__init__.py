"""The backup engine: classic/quorum queues (never acked), streams by offset, definitions, checkpoint."""

from .engine import BackupEngine, BackupError, BackupSummary, run_backup

__all__ = ["BackupEngine", "BackupError", "BackupSummary", "run_backup"]
