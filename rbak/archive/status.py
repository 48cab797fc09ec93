"""An archive's state as the storage holds it: what ``rbak describe`` shows of it and what the
operator's ``RabbitMQArchive`` status reads (it runs ``rbak archive`` in a Deployment and never
talks to the process: the storage is the truth, as it is for a restore).

``archive_status(storage, name, prefix)`` is the stable entry point: the newest generation, whether
it is open, the recoverable-until (epoch ms and UTC), the lag (now minus recoverable-until, as
``rbak_archive_lag_seconds`` reports it for the slowest stream), every gap retention made across the
generations, each stream's epoch, and each stream's archived offset beside the broker's committed
offset as the archiver last probed it (so "how far behind the broker" is read from the storage).
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field

from ..format.archive import stream_key
from ..format.manifest import TapOf
from ..repo.catalog import archive_generations
from ..storage.base import Storage


@dataclass(frozen=True, slots=True)
class ArchiveGap:
    """Records retention removed before the archive read them (``StreamGap`` with its stream)."""

    vhost: str
    stream: str
    generation: str
    from_offset: int
    to_offset: int
    after_timestamp: int | None  # ms: the lost records were stamped after this ...
    before_timestamp: int | None  # ... and before this

    @property
    def count(self) -> int:
        return self.to_offset - self.from_offset + 1


@dataclass(frozen=True, slots=True)
class StreamPosition:
    """One stream of the newest generation: its last archived offset (durable and named by a tick) and
    the broker's committed end at the archiver's newest probe (``committed_at``, epoch ms)."""

    vhost: str
    stream: str
    archived_offset: int | None
    committed_offset: int | None
    committed_at: int | None
    tap: TapOf | None = None  # the classic or quorum queue this stream taps (``archive.taps``), else None

    @property
    def behind(self) -> int | None:
        """Offsets the broker had committed and the archive did not hold, at the probe (None: unknown)."""
        if self.committed_offset is None:
            return None
        return max(0, self.committed_offset - (-1 if self.archived_offset is None else self.archived_offset))


@dataclass(slots=True)
class ArchiveStatus:
    name: str
    generations: int = 0
    newest: str | None = None  # the newest generation's backup id
    open: bool = False  # the newest generation is being written (or its archiver died: the next start closes it)
    recoverable_until: int | None = None  # epoch ms (None: nothing is recoverable yet)
    ticks: int = 0  # the newest generation's
    last_write: int | None = None  # epoch ms of the newest tick or manifest: an archiver that stopped shows here
    gaps: list[ArchiveGap] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)  # "vhost/stream" -> epoch
    records: int = 0  # in every generation
    streams: list[StreamPosition] = field(default_factory=list)  # the newest generation's, by vhost and name

    @property
    def recoverable_until_utc(self) -> str | None:
        if self.recoverable_until is None:
            return None
        return _dt.datetime.fromtimestamp(self.recoverable_until / 1000, _dt.timezone.utc).isoformat(
            timespec="milliseconds")

    def lag_seconds(self, now: float | None = None) -> float | None:
        """Now (epoch seconds) minus the recoverable-until: how much a loss now would cost at most."""
        if self.recoverable_until is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.recoverable_until / 1000)

    def to_json_obj(self, now: float | None = None) -> dict:
        return {"name": self.name, "generations": self.generations, "newest": self.newest, "open": self.open,
                "recoverable_until": self.recoverable_until, "recoverable_until_utc": self.recoverable_until_utc,
                "lag_seconds": self.lag_seconds(now), "ticks": self.ticks, "last_write": self.last_write,
                "records": self.records, "epochs": dict(self.epochs),
                "gaps": [{"vhost": g.vhost, "stream": g.stream, "generation": g.generation,
                          "from_offset": g.from_offset, "to_offset": g.to_offset, "count": g.count,
                          "after_timestamp": g.after_timestamp, "before_timestamp": g.before_timestamp}
                         for g in self.gaps],
                "streams": [{"vhost": p.vhost, "name": p.stream, "archived_offset": p.archived_offset,
                             "committed_offset": p.committed_offset, "committed_at": p.committed_at,
                             "behind": p.behind, "tap": p.tap.to_json_obj() if p.tap else None}
                            for p in self.streams]}


def archive_status(storage: Storage, name: str, prefix: str | None = "") -> ArchiveStatus:
    """The state of archive ``name`` under ``prefix`` (one LIST, and a GET per generation's manifest or
    per tick of the open one)."""
    st = ArchiveStatus(name)
    gens = archive_generations(storage, name, prefix)
    st.generations = len(gens)
    for m in gens:
        st.records += m.total_messages
        for q in m.queues:
            for gp in (q.stream.gaps if q.stream is not None else ()):
                st.gaps.append(ArchiveGap(q.vhost, q.name, m.backup_id, gp.from_offset, gp.to_offset,
                                          gp.after_timestamp, gp.before_timestamp))
    if gens:
        newest = gens[-1]
        info = newest.archive
        assert info is not None
        st.newest, st.open, st.ticks = newest.backup_id, info.open, info.ticks
        st.recoverable_until = info.recoverable_until
        st.last_write = newest.completed_at
        st.epochs = dict(info.epochs)
        for q in sorted(newest.queues, key=lambda q: (q.vhost, q.name)):
            c = info.committed.get(stream_key(q.vhost, q.name))
            st.streams.append(StreamPosition(q.vhost, q.name, q.stream.last_offset if q.stream else None,
                                             c.offset if c else None, c.at if c else None,
                                             q.stream.tap if q.stream else None))
    return st
