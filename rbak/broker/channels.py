"""Channels a connection keeps open across queues, held here rather than on pika's objects.

Opening and closing a channel per queue cost round trips and ~1.6 ms of pika per queue
(issue 20): a backup keeps one channel per connection for passive declares (``CONTROL``) and
one for small classic reads (``READING``). They are found by connection in a weak mapping,
never as attributes set on pika's connection or channel. The mapping holds weak references
to the channels too: a channel refers to its connection, and a strong one would keep every
connection alive for the life of the process. While its connection is open, pika itself
keeps an open channel alive.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

CONTROL = "control"  # passive declares; never consumes, so it never holds a message
READING = "reading"  # small classic reads (queue_reader.SHARED_MAX_DEPTH)

_KEPT: "weakref.WeakKeyDictionary[Any, dict[str, weakref.ref]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def kept_channel(conn: Any, purpose: str, prepare: Callable[[Any], None] | None = None) -> Any:
    """``conn``'s open channel for ``purpose``, opened (and given to ``prepare``) when there is none
    or the last one was closed (a broker refusal closes it; the next caller gets a fresh one).
    One connection is used by one thread at a time (pika's rule), so only the mapping is locked."""
    with _LOCK:
        kept = _KEPT.get(conn)
        if kept is None:
            kept = _KEPT[conn] = {}
    ref = kept.get(purpose)
    ch = ref() if ref is not None else None
    if ch is None or not ch.is_open:
        ch = conn.channel()
        if prepare is not None:
            prepare(ch)
        kept[purpose] = weakref.ref(ch)
    return ch
