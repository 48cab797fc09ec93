"""Decisions taken before a backup touches a classic or quorum queue.

- which queues are skipped, and why (exclusive queues cannot be read by another
  connection; single-active-consumer queues while a consumer is attached;
  ``backup.skip_queues_with_consumers``), recorded in the manifest;
- the quorum settings the broker applies (delivery limit, delayed retries),
  resolved from arguments, policies and operator policies, waiting (bounded)
  for the management API to report a fresh queue's arguments;
- whether the broker returns a ``basic.nack``-ed quorum message without counting
  a delivery (4.3+): the version says "maybe", a probe on a scratch queue says
  "yes" (never the version string alone).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from typing import Any, Callable

from ..broker.deliveries import receive
from ..broker.wire import PERSISTENT, Connection
from ..errors import ChannelClosedByBroker, ConfigError, QueueRefused, QueueSkipped, RbakError
from .convert import delivery_count
from .limits import QueueSettings, resolve_settings, version_tuple
from .management import ManagementClient, QueueInfo
from .management import q as quote
from .priorities import priorities_matter, priority_levels, refuse_live_priorities

log = logging.getLogger(__name__)

ARGUMENTS_WAIT_SECS = 15.0  # how long a fresh queue's arguments may take to show up in the management API
PROBE_QUEUE_PREFIX = "rbak-probe-"


class PolicyCache:
    """Policies and operator policies per vhost, fetched once per run."""

    def __init__(self, client: ManagementClient):
        self.client = client
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {}

    def get(self, vhost: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """(policies, operator policies); the latter None when this user may not list them."""
        with self._lock:
            if vhost not in self._cache:
                pol = self.client.policies(vhost)
                try:
                    op: list[dict[str, Any]] | None = self.client.request("GET", f"operator-policies/{_q(vhost)}") or []
                except RbakError as e:
                    log.info("vhost %r: cannot list operator policies (%s); using what each queue reports", vhost, e)
                    op = None
                self._cache[vhost] = (pol, op)
            return self._cache[vhost]


def _q(name: str) -> str:
    return quote(name)


def quorum_settings(q: QueueInfo, client: ManagementClient, policies: PolicyCache, version: str | None,
                    wait_secs: float = ARGUMENTS_WAIT_SECS, sleep: Callable[[float], None] = time.sleep) -> QueueSettings:
    """The settings the broker applies to quorum queue ``q``; refuses when they cannot be known."""
    info = q
    deadline = time.monotonic() + wait_secs
    while "arguments" not in info.reported or "type" not in info.reported:
        if time.monotonic() > deadline:
            raise QueueRefused(
                f"queue {q.name!r} in vhost {q.vhost!r}: refused before reading: the management API has not "
                f"reported its arguments after {wait_secs:g}s, so its delivery limit is unknown (an unknown "
                "limit is never taken as 'no limit')")
        sleep(0.5)
        fresh = client.queue(q.vhost, q.name)
        if fresh is None:
            raise QueueSkipped(f"queue {q.name!r} in vhost {q.vhost!r}: deleted before the backup read it")
        info = fresh
    pol, op = policies.get(q.vhost)
    if op is None:
        # not knowing an operator policy is not "no operator policy": the queue's own report
        # (its effective definition merges the operator policy in) is the only other source
        if "effective_policy_definition" in info.reported:
            op = [{"name": "effective definition reported for the queue", "definition": info.effective_policy}]
        elif "operator_policy" in info.reported and info.operator_policy is None:
            op = []
        else:
            raise QueueRefused(
                f"queue {q.name!r} in vhost {q.vhost!r}: refused before reading: the management user may not "
                "list operator policies and the management API has not reported the queue's effective policy "
                "yet, so its delivery limit is unknown (give the user the policymaker tag, or retry)")
    return resolve_settings(info.arguments, info.name, info.queue_type, pol, op, version,
                            info.policy, info.operator_policy)


def live_priorities(q: QueueInfo, client: ManagementClient, version: str | None, consumers: int, depth: int,
                    wait_secs: float = ARGUMENTS_WAIT_SECS, sleep: Callable[[float], None] = time.sleep) -> None:
    """Refuse a 4.x quorum queue whose priorities are in live use (``priorities``), before reading.

    Waits (bounded) for the management API to report ready messages per priority level,
    which lags a publish by a statistics interval or more."""
    if not (priorities_matter(version, q.queue_type) and consumers and depth):
        return
    info: QueueInfo | None = q
    deadline = time.monotonic() + wait_secs
    while True:
        levels = priority_levels(info.priority_stats) if info is not None else None
        if levels:  # reported, and holding something: the counts have caught up with the queue
            break
        if time.monotonic() > deadline:
            levels = None  # never reported, or reported empty while the queue holds messages: unknown
            break
        sleep(0.5)
        info = client.queue(q.vhost, q.name)
        if info is None:
            raise QueueSkipped(f"queue {q.name!r} in vhost {q.vhost!r}: deleted before the backup read it")
    why = refuse_live_priorities(version, levels, consumers)
    if why:
        raise QueueRefused(f"queue {q.name!r} in vhost {q.vhost!r}: refused before reading: {why}. Back it up "
                           "while no consumer is attached, or exclude it (source.queues.exclude)")


def skip_reason(q: QueueInfo, consumers: int | None, skip_with_consumers: bool) -> str | None:
    """Why this queue is left out of the backup, or None."""
    if q.exclusive:
        return "exclusive queue: only its owning connection can read it (405 RESOURCE_LOCKED)"
    if skip_with_consumers and consumers:
        return f"{consumers} consumer(s) attached and backup.skip_queues_with_consumers is true"
    return None


def single_active_reason(q: QueueInfo, consumers: int | None, client: ManagementClient,
                         wait_secs: float = ARGUMENTS_WAIT_SECS, sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Why a single-active-consumer queue cannot be read now, or None.

    With ``x-single-active-consumer`` (a queue argument only; no policy sets it) the broker
    delivers to one consumer at a time: while an application's consumer is active, a backup's
    consumer receives nothing, and the read used to wait the whole ``read_timeout_secs`` and fail
    without saying why. Decided from the passive declare's consumer count and the queue's
    arguments, waiting (bounded) for the management API to report those of a fresh queue."""
    if not consumers:
        return None
    info: QueueInfo | None = q
    deadline = time.monotonic() + wait_secs
    while info is not None and "arguments" not in info.reported and time.monotonic() < deadline:
        sleep(0.5)
        info = client.queue(q.vhost, q.name)
    if info is None or "arguments" not in info.reported:
        return None  # unknown: the read's own timeout still ends it, with its error
    if info.arguments.get("x-single-active-consumer") is not True:
        return None
    return (f"single active consumer queue (x-single-active-consumer) with {consumers} consumer(s): the broker "
            "delivers only to the active one, so a backup can read it only while no application consumer is "
            "attached")


class NackSupport:
    """Does this broker return a nacked quorum message without counting a delivery? Decided once per run."""

    def __init__(self, version: str | None):
        self.version = version
        self._lock = threading.Lock()
        self._result: bool | None = None if version_tuple(version) >= (4, 3) else False

    def supported(self, conn: Connection, vhost: str) -> bool:
        with self._lock:
            if self._result is None:
                found = probe_nack(conn, vhost)
                if found is None:
                    log.warning("RabbitMQ %s: could not probe how a nacked quorum message is counted in vhost %r "
                                "(rbak needs to declare a scratch queue %s*); returning by channel close with "
                                "the delivery guard", self.version, vhost, PROBE_QUEUE_PREFIX)
                    return False  # try again in the next vhost
                self._result = found
                log.info("RabbitMQ %s: a nacked quorum message %s a delivery", self.version,
                         "does not count as" if found else "counts as")
            return self._result


def probe_nack(conn: Connection, vhost: str) -> bool | None:
    """On a scratch quorum queue (never a user's): publish one message, take it, cancel, nack it,
    take it again. True: its ``x-delivery-count`` stayed 0; False: it went up; None: cannot tell."""
    name = f"{PROBE_QUEUE_PREFIX}{uuid.uuid4().hex}"
    ch = None
    try:
        ch = conn.channel()
        ch.declare(name, durable=True, arguments={"x-queue-type": "quorum", "x-expires": 120_000})
        ch.select_confirms()
        ch.publish("", name, PERSISTENT, b"rbak probe")
        if not conn.pump(lambda: bool(ch.acks) or not ch.is_open, timeout=10) or not all(a for a, _, _ in ch.acks):
            return None
        counts = []
        ch.qos(1)
        for _ in range(2):
            tag = ch.consume(name)
            got = next(receive(conn, ch, tag, 10))
            if got[0] is None:
                return None
            counts.append(delivery_count(got[1]))
            ch.cancel(tag)
            ch.nack(got[0].delivery_tag, multiple=False, requeue=True)
        return counts[1] == counts[0]
    except RbakError as e:
        log.debug("nack probe in vhost %r: %r", vhost, e)
        return None
    finally:
        try:
            if ch is not None and ch.is_open:
                ch.delete(name)
                ch.close()
            elif conn.is_open:
                c2 = conn.channel()
                c2.delete(name)
                c2.close()
        except Exception as e:  # noqa: BLE001 - x-expires removes it anyway
            log.debug("deleting probe queue %s: %r", name, e)


READ_PROBE_ARGUMENTS = {"x-priority": "rbak-read-check"}
"""A consumer argument every broker refuses (406: x-priority must be an integer), checked only AFTER
the user's read permission (403): so ``basic.consume`` with it tells whether the user may read the
queue without ever registering a consumer (measured on 3.10.8, 4.0.5 and 4.3.6)."""


def probe_read_permissions(conn: Connection, vhost: str, queues: list[QueueInfo]) -> list[str]:
    """The queues of ``vhost`` the connection's user may not read, asked over AMQP (a user who
    may not read ``/api/permissions`` still learns it before anything is written)."""
    denied: list[str] = []
    for x in queues:
        if x.vhost != vhost:
            continue
        ch = conn.channel()
        try:
            ch.qos(1)  # should a broker ever accept the argument: one message at most
            tag = ch.consume(x.name, READ_PROBE_ARGUMENTS)
            ch.declare_passive(x.name)  # a round trip: a refused consume has closed the channel by its reply
            log.warning("queue %r in vhost %r: the read-permission probe was accepted; permissions are checked "
                        "when each queue is read", x.name, vhost)
            ch.cancel(tag)
            ch.close()
            return denied
        except ChannelClosedByBroker as e:
            if e.code == 403:
                denied.append(f"{vhost}/{x.name}")
    return denied


def check_read_permissions(client: ManagementClient, user: str, queues: list[QueueInfo],
                           probe: Callable[[str, list[QueueInfo]], list[str]] | None = None) -> None:
    """Refuse, before anything is written, queues ``user`` may not read: from the management API
    (``/api/permissions/VHOST/USER`` answers administrators only), else by ``probe(vhost, queues)``
    over AMQP (``probe_read_permissions``)."""
    denied: list[str] = []
    for vhost in sorted({x.vhost for x in queues}):
        try:
            perm = client.request("GET", f"permissions/{quote(vhost)}/{quote(user)}")
        except RbakError as e:
            log.debug("vhost %r: permissions of %r not readable (%s): asked over AMQP", vhost, user, e)
            if probe is not None:
                denied += probe(vhost, queues)
            continue
        regex = (perm or {}).get("read") if isinstance(perm, dict) else None
        if regex is None:
            continue
        for x in queues:
            if x.vhost != vhost:
                continue
            try:
                ok = regex != "" and re.search(regex, x.name) is not None
            except re.error:
                ok = True  # an Erlang regex Python cannot parse: the broker decides at read time
            if not ok:
                denied.append(f"{vhost}/{x.name}")
    if denied:
        more = f" (+{len(denied) - 5} more)" if len(denied) > 5 else ""
        raise ConfigError(f"source: user {user!r} has no read permission on queue(s) {', '.join(denied[:5])}{more}: "
                          "grant it, or leave them out (source.queues.exclude); nothing was written")
