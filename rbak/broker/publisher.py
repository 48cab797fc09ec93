"""The one contract for publishing a queue's messages with confirms, kept by every transport.

httpx's transports are the model: one interface, several implementations, a mock one for tests. Here the
restore publishes through a ``Publisher`` and never sees the protocol under it:

- ``amqp091_publisher.ConfirmingPublisher``: AMQP 0-9-1 on rbak's own connection (``wire``);
- ``amqp10_publisher.Amqp10Publisher``: AMQP 1.0 on Qpid Proton's engine (RabbitMQ 4.x);
- ``memory.MemoryPublisher``: a broker in memory, for tests of the restore's logic without a RabbitMQ.

A ``transport.Transport`` opens them. What every one of them promises:

- ``publish`` sends one message in order; it blocks while ``window`` messages are unconfirmed.
- A message counts as ``confirmed`` only once the broker accepted it and every message published before it;
  ``take_progress`` gives the token of the last message of that confirmed prefix, so a checkpoint never
  records a message the broker may not hold.
- Anything but an accept (a nack, a return of an unroutable message, a closed channel, link or connection)
  counts the message as ``failed``, sets ``failure`` (naming the queue) and raises ``PublishError`` on the
  next call; nothing published after a failed message counts as confirmed.
- ``drain`` waits for every confirm (or raises); ``close`` never raises.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Literal, Protocol

Encoding = Literal["amqp091", "amqp10"]


class Publisher(Protocol):
    """One queue's ordered publishing with confirms (see the module docstring for the contract)."""

    label: str  # "queue 'q' in vhost 'v'": what errors name
    # What ``publish`` takes as ``header``: "amqp091" the encoded basic properties
    # (``format.amqp091.encode_basic_properties``), "amqp10" the encoded message sections before the body's
    # data section (``restore.amqp10_message``).
    encoding: Encoding
    published: int
    confirmed: int  # the confirmed prefix's length
    failed: int
    failure: str | None

    def fits(self, size: int) -> bool:
        """Whether a message of ``size`` encoded bytes is within the largest one the broker announced it
        takes (AMQP 1.0's max-message-size); True when it announced none (0-9-1 checks at publish)."""
        ...

    def publish(self, exchange: str, routing_key: str, header: bytes, body: bytes, token: Hashable) -> None:
        """Send one message (an AMQP 1.0 link has one address: it ignores ``exchange`` and ``routing_key``)."""
        ...

    def take_progress(self) -> tuple[bool, Hashable]:
        """(whether the confirmed prefix grew since the last call, the token of its last message)."""
        ...

    @property
    def in_flight(self) -> int:
        """Messages published and neither confirmed nor failed yet."""
        ...

    def drain(self, timeout: float = 120.0) -> None:
        """Wait until every published message is confirmed; raise ``PublishError`` otherwise."""
        ...

    def close(self) -> None:
        ...
