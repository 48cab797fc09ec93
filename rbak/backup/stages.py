"""The typed joints between a backup's stages (``pipeline`` names the stages themselves).

    delivery source (queue_reader / stream_reader)
      --DeliverySink / StreamSink-->   intake (pipeline.QueueIntake / StreamIntake)
      --RecordSink-->                  record_thread.RecordThread (builds records with a RecordBuilder)
      --segments.AsyncSegmentWriter--> SegmentStore (storage), durable segments to an OnDurable

Each joint is a Protocol, so a stage is any object with the method it names (a test's list
appender, a benchmark's counter), and the type checker sees what travels from one to the next.
This module imports nothing of the backup package: every stage may import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..format.manifest import SegmentMetadata
    from ..format.record import BackupRecord

#: One delivery queued for the record thread: (method, properties, body, backed_up_at ms[, stream offset]).
QueuedDelivery = tuple[Any, ...]


class DeliverySink(Protocol):
    """Receives each message a classic or quorum read takes, in queue order."""

    def __call__(self, method: Any, props: Any, body: bytes, /) -> None: ...


class StreamSink(Protocol):
    """Receives each message a stream read takes, with its offset."""

    def __call__(self, method: Any, props: Any, body: bytes, offset: int, /) -> None: ...


class Progress(Protocol):
    """``progress(event, **kw)``: ``plan`` (queues, records or None), ``start`` (vhost, queue, total),
    ``advance`` (vhost, queue, n, bytes), ``done`` (vhost, queue, summary); see ``rbak.repo.progress.backup_events``."""

    def __call__(self, event: str, /, **kw: Any) -> None: ...


class Throttle(Protocol):
    """Called with the number of messages read so far after each one (a test's brake)."""

    def __call__(self, records: int, /) -> None: ...


class RecordSink(Protocol):
    """Takes a delivery for encoding: ``tag`` marks the segment it ends (a stream's offset)."""

    def put(self, item: QueuedDelivery, tag: Any = None, size: int = 0) -> None: ...


class RecordBuilder(Protocol):
    """Builds the record of one queued delivery (on the encoder thread)."""

    def __call__(self, item: QueuedDelivery, /) -> BackupRecord: ...


class OnDurable(Protocol):
    """Told of each segment once it is stored, with the tag of its last record."""

    def __call__(self, meta: SegmentMetadata, tag: Any, /) -> None: ...


class FirstOffset(Protocol):
    """Told the offset of a stream read's first record (a later one than asked is a retention gap)."""

    def first_offset(self, offset: int) -> None: ...
