"""Where a restore's connections, publishers and target facts come from: a broker, or memory.

The restore never opens a socket itself: it asks a ``Transport`` for a connection to a target vhost
(passive declares, the broker's version, waiting), for a ``publisher.Publisher`` per queue, for the
management API and for the max-message-size a 4.x broker announces. ``AmqpTransport`` is the real
one (rbak's 0-9-1 connection ``wire``, Proton for AMQP 1.0, ``management.ManagementClient``);
``memory.MemoryBroker`` keeps the same contract in memory, so the restore's decisions (plans,
checkpoints and resume, lossy targets, confirms) are tested without a RabbitMQ.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Hashable
from typing import Any, Protocol

from ..config import ConnectionConfig
from ..errors import AmqpError
from .management import ManagementClient
from .amqp091_publisher import ConfirmingPublisher
from .connect import connect
from .publisher import Encoding, Publisher
from .wire import Connection


class ControlChannel(Protocol):
    """The part of a channel a passive declare uses (``declare.passive_declare``)."""

    is_open: bool

    def declare_passive(self, queue: str) -> tuple[int, int]: ...


class TargetConnection(Protocol):
    """A connection to one vhost of the target: rbak's ``wire.Connection`` or a memory one."""

    server_properties: dict[str, Any]  # what the broker announced: version, cluster_name

    def channel(self) -> ControlChannel: ...

    def sleep(self, seconds: float) -> None:
        """Wait, taking what the broker sends meanwhile."""
        ...

    def close(self) -> None: ...


class ManagementApi(Protocol):
    """What a restore reads of the management API (``management.ManagementClient``'s methods)."""

    def request(self, method: str, path: str, body: Any = None) -> Any: ...

    def overview(self) -> dict[str, Any]: ...

    def vhosts(self) -> list[str]: ...

    def policies(self, vhost: str) -> list[dict[str, Any]]: ...

    def operator_policies(self, vhost: str) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...

    def __enter__(self) -> ManagementApi: ...

    def __exit__(self, *exc: Any) -> None: ...


class Transport(Protocol):
    """Opens what a restore needs of one target broker."""

    @property
    def key(self) -> Hashable:
        """One per broker and user: what per-broker facts (the max-message-size) are cached by."""
        ...

    @property
    def amqp10(self) -> bool:
        """Whether AMQP 1.0 can be spoken from here (Proton is installed)."""
        ...

    def connect(self, vhost: str) -> TargetConnection:
        """A connection to ``vhost``, or an ``AmqpError`` naming host, port and vhost."""
        ...

    def publisher(self, conn: TargetConnection, vhost: str, queue: str, label: str, window: int,
                  confirms: bool, encoding: Encoding) -> Publisher:
        """A publisher into ``queue``: over ``conn`` for 0-9-1 (by exchange and routing key, with confirms
        unless ``confirms`` is False), on its own link to the queue for 1.0."""
        ...

    def management(self) -> ManagementApi:
        """The target's management API (a context manager), or an ``RbakError`` when it cannot be used."""
        ...

    def max_message_size(self, vhost: str) -> int | None:
        """The max-message-size the broker announces over AMQP 1.0 (None or 0: none); raises when it
        does not answer."""
        ...


@functools.cache
def proton_installed() -> bool:
    return importlib.util.find_spec("proton") is not None


class AmqpTransport:
    """A RabbitMQ target: 0-9-1 on rbak's own connection, 1.0 on Proton, the management API over HTTP."""

    def __init__(self, target: ConnectionConfig):
        self.target = target
        self.key = (target.host, target.port, target.username)
        self.amqp10 = proton_installed()

    def connect(self, vhost: str) -> Connection:
        return connect(self.target, vhost, "target")

    def publisher(self, conn: TargetConnection, vhost: str, queue: str, label: str, window: int,
                  confirms: bool, encoding: Encoding) -> Publisher:
        if encoding == "amqp10":
            # Proton costs about 160 ms to import (python -X importtime): only a restore over 1.0 pays it.
            from .amqp10_publisher import Amqp10Publisher  # noqa: PLC0415 - start-up (comment above)

            return Amqp10Publisher(self.target, vhost, queue, label, window)
        return ConfirmingPublisher(wire_connection(conn), label, window, confirms)

    def management(self) -> ManagementClient:
        return ManagementClient.for_connection(self.target, "target")

    def max_message_size(self, vhost: str) -> int | None:
        # Proton's import cost, as above: 3.x targets never ask.
        from .amqp10_publisher import announced_max_message_size  # noqa: PLC0415 - start-up (comment above)

        return announced_max_message_size(self.target, vhost)


def wire_connection(conn: TargetConnection) -> Connection:
    """``conn`` as rbak's AMQP 0-9-1 connection, which streams are read on and 0-9-1 publishes go through;
    the memory broker's connections have neither."""
    if isinstance(conn, Connection):
        return conn
    raise AmqpError(f"{type(conn).__name__} is not an AMQP 0-9-1 connection: it cannot read streams")
