"""Quorum queues of a stopped node (``quorum/<node>/<server dir>/`` + the shared WAL)."""

from __future__ import annotations

import os
from typing import Iterator

from ..damage import ImportContext


def iter_quorum_queues(node_dir: str, ctx: ImportContext, backed_up_at: int) -> Iterator:
    root = os.path.join(node_dir, "quorum")
    dirs = []
    if os.path.isdir(root):
        for node in sorted(os.listdir(root)):
            p = os.path.join(root, node)
            if os.path.isdir(p):
                dirs += [d for d in sorted(os.listdir(p)) if os.path.isdir(os.path.join(p, d))]
    if dirs:
        ctx.note(f"{len(dirs)} quorum queue(s) on this node ({', '.join(dirs[:5])}) are NOT in this backup: "
                 "reading Ra logs is not implemented yet")
    return iter(())
