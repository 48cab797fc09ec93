"""The operator's own long-lived tasks on kopf's event loop: one per object and purpose.

Why not kopf daemons and timers: kopf puts a finalizer on every object that has one, so that deleting a
RabbitMQBackup would wait for the operator, and dropping that finalizer takes kopf's private registry.
Ours are started from the objects' watch events (the initial listing included), end themselves when
their object is gone or their work is done, and are stopped together at operator cleanup. The only
finalizer left is the opt-in one of ``deletionPolicy: delete``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("rbak_operator.runtime.tasks")

Key = tuple[str, ...]

_tasks: dict[Key, asyncio.Task[None]] = {}
_again: dict[Key, Callable[[], Coroutine[Any, Any, None]]] = {}
_stopping: asyncio.Event | None = None


def stopping() -> asyncio.Event:
    """Set when the operator stops: every task's loop ends at its next check."""
    global _stopping
    if _stopping is None:
        _stopping = asyncio.Event()
    return _stopping


def running(key: Key) -> bool:
    task = _tasks.get(key)
    return task is not None and not task.done()


def ensure(key: Key, start: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Start ``start()`` as the task of ``key`` (not while the operator is stopping). If one is running,
    it runs once more after it ends: the event that asked may have come just after the running one
    decided to end (a run started as its follower saw none; an object recreated as its loop saw it
    gone). That rerun costs one read and ends at once when there is nothing to do."""
    if stopping().is_set():
        return
    if running(key):
        _again[key] = start
        return
    task = asyncio.get_running_loop().create_task(start(), name="rbak:" + "/".join(key))
    _tasks[key] = task
    task.add_done_callback(lambda t: _done(key, t))


def _done(key: Key, task: asyncio.Task[None]) -> None:
    if _tasks.get(key) is task:
        del _tasks[key]
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s failed", "/".join(key), exc_info=task.exception())
    again = _again.pop(key, None)
    if again is not None:
        ensure(key, again)


async def stop_all(timeout: float = 5.0) -> None:
    """Ask every task to end, wait up to ``timeout`` seconds (a pass on the pool finishes its HTTP
    calls), then cancel what is left."""
    stopping().set()
    _again.clear()
    pending = [t for t in _tasks.values() if not t.done()]
    if pending:
        _, late = await asyncio.wait(pending, timeout=timeout)
        for t in late:
            t.cancel()
        if late:
            await asyncio.wait(late, timeout=timeout)
    global _stopping
    _stopping = None
