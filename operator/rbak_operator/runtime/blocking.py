"""The worker threads that run the operator's blocking calls (Kubernetes API, storage) off kopf's loop.

Two bounded pools, so the calls in flight stay bounded however many objects there are (a thread per
object would starve everything once objects outnumber threads): ``PASSES`` for reconcile passes
(``RBAK_OPERATOR_WORKERS``, default 8) and ``POLLS`` for the progress reads of running Jobs (as many
threads as asyncio's default executor, where they ran before): a nightly burst of hundreds of runs
polling their progress must not delay the passes that start and finish runs. Calls in flight are
counted, so that exiting can tell whether one is still blocked (``busy``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

PASSES = concurrent.futures.ThreadPoolExecutor(
    max_workers=int(os.environ.get("RBAK_OPERATOR_WORKERS", "8")), thread_name_prefix="rbak-reconcile")
POLLS = concurrent.futures.ThreadPoolExecutor(
    max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="rbak-progress")
_lock = threading.Lock()
_busy = 0


def _counted(fn: Callable[..., T], *args: Any) -> T:
    global _busy
    with _lock:
        _busy += 1
    try:
        return fn(*args)
    finally:
        with _lock:
            _busy -= 1


async def run(fn: Callable[..., T], *args: Any, pool: concurrent.futures.Executor = PASSES) -> T:
    """``fn(*args)`` on ``pool``, in a copy of this task's context (kopf.event() finds its poster
    through context vars). Cancelling the awaiting task does not stop the call: see ``busy``."""
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(_counted, ctx.run, fn, *args))


def busy() -> int:
    """How many calls are running now (a cancelled task's call runs on until its I/O returns)."""
    with _lock:
        return _busy
