"""A continuous archive's ticks: the small objects that make an open generation readable.

``rbak archive`` writes each generation of an archive as an ordinary backup folder
(``{prefix}/{archive}.{UTC stamp}/``: segments under ``queues/`` as any backup's). While the
generation is open, each tick adds one object ``archive/tick-NNNNNNNNNN.json`` (a new key every
time: nothing is ever overwritten, so Object Lock buckets work) holding every stream's position,
the segments made durable since the previous tick and the archive's recoverable-until instant.
Closing the generation writes its ``manifest.json`` once, from the ticks. Readers of an open
generation (``catalog``) assemble the same manifest from the ticks, so ``list``, ``describe``,
``validate`` and ``restore`` see the archive as backups; a segment stored after the last tick is
named by no tick, is never read, and its records are archived again by the next generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import ManifestError
from .manifest import BackupManifest, EncryptionInfo, QueueBackup, SegmentMetadata, StreamInfo
from .manifest_archive import ArchiveInfo, CommittedEnd

TICK_DIR = "archive"
TICK_FORMAT = "rbak-archive-tick/1"


def tick_key(root: str, sequence: int) -> str:
    """The key of a generation's tick ``sequence`` (``root``: the generation's folder)."""
    return f"{root}/{TICK_DIR}/tick-{sequence:010d}.json"


def stream_key(vhost: str, name: str) -> str:
    return f"{vhost}/{name}"


@dataclass(slots=True)
class TickStream:
    """One stream in a tick: where it stands (cumulative) and the segments new since the last tick."""

    vhost: str
    name: str
    info: StreamInfo
    epoch: int = 1
    complete_until: int | None = None  # ms: every record the broker committed by here is archived
    present: bool = True  # False: the stream is gone from the broker; its link is carried on
    segments: list[SegmentMetadata] = field(default_factory=list)
    committed: CommittedEnd | None = None  # the broker's committed end, probed at this tick (rbak extension)

    def to_json_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "vhost": self.vhost, "name": self.name, "epoch": self.epoch, "present": self.present,
            "complete_until": self.complete_until, "stream": self.info.to_json_obj(),
            "segments": [s.to_json_obj() for s in self.segments]}
        if self.committed is not None:
            out["committed"] = self.committed.to_json_obj()
        return out

    @classmethod
    def from_json_obj(cls, d: Any, where: str) -> "TickStream":
        if not isinstance(d, dict) or not isinstance(d.get("vhost"), str) or not isinstance(d.get("name"), str):
            raise ManifestError(f"{where}: a stream needs 'vhost' and 'name'")
        segs = d.get("segments") or []
        if not isinstance(segs, list):
            raise ManifestError(f"{where}: 'segments' must be a list")
        cu = d.get("complete_until")
        committed = d.get("committed")
        return cls(d["vhost"], d["name"], StreamInfo.from_json_obj(d.get("stream") or {}, f"{where} stream"),
                   int(d.get("epoch") or 1), cu if isinstance(cu, int) else None, d.get("present") is not False,
                   [SegmentMetadata.from_json_obj(s, f"{where} segment {i}") for i, s in enumerate(segs)],
                   CommittedEnd.from_json_obj(committed, f"{where} committed") if committed is not None else None)


@dataclass(slots=True)
class Tick:
    """One tick of an open generation (see the module doc)."""

    archive: str
    generation: str
    sequence: int
    written_at: int
    created_at: int
    recoverable_until: int | None
    streams: list[TickStream]
    source_cluster: str | None = None
    rabbitmq_version: str | None = None
    tool_version: str = ""
    encryption: EncryptionInfo | None = None

    def to_json(self) -> bytes:
        return orjson.dumps({
            "format": TICK_FORMAT, "archive": self.archive, "generation": self.generation,
            "sequence": self.sequence, "written_at": self.written_at, "created_at": self.created_at,
            "recoverable_until": self.recoverable_until, "source_cluster": self.source_cluster,
            "rabbitmq_version": self.rabbitmq_version, "tool_version": self.tool_version,
            "encryption": self.encryption.to_json_obj() if self.encryption else None,
            "streams": [s.to_json_obj() for s in self.streams]})

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "Tick":
        try:
            d = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise ManifestError(f"{where}: not valid JSON: {e}") from None
        if not isinstance(d, dict) or d.get("format") != TICK_FORMAT:
            raise ManifestError(f"{where}: not an rbak archive tick ({TICK_FORMAT})")
        try:
            streams = [TickStream.from_json_obj(s, f"{where} stream {i}") for i, s in enumerate(d["streams"])]
            enc = d.get("encryption")
            return cls(d["archive"], d["generation"], int(d["sequence"]), int(d["written_at"]), int(d["created_at"]),
                       d.get("recoverable_until"), streams, d.get("source_cluster"), d.get("rabbitmq_version"),
                       d.get("tool_version") or "",
                       EncryptionInfo.from_json_obj(enc, where) if enc is not None else None)
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{where}: malformed tick ({e!r})") from None


def assemble(ticks: list[Tick], open_: bool) -> BackupManifest:
    """The generation's manifest from its ticks (all of them, any order): segments of every tick in
    order, each stream's position and the recoverable-until of the last tick."""
    if not ticks:
        raise ManifestError("an archive generation without ticks has no manifest")
    ticks = sorted(ticks, key=lambda t: t.sequence)
    for i, t in enumerate(ticks):
        if t.sequence != i:
            raise ManifestError(f"archive generation {t.generation!r}: tick {i} is missing (found {t.sequence})")
    last = ticks[-1]
    segments: dict[str, list[SegmentMetadata]] = {}
    for t in ticks:
        for s in t.streams:
            segments.setdefault(stream_key(s.vhost, s.name), []).extend(s.segments)
    queues = []
    for s in last.streams:
        q = QueueBackup(s.vhost, s.name, "stream", stream=s.info)
        for seg in segments.get(stream_key(s.vhost, s.name), []):
            q.add_segment(seg)
        queues.append(q)
    m = BackupManifest(backup_id=last.generation, created_at=ticks[0].created_at, completed_at=last.written_at,
                       source_cluster=last.source_cluster, rabbitmq_version=last.rabbitmq_version,
                       backup_tool_version=last.tool_version, queues=sorted(queues, key=lambda q: (q.vhost, q.name)),
                       encryption=last.encryption,
                       archive=ArchiveInfo(last.archive, last.recoverable_until, open_, len(ticks),
                                           {stream_key(s.vhost, s.name): s.epoch for s in last.streams},
                                           {stream_key(s.vhost, s.name): s.committed for s in last.streams
                                            if s.committed is not None}))
    m.recompute_totals()
    return m
