"""Every stream of a stopped node (``<node dir>/stream/<dir>/``) as RBAK records.

A record is what the online stream backup stores for the same message (see
``rbak.backup.stream_backup.StreamJob``): the message as an AMQP 0-9-1 consumer gets
it, minus the ``x-stream-offset``/``x-stream-chunk-timestamp`` headers the
broker adds on delivery, with ``delivery_tag`` the message's stream offset
(the RBAK spec's meaning of ``delivery_tag`` for streams) and
``redelivered`` false.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from ...format.record import BackupRecord
from .damage import ImportContext
from .names import known_queue_names, name_stream_dir
from .osiris import iter_stream, segment_files
from .stream_message import decode_stream_message, decode_v3_stream_message, is_v3_message
from ...errors import Amqp10Error, MappingError


def message_containers(node_dir: str) -> bool | None:
    """Whether the node delivered stream messages through message containers (3.13+/4.x), from the
    ``<node>-feature_flags`` file beside its data dir; None when that file is not there."""
    try:
        with open(node_dir.rstrip("/") + "-feature_flags", "rb") as f:
            return b"message_containers" in f.read()
    except OSError:
        return None


@dataclass
class StreamDir:
    path: str
    vhost: str
    name: str
    mc: bool | None = None  # message_containers(); None: judged per message
    first_offset: int | None = None
    last_offset: int | None = None
    exported: int = 0


def stream_dirs(node_dir: str, ctx: ImportContext) -> list[StreamDir]:
    """Named stream directories, by (vhost, name); unnamable ones reported as damaged."""
    root = os.path.join(node_dir, "stream")
    try:
        dirs = sorted(e.name for e in os.scandir(root) if e.is_dir())
    except OSError:
        return []
    if not dirs:
        return []
    cands = known_queue_names(node_dir)
    out = []
    for d in dirs:
        path = os.path.join(root, d)
        if not segment_files(path):
            continue
        named = name_stream_dir(d, cands)
        if named is None:
            ctx.damaged(path, None, "cannot tell which vhost/stream this directory belongs to (no queue record "
                        "in the node's Mnesia or Khepri files matches its name)", then="skipped")
            continue
        out.append(StreamDir(path, named[0], named[1], message_containers(node_dir)))
    out.sort(key=lambda s: (s.vhost, s.name))
    return out


def stream_records(s: StreamDir, ctx: ImportContext, backed_up_at: int,
                   from_offset: int | None = None) -> Iterator[BackupRecord]:
    ctx.reading("stream", s.vhost, s.name)
    try:
        for r in iter_stream(s.path, ctx, from_offset):
            try:
                legacy = (not s.mc) if s.mc is not None else is_v3_message(r.data)
                m = decode_v3_stream_message(r.data, s.name) if legacy else decode_stream_message(r.data)
            except (Amqp10Error, MappingError) as e:
                where = getattr(e, "offset", None)
                ctx.damaged(r.path, r.pos, f"offset {r.offset}: not a message RabbitMQ can deliver over AMQP "
                            f"0-9-1 ({e}{'' if where is None else f', byte {where} of the record'})")
                continue
            if s.first_offset is None:
                s.first_offset = r.offset
            s.last_offset = r.offset
            s.exported += 1
            yield BackupRecord(
                body=m.body, properties=m.properties, headers=m.headers, exchange=m.exchange,
                routing_key=m.routing_key, delivery_tag=r.offset, redelivered=False, backed_up_at=backed_up_at,
                source_queue=s.name, source_vhost=s.vhost,
            )
    finally:
        ctx.done_reading()
