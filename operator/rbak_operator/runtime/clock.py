"""The operator's "now": the one seam where a test steps time, documented here and read nowhere else.

``RBAK_OPERATOR_CLOCK_FILE`` names a file holding an RFC 3339 time or epoch
seconds: when set, "now" is read from it on every call, so an end-to-end test
can step a real operator process across schedule slots without waiting.
``RBAK_OPERATOR_NOW_OFFSET`` (seconds) shifts the real clock instead. Every
pass and sleep asks ``now()`` (the pure decisions get the time as an argument),
so these two variables are the only test switch in the operator; the chart
sets neither.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from rbak_operator.decide.times import parse_time


def now() -> datetime:
    """The time every pass and sleep goes by: the clock file's, else the wall clock plus the offset."""
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
