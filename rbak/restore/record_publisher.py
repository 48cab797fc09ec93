"""Which protocol publishes a queue's records, and the publisher that switches when it must.

``restore.protocol``: ``auto`` (the default) and ``amqp091`` publish over rbak's own AMQP 0-9-1
connection. Measured against AMQP 1.0 on 4.0.5 and 4.3.6 (``benchmarks/restore_protocol.py``: 100 B,
1 KiB and 64 KiB bodies, 1, 4 and 16 queues at once; docs/performance.md), 1.0 was nowhere reliably
faster (median ratios 0.49-1.21, most below 1) and it carries fewer records exactly, so ``auto`` is
0-9-1 everywhere. ``amqp10`` publishes classic and quorum queues in ``queue`` mode over AMQP 1.0
(``broker.amqp10_publisher``) on a 4.x target: streams stay on 0-9-1 (a stream stores what it is sent,
so 1.0 would change the stored bytes) and so does ``exchange`` mode (the 0-9-1 ``mandatory``
return is what reports an unroutable record there).

A record 1.0 cannot carry exactly (``amqp10_message.encode_sections`` says
``None``) switches the queue to 0-9-1 for the rest of the run: every 1.0
message is accepted first, so the queue's order holds.

Both are ``broker.publisher.Publisher``s the options' transport opens (``RestoreOptions.broker``): the
broker's, or a broker in memory in tests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

from ..broker.publisher import Publisher
from ..broker.transport import TargetConnection, Transport
from ..config import ConnectionConfig
from ..errors import AmqpError
from ..format.record import BackupRecord
from .amqp10_message import SectionsCache
from .compat import version_tuple
from .options import RestoreOptions
from .plan import QueuePlan

log = logging.getLogger(__name__)
PROTOCOLS = ("auto", "amqp091", "amqp10")


def version_of(connection: TargetConnection) -> tuple[int, ...]:
    """The broker version a connection announced (``server_properties['version']``)."""
    props = connection.server_properties or {}
    v = props.get("version", b"")
    return version_tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))


def choose_protocol(setting: str, queue_type: str, publish_mode: str) -> str:
    """``amqp10`` or ``amqp091`` for one queue (pure): 1.0 only when asked for, where it can be used."""
    if setting == "amqp10" and queue_type != "stream" and publish_mode == "queue":
        return "amqp10"
    return "amqp091"


def check_amqp10_supported(target: ConnectionConfig, version: tuple[int, ...], transport: Transport,
                           field: str = "restore.protocol") -> None:
    """Raise unless this target can be reached over AMQP 1.0 here (an explicit ``amqp10`` setting)."""
    if version and version < (4, 0):
        raise AmqpError(f"{field}: amqp10 needs RabbitMQ 4.0 or later (native AMQP 1.0 with /queues/ addresses); "
                        f"the target runs {'.'.join(map(str, version))}: use amqp091 or auto")
    if not transport.amqp10:
        raise AmqpError(f"{field}: amqp10 needs the python-qpid-proton package (pip install python-qpid-proton)")
    if target.use_tls:
        raise AmqpError(f"{field}: amqp10 is not supported with TLS targets yet; use amqp091 or auto")


def protocol_for(options: RestoreOptions, plan: QueuePlan, connection: TargetConnection) -> str:
    chosen = choose_protocol(options.protocol, plan.queue_type, options.publish_mode)
    if chosen == "amqp10":
        check_amqp10_supported(options.target, version_of(connection), options.broker())
    return chosen


class RecordPublisher:
    """A queue's records over 1.0 while each one fits, then over 0-9-1; counters cover both."""

    def __init__(self, connection: TargetConnection, plan: QueuePlan, options: RestoreOptions, label: str,
                 properties_0091: Callable[[BackupRecord, int, str], bytes]):
        self.label = label
        self._props = properties_0091
        self._conn, self._plan, self._options = connection, plan, options
        self._transport = options.broker()
        self._p10: Publisher | None = None
        self._p091: Publisher | None = None
        self._sections = SectionsCache()
        self.protocol = protocol_for(options, plan, connection)
        if self.protocol == "amqp10":  # asked for: a target that cannot take it fails the queue, named
            self._p10 = self._transport.publisher(connection, plan.target_vhost, plan.target_queue, label,
                                                  options.produce_batch_size, True, "amqp10")
        if self._p10 is None:
            self._open_091()
        self._landed_token: Hashable = None
        self._landed = False

    def _open_091(self) -> Publisher:
        self._p091 = self._transport.publisher(self._conn, self._plan.target_vhost, self._plan.target_queue,
                                               self.label, self._options.produce_batch_size,
                                               self._options.publisher_confirms, "amqp091")
        return self._p091

    def _parts(self) -> list[Publisher]:
        return [p for p in (self._p10, self._p091) if p is not None]

    def publish(self, exchange: str, routing_key: str, r: BackupRecord, index: int, segment_key: str,
                token: Hashable) -> None:
        p091 = self._p091
        if p091 is None:
            p10 = self._p10
            assert p10 is not None  # one of the two is always open
            sections = self._sections(r)
            if sections is not None and p10.fits(len(sections) + len(r.body) + 8):
                p10.publish(exchange, routing_key, sections, r.body, token)
                return
            why = "its properties" if sections is None else "its size (over the broker's AMQP 1.0 max-message-size)"
            log.info("%s: record %d of %s needs AMQP 0-9-1 (1.0 cannot carry %s exactly); "
                     "the rest of this queue is published over 0-9-1", self.label, index, segment_key, why)
            p10.drain()
            p091 = self._open_091()
            self.protocol = "amqp10+amqp091"
        p091.publish(exchange, routing_key, self._props(r, index, segment_key), r.body, token)

    def mark_landed(self, token: Hashable) -> None:
        """A record a killed run had already enqueued now counts as restored."""
        self._landed_token, self._landed = token, True

    def take_progress(self) -> tuple[bool, Hashable]:
        adv, token = self._landed, self._landed_token
        self._landed = False
        for p in self._parts():  # 1.0 first: it always precedes 0-9-1 in a run
            a, t = p.take_progress()
            if a:
                adv, token = True, t
        return adv, token

    @property
    def published(self) -> int:
        return sum(p.published for p in self._parts())

    @property
    def confirmed(self) -> int:
        return sum(p.confirmed for p in self._parts())

    @property
    def failed(self) -> int:
        return sum(p.failed for p in self._parts())

    @property
    def in_flight(self) -> int:
        return sum(p.in_flight for p in self._parts())

    def drain(self, timeout: float = 120.0) -> None:
        for p in self._parts():
            p.drain(timeout)

    def close(self) -> None:
        for p in self._parts():
            p.close()
