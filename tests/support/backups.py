"""Helpers of the backup tests: fast publish/drain, a backup config for one vhost, reading a backup back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

import pika

from rbak.config import Config
from rbak.format.manifest import BackupManifest
from rbak.format.segment import decode_segment
from rbak.storage import open_storage


def backup_config(broker, vhost: str, store: Path | str, backup_id: str, state: Path | str, **backup: Any) -> Config:
    """A backup config limited to ``vhost`` (never touch other tests' vhosts on the shared brokers)."""
    return Config.from_dict({
        "mode": "backup",
        "backup_id": backup_id,
        "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                   "stream_port": broker.stream_port, "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "filesystem", "path": str(store)},
        "backup": {"include_definitions": False, **backup},
        "offset_storage": {"path": str(state), "sync_interval_secs": 0},
    }, env={})


def fast_publish(broker, vhost: str, queue: str, bodies: Iterable[bytes], declare: dict | None = None,
                 properties: pika.BasicProperties | None = None, window: int = 2000) -> int:
    """Publish with publisher confirms, up to ``window`` unconfirmed at once (pika's blocking
    confirm mode waits for each message: too slow for 50,000; without confirms a loaded
    quorum queue may drop some). Raises if any message is nacked."""
    raw = b"".join((properties or pika.BasicProperties(delivery_mode=2)).encode())
    n = 0
    pending: set[int] = set()
    nacked: list[int] = []
    with broker.wire(vhost) as conn:
        ch = conn.channel()
        if declare is not None:
            ch.declare(queue, durable=True, arguments=dict(declare))
        ch.select_confirms()

        def settle() -> None:
            for ack, tag, multiple in ch.acks:
                tags = [t for t in pending if t <= tag] if multiple else [tag]
                pending.difference_update(tags)
                if not ack:
                    nacked.extend(tags)
            ch.acks.clear()

        for body in bodies:
            ch.publish("", queue, raw, body, flush=False)
            n += 1
            pending.add(n)
            if n % 200 == 0:
                conn.flush()
            while len(pending) >= window:
                conn.pump(lambda: bool(ch.acks), timeout=0.05)
                settle()
        deadline = time.time() + 120
        while pending and time.time() < deadline:
            conn.pump(lambda: bool(ch.acks), timeout=0.05)
            settle()
    assert not pending, f"{len(pending)} publishes to {queue} never confirmed"
    assert not nacked, f"{len(nacked)} publishes to {queue} were nacked"
    return n


def wait_count(broker, vhost: str, queue: str, n: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while True:
        c = broker.message_count(vhost, queue)
        if c >= n:
            assert c == n, f"{queue}: {c} messages, expected {n}"
            return
        if time.time() > deadline:
            raise AssertionError(f"{queue}: only {c} of {n} messages arrived")
        time.sleep(0.1)


def drain(broker, vhost: str, queue: str, idle: float = 1.5) -> list[tuple[bytes, Any, bool]]:
    """Destructively consume everything (no-ack consumer: fast); (body, properties, redelivered) in order."""
    out = []
    with broker.connect(vhost) as conn:
        ch = conn.channel()
        for method, props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=idle):
            if method is None:
                break
            out.append((body, props, method.redelivered))
        ch.cancel()
    return out


def load(store: Path | str, backup_id: str) -> BackupManifest:
    s = open_storage(str(store))
    return BackupManifest.from_json(s.get(f"{backup_id}/manifest.json"))


def records(store: Path | str, manifest: BackupManifest, vhost: str, queue: str) -> list:
    s = open_storage(str(store))
    qb = manifest.find_queue(vhost, queue)
    assert qb is not None, f"{vhost}/{queue} not in the manifest"
    out = []
    for seg in qb.segments:
        out.extend(decode_segment(s.get(seg.key), seg.key).records)
    return out
