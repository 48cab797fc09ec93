"""A broker in memory that keeps the ``transport.Transport`` contract, for tests of the restore's logic.

Like httpx's ``MockTransport``: the restore runs unchanged on it (``RestoreOptions(transport=MemoryBroker())``)
and the test reads what the target holds, in order. It behaves as RabbitMQ does for what the restore
depends on, and nothing more:

- queues in vhosts, the default exchange and direct bindings; a passive declare gives the exact depth
  and consumers, or closes the channel with 404;
- confirms arrive as a 0-9-1 client reads them: when the window is full, every 128 publishes and on
  ``drain``, so a lost connection leaves messages enqueued and not confirmed, as a killed run does;
- ``x-max-length`` / ``x-max-length-bytes`` with ``x-overflow``: ``drop-head`` drops the oldest (and still
  confirms), ``reject-publish`` / ``reject-publish-dlx`` refuse the message (a nack);
- an unroutable message is returned (``mandatory``), an unknown exchange closes the channel (404);
- ``lose_connection_after``: the connection drops once the broker has taken that many messages;
- the management API: queue records with their arguments, policies, vhosts, the cluster name.

There are no streams, TTLs, consumers that take messages, or definitions import: those stay with the
broker tests.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from ..errors import ChannelClosedByBroker, ConnectionLost, ManagementApiError, PublishError
from .publisher import Encoding, Publisher

CONFIRM_EVERY = 128  # publishes between two reads of confirms, as amqp091_publisher
_BROKERS = itertools.count(1)  # keys never reused (an id() is, once its broker is gone)


@dataclass(frozen=True)
class MemoryMessage:
    exchange: str
    routing_key: str
    header: bytes  # as published: encoded basic properties (0-9-1) or message sections (1.0)
    body: bytes
    encoding: Encoding


@dataclass
class MemoryQueue:
    name: str
    queue_type: str = "classic"
    arguments: dict[str, Any] = field(default_factory=dict)
    messages: list[MemoryMessage] = field(default_factory=list)
    consumers: int = 0

    def offer(self, m: MemoryMessage) -> bool:
        """Enqueue ``m`` as the queue's length limits decide; False: refused (reject-publish)."""
        max_len, max_bytes = self.arguments.get("x-max-length"), self.arguments.get("x-max-length-bytes")
        overflow = self.arguments.get("x-overflow", "drop-head")
        over = ((max_len is not None and len(self.messages) + 1 > max_len)
                or (max_bytes is not None and self.body_bytes + len(m.body) > max_bytes))
        if over and overflow in ("reject-publish", "reject-publish-dlx"):
            return False
        self.messages.append(m)
        while self.messages and ((max_len is not None and len(self.messages) > max_len)
                                 or (max_bytes is not None and self.body_bytes > max_bytes)):
            self.messages.pop(0)
        return True

    @property
    def body_bytes(self) -> int:
        return sum(len(m.body) for m in self.messages)


class MemoryBroker:
    """One broker's vhosts, queues and bindings, and the transport onto it."""

    amqp10 = True

    def __init__(self, version: str = "4.0.5", cluster_name: str = "rabbit@memory",
                 max_message_size: int | None = None):
        self.key: Hashable = ("memory", next(_BROKERS))
        self.version = version
        self.cluster_name = cluster_name
        self.management_cluster_name = cluster_name  # another name: the management URL answers for another cluster
        self.max_message_size_announced = max_message_size
        self.management_answers = True
        self.lose_connection_after: int | None = None  # messages taken before the publishing connection drops
        self.vhosts: dict[str, dict[str, MemoryQueue]] = {"/": {}}
        self.bindings: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (vhost, exchange) -> [(key, queue)]
        self.policies: dict[str, list[dict[str, Any]]] = {}
        self.connections_opened = 0
        self.taken = 0  # messages the broker took (enqueued, dropped or refused), over every connection
        self.lock = threading.Lock()  # a restore publishes its queues from a thread pool

    # -- setting it up and reading it back -------------------------------------------------
    def add_vhost(self, vhost: str) -> None:
        self.vhosts.setdefault(vhost, {})

    def declare(self, vhost: str, queue: str, queue_type: str = "classic",
                arguments: dict[str, Any] | None = None) -> MemoryQueue:
        if queue_type == "stream":
            raise ValueError("the memory broker has no streams: test them against a broker")
        self.add_vhost(vhost)
        q = self.vhosts[vhost][queue] = MemoryQueue(queue, queue_type, dict(arguments or {}))
        return q

    def bind(self, vhost: str, exchange: str, queue: str, routing_key: str) -> None:
        """A direct exchange's binding (the exchange exists once it has one)."""
        self.bindings.setdefault((vhost, exchange), []).append((routing_key, queue))

    def queue(self, vhost: str, queue: str) -> MemoryQueue | None:
        return self.vhosts.get(vhost, {}).get(queue)

    def messages(self, vhost: str, queue: str) -> list[MemoryMessage]:
        q = self.queue(vhost, queue)
        return [] if q is None else list(q.messages)

    def bodies(self, vhost: str, queue: str) -> list[bytes]:
        return [m.body for m in self.messages(vhost, queue)]

    # -- the transport ----------------------------------------------------------------------
    def connect(self, vhost: str) -> MemoryConnection:
        if vhost not in self.vhosts:
            raise ConnectionLost(f"memory broker vhost {vhost!r}: access refused (530 NOT_ALLOWED)", 530,
                                 f"NOT_ALLOWED - vhost {vhost} not found")
        with self.lock:
            self.connections_opened += 1
        return MemoryConnection(self, vhost)

    def publisher(self, conn: Any, vhost: str, queue: str, label: str, window: int, confirms: bool,
                  encoding: Encoding) -> Publisher:
        if not isinstance(conn, MemoryConnection):
            raise TypeError(f"the memory broker publishes over its own connections, not {type(conn).__name__}")
        if encoding == "amqp10" and self.queue(vhost, queue) is None:
            raise PublishError(f"cannot publish to {label}: the broker refused the AMQP 1.0 link to "
                               f"/queues/{queue} (link: amqp:not-found)")
        return MemoryPublisher(conn, queue if encoding == "amqp10" else None, label, window, confirms, encoding)

    def management(self) -> MemoryManagement:
        if not self.management_answers:
            raise ManagementApiError("memory broker: the management API does not answer")
        return MemoryManagement(self)

    def max_message_size(self, vhost: str) -> int | None:
        return self.max_message_size_announced

    # -- what a publish does ----------------------------------------------------------------
    def take(self, conn: MemoryConnection, link_queue: str | None, m: MemoryMessage) -> str | None:
        """Route and enqueue one message; None: accepted, else why not ("nack", "return")."""
        with self.lock:
            if self.lose_connection_after is not None and self.taken >= self.lose_connection_after:
                self.lose_connection_after = None  # once: a rerun connects again
                conn.lost = "the broker closed the connection (320 CONNECTION_FORCED)"
                raise ConnectionLost(f"memory broker vhost {conn.vhost!r}: {conn.lost}", 320, "CONNECTION_FORCED")
            self.taken += 1
            queues = self.vhosts[conn.vhost]
            if link_queue is not None:
                names = [link_queue]
            elif m.exchange == "":
                names = [m.routing_key] if m.routing_key in queues else []
            else:
                bound = self.bindings.get((conn.vhost, m.exchange))
                if bound is None:
                    raise ChannelClosedByBroker(1, 404, f"NOT_FOUND - no exchange '{m.exchange}' in vhost "
                                                        f"'{conn.vhost}'")
                names = [q for k, q in bound if k == m.routing_key and q in queues]
            if not names:
                return "return"
            refused = [n for n in names if not queues[n].offer(m)]
            return "nack" if refused else None


class MemoryConnection:
    """A connection to one vhost of a ``MemoryBroker``."""

    def __init__(self, broker: MemoryBroker, vhost: str):
        self.broker = broker
        self.vhost = vhost
        self.server_properties: dict[str, Any] = {"version": broker.version.encode(),
                                                  "cluster_name": broker.cluster_name.encode()}
        self.is_open = True
        self.lost: str | None = None
        self.slept = 0.0  # what the restore waited (nothing settles later in memory, so no real wait)

    def check(self) -> None:
        if self.lost is not None:
            raise ConnectionLost(f"memory broker vhost {self.vhost!r}: {self.lost}")

    def channel(self) -> MemoryChannel:
        self.check()
        return MemoryChannel(self)

    def sleep(self, seconds: float) -> None:
        self.check()
        self.slept += seconds

    def close(self) -> None:
        self.is_open = False


class MemoryChannel:
    """The control channel of a passive declare."""

    def __init__(self, conn: MemoryConnection):
        self.conn = conn
        self.is_open = True

    def declare_passive(self, queue: str) -> tuple[int, int]:
        self.conn.check()
        q = self.conn.broker.queue(self.conn.vhost, queue)
        if q is None:
            self.is_open = False
            raise ChannelClosedByBroker(1, 404, f"NOT_FOUND - no queue '{queue}' in vhost '{self.conn.vhost}'")
        return len(q.messages), q.consumers


class MemoryPublisher:
    """The ``Publisher`` onto a ``MemoryBroker``: 0-9-1 by exchange and routing key, or 1.0 to one queue."""

    def __init__(self, conn: MemoryConnection, link_queue: str | None, label: str, window: int, confirms: bool,
                 encoding: Encoding):
        self.label = label
        self.encoding = encoding
        self.window = max(1, window)
        self.confirms = confirms
        self.published = self.confirmed = self.failed = 0
        self.failure: str | None = None
        self._conn = conn
        self._link_queue = link_queue
        self._pending: deque[tuple[Hashable, str | None, MemoryMessage]] = deque()  # taken, confirm not read
        self._broken = False  # a message failed: nothing after it counts
        self._last_done_token: Hashable = None
        self._advanced = False

    def fits(self, size: int) -> bool:
        limit = self._conn.broker.max_message_size_announced if self.encoding == "amqp10" else None
        return not limit or size <= limit

    def _take_confirms(self) -> None:
        while self._pending:
            token, outcome, m = self._pending.popleft()
            if outcome is None and not self._broken:
                self.confirmed += 1
                self._last_done_token = token
                self._advanced = True
                continue
            if outcome is None:
                continue
            self.failed += 1
            self._broken = True
            if self.failure is None:
                self.failure = self._why(outcome, m)

    def _why(self, outcome: str, m: MemoryMessage) -> str:
        if self.encoding == "amqp10":
            return f"the broker did not accept a message for {self.label} (outcome REJECTED)"
        if outcome == "return":
            return (f"message for {self.label} was returned as unroutable by exchange {m.exchange!r} "
                    f"with routing key {m.routing_key!r}: 312 NO_ROUTE")
        return (f"the broker rejected (nack) a message for {self.label} "
                f"(exchange {m.exchange!r}, routing key {m.routing_key!r})")

    def publish(self, exchange: str, routing_key: str, header: bytes, body: bytes, token: Hashable) -> None:
        if self.failure is not None:
            raise PublishError(self.failure)
        if self.confirms and len(self._pending) >= self.window:
            self._take_confirms()
            if self.failure is not None:
                raise PublishError(self.failure)
        m = MemoryMessage(exchange, routing_key, header, body, self.encoding)
        try:
            outcome = self._conn.broker.take(self._conn, self._link_queue, m)
        except ConnectionLost as e:
            self.failure = f"connection lost while publishing {self.label}: {e}"
            raise PublishError(self.failure) from None
        except ChannelClosedByBroker as e:
            self.failure = f"the broker closed the channel publishing {self.label}: {e.code} {e.text}"
            raise PublishError(self.failure) from None
        self.published += 1
        if not self.confirms:  # no confirms: sent counts as done, as over 0-9-1
            self.confirmed += 1
            self._last_done_token = token
            self._advanced = True
            return
        self._pending.append((token, outcome, m))
        if self.published % CONFIRM_EVERY == 0:
            self._take_confirms()

    def take_progress(self) -> tuple[bool, Hashable]:
        adv, self._advanced = self._advanced, False
        return adv, self._last_done_token

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def drain(self, timeout: float = 120.0) -> None:
        if self._conn.lost is not None and self._pending:
            raise PublishError(self.failure or f"connection lost while publishing {self.label}: {self._conn.lost}")
        self._take_confirms()
        if self.failure is not None:
            raise PublishError(self.failure)

    def close(self) -> None:
        self._pending.clear()


class MemoryManagement:
    """The management API of a ``MemoryBroker``: what the restore reads of it."""

    def __init__(self, broker: MemoryBroker):
        self.broker = broker

    def request(self, method: str, path: str, body: Any = None) -> Any:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if method != "GET" or not parts or parts[0] != "queues" or len(parts) not in (2, 3):
            raise ManagementApiError(f"memory broker: {method} {path} is not served", status=404)
        queues = self.broker.vhosts.get(parts[1])
        if queues is None:
            raise ManagementApiError(f"memory broker: no vhost {parts[1]!r}", status=404)
        if len(parts) == 2:
            return [self._record(parts[1], q) for q in queues.values()]
        q = queues.get(parts[2])
        if q is None:
            raise ManagementApiError(f"memory broker: no queue {parts[2]!r} in vhost {parts[1]!r}", status=404)
        return self._record(parts[1], q)

    @staticmethod
    def _record(vhost: str, q: MemoryQueue) -> dict[str, Any]:
        return {"name": q.name, "vhost": vhost, "type": q.queue_type, "arguments": dict(q.arguments),
                "messages": len(q.messages), "message_bytes": q.body_bytes, "consumers": q.consumers}

    def overview(self) -> dict[str, Any]:
        return {"cluster_name": self.broker.management_cluster_name}

    def vhosts(self) -> list[str]:
        return sorted(self.broker.vhosts)

    def policies(self, vhost: str) -> list[dict[str, Any]]:
        return list(self.broker.policies.get(vhost, []))

    def operator_policies(self, vhost: str) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass

    def __enter__(self) -> MemoryManagement:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
