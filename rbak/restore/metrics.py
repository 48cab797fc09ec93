"""Prometheus counters of the restore, named like the Rust tool's metrics.

``rabbitmq_backup_messages_published_total`` / ``_confirmed_total`` /
``_failed_total`` with labels ``vhost`` and ``queue`` (the target's), and
``rabbitmq_backup_errors_total`` by ``error_type``. Collectors are created
once per process and looked up again if another module registered the same
name first (prometheus-client refuses duplicate registrations).
"""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, Counter

_lock = threading.Lock()


def _counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
    with _lock:
        existing = REGISTRY._names_to_collectors.get(name)  # noqa: SLF001 - no public lookup API
        if existing is None:
            existing = REGISTRY._names_to_collectors.get(name + "_total")  # noqa: SLF001
        if existing is not None:
            return existing  # type: ignore[return-value]
        return Counter(name, doc, labels)


def published() -> Counter:
    return _counter("rabbitmq_backup_messages_published", "Messages published by restores.", ("vhost", "queue"))


def confirmed() -> Counter:
    return _counter("rabbitmq_backup_messages_confirmed", "Restored messages confirmed by the broker.", ("vhost", "queue"))


def failed() -> Counter:
    return _counter("rabbitmq_backup_messages_failed", "Restored messages returned, nacked or lost.", ("vhost", "queue"))


def errors() -> Counter:
    return _counter("rabbitmq_backup_errors", "Errors by kind.", ("error_type",))
