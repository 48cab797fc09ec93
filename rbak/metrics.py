"""Prometheus metrics of backups and restores, named like the Rust tool's, and their endpoint.

Backup: ``rabbitmq_backup_messages_read_total``, ``_bytes_read_total``,
``_segments_written_total``, ``_segment_bytes_total`` (labels ``vhost``,
``queue``, ``queue_type``), ``rabbitmq_backup_checkpoint_syncs_total``,
``rabbitmq_backup_active_connections``. Restore:
``rabbitmq_backup_messages_published_total`` / ``_confirmed_total`` /
``_failed_total`` (labels ``vhost``, ``queue``: the target's). Both:
``rabbitmq_backup_errors_total`` by ``error_type``, classified by exception
type. Labels never carry credentials: only vhost and queue names.

Collectors are created once per process and looked up again when asked for
twice (prometheus-client refuses duplicate registrations).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, Counter, Gauge, make_wsgi_app

from .config import MetricsConfig
from .errors import (AmqpAuthenticationError, AmqpConnectionError, AmqpError, CheckpointError, ConfigError,
                     DeliveryLimitError, ManagementApiError, SerializationError, StorageError)

log = logging.getLogger(__name__)
_lock = threading.Lock()
Q_LABELS = ("vhost", "queue", "queue_type")
T_LABELS = ("vhost", "queue")


def _get(kind, name: str, doc: str, labels: tuple[str, ...]):
    with _lock:
        for n in (name, name + "_total"):
            existing = REGISTRY._names_to_collectors.get(n)  # noqa: SLF001 - no public lookup API
            if existing is not None:
                return existing
        return kind(name, doc, labels)


def messages_read() -> Counter:
    return _get(Counter, "rabbitmq_backup_messages_read", "Messages read by backups.", Q_LABELS)


def bytes_read() -> Counter:
    return _get(Counter, "rabbitmq_backup_bytes_read", "Message body bytes read by backups.", Q_LABELS)


def segments_written() -> Counter:
    return _get(Counter, "rabbitmq_backup_segments_written", "Segments written by backups.", Q_LABELS)


def segment_bytes() -> Counter:
    return _get(Counter, "rabbitmq_backup_segment_bytes", "Segment bytes (compressed) written.", Q_LABELS)


def checkpoint_syncs() -> Counter:
    return _get(Counter, "rabbitmq_backup_checkpoint_syncs", "Checkpoint database syncs to storage.", ())


def active_connections() -> Gauge:
    return _get(Gauge, "rabbitmq_backup_active_connections", "Open AMQP connections of the backup.", ())


def published() -> Counter:
    return _get(Counter, "rabbitmq_backup_messages_published", "Messages published by restores.", T_LABELS)


def confirmed() -> Counter:
    return _get(Counter, "rabbitmq_backup_messages_confirmed", "Restored messages confirmed by the broker.", T_LABELS)


def failed() -> Counter:
    return _get(Counter, "rabbitmq_backup_messages_failed", "Restored messages returned, nacked or lost.", T_LABELS)


def errors() -> Counter:
    return _get(Counter, "rabbitmq_backup_errors", "Errors by kind.", ("error_type",))


def error_type(e: BaseException) -> str:
    if isinstance(e, DeliveryLimitError):
        return "delivery_limit"
    if isinstance(e, AmqpAuthenticationError):
        return "authentication"
    if isinstance(e, AmqpConnectionError):
        return "connection"
    if isinstance(e, AmqpError):
        return "amqp"
    if isinstance(e, ManagementApiError):
        return "authentication" if e.status == 401 else "management"
    if isinstance(e, StorageError):
        return "storage"
    if isinstance(e, SerializationError):
        return "serialization"
    if isinstance(e, CheckpointError):
        return "checkpoint"
    return "other"


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # no per-scrape log lines
        pass


def serve(cfg: MetricsConfig):
    """Serve ``cfg.path`` on ``cfg.bind:cfg.port`` in a daemon thread; returns the server (``.shutdown()``)."""
    app = make_wsgi_app(REGISTRY)

    def only_path(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") != cfg.path:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"metrics are at {cfg.path}\n".encode()]
        return app(environ, start_response)

    try:
        httpd = make_server(cfg.bind, cfg.port, only_path, handler_class=_Quiet)
    except OSError as e:
        raise ConfigError(f"metrics.port: cannot listen on {cfg.bind}:{cfg.port}: {e}") from None
    t = threading.Thread(target=httpd.serve_forever, name="rbak-metrics", daemon=True)
    t.start()
    log.info("metrics on http://%s:%d%s", cfg.bind, httpd.server_port, cfg.path)
    return httpd


# -- rbak archive (labels vhost, stream) -------------------------------------------------------------
A_LABELS = ("vhost", "stream")


def archive_lag() -> Gauge:
    return _get(Gauge, "rbak_archive_lag_seconds", "How far behind the broker the archive's complete-until of "
                "each stream is (from the broker's committed end and chunk timestamps).", A_LABELS)


def archive_recoverable() -> Gauge:
    return _get(Gauge, "rbak_archive_recoverable_timestamp_seconds", "Every record the broker stamped up to this "
                "time (epoch seconds) is archived, per stream.", A_LABELS)


def archive_records() -> Counter:
    return _get(Counter, "rbak_archive_records", "Records read by the archiver.", A_LABELS)


def archive_bytes() -> Counter:
    return _get(Counter, "rbak_archive_bytes", "Message body bytes read by the archiver.", A_LABELS)


def archive_gaps() -> Gauge:
    return _get(Gauge, "rbak_archive_gaps", "Gaps (offsets the stream's retention removed before the archive read "
                "them) recorded in the open generation, per stream.", A_LABELS)


def archive_uploads() -> Counter:
    return _get(Counter, "rbak_archive_uploads", "Objects the archiver stored, by kind (segment, tick, manifest).",
                ("kind",))


def archive_waiting() -> Gauge:
    return _get(Gauge, "rbak_archive_waiting", "1 while another archiver of this source holds the archive lease.", ())
