"""A cheaper per-frame callback check on the backup's reading connections (issue 20).

For every method frame it receives (one ``Basic.Deliver`` per message), pika asks its
``CallbackManager`` whether a callback waits for it: ``pending`` is wrapped by
``sanitize_prefix``, which copies the arguments and passes channel number and method
through ``name_or_value``, raising and catching a ``TypeError`` for each: about 3-4 us per
message on the thread that reads, 8-9% of it in the profile (py-spy, rmq43 quorum read).
``has_pending_callbacks`` gives exactly ``pending``'s answer (the same keys: ``str`` of the
channel number, the method's ``NAME``) from the same dictionary, without the detour.

It is set on the reading connections only (an attribute of that one ``Connection``
object), never on pika's class: other connections of the process keep pika's own code.
If pika's internals are not what this was written against, nothing is changed.
"""

from __future__ import annotations

import types
from typing import Any


def has_pending_callbacks(self: Any, value: Any) -> int | None:
    """pika's ``Connection._has_pending_callbacks(frame)``: the number of callbacks registered for
    the frame's channel and method, or None."""
    by_key = self.callbacks._stack.get(str(value.channel_number))
    if by_key is None:
        return None
    found = by_key.get(value.method.NAME)
    return None if found is None else len(found)


def install(conn: Any) -> None:
    """Use ``has_pending_callbacks`` on ``conn`` (a BlockingConnection or its ``_impl``); idempotent."""
    impl = getattr(conn, "_impl", conn)
    stack = getattr(getattr(impl, "callbacks", None), "_stack", None)
    if not isinstance(stack, dict) or not hasattr(type(impl), "_has_pending_callbacks"):
        return  # not the pika this was written against: keep its own check
    if not isinstance(impl.__dict__.get("_has_pending_callbacks"), types.MethodType):
        impl._has_pending_callbacks = types.MethodType(has_pending_callbacks, impl)
