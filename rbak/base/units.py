"""Sizes as people read them (CLI tables, progress lines, the operator's status)."""

from __future__ import annotations


def human_bytes(n: int) -> str:
    """``0 B``, ``1023 B``, ``1.0 KiB`` ... ``5.0 GiB`` (binary units, one decimal above bytes)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
