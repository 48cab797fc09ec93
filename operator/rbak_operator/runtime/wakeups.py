"""The live side of event-driven reconciliation: one wake-up flag per object, and an index
of what the watches have shown.

A RabbitMQBackup's or RabbitMQRestore's loop (loop.py) sleeps on its flag until its due
time (wake.py). Watch events set the flag: the object's own spec, annotation or deletion
changes, and every event of a Job or SparkApplication it owns (mapped back through
``ownerReferences``). The object's own status patches do not: they are what a pass just wrote.
Everything runs on kopf's event loop; nothing here calls the API.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from rbak_operator.runtime import clock

Key = tuple[str, str, str]  # (kind: "backup" | "restore", namespace, name)

OWNER_KINDS = {"RabbitMQBackup": "backup", "RabbitMQRestore": "restore", "RabbitMQArchive": "archive"}
FAKE_CLOCK_POLL = 0.5  # seconds: with RBAK_OPERATOR_CLOCK_FILE, "now" can jump at any time
REAL_CLOCK_CAP = 30.0  # seconds: a sleep re-reads the wall clock at least this often (suspend, NTP steps)

_flags: dict[Key, asyncio.Event] = {}
_seen: dict[Key, tuple[Any, ...]] = {}
_sources: dict[str, dict[str, Any]] = {}  # namespace -> {RabbitMQBackup name: its source (policy.source_of)}
_sources_lock = threading.Lock()  # written on the event loop, read by passes on the reconcile pool


def flag(key: Key) -> asyncio.Event:
    return _flags.setdefault(key, asyncio.Event())


def forget(key: Key) -> None:
    _flags.pop(key, None)
    _seen.pop(key, None)
    if key[0] == "backup":
        with _sources_lock:
            _sources.get(key[1], {}).pop(key[2], None)


def poke(key: Key) -> None:
    """Run the object's next pass now (a no-op for an object without a loop yet: its first pass comes)."""
    ev = _flags.get(key)
    if ev is not None:
        ev.set()


def object_changed(key: Key, body: Mapping[str, Any]) -> bool:
    """True when a watch event of the object itself brings something a pass must act on: its spec,
    annotations (run now, drill now) or a deletion; False for status-only events, which our own
    passes cause. (The spec itself, not metadata.generation: not every server bumps it.)"""
    meta = body.get("metadata") or {}
    mark = (json.dumps(body.get("spec"), sort_keys=True, default=str),
            json.dumps(meta.get("annotations") or {}, sort_keys=True), meta.get("deletionTimestamp"))
    if _seen.get(key) == mark:
        return False
    _seen[key] = mark
    return True


def owners(body: Mapping[str, Any]) -> list[Key]:
    """The RabbitMQBackups/RabbitMQRestores that own a Job or SparkApplication."""
    meta = body.get("metadata") or {}
    ns = meta.get("namespace") or ""
    return [(OWNER_KINDS[o["kind"]], ns, o["name"]) for o in meta.get("ownerReferences") or []
            if o.get("kind") in OWNER_KINDS and o.get("name")]


def remember_source(namespace: str, name: str, source: Any) -> None:
    with _sources_lock:
        _sources.setdefault(namespace, {})[name] = source


def sources_in(namespace: str) -> dict[str, Any] | None:
    """The sources of the RabbitMQBackups the watch has shown in a namespace; None when the watch
    has shown none there (then a caller must ask the API)."""
    with _sources_lock:
        known = _sources.get(namespace)
        return dict(known) if known else None


async def sleep_for(key: Key, seconds: float, stopped: asyncio.Event) -> None:
    """Sleep ``seconds`` of wall-clock time, or until the object's flag or ``stopped`` is set."""
    ev = flag(key)
    waits = {asyncio.ensure_future(ev.wait()), asyncio.ensure_future(stopped.wait())}
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    ev.clear()


async def sleep_until(key: Key, due: datetime, stopped: asyncio.Event) -> None:
    """Sleep until ``due`` on the operator's clock, the object's flag, or ``stopped`` (operator shutdown)."""
    ev = flag(key)
    fake = clock.is_fake()
    stop = asyncio.ensure_future(stopped.wait())
    try:
        while not stopped.is_set() and not ev.is_set():
            left = (due - clock.now()).total_seconds()
            if left <= 0:
                break
            woken = asyncio.ensure_future(ev.wait())
            try:
                await asyncio.wait({woken, stop}, timeout=min(left, FAKE_CLOCK_POLL if fake else REAL_CLOCK_CAP),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
    finally:
        stop.cancel()
    ev.clear()
