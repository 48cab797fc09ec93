"""Which codec backend runs: the optional C helper or pure Python.

One place decides, as python-zstandard does with its import policy: record.py
and batch.py both take ``speedups`` from here. ``RBAK_SPEEDUPS`` chooses:

- unset or ``auto``: the C helper when the install built it, else pure Python;
- ``0``: pure Python even where the helper exists (to compare, or to rule it out);
- ``1``: the C helper or an ImportError (a build that must have it).

Both backends produce the same bytes and records; only speed differs.
"""

from __future__ import annotations

import os
from types import ModuleType

ENV = "RBAK_SPEEDUPS"


def _load() -> tuple[ModuleType | None, bool]:
    """(the module in use or None, whether it was built at all)."""
    policy = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if policy not in ("auto", "0", "1"):
        raise ImportError(f"{ENV}={policy!r}: use 0 (pure Python), 1 (C helper required) or auto")
    try:
        from . import _speedups  # noqa: PLC0415 - the optional C helper
    except ImportError as e:
        if policy == "1":
            raise ImportError(f"{ENV}=1 but the C helper rbak.format._speedups is not built: {e}") from e
        return None, False
    return (None if policy == "0" else _speedups), True


speedups, BUILT = _load()
"""``speedups``: the C module in use (None: pure Python). ``BUILT``: the install compiled it."""
