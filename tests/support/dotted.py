"""Edit a manifest by dotted path, for tables of bad objects (the offline schema tests and the real server's)."""

from __future__ import annotations


class _Deleted:
    """Marks a field to delete; a stable repr keeps test ids equal on every xdist worker."""

    def __repr__(self) -> str:
        return "<deleted>"


DEL = _Deleted()


def set_path(obj: dict, dotted: str, value) -> dict:
    """``obj`` with ``dotted`` set to ``value`` (or removed, for ``DEL``); intermediate maps are made."""
    cur = obj
    keys = dotted.split(".")
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    if value is DEL:
        cur.pop(keys[-1], None)
    else:
        cur[keys[-1]] = value
    return obj
