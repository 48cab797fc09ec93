"""The AMQP 1.0 ``Publisher`` (RabbitMQ 4.x), on Qpid Proton's C engine, pipelined.

Same contract as ``amqp091_publisher.ConfirmingPublisher`` (``publisher``): a message counts as
confirmed only once the broker accepted it and every message before it (``confirmed`` and the last
token of that prefix); anything but ``accepted`` (rejected, released, modified), a detached link or a
closed connection raises ``PublishError`` naming the queue. One unsettled link per queue to the v2
address ``/queues/<name>`` keeps the queue's order. The restore uses it only with ``restore.protocol:
amqp10``: against rbak's own 0-9-1 connection it was not faster in the measurements
(``benchmarks/restore_protocol.py``, docs/performance.md), so ``auto`` is 0-9-1. The restore encodes
the sections (``restore.amqp10_message``).

Importing this module imports Proton (about 160 ms): ``transport`` imports it only for a restore that
speaks AMQP 1.0 or reads a 4.x target's max-message-size.
"""

from __future__ import annotations

import select
import socket
import time
from collections import deque
from collections.abc import Hashable
from typing import Any
from urllib.parse import quote

from proton import SASL, Connection, Delivery, Endpoint, Transport
from proton.utils import BlockingConnection

from ..config import ConnectionConfig
from ..errors import AmqpConnectionError, AmqpError, PublishError
from ..format.amqp10 import data_section
from .publisher import Encoding

STALL_SECS = 300.0  # no credit this long: the broker is blocking publishers (alarm), as pika's blocked timeout


class Amqp10Publisher:
    """One sender link to a queue with at most ``window`` unsettled messages."""

    encoding: Encoding = "amqp10"

    def __init__(self, target: ConnectionConfig, vhost: str, queue: str, label: str, window: int = 500):
        self.label = label
        self.window = max(1, window)
        self.published = self.confirmed = self.failed = 0
        self.failure: str | None = None
        self._last_done_token: Hashable = None
        self._advanced = False
        self._inflight: deque[tuple[Any, Hashable]] = deque()
        self._accepted = Delivery.ACCEPTED
        self._tag = 0
        self._wire = _Wire(target, vhost)
        try:
            self._link = self._wire.sender("/queues/" + quote(queue, safe=""), target.connection_timeout_secs + 5)
        except AmqpError as e:
            self.close()
            raise PublishError(f"cannot publish to {label}: {e.args[0]}") from None

    def _pump(self, wait: float) -> None:
        try:
            self._wire.io(wait)
        except AmqpError as e:
            if self.failure is None:
                self.failure = f"connection lost while publishing {self.label}: {e.args[0]}"
        if self.failure is None:
            problem = self._wire.problem(self._link)
            if problem:
                self.failure = f"the broker closed the AMQP 1.0 {problem} publishing {self.label}"
        self._settle()

    def fits(self, size: int) -> bool:
        """Whether an encoded message of ``size`` bytes is within the broker's max-message-size
        (checked on the whole 1.0 message, where 0-9-1 checks the body alone)."""
        limit = self._link.remote_max_message_size
        return not limit or size <= limit

    def _settle(self) -> None:
        inflight = self._inflight
        while inflight:
            d, token = inflight[0]
            state = d.remote_state
            if not state:
                break
            if state != self._accepted:
                self.failed += 1
                if self.failure is None:
                    cond = getattr(d.remote, "condition", None)
                    self.failure = (f"the broker did not accept a message for {self.label} "
                                    f"(outcome {d.remote_state}{': ' + str(cond) if cond else ''})")
                return
            d.settle()
            inflight.popleft()
            self.confirmed += 1
            self._last_done_token = token
            self._advanced = True

    def publish(self, exchange: str, routing_key: str, sections: bytes, body: bytes, token: Hashable) -> None:
        """Send one message to the link's queue (``exchange`` and ``routing_key`` are not used: the link has
        one address); blocks while there is no credit or the window is full."""
        if self.failure is not None:
            raise PublishError(self.failure)
        size = len(sections) + len(body) + 8
        if not self.fits(size):  # Proton would hold it forever; callers check fits() first
            raise PublishError(f"{self.label}: a {size}-byte message exceeds the broker's AMQP 1.0 max-message-size "
                               f"({self._link.remote_max_message_size})")
        link = self._link
        if link.credit <= 0 or len(self._inflight) >= self.window:
            deadline = time.monotonic() + STALL_SECS
            while link.credit <= 0 or len(self._inflight) >= self.window:
                self._pump(0.05)
                if self.failure is not None:
                    raise PublishError(self.failure)
                if time.monotonic() > deadline:
                    raise PublishError(f"{self.label}: the broker granted no AMQP 1.0 credit for {STALL_SECS:.0f} s "
                                       "(a memory or disk alarm blocks publishers)")
        self._tag += 1
        d = link.delivery(b"%x" % self._tag)
        link.stream(sections)
        link.stream(data_section(body))
        link.advance()
        self._inflight.append((d, token))
        self.published += 1
        if self._tag % 64 == 0:
            self._pump(0)

    def take_progress(self) -> tuple[bool, Hashable]:
        """(whether the accepted prefix grew since the last call, its last token)."""
        adv, self._advanced = self._advanced, False
        return adv, self._last_done_token

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def drain(self, timeout: float = 120.0) -> None:
        """Wait until every message sent is accepted (or raise)."""
        deadline = time.monotonic() + timeout
        self._pump(0)
        while self._inflight:
            if self.failure is not None:
                raise PublishError(self.failure)
            if time.monotonic() > deadline:
                raise PublishError(f"{len(self._inflight)} message(s) for {self.label} not accepted within {timeout:.0f} s")
            self._pump(0.05)
        if self.failure is not None:
            raise PublishError(self.failure)

    def close(self) -> None:
        self._wire.close()


class _Wire:
    """Proton's protocol engine on our own blocking socket. No reactor: with ``proton.utils.BlockingConnection``
    a Python event object per settled delivery cost more CPU than the publishing itself."""

    def __init__(self, target: ConnectionConfig, vhost: str):
        self.where = f"amqp://{target.host}:{target.port} vhost {vhost!r} (AMQP 1.0)"
        try:
            self.sock = socket.create_connection((target.host, target.port), timeout=target.connection_timeout_secs)
        except OSError as e:
            raise AmqpConnectionError(f"{self.where}: cannot connect ({e})") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.poller = select.poll()  # not select(): it fails on descriptors past 1024 (many queues at once)
        self.poller.register(self.sock, select.POLLIN)
        self.conn = Connection()
        self.conn.container = f"rbak-restore {vhost}"
        self.conn.hostname = "vhost:" + vhost  # RabbitMQ 4.x takes the vhost from the open frame's hostname
        self.conn.user, self.conn.password = target.username, target.password
        self.transport = Transport()
        sasl = self.transport.sasl()
        sasl.allowed_mechs("PLAIN")
        sasl.allow_insecure_mechs = True  # PLAIN over a plain socket, as 0-9-1 sends it (TLS targets stay on 0-9-1)
        self.transport.bind(self.conn)
        self.conn.open()
        self.session = self.conn.session()
        self.session.open()

    def io(self, wait: float) -> None:
        """Write what the engine has, then read what arrives within ``wait`` seconds."""
        t = self.transport
        try:
            t.tick(time.monotonic())  # Proton sends the empty frames the broker's idle-time-out asks for
            while True:
                n = t.pending()
                if n < 0:
                    raise AmqpError(f"{self.where}: {t.condition or 'transport closed'}")
                if n == 0:
                    break
                out = t.peek(n)
                assert out is not None  # n > 0 bytes are pending
                t.pop(self.sock.send(out))
            if self.poller.poll(wait * 1000):
                data = self.sock.recv(max(t.capacity(), 4096))
                if not data:
                    t.close_tail()
                    raise AmqpError(f"{self.where}: the broker closed the connection ({t.condition or 'no reason'})")
                t.push(data)
        except OSError as e:
            raise AmqpError(f"{self.where}: {e}") from None

    def problem(self, link: Any) -> str | None:
        """What the broker closed (link, session, connection) and why; a failed login included."""
        if self.transport.sasl().outcome not in (None, SASL.OK):
            return f"connection: authentication failed for user {self.conn.user!r}"
        for what, ep in (("link", link), ("session", self.session), ("connection", self.conn)):
            if ep is None:
                continue
            cond = ep.remote_condition or ep.condition
            if cond or ep.state & Endpoint.REMOTE_CLOSED:
                return f"{what}: {cond or 'no reason given'}"
        if self.transport.condition:
            return f"connection: {self.transport.condition}"
        return None

    def sender(self, address: str, timeout: float) -> Any:
        """A sender link the broker attached to ``address``, or an error with the broker's reason."""
        link = self.session.sender(f"rbak-restore {address}")
        link.target.address = address
        link.open()
        deadline = time.monotonic() + timeout
        while not (link.state & Endpoint.REMOTE_ACTIVE and link.remote_target.address):
            problem = self.problem(link)
            if problem:
                raise AmqpError(f"the broker refused the AMQP 1.0 link to {address} ({problem})")
            if time.monotonic() > deadline:
                raise AmqpError(f"the broker did not attach the AMQP 1.0 link to {address} within {timeout:.0f} s")
            self.io(0.05)
        return link

    def close(self) -> None:
        try:
            self.conn.close()
            self.io(0)
        except Exception:  # noqa: BLE001 - closing after a broker error
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def announced_max_message_size(target: ConnectionConfig, vhost: str) -> int | None:
    """The max-message-size a 4.x broker announces in its AMQP 1.0 attach (None or 0: none), read on one
    short connection with the anonymous terminus, so no queue is touched; raises whatever Proton raises."""
    conn = BlockingConnection(f"amqp://{target.host}:{target.port}", timeout=target.connection_timeout_secs,
                              user=target.username, password=target.password, virtual_host=f"vhost:{vhost}",
                              allowed_mechs="PLAIN", allow_insecure_mechs=True)
    try:
        return conn.create_sender(None).link.remote_max_message_size
    finally:
        conn.close()
