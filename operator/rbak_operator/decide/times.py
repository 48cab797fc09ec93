"""Kubernetes' time format in and out (pure): what a status holds, what an annotation or a clock file says."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import overload


def parse_time(text: str) -> datetime:
    """RFC 3339 or epoch seconds -> aware UTC datetime."""
    t = text.strip()
    try:
        return datetime.fromtimestamp(float(t), timezone.utc)
    except ValueError:
        pass
    dt = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


@overload
def fmt(dt: datetime) -> str: ...
@overload
def fmt(dt: datetime | None) -> str | None: ...
def fmt(dt: datetime | None) -> str | None:
    """Kubernetes' time format: RFC 3339 UTC, whole seconds, 'Z'."""
    if dt is None:
        return None
    return dt.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
