"""Which protocol publishes a queue's records, and the publisher that switches when it must.

``restore.protocol``: ``amqp091`` always uses pika; ``amqp10`` and ``auto``
publish classic and quorum queues in ``queue`` mode over AMQP 1.0
(``amqp10_publisher``), which is about twice as fast on 4.x; ``auto`` only
where it is known to be exact: a 4.1+ target, or 4.0 with the
``rabbitmq_4.0.0`` feature flag enabled (before it, 4.0 adds
``x-amqp-1.0-*`` headers on conversion), no TLS, Proton installed. Streams
stay on 0-9-1 (a stream stores what it is sent, so 1.0 would change the
stored bytes) and so does ``exchange`` mode (the 0-9-1 ``mandatory`` return
is what reports an unroutable record there).

A record 1.0 cannot carry exactly (``amqp10_message.encode_sections`` says
``None``) switches the queue to 0-9-1 for the rest of the run: every 1.0
message is accepted first, so the queue's order holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from functools import lru_cache
from typing import Any

from ..errors import AmqpError
from ..format.record import BackupRecord
from .amqp10_message import SectionsCache
from .publisher import ConfirmingPublisher

log = logging.getLogger(__name__)
PROTOCOLS = ("auto", "amqp091", "amqp10")


def version_of(connection: Any) -> tuple[int, ...]:
    """The broker version a connection announced (``server_properties['version']``)."""
    from .compat import version_tuple

    props = connection.server_properties or {}
    v = props.get("version", b"")
    return version_tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))


def choose_protocol(setting: str, version: tuple[int, ...], queue_type: str, publish_mode: str,
                    proton_ok: bool, tls: bool, v4_flag: Callable[[], bool]) -> str:
    """``amqp10`` or ``amqp091`` for one queue (pure but for the lazy ``v4_flag`` lookup)."""
    if setting == "amqp091" or queue_type == "stream" or publish_mode != "queue":
        return "amqp091"
    if setting == "amqp10":
        return "amqp10"
    if not proton_ok or tls or not version or version < (4, 0):
        return "amqp091"
    if version < (4, 1) and not v4_flag():
        return "amqp091"
    return "amqp10"


@lru_cache(maxsize=16)
def _flag_enabled(management_url: str, user: str, password: str, timeout: float) -> bool:
    from ..management import ManagementClient

    try:
        with ManagementClient(management_url, user, password, timeout=timeout) as client:
            flags = client.feature_flags() or []
    except Exception as e:  # noqa: BLE001 - no management API: stay on 0-9-1
        log.info("cannot read the target's feature flags (%s): publishing over AMQP 0-9-1", e)
        return False
    return any(f.get("name") == "rabbitmq_4.0.0" and f.get("state") == "enabled" for f in flags)


def protocol_for(options: Any, plan: Any, connection: Any) -> str:
    from .amqp10_publisher import check_amqp10_supported, proton_available

    t = options.target
    setting = getattr(options, "protocol", "auto")
    chosen = choose_protocol(setting, version_of(connection), plan.queue_type, options.publish_mode,
                             proton_available(), t.use_tls,
                             lambda: _flag_enabled(t.management_url, t.mgmt_username, t.mgmt_password,
                                                   t.connection_timeout_secs))
    if chosen == "amqp10" and setting == "amqp10":
        check_amqp10_supported(t, version_of(connection))
    return chosen


class RecordPublisher:
    """A queue's records over 1.0 while each one fits, then over 0-9-1; counters cover both."""

    def __init__(self, connection: Any, plan: Any, options: Any, label: str,
                 properties_0091: Callable[[BackupRecord, int, str], bytes]):
        self.label = label
        self._props = properties_0091
        self._conn, self._options = connection, options
        self._p10 = None
        self._p091: ConfirmingPublisher | None = None
        self._sections = SectionsCache()
        self.protocol = protocol_for(options, plan, connection)
        if self.protocol == "amqp10":
            from .amqp10_publisher import Amqp10Publisher

            try:
                self._p10 = Amqp10Publisher(options.target, plan.target_vhost, plan.target_queue, label,
                                            options.produce_batch_size)
            except AmqpError as e:
                if getattr(options, "protocol", "auto") == "amqp10":
                    raise
                log.warning("%s: AMQP 1.0 unavailable (%s); publishing over AMQP 0-9-1", label, e)
                self.protocol = "amqp091"
        if self._p10 is None:
            self._open_091()
        self._landed_token: Hashable = None
        self._landed = False

    def _open_091(self) -> ConfirmingPublisher:
        self._p091 = ConfirmingPublisher(self._conn, self.label, self._options.produce_batch_size,
                                         self._options.publisher_confirms)
        return self._p091

    def _parts(self) -> list[Any]:
        return [p for p in (self._p10, self._p091) if p is not None]

    def publish(self, exchange: str, routing_key: str, r: BackupRecord, index: int, segment_key: str,
                token: Hashable) -> None:
        p091 = self._p091
        if p091 is None:
            p10 = self._p10
            assert p10 is not None  # one of the two is always open
            sections = self._sections(r)
            if sections is not None and p10.fits(len(sections) + len(r.body) + 8):
                p10.publish(sections, r.body, token)
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
