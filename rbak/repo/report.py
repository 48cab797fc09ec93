"""What is stored, as people and scripts read it: the rows and notes of ``list``, the object of ``describe``,
and their time formats. Shared by ``rbak list``/``describe`` and ``kubectl rbak list``/``describe``, so both
say the same of one backup; below the CLI layer, so the kubectl plugin imports no command module."""

from __future__ import annotations

from datetime import datetime, timezone

from ..format.manifest import BackupManifest


def fmt_ts(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_ms(ms: int | None) -> str:
    """An instant to the millisecond (an archive's recoverable-until)."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def list_obj(entries: list) -> list[dict]:
    """The JSON of ``list`` (also ``kubectl rbak list -o json``)."""
    out = []
    for e in entries:
        m = e.manifest
        out.append({
            "backup_id": e.backup_id,
            "status": e.status,
            "created_at": m.created_at if m else None,
            "completed_at": m.completed_at if m else None,
            "total_messages": m.total_messages if m else None,
            "total_bytes": m.total_bytes if m else None,
            "total_segments": m.total_segments if m else None,
            "queues": len(m.queues) if m else None,
            "queue_status": [x.to_json_obj() for x in m.queue_status] if m else [],
            "gaps": sum(g.count for _, g in m.gaps) if m else 0,
            "depends_on": sorted(m.depends_on) if m else [],
            "content": m.content if m else None,
            "encrypted": m.encryption is not None if m else None,
            "error": e.error,
            **({"note": e.note} if e.note else {}),
            **({"archive": m.archive.to_json_obj()} if m is not None and m.archive is not None else {}),
            **({"taps": taps} if (taps := _taps(m)) else {}),
        })
    return out


def _taps(m: BackupManifest | None) -> list[dict]:
    """The queue taps of an archive generation: each tap stream and the queue it records."""
    return [{"vhost": q.vhost, "stream": q.name, **q.stream.tap.to_json_obj()} for q in (m.queues if m else [])
            if q.stream is not None and q.stream.tap is not None]


def encrypted_label(m: BackupManifest) -> str:
    """``yes (key K)``, ``yes (envelope)`` or ``no``: whether a backup's segments are sealed."""
    if m.encryption is None:
        return "no"
    return "yes (envelope)" if m.encryption.envelope else f"yes (key {m.encryption.key_id})"


def list_notes(m: BackupManifest) -> str:
    """What ``list`` says beside the status: empty or definitions-only, not-backed-up queues, gaps, the chain."""
    out = []
    if m.content == "empty" and m.is_complete:
        out.append("empty: no message (restore without an id and prune's keep rules pass over it)")
    elif m.content == "definitions-only":
        out.append("definitions only (by backup.definitions_only)")
    short = [s for s in m.queue_status if s.status == "partial"]
    if short:
        out.append(", ".join(f"{s.vhost}/{s.name} " + (f"read {s.read} of {s.expected}" if s.expected is not None
                                                        else "damaged data skipped") for s in short[:3])
                   + (f" (+{len(short) - 3} more)" if len(short) > 3 else ""))
    rest = len(m.queue_status) - len(short)
    if rest:
        out.append(f"{rest} queue(s) not backed up")
    gaps = sum(g.count for _, g in m.gaps)
    if gaps:
        out.append(f"gaps: {gaps} message(s)")
    if m.depends_on:
        out.append("continues " + ", ".join(sorted(m.depends_on)))
    if m.archive is not None:
        out.append(f"archive {m.archive.name} ({'open' if m.archive.open else 'closed'}), recoverable until "
                   f"{fmt_ms(m.archive.recoverable_until)}")
    taps = [f"{q.vhost}/{q.stream.tap.queue}" for q in m.queues if q.stream is not None and q.stream.tap is not None]
    if taps:
        out.append(f"{len(taps)} queue tap(s): {', '.join(taps[:3])}" + (f" (+{len(taps) - 3} more)" if len(taps) > 3
                                                                          else ""))
    return "; ".join(out)


def describe_obj(m: BackupManifest) -> dict:
    """The JSON of ``describe``: the Rust tool's keys first, then more detail."""
    return {
        "backup_id": m.backup_id,
        "status": m.state,
        "created_at": m.created_at,
        "completed_at": m.completed_at,
        "source_cluster": m.source_cluster,
        "rabbitmq_version": m.rabbitmq_version,
        "backup_tool_version": m.backup_tool_version,
        "total_messages": m.total_messages,
        "total_bytes": m.total_bytes,
        "total_segments": m.total_segments,
        "definitions": m.definitions.to_json_obj() if m.definitions else None,
        "encryption": m.encryption.to_json_obj() if m.encryption else None,
        "encrypted": m.encryption is not None,
        "content": m.content,
        "queues": [
            {
                "name": q.name,
                "vhost": q.vhost,
                "queue_type": q.queue_type,
                "message_count": q.message_count,
                **({"expected_messages": q.expected_messages} if q.expected_messages is not None else {}),
                "first_message_timestamp": q.first_message_timestamp,
                "last_message_timestamp": q.last_message_timestamp,
                "segments": len(q.segments),
                "size_bytes": q.size_bytes,
                "max_body_bytes": q.max_body_bytes,  # None: not recorded (older backups; a restore scans)
                **({"stream": q.stream.to_json_obj()} if q.stream is not None else {}),
            }
            for q in m.queues
        ],
        "queue_status": [s.to_json_obj() for s in m.queue_status],
        "gaps": [{"vhost": q.vhost, "name": q.name, **g.to_json_obj()} for q, g in m.gaps],
        "depends_on": sorted(m.depends_on),
        **({"archive": {**m.archive.to_json_obj(), "recoverable_until_utc": fmt_ms(m.archive.recoverable_until)}}
           if m.archive is not None else {}),
    }
