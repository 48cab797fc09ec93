"""One exception tree for everything rbak raises on purpose.

Callers (the CLI, the operator, the Spark jobs) catch ``RbakError`` and print
``str(err)``: every message names the thing that is wrong (storage key, config
key path, queue, file and offset) so no traceback is needed to act on it.
The prefixes follow the Rust tool's error messages.
"""

from __future__ import annotations


PARTIAL_EXIT_CODE = 3
"""``rbak backup``: the run completed and wrote its manifest, but the backup is partial (a queue refused,
failed or read short of its depth); 1 is a run that wrote no complete manifest, 2 a configuration error."""
LEASE_EXIT_CODE = 4
"""``rbak backup``: another backup of the same source holds its lease; nothing was written."""


class RbakError(Exception):
    """Base of every error rbak raises deliberately."""

    prefix = "Error"
    exit_code = 1

    def __str__(self) -> str:  # pragma: no cover - trivial
        return f"{self.prefix}: {super().__str__()}"


class ConfigError(RbakError):
    prefix = "Configuration error"
    exit_code = 2


class StorageError(RbakError):
    prefix = "Storage error"


class NotFoundError(StorageError):
    """A key that should exist does not."""


class UnsupportedStorageError(StorageError):
    """A storage URL scheme rbak knows of but does not implement."""


class SegmentError(RbakError):
    """A segment file is damaged or not a segment; ``key`` names it."""

    prefix = "Segment error"

    def __init__(self, key: str, problem: str):
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}")


class ManifestError(RbakError):
    prefix = "Manifest error"


class SerializationError(RbakError):
    prefix = "Serialization error"


class CompressionError(RbakError):
    prefix = "Compression error"


class ValidationError(RbakError):
    """A backup failed validation; ``problems`` lists every finding."""

    prefix = "Validation error"

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = problems or []
        super().__init__(message)


class AmqpError(RbakError):
    prefix = "AMQP error"


class AmqpAuthenticationError(AmqpError):
    """The broker refused the credentials or the vhost."""


class AmqpConnectionError(AmqpError):
    """No connection could be opened, or an open one was lost."""


class ManagementApiError(RbakError):
    """``status``: the HTTP status when the API answered with an error (None: no answer or a bad one)."""

    prefix = "Management API error"

    def __init__(self, message: str, status: int | None = None):
        self.status = status
        super().__init__(message)


class RestoreError(RbakError):
    prefix = "Restore error"


class CheckpointError(RbakError):
    prefix = "Checkpoint error"


class ImportFormatError(RbakError):
    """A broker's on-disk file could not be read; names the file and offset."""

    prefix = "Import error"


class EvidenceError(RbakError):
    """A signed drill report that does not verify, or a signing key that cannot be used."""

    prefix = "Drill evidence"


class BackupLeaseError(RbakError):
    """Another backup of the same source (vhost) holds its lease; nothing was written."""

    prefix = "Backup lease"
    exit_code = LEASE_EXIT_CODE


class DeliveryLimitError(RbakError):
    """A quorum queue whose messages a backup could push past their delivery limit."""

    prefix = "Delivery limit"
    message_name = ""  # the message that stopped a read, when one did
    count = 0  # its x-delivery-count when the read took it
