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
from ..format.manifest import SegmentMetadata, TapOf
from ..format.manifest_archive import CommittedEnd
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
    tap: TapOf | None = None  # the queue this tap stream records (archive.taps), kept in its manifest entry

    @property
    def key(self) -> str:
        return stream_key(self.vhost, self.name)

    def claim(self, durable: Durable, received: int | None) -> int | None:
        """The newest probe instant whose committed end is durable (its probes up to it are dropped)."""
        best: int | None = None
        keep: list[Probe] = []
        for p in self.probes:
            if p.end is None:  # no chunk delivered, unconfirmed: only while nothing was read at all
                ok = durable.last_offset is None and received is None
            else:
                ok = p.end < 0 or (durable.last_offset is not None and durable.last_offset >= p.end)
            if ok:
                best = p.at - p.margin
                keep = []
            else:
                keep.append(p)
        self.probes = keep
        return best


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
    storage: str  # the storage URL and the prefix under it: ``rbak list --path STORAGE --prefix PREFIX``
    prefix: str = ""
    state: str = "starting"  # "archived" (a generation was written), "waiting" (for another archiver's lease,
    # never archived) or "starting" (stopped before either: a broker or storage away)
    generations: list[str] = field(default_factory=list)
    recoverable_until: int | None = None
    ticks: int = 0
    segments: int = 0
    records: int = 0
    errors: list[str] = field(default_factory=list)
    streams: list[dict] = field(default_factory=list)

    def to_json_obj(self) -> dict:
        gaps = [dict(vhost=s["vhost"], name=s["name"], **g) for s in self.streams for g in s.get("gaps", [])]
        return {"archive": self.archive, "state": self.state, "storage": self.storage, "prefix": self.prefix,
                "generations": self.generations,
                "recoverable_until": self.recoverable_until,
                "recoverable_until_utc": utc_text(self.recoverable_until), "ticks": self.ticks,
                "segments": self.segments, "records": self.records, "streams": self.streams, "gaps": gaps,
                "errors": self.errors}


def utc_text(ms: int | None) -> str | None:
    if ms is None:
        return None
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat(timespec="milliseconds")


def now_ms() -> int:
    return int(time.time() * 1000)
