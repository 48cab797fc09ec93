"""Quorum-queue priorities: when a backup's read would reorder what consumers receive.

Measured on 3.10.8, 4.0.5 and 4.3.6 (``tests/engine/test_backup_priorities.py``) and
read in ``rabbit_fifo`` (4.3: ``take_next_msg`` serves the ``returns`` queue before
``rabbit_fifo_pq``, the 32 strict priority levels; 4.0: before the high/normal pair):

- every message a backup returns goes to the ``returns`` queue, in the order it was
  delivered, and is served before anything still in the priority levels. With nothing
  published during the read, the queue is delivered afterwards exactly as before.
- a message published *while the backup holds the queue* at a higher priority than a
  held one is delivered after it (4.3: any higher level; 4.0: priority > 4 after held
  normal ones). 3.10 quorum queues ignore priorities (FIFO), so nothing is reordered.

A backup cannot know before taking messages whether a producer will publish during the
read, but it can see a priority queue in live use: ready messages at more than one
priority level (the management API's ``messages_by_priority`` on 4.3,
``messages_ready_high``/``_normal`` on 4.0-4.2) and consumers attached. Such a queue is
refused before anything is taken; an idle one is read (its order is kept).
"""

from __future__ import annotations

from typing import Any

from .limits import version_tuple


def priority_levels(reported: dict[str, Any]) -> dict[str, int] | None:
    """Ready messages per priority level as the management API reports them (levels holding
    none left out); None when the broker reported no per-priority counts (yet)."""
    by = reported.get("messages_by_priority")
    if isinstance(by, dict):  # 4.3+: strict levels 0-31
        return {str(k): int(v) for k, v in by.items() if int(v or 0) > 0}
    if "messages_ready_high" in reported or "messages_ready_normal" in reported:  # 4.0-4.2
        pairs = (("high (> 4)", reported.get("messages_ready_high")), ("normal (<= 4)", reported.get("messages_ready_normal")))
        return {k: int(v or 0) for k, v in pairs if int(v or 0) > 0}
    return None


def priorities_matter(version: str | None, queue_type: str) -> bool:
    """Quorum queues deliver by priority from 4.0 on; 3.x quorum queues are FIFO."""
    return queue_type == "quorum" and version_tuple(version) >= (4, 0)


def refuse_live_priorities(version: str | None, levels: dict[str, int] | None, consumers: int) -> str | None:
    """Why reading this quorum queue now would reorder its consumers' messages, or None.

    ``levels`` None (not reported) with consumers attached is refused too: not knowing is
    not "one level"."""
    if not consumers:
        return None
    strict = version_tuple(version) >= (4, 3)
    kind = "strict priority levels (RabbitMQ 4.3+)" if strict else "two priority levels (RabbitMQ 4.0-4.2, > 4 is high)"
    if levels is None:
        return (f"it has {consumers} consumer(s) and the management API has not reported its messages per "
                f"priority, so rbak cannot tell whether its {kind} are in use")
    if len(levels) <= 1:
        return None
    shown = ", ".join(f"{k}: {v}" for k, v in sorted(levels.items()))
    return (f"quorum queue priorities are in use ({kind}; ready messages per priority {{{shown}}}) and it has "
            f"{consumers} consumer(s): the messages a backup holds go back ahead of the priority levels, so a "
            "higher-priority message published during the read would reach your consumers after lower-priority "
            "ones")
