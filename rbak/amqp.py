"""The one way rbak opens AMQP connections (backup source, restore target, drills): pika
connections from a ``ConnectionConfig``, TLS done right, errors without secrets.

``amqps://`` (or ``tls.enabled``) always means TLS with certificate checks
unless ``tls.verify: false``; a handshake failure is an error, never a
plaintext retry. Failures are typed (``AmqpAuthenticationError``,
``AmqpConnectionError``) so metrics and callers classify them without
reading messages.
"""

from __future__ import annotations

import logging
import ssl

import pika
import pika.exceptions

from .config import ConnectionConfig
from .errors import AmqpAuthenticationError, AmqpConnectionError, AmqpError

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


def connection_parameters(conn: ConnectionConfig, vhost: str, role: str = "source",
                          name: str | None = None) -> pika.ConnectionParameters:
    """``name``: the ``connection_name`` the broker shows (default ``rbak-backup VHOST`` / ``rbak-restore VHOST``)."""
    kw = {}
    if conn.use_tls:
        try:
            ctx = ssl_context(conn)
        except (OSError, ssl.SSLError) as e:
            raise AmqpError(f"cannot load TLS files from {role}.tls: {e}") from None
        kw["ssl_options"] = pika.SSLOptions(ctx, conn.tls.server_name or conn.host)
    return pika.ConnectionParameters(
        host=conn.host,
        port=conn.port,
        virtual_host=vhost,
        credentials=pika.PlainCredentials(conn.username, conn.password),
        heartbeat=conn.heartbeat_secs,
        blocked_connection_timeout=300,
        connection_attempts=1,
        socket_timeout=conn.connection_timeout_secs,
        stack_timeout=conn.connection_timeout_secs + 5,
        client_properties={"connection_name": name or f"rbak-{CONNECTION_NAMES.get(role, role)} {vhost}",
                           "product": "rbak"},
        **kw,
    )


def connect(conn: ConnectionConfig, vhost: str, role: str = "source", name: str | None = None) -> pika.BlockingConnection:
    """Open a connection to ``vhost`` or raise an ``AmqpError`` naming host, port and vhost
    (``role``: the config section, ``source`` or ``target``)."""
    where = f"{'amqps' if conn.use_tls else 'amqp'}://{conn.host}:{conn.port} vhost {vhost!r}"
    params = connection_parameters(conn, vhost, role, name)
    try:
        return pika.BlockingConnection(params)
    except pika.exceptions.ProbableAuthenticationError:
        raise AmqpAuthenticationError(f"{where}: authentication failed for user {conn.username!r}") from None
    except pika.exceptions.ProbableAccessDeniedError:
        raise AmqpAuthenticationError(f"{where}: access to the vhost was refused for user {conn.username!r}") from None
    except pika.exceptions.AMQPConnectionError as e:
        raise AmqpConnectionError(f"{where}: cannot connect ({_cause(e)})") from None
    except (OSError, ssl.SSLError) as e:
        raise AmqpConnectionError(f"{where}: cannot connect ({_cause(e)})") from None


def _cause(e: BaseException) -> str:
    """Dig the root cause (e.g. the SSL verification error) out of pika's wrappers."""
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(seen) < 8:
        seen.append(cur)
        inner = getattr(cur, "exception", None)  # pika's connector errors keep the socket's error here
        nxt = inner if isinstance(inner, BaseException) else None
        for a in () if nxt is not None else getattr(cur, "args", ()):
            if isinstance(a, BaseException):
                nxt = a
                break
        cur = nxt or cur.__cause__ or cur.__context__
    for x in seen:
        if isinstance(x, ssl.SSLCertVerificationError):
            return f"TLS certificate verification failed: {x.verify_message}"
        if isinstance(x, ssl.SSLError):
            return f"TLS error: {x.reason or x}"
    text = " / ".join(str(x) for x in seen if str(x))
    return text[:300] or type(e).__name__
