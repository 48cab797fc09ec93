"""A record larger than the target's ``max_message_size``, found before the first publish.

RabbitMQ refuses a message whose body is over ``max_message_size`` (rabbitmq.conf; 4.x's default is
16 MiB, 3.x's 128 MiB) by closing the channel with a 406, so a migration restore from 3.x used to
publish until the first such message and fail there. The backup records each segment's largest body
(``SegmentMetadata.max_body_bytes``, an rbak extension); a backup written before that, or by another
tool, is scanned, but only in segments whose uncompressed payload could hold a body over the limit.

The limit itself: a 4.x broker announces it in every AMQP 1.0 attach (``max-message-size``), read here
on one short connection per target (the anonymous terminus, so no queue is touched). 3.x says it
nowhere an rbak client can read (not in the management API either): the check is then skipped, with a
warning. Bodies are compared (what the 0-9-1 check counts); a body that fits but whose AMQP 1.0
encoding does not is published over 0-9-1 by the record publisher.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from ..config import ConnectionConfig
from ..sealing.crypto import ObjectCodec
from .options import RestoreOptions
from .plan import QueuePlan, record_in_window, segment_fully_inside
from .source import BackupSource

log = logging.getLogger(__name__)

SETTING = "max_message_size"


@dataclass(frozen=True)
class SizeLimit:
    limit: int
    source: str  # where the figure comes from, for the refusal

    def describe(self) -> str:
        return f"{SETTING} {self.limit} ({self.source})"


@dataclass(frozen=True)
class Oversize:
    segment: str
    index: int
    size: int

    def to_json_obj(self) -> dict[str, Any]:
        return {"segment": self.segment, "index": self.index, "bytes": self.size}


_cache: dict[tuple[str, int, str], SizeLimit | None] = {}
_lock = threading.Lock()


def target_limit(target: ConnectionConfig, vhost: str, version: tuple[int, ...],
                 skip_asked: bool = False) -> SizeLimit | None:
    """The target's max_message_size, or None when it cannot be read (3.x, TLS, no Proton, no answer:
    said at DEBUG (documented: restore.md), or as a warning when ``skip_asked``, since allow_oversize_skip
    cannot take effect then).
    Read once per broker and process (every queue of a restore asks)."""
    key = (target.host, target.port, target.username)
    with _lock:
        if key in _cache:
            return _cache[key]
    found = _read_limit(target, vhost, version, logging.WARNING if skip_asked else logging.DEBUG)
    with _lock:
        _cache[key] = found
    return found


def _read_limit(target: ConnectionConfig, vhost: str, version: tuple[int, ...], level: int) -> SizeLimit | None:
    shown = ".".join(map(str, version)) or "unknown"
    if not version or version < (4, 0):
        log.log(level, "the target (RabbitMQ %s) does not say its %s (RabbitMQ 3.x reports it nowhere a client can "
                "read; its default is 134217728): not checked before publishing, and a record over it fails its "
                "queue when it is published", shown, SETTING)
        return None
    if target.use_tls:
        log.log(level, "the target's %s is not read over TLS (AMQP 1.0 attach): not checked before publishing",
                SETTING)
        return None
    try:
        from proton.utils import BlockingConnection
    except ImportError:
        log.log(level, "python-qpid-proton is not installed: the target's %s is not checked before publishing",
                SETTING)
        return None
    try:
        conn = BlockingConnection(f"amqp://{target.host}:{target.port}", timeout=target.connection_timeout_secs,
                                  user=target.username, password=target.password, virtual_host=f"vhost:{vhost}",
                                  allowed_mechs="PLAIN", allow_insecure_mechs=True)
        try:
            limit = conn.create_sender(None).link.remote_max_message_size
        finally:
            conn.close()
    except Exception as e:  # noqa: BLE001 - no answer: the publish itself still fails clearly
        log.log(level, "cannot read the target's %s over AMQP 1.0 (%s): not checked before publishing", SETTING, e)
        return None
    if not limit:
        return None
    return SizeLimit(int(limit), f"RabbitMQ {shown}, as its AMQP 1.0 attach announces it")


def oversize_records(source: BackupSource, plan: QueuePlan, options: RestoreOptions, codec: ObjectCodec | None,
                     limit: int, resume: tuple[int, int] = (0, 0)) -> list[Oversize]:
    """Every record still to publish (after ``resume``, inside the window) whose body is over ``limit``.
    Reads only segments that may hold one: recorded largest body over the limit, or not recorded and
    an uncompressed payload over it (a body is always smaller than its record)."""
    out: list[Oversize] = []
    s, e = options.window_start_ms, options.window_end_ms
    for seg in plan.segments:
        if seg.sequence < resume[0]:
            continue
        largest = seg.max_body_bytes if seg.max_body_bytes is not None else seg.uncompressed_bytes
        if largest <= limit:
            continue
        start = resume[1] if seg.sequence == resume[0] else 0
        whole = segment_fully_inside(seg.first_timestamp, seg.last_timestamp, s, e)
        for i, r in source.records(seg, options.verify_checksums, start, codec=codec):
            if len(r.body) > limit and (whole or record_in_window(r.backed_up_at, s, e)):
                out.append(Oversize(seg.key, i, len(r.body)))
    return out


def refusal(plan: QueuePlan, found: list[Oversize], limit: SizeLimit) -> str:
    """The one line refusing a queue: the size, the limit and the setting."""
    first = found[0]
    more = f" (and {len(found) - 1} more over it)" if len(found) > 1 else ""
    return (f"{plan.label} -> {plan.target_label}: record {first.index} of {first.segment} has a {first.size}-byte "
            f"body, over the target's {limit.describe()}{more}; the broker would refuse it (406) half-way through. "
            f"Nothing was published. Raise {SETTING} in the target's rabbitmq.conf, or set "
            f"restore.allow_oversize_skip: true (--allow-oversize-skip) to restore the rest and list each skipped "
            f"record in the summary")
