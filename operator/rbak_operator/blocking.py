"""The worker threads that run the operator's blocking calls (Kubernetes API, storage) off kopf's loop.

One pool for the reconcile passes and the progress polls: its size bounds the calls in flight however
many objects there are (a thread per object would starve everything once objects outnumber threads).
It counts the calls in flight, so that exiting can tell whether one is still blocked (``busy``).
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

_POOL = concurrent.futures.ThreadPoolExecutor(
    max_workers=int(os.environ.get("RBAK_OPERATOR_WORKERS", "8")), thread_name_prefix="rbak-reconcile")
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


async def run(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the pool, in a copy of this task's context (kopf.event() finds its poster
    through context vars). Cancelling the awaiting task does not stop the call: see ``busy``."""
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_POOL, functools.partial(_counted, ctx.run, fn, *args))


def busy() -> int:
    """How many calls are running now (a cancelled task's call runs on until its I/O returns)."""
    with _lock:
        return _busy
