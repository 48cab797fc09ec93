"""The per-object model of the operator: one loop per custom resource, woken by events, asleep otherwise.

Every RabbitMQBackup, RabbitMQRestore and RabbitMQArchive is a key ``(kind, namespace, name)``. Its whole life in the
operator is one asyncio task on kopf's event loop (``tasks``), running ``run`` below:

1. **Start.** kopf's watch streams deliver every event of our objects, the initial listing included; the
   first event of a key starts its task (``tasks.ensure``). An event for a key whose task is running only
   marks it to run once more after it ends, so a task is never started twice and never missed.
2. **Pass.** The task runs one pass of its kind (``reconcile.backup.backup_pass``,
   ``reconcile.restore.restore_pass``, ``reconcile.archive.archive_pass``, handed in by ``handlers``: this module knows no kind) on a bounded
   thread pool (``blocking``): a pass is blocking HTTP to the API server and the storage, and the pool
   bounds the calls in flight however many objects there are. A pass reads everything it decides on
   afresh, decides with pure functions (``decide``) and applies the result; it returns the result and
   the times it wants to run again (a schedule slot, a drill, a pod's start deadline).
3. **Sleep.** The task then sleeps on its key's flag (``wakeups``) until the earliest of those times,
   or the safety resync (``RBAK_OPERATOR_RESYNC_SECONDS``, 6 h), whichever comes first
   (``decide.wake.next_wake``); an archive sleeps its wall-clock poll interval instead. Watch events set the flag: a change of the object's spec, annotations or
   deletion (not its status: that is what passes write), and any event of a Job or SparkApplication it
   owns (mapped back by ``ownerReferences``). An idle object therefore costs no API call between passes.
4. **Fail.** A pass that raises is logged and retried with a capped exponential backoff
   (``decide.wake.backoff``: 2 s up to 5 min); one bad object never stops its own loop or another's.
5. **End.** The loop ends when its pass says the object is gone (deleted, or a restore that finished):
   ``GONE``. Operator shutdown (a lost Lease, SIGTERM) sets ``tasks.stopping()``, which every sleep
   watches; ``tasks.stop_all`` waits a few seconds for passes in flight, then cancels.

Time is ``clock.now()`` throughout (the one test seam). Which replica runs any of this is ``leader``'s.
No kopf daemon, timer or finalizer is involved: kopf only delivers events and logs in (``handlers``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from rbak_operator.decide.status import GONE
from rbak_operator.decide.wake import backoff, next_wake
from rbak_operator.kube.client import ApiError, Kube
from rbak_operator.runtime import blocking, clock, wakeups

log = logging.getLogger("rbak_operator")

RESYNC = timedelta(seconds=float(os.environ.get("RBAK_OPERATOR_RESYNC_SECONDS", str(6 * 3600))))

# A kind's pass: (client, namespace, name, logger) -> (result, the times the next pass is due for).
Pass = Callable[[Kube, str, str, Any], tuple[Any, list[datetime | None]]]


async def run(reconcile: Pass, kind: str, name: str, namespace: str, stopped: asyncio.Event, logger: Any,
              *, poll: timedelta | None = None) -> None:
    """Run a pass, sleep until woken or due, repeat until stopped or the pass answers ``GONE``.

    ``poll`` (the archive's): after a good pass, sleep that long of wall-clock time instead of until the
    times the pass named; the archive's ticks are stamped in wall time, whatever clock schedules run on."""
    kube = Kube()
    key = (kind, namespace, name)
    wakeups.flag(key)  # from now on, watch events wake this loop
    failures = 0
    log.info("%s %s/%s: reconcile loop started", kind, namespace, name)
    try:
        while not stopped.is_set():
            times: list[datetime | None] = []
            try:
                result, times = await blocking.run(reconcile, kube, namespace, name, logger)
                if result == GONE:
                    return
                failures = 0
            except ApiError as e:
                failures += 1
                logger.warning("%s %s/%s: API error %s %s; retrying", kind, namespace, name, e.status, e.reason)
            except Exception:  # never let one bad object kill its loop
                failures += 1
                logger.exception("%s %s/%s: reconcile failed; retrying", kind, namespace, name)
            if poll is not None:
                await wakeups.sleep_for(key, (backoff(failures) if failures else poll).total_seconds(), stopped)
                continue
            now = clock.now()
            due = now + backoff(failures) if failures else next_wake(times, now, RESYNC)
            await wakeups.sleep_until(key, due, stopped)
    finally:
        wakeups.forget(key)
