"""One exception tree for everything rbak raises on purpose.

Callers (the CLI, the operator, the Spark jobs) catch ``RbakError`` and print
``str(err)``: every message names the thing that is wrong (storage key, config
key path, queue, file and offset) so no traceback is needed to act on it.
The prefixes follow the Rust tool's error messages. Every error class of rbak
is here (the only others are a few private control-flow signals that never
leave their module); ``DetailError`` marks the findings a caller wraps into its
own message.
"""

from __future__ import annotations

from typing import Any


PARTIAL_EXIT_CODE = 3
"""``rbak backup``: the run completed and wrote its manifest, but the backup is partial (a queue refused,
failed or read short of its depth); 1 is a run that wrote no complete manifest, 2 a configuration error."""
LEASE_EXIT_CODE = 4
"""``rbak backup``: another backup of the same source holds its lease; nothing was written."""
UNVERIFIED_EXIT_CODE = 5
"""``rbak validate --deep`` (and Spark's validate): an encrypted backup whose contents could not be
decrypted (no key, only a newer key, KMS unreachable): neither valid nor invalid, never a pass."""


class RbakError(Exception):
    """Base of every error rbak raises deliberately."""

    prefix = "Error"
    exit_code = 1
    # Set on an error escaping a run, for its summary (read with getattr: most errors carry none):
    queue_result: object  # rbak.restore: the QueueResult of the queue whose restore failed
    summary: object  # rbak.backup: the BackupSummary of the backup that failed

    def __str__(self) -> str:  # pragma: no cover - trivial
        return f"{self.prefix}: {super().__str__()}"


class ConfigError(RbakError):
    prefix = "Configuration error"
    exit_code = 2


class UsageError(ConfigError):
    """A command line argparse refuses (an unknown option, a missing argument): exit 2."""

    prefix = "Usage error"


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


class UnverifiedError(ValidationError):
    """A deep validation that decrypted nothing: no proof the backup can be restored."""

    prefix = "Validation unverified"
    exit_code = UNVERIFIED_EXIT_CODE


class AmqpError(RbakError):
    prefix = "AMQP error"


class AmqpAuthenticationError(AmqpError):
    """The broker refused the credentials or the vhost."""


class AmqpConnectionError(AmqpError):
    """No connection could be opened, or an open one was lost."""


class ConnectionLost(AmqpConnectionError):
    """An open connection is gone: the broker closed it (``code``/``text``), the socket failed or ended,
    or heartbeats were missed (``broker.wire``)."""

    def __init__(self, message: str, code: int = 0, text: str = ""):
        super().__init__(message)
        self.code = code
        self.text = text


class ChannelClosedByBroker(AmqpError):
    """The broker closed a channel: ``code`` (404 not found, 405 locked, 403 refused, 406 precondition)
    and its text. The connection stays open (``broker.wire``)."""

    def __init__(self, channel: int, code: int, text: str):
        super().__init__(f"channel {channel} closed by the broker: {code} {text}")
        self.code = code
        self.text = text


class ReadCut(AmqpConnectionError):
    """A quorum read lost its connection where the broker's return may change the queue's order: it
    had taken messages from the queue's returns (they go back BEHIND the ones not taken: rotated), or
    it held them on several channels (given back in no particular order). ``lost``: the message
    without that note, and ``context``: what to say instead once a repair put the order back."""

    def __init__(self, message: str, lost: str, context: str = ""):
        super().__init__(message)
        self.lost = lost
        self.context = context


class QueueNotFound(AmqpError):
    """A passive declare found no such queue (404); the message names vhost and queue."""


class QueueLocked(AmqpError):
    """An exclusive queue of another connection (405 RESOURCE_LOCKED): only its owner can use it."""


class QueueAccessRefused(AmqpError):
    """The broker refused the user access to the queue (403 ACCESS_REFUSED)."""


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


class StorageSettingsError(RbakError):
    """``rbak doctor`` found a storage setting or right that can lose or expose backups."""

    prefix = "Storage doctor"


class EvidenceError(RbakError):
    """A signed drill report that does not verify, or a signing key that cannot be used."""

    prefix = "Drill evidence"


class BackupLeaseError(RbakError):
    """Another backup of the same source (vhost) holds its lease; nothing was written."""

    prefix = "Backup lease"
    exit_code = LEASE_EXIT_CODE


# -- backup ----------------------------------------------------------------------------------------


class BackupError(RbakError):
    """Some queues failed; the manifest stays incomplete so a rerun resumes them."""

    prefix = "Backup error"


class PartialBackupError(BackupError):
    """The run completed and wrote its manifest, but some queue is not (fully) in it: a distinct exit code."""

    prefix = "Backup partial"
    exit_code = PARTIAL_EXIT_CODE


class DeliveryLimitError(RbakError):
    """A quorum queue whose messages a backup could push past their delivery limit."""

    prefix = "Delivery limit"
    message_name = ""  # the message that stopped a read, when one did
    count = 0  # its x-delivery-count when the read took it


class ShortRead(RbakError):
    """A read that ended before the depth the queue had when it started: ``backup`` holds what was read
    (kept in the manifest, the queue recorded as partial; not checkpointed, so a rerun reads it again)."""

    prefix = "Partial"

    def __init__(self, backup: Any, reason: str):  # backup: a format.manifest.QueueBackup
        self.backup = backup
        self.reason = reason
        super().__init__(f"queue {backup.name!r} in vhost {backup.vhost!r}: {reason}")

    def __reduce__(self) -> tuple[type[ShortRead], tuple[Any, str]]:  # crosses from a reader process
        return (ShortRead, (self.backup, self.reason))


class QueueRefused(RbakError):
    """A queue the backup will not read, decided before taking any message (the backup is incomplete)."""

    prefix = "Refused"


class QueueSkipped(RbakError):
    """A queue left out on purpose (noted in the manifest; the backup is complete without it)."""

    prefix = "Skipped"


class ReaderProcessError(RbakError):
    """A reader process died (its connection closed: the broker returned its messages)."""

    prefix = "Backup error"


class NoReaderProcess(RbakError):
    """No child could be started (nothing was sent to one): the queue is read by the thread instead."""


# -- restore ---------------------------------------------------------------------------------------


class PublishError(AmqpError):
    """A record was returned, nacked, or the channel died; names the queue."""


class ChainError(ManifestError):
    prefix = "Broken backup chain"


class IncompatibleDefinitionsError(RbakError):
    """``restore.definitions_strict``: the target would refuse part of the backup's definitions."""

    prefix = "Definitions error"


# -- drills, progress, encryption, properties ------------------------------------------------------


class DrillError(RbakError):
    prefix = "Restore drill"


class Terminated(RbakError):
    """``rbak drill`` stopped by SIGTERM: exit 143, as a shell reports it."""

    prefix = "Restore drill"
    exit_code = 143


class ProgressError(RbakError):
    prefix = "Progress error"


class EncryptionError(RbakError):
    """A missing or wrong key, or a sealed object that is damaged."""

    prefix = "Encryption error"


class PropertiesError(SerializationError):
    """Malformed property or field-table bytes.

    ``offset`` counts from the start of the decoded binary; ``field`` names
    where it went wrong (``content_type``, ``headers['k'][2]``, ...).
    """

    def __init__(self, problem: str, offset: int, field: str = "", what: str = "properties"):
        self.problem = problem
        self.offset = offset
        self.field = field
        where = f" in {field}" if field else ""
        super().__init__(f"{problem}{where} (at byte {offset} of the {what})")


# -- details that callers wrap ---------------------------------------------------------------------


class DetailError(RbakError):
    """A finding deep inside one input (a term, an AMQP 1.0 section, a YAML mapping, a stream-protocol
    answer) that its caller wraps or falls back from: ``str()`` is the bare problem, without a prefix,
    because the caller's own message names the file, offset or queue. The decoders' errors are also
    ``ValueError`` (what they were before they moved here; their callers still catch that)."""

    def __str__(self) -> str:
        return Exception.__str__(self)


class DuplicateKeyError(DetailError):
    """A key given twice in one YAML mapping (the later one would silently win)."""


class StreamProtocolError(DetailError):
    """The probe could not answer (the caller falls back to the quiet-period end)."""


class ChunkError(DetailError, ValueError):
    """An osiris chunk that cannot be read; ``pos`` is where it starts in its segment file."""

    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.pos = pos


class MappingError(DetailError, ValueError):
    """The AMQP 1.0 message cannot be expressed in AMQP 0-9-1."""


class MqttMappingError(DetailError, ValueError):
    """The stored MQTT message is not in the shape RabbitMQ 4.0 writes."""


class Amqp10Error(DetailError, ValueError):
    """Malformed AMQP 1.0 bytes; ``offset`` is relative to the decoded buffer."""

    def __init__(self, message: str, offset: int):
        self.offset = offset
        super().__init__(f"{message} (at byte {offset} of the AMQP 1.0 message)")


class MessageFormatError(DetailError, ValueError):
    """The stored term is not a message we understand."""


class TermError(DetailError, ValueError):
    """The bytes are not a term we can decode; ``offset`` is where it went wrong."""

    def __init__(self, message: str, offset: int):
        self.offset = offset
        super().__init__(f"{message} (at byte {offset} of the term)")


class SnapshotStateError(DetailError, ValueError):
    """The machine state is not a ``rabbit_fifo`` record laid out as this module knows."""
