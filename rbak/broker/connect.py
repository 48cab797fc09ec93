"""The one way rbak opens AMQP 0-9-1 connections (backup source, restore target, drills): rbak's
own connection (``broker.wire``) from a ``ConnectionConfig``, TLS done right, errors without secrets.

``amqps://`` (or ``tls.enabled``) always means TLS with certificate checks
unless ``tls.verify: false``; a handshake failure is an error, never a
plaintext retry. Failures are typed (``AmqpAuthenticationError``,
``AmqpConnectionError``) so metrics and callers classify them without
reading messages.
"""

from __future__ import annotations

import logging
import socket
import ssl

from .wire import Connection, Params
from ..config import ConnectionConfig
from ..errors import AmqpError

log = logging.getLogger(__name__)
CONNECTION_NAMES = {"source": "backup", "target": "restore"}  # what the broker's connection list shows


def ssl_context(conn: ConnectionConfig) -> ssl.SSLContext:
    tls = conn.tls
    ctx = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=tls.ca_cert or None)
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.client_cert:
        ctx.load_cert_chain(tls.client_cert, tls.client_key or None)
    return ctx


def connection_params(conn: ConnectionConfig, vhost: str, role: str = "source", name: str | None = None) -> Params:
    """``name``: the ``connection_name`` the broker shows (default ``rbak-backup VHOST`` / ``rbak-restore VHOST``)."""
    ctx = None
    if conn.use_tls:
        try:
            ctx = ssl_context(conn)
        except (OSError, ssl.SSLError) as e:
            raise AmqpError(f"cannot load TLS files from {role}.tls: {e}") from None
    return Params(host=conn.host, port=conn.port, vhost=vhost, username=conn.username, password=conn.password,
                  ssl_context=ctx, server_hostname=conn.tls.server_name or conn.host if ctx else None,
                  heartbeat=conn.heartbeat_secs, connect_timeout=conn.connection_timeout_secs,
                  client_properties={"connection_name": name or f"rbak-{CONNECTION_NAMES.get(role, role)} {vhost}"})


def connect(conn: ConnectionConfig, vhost: str, role: str = "source", name: str | None = None) -> Connection:
    """Open a connection to ``vhost`` or raise an ``AmqpError`` naming host, port and vhost
    (``role``: the config section, ``source`` or ``target``)."""
    return Connection.open(connection_params(conn, vhost, role, name))


def answers_http(conn: ConnectionConfig, timeout: float = 5.0) -> bool:
    """Whether ``amqp_url``'s port is an HTTP listener (the management API's port under another host name):
    asked in HTTP only after an AMQP connection failed, so that a long-running process can tell a setting
    to fix from a broker that is away (which it retries). Plain AMQP only: over TLS a failure says enough."""
    if conn.use_tls:
        return False
    try:
        with socket.create_connection((conn.host, conn.port), timeout=timeout) as s:
            s.sendall(b"GET / HTTP/1.0\r\nHost: " + conn.host.encode("idna") + b"\r\n\r\n")
            return s.recv(5) == b"HTTP/"
    except (OSError, UnicodeError):
        return False
