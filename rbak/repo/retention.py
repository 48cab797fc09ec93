"""Which backups to keep: one pure function for ``rbak prune`` and the operator's retention.

Rules, applied to the complete (and partial) backups a policy owns:

- ``keep_last N``: the newest N.
- ``keep_daily D`` / ``keep_weekly W`` / ``keep_monthly M`` (grandfather-father-son):
  the newest backup of each of the newest D days / W ISO weeks / M months
  that have a backup (UTC).
- When any of those is set, a backup none of them chose is deleted.
- The keep rules count only backups that hold data (a message, or definitions by intent): an
  ``empty`` backup (its selection found no message) is never one of the "last N", so no number of
  empty backups can push the last backup with data out; with keep rules set, it is deleted.
- ``max_age``: a backup created before ``now - max_age`` is deleted.

Then, whatever the rules say:

- the newest complete backup is kept (a wrong ``max_age`` never empties the storage);
- an incomplete backup (a manifest with ``completed_at`` null: possibly still
  running) is never deleted, nor is a backup the policy does not own;
- every backup a kept backup's incremental streams continue (its chain,
  transitively) is kept, because restoring the kept one needs it.

``plan_retention`` returns every backup with the reasons it is kept or deleted,
so callers print what they keep and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable

from ..errors import ConfigError

_DUR = re.compile(r"^([0-9]+)(s|m|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, field_name: str = "--max-age") -> timedelta:
    m = _DUR.match(str(text).strip())
    if not m:
        raise ConfigError(f"{field_name}: {text!r} is not a duration like 30d, 12h, 90m, 2w")
    return timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])


@dataclass(frozen=True, slots=True)
class StoredBackup:
    """What retention needs to know of one backup."""

    backup_id: str
    created_at_ms: int
    complete: bool
    depends_on: frozenset[str] = frozenset()  # backups its incremental streams continue
    owned: bool = True  # made by this policy (others are never deleted, but their chains are kept)
    holds_data: bool = True  # a message, or definitions by intent (``BackupManifest.holds_data``)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    keep_last: int | None = None
    keep_daily: int | None = None
    keep_weekly: int | None = None
    keep_monthly: int | None = None
    max_age: timedelta | None = None

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_daily", "keep_weekly", "keep_monthly"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < (1 if name == "keep_last" else 0)):
                raise ConfigError(f"{name}: must be a whole number >= {1 if name == 'keep_last' else 0}, got {v!r}")

    @property
    def counts(self) -> bool:
        return any(v is not None for v in (self.keep_last, self.keep_daily, self.keep_weekly, self.keep_monthly))

    @property
    def empty(self) -> bool:
        return not self.counts and self.max_age is None


@dataclass(slots=True)
class Verdict:
    backup_id: str
    keep: bool
    reasons: list[str] = field(default_factory=list)


@dataclass(slots=True)
class RetentionPlan:
    verdicts: list[Verdict]  # oldest first

    @property
    def delete(self) -> list[str]:
        return [v.backup_id for v in self.verdicts if not v.keep]

    @property
    def keep(self) -> list[str]:
        return [v.backup_id for v in self.verdicts if v.keep]

    def lines(self) -> list[str]:
        return [f"{'keep  ' if v.keep else 'delete'} {v.backup_id}: {'; '.join(v.reasons)}" for v in self.verdicts]


def _buckets(done: list[StoredBackup], n: int | None, key, label: str, why: dict[str, list[str]]) -> None:
    """The newest backup of each of the newest ``n`` periods holding one."""
    if not n:
        return
    seen: list[str] = []
    for b in reversed(done):  # newest first
        k = key(datetime.fromtimestamp(b.created_at_ms / 1000, tz=timezone.utc))
        if k in seen:
            continue
        if len(seen) >= n:
            break
        seen.append(k)
        why[b.backup_id].append(f"{label} {k}")


def plan_retention(backups: Iterable[StoredBackup], policy: RetentionPolicy, now: datetime) -> RetentionPlan:
    """Keep or delete, with reasons, for every backup (pure: no storage, no clock)."""
    allb = sorted(backups, key=lambda b: (b.created_at_ms, b.backup_id))
    by_id = {b.backup_id: b for b in allb}
    owned_done = [b for b in allb if b.complete and b.owned]
    done = [b for b in owned_done if b.holds_data]  # what the keep rules count
    empty = [b for b in owned_done if not b.holds_data]
    why: dict[str, list[str]] = {b.backup_id: [] for b in allb}
    gone: dict[str, list[str]] = {b.backup_id: [] for b in allb}
    for b in empty:
        if policy.counts:
            gone[b.backup_id].append("empty (holds no message): keep rules count only backups holding data")
    if policy.keep_last:
        for b in done[-policy.keep_last:]:
            why[b.backup_id].append(f"one of the last {policy.keep_last}")
    _buckets(done, policy.keep_daily, lambda d: d.strftime("%Y-%m-%d"), "newest of day", why)
    _buckets(done, policy.keep_weekly, lambda d: "%04d-W%02d" % d.isocalendar()[:2], "newest of week", why)
    _buckets(done, policy.keep_monthly, lambda d: d.strftime("%Y-%m"), "newest of month", why)
    cutoff = int((now - policy.max_age).timestamp() * 1000) if policy.max_age is not None else None
    for b in done:
        if policy.counts and not why[b.backup_id]:
            gone[b.backup_id].append("chosen by no keep rule")
    for b in owned_done:
        if cutoff is not None and b.created_at_ms < cutoff:
            gone[b.backup_id].append(f"older than max age {policy.max_age}")
    keep = {b.backup_id for b in allb if policy.empty or not gone[b.backup_id]}
    for b in allb:
        if not b.owned:
            why[b.backup_id].append("not made by this policy")
            keep.add(b.backup_id)
        elif not b.complete:
            why[b.backup_id].append("incomplete (may still be running)")
            keep.add(b.backup_id)
    last = done or owned_done  # the newest backup holding data (else the newest complete one)
    if last and last[-1].backup_id not in keep:
        why[last[-1].backup_id].append("the newest complete backup" + (" holding data" if done else ""))
        keep.add(last[-1].backup_id)
    if policy.empty:
        for b in owned_done:
            why[b.backup_id].append("no retention rule")
    # chains: whatever a kept backup continues is kept, transitively
    stack = list(keep)
    while stack:
        bid = stack.pop()
        kept = by_id.get(bid)
        for dep in sorted(kept.depends_on if kept else ()):
            if dep not in by_id:
                continue  # already gone: nothing to keep (validate/restore name the broken link)
            why[dep].append(f"base of {bid} (its incremental streams continue it)")
            if dep not in keep:
                keep.add(dep)
                stack.append(dep)
    verdicts = []
    for b in allb:
        if b.backup_id in keep:
            reasons = why[b.backup_id] or ["kept"]
            verdicts.append(Verdict(b.backup_id, True, reasons))
        else:
            verdicts.append(Verdict(b.backup_id, False, gone[b.backup_id]))
    return RetentionPlan(verdicts)


def stored_backups(entries, owns=lambda _bid: True) -> list[StoredBackup]:
    """``StoredBackup``s from ``catalog.list_backups`` entries (an unreadable manifest counts as incomplete)."""
    out = []
    for e in entries:
        m = e.manifest
        out.append(StoredBackup(e.backup_id, m.created_at if m else 0, e.complete,
                                frozenset(m.depends_on) if m else frozenset(), owns(e.backup_id),
                                m.holds_data if m else True))
    return out
