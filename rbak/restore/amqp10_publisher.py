"""Publishing over AMQP 1.0 (RabbitMQ 4.x) with Qpid Proton's C engine, pipelined.

Same contract as ``publisher.ConfirmingPublisher``: a record counts as restored
only once the broker accepted it and every record before it (``confirmed`` and
the last token of that prefix); anything but ``accepted`` (rejected, released,
modified), a detached link or a closed connection raises ``PublishError``
naming the queue. One unsettled link per queue to the v2 address
``/queues/<name>`` keeps the queue's order. Why 1.0 at all: pika marshals and
parses frames in Python, Proton in C; on 4.3.6 a bare Proton publisher moves
about twice as many 1 KiB messages a second as pipelined pika
(``benchmarks/restore.py``). The sections are encoded by ``amqp10_message``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Hashable
from urllib.parse import quote

from ..config import ConnectionConfig
from ..errors import AmqpConnectionError, AmqpError
from .amqp10_message import data_section
from .publisher import PublishError

STALL_SECS = 300.0  # no credit this long: the broker is blocking publishers (alarm), as pika's blocked timeout


def proton_available() -> bool:
    try:
        import proton  # noqa: F401
        import proton.utils  # noqa: F401
    except ImportError:
        return False
    return True


class Amqp10Publisher:
    """One sender link to a queue with at most ``window`` unsettled messages."""

    def __init__(self, target: ConnectionConfig, vhost: str, queue: str, label: str, window: int = 500):
        from proton import Delivery
        from proton.utils import BlockingConnection

        self.label = label
        self.window = max(1, window)
        self.published = self.confirmed = self.failed = 0
        self.failure: str | None = None
        self._last_done_token: Hashable = None
        self._advanced = False
        self._inflight: deque[tuple[Any, Hashable]] = deque()
        self._accepted = Delivery.ACCEPTED
        self._tag = 0
        where = f"amqp://{target.host}:{target.port} vhost {vhost!r} (AMQP 1.0)"
        try:
            self._conn = BlockingConnection(f"amqp://{target.host}:{target.port}",
                                            timeout=target.connection_timeout_secs + 5,
                                            virtual_host="vhost:" + vhost, user=target.username,
                                            password=target.password, allowed_mechs="PLAIN", sasl_enabled=True,
                                            container_id=f"rbak-restore {vhost}")
        except Exception as e:  # noqa: BLE001 - Proton raises its own ConnectionException/Timeout types
            raise AmqpConnectionError(f"{where}: cannot connect ({type(e).__name__}: {e})") from None
        self._container = self._conn.container
        try:
            self._sender = self._conn.create_sender("/queues/" + quote(queue, safe=""))
        except Exception as e:  # noqa: BLE001 - LinkDetached carries the broker's condition (e.g. not-found)
            self.close()
            raise PublishError(f"cannot publish to {label}: the broker refused the AMQP 1.0 link ({e})") from None
        self._link = self._sender.link

    def _pump(self, wait: float) -> None:
        self._container.timeout = wait
        try:
            self._container.process()
        except Exception as e:  # noqa: BLE001 - LinkDetached / ConnectionClosed raised from Proton's handler
            if self.failure is None:
                self.failure = f"the broker closed the AMQP 1.0 link publishing {self.label}: {e}"
            raise PublishError(self.failure) from None
        if self.failure is None:
            if self._conn.disconnected:
                self.failure = f"connection lost while publishing {self.label}: {self._conn.disconnected}"
            elif self._link.condition or self._link.remote_condition:
                self.failure = (f"the AMQP 1.0 link publishing {self.label} failed: "
                                f"{self._link.remote_condition or self._link.condition}")
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

    def publish(self, sections: bytes, body: bytes, token: Hashable) -> None:
        """Send one message (``sections`` from ``amqp10_message``); blocks while no credit or the window is full."""
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
        adv, self._advanced = self._advanced, False
        return adv, self._last_done_token

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def drain(self, timeout: float = 120.0) -> None:
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
        try:
            self._conn.close()
        except Exception:  # noqa: BLE001 - closing after a broker error
            pass


def check_amqp10_supported(target: ConnectionConfig, field: str = "restore.protocol") -> None:
    """Raise unless this target can be reached over AMQP 1.0 here (an explicit ``amqp10`` setting)."""
    if not proton_available():
        raise AmqpError(f"{field}: amqp10 needs the python-qpid-proton package (pip install python-qpid-proton)")
    if target.use_tls:
        raise AmqpError(f"{field}: amqp10 is not supported with TLS targets yet; use amqp091 or auto")
