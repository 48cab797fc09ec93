"""Naming the closest names in a refusal: a typo'd queue, vhost or pattern is then plain."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, names: Iterable[str]) -> str:
    """`` (closest: 'a', 'b')`` for an error message, or ``""``."""
    near = difflib.get_close_matches(name, sorted(set(names)), n=3, cutoff=0.5)
    return f" (closest: {', '.join(map(repr, near))})" if near else ""
