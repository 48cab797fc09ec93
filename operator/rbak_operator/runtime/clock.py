"""The operator's notion of "now", injectable for tests.

``RBAK_OPERATOR_CLOCK_FILE`` names a file holding an RFC 3339 time or epoch
seconds: when set, "now" is read from it on every call, so an end-to-end test
can step a real operator process across schedule slots without waiting.
``RBAK_OPERATOR_NOW_OFFSET`` (seconds) shifts the real clock instead.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import overload


def now() -> datetime:
    path = os.environ.get("RBAK_OPERATOR_CLOCK_FILE")
    if path:
        try:
            text = open(path, encoding="utf-8").read().strip()
        except OSError:
            text = ""
        if text:
            return parse_time(text)
    offset = float(os.environ.get("RBAK_OPERATOR_NOW_OFFSET", "0") or 0)
    return datetime.now(timezone.utc) + timedelta(seconds=offset)


def is_fake() -> bool:
    """True when "now" comes from RBAK_OPERATOR_CLOCK_FILE: it may jump, so sleepers re-read it often."""
    return bool(os.environ.get("RBAK_OPERATOR_CLOCK_FILE"))


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
