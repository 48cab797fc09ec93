"""The open generation's state, as the archiver holds it between ticks: each stream's position and
claims (``StreamState``), the generation being written (``Generation``) and what ``rbak archive --json``
prints when it stops (``ArchiveSummary``)."""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from typing import Any

from ..backup.stream_chain import ChainDecision
from ..format.archive import Tick, stream_key
from ..format.layout import BackupLayout
from ..format.manifest import CommittedEnd, SegmentMetadata
from .follower import Durable, Probe, StreamFollower


@dataclass(slots=True)
class StreamState:
    """One stream of the open generation."""

    vhost: str
    name: str
    decision: ChainDecision
    durable: Durable
    epoch: int = 1
    present: bool = True
    complete_until: int | None = None
    follower: StreamFollower | None = None
    unticked: list[SegmentMetadata] = field(default_factory=list)
    segments: list[SegmentMetadata] = field(default_factory=list)  # named by a tick (this generation)
    probes: list[Probe] = field(default_factory=list)  # committed ends not yet durable (oldest first)
    committed: CommittedEnd | None = None  # the newest probe, recorded in each tick

    @property
    def key(self) -> str:
        return stream_key(self.vhost, self.name)


@dataclass(slots=True)
class Generation:
    backup_id: str
    layout: BackupLayout
    created_at: int
    cluster: str | None
    version: str | None
    codec: Any
    streams: dict[str, StreamState]
    recoverable_until: int | None
    ticks: list[Tick] = field(default_factory=list)
    flush_seq: int = 0
    last_tick_mono: float = 0.0
    # wall-clock ms at which the selection was last listed and found unchanged: a stream created after it
    # may hold messages no tick names yet, so recoverable-until never passes it
    listed_ms: int | None = None
    # followers whose segment missed the last tick's deadline, with that tick's flush request: once they
    # are durable a tick names them at once, not a whole interval later
    late: dict[str, tuple[StreamFollower, int]] = field(default_factory=dict)


@dataclass
class ArchiveSummary:
    """What ``rbak archive --json`` prints when it stops."""

    archive: str
    storage: str
    generations: list[str] = field(default_factory=list)
    recoverable_until: int | None = None
    ticks: int = 0
    segments: int = 0
    records: int = 0
    errors: list[str] = field(default_factory=list)
    streams: list[dict] = field(default_factory=list)

    def to_json_obj(self) -> dict:
        gaps = [dict(vhost=s["vhost"], name=s["name"], **g) for s in self.streams for g in s.get("gaps", [])]
        return {"archive": self.archive, "storage": self.storage, "generations": self.generations,
                "recoverable_until": self.recoverable_until,
                "recoverable_until_utc": _utc(self.recoverable_until), "ticks": self.ticks,
                "segments": self.segments, "records": self.records, "streams": self.streams, "gaps": gaps,
                "errors": self.errors}


def _utc(ms: int | None) -> str | None:
    if ms is None:
        return None
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat(timespec="milliseconds")


def _now_ms() -> int:
    return int(time.time() * 1000)
