"""rbak's ``archive`` extension of manifest.json: a generation of a continuous archive (``rbak archive``).
Old readers (the Rust tool) ignore the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ManifestError
from .manifest_fields import optional, required, type_ok


@dataclass(frozen=True, slots=True)
class CommittedEnd:
    """A stream's committed end as the archiver probed it (rbak extension): ``offset``, the broker's last
    committed offset (-1: empty; None: the broker could not say) at ``at`` (epoch ms). Every record the
    broker had committed by ``at`` has an offset at most ``offset``."""

    offset: int | None
    at: int

    def to_json_obj(self) -> dict[str, Any]:
        return {"offset": self.offset, "at": self.at}

    @classmethod
    def from_json_obj(cls, d: Any, where: str) -> "CommittedEnd":
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: must be a JSON object")
        return cls(optional(d, "offset", int, where), required(d, "at", int, where))


@dataclass(slots=True)
class ArchiveInfo:
    """rbak's ``archive`` field: this backup is one generation of a continuous archive (``rbak archive``).

    ``recoverable_until`` (epoch ms): every stream of the archive holds, in this generation's chain,
    every record the broker stamped at or before it, so a restore to it is consistent across
    streams. ``open``: the generation is still being written (the manifest was assembled from its
    ticks, not stored)."""

    name: str
    recoverable_until: int | None = None
    open: bool = False
    ticks: int = 0
    epochs: dict[str, int] = field(default_factory=dict)  # "vhost/stream" -> epoch (1 + times recreated)
    committed: dict[str, CommittedEnd] = field(default_factory=dict)  # "vhost/stream" -> the newest probe

    def to_json_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "recoverable_until": self.recoverable_until, "open": self.open,
                               "ticks": self.ticks, "epochs": dict(self.epochs)}
        if self.committed:  # written only when probed: older generations keep their bytes
            out["committed"] = {k: c.to_json_obj() for k, c in self.committed.items()}
        return out

    @classmethod
    def from_json_obj(cls, d: Any, where: str = "archive") -> "ArchiveInfo":
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: must be a JSON object")
        epochs = d.get("epochs") or {}
        if not isinstance(epochs, dict) or not all(type_ok(v, int) for v in epochs.values()):
            raise ManifestError(f"{where}: 'epochs' must map stream names to integers")
        committed = d.get("committed") or {}
        if not isinstance(committed, dict):
            raise ManifestError(f"{where}: 'committed' must map stream names to objects")
        return cls(required(d, "name", str, where), optional(d, "recoverable_until", int, where), d.get("open") is True,
                   optional(d, "ticks", int, where) or 0, dict(epochs),
                   {k: CommittedEnd.from_json_obj(v, f"{where} committed {k!r}") for k, v in committed.items()})
