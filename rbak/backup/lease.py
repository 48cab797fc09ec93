"""One backup per source at a time: a lease the broker itself holds.

Two backups of the same queues at once each hold part of them unacked, so each reads short
(issue 27: 0 / 13,180 of 20,000). Before anything is written to storage a backup declares the
exclusive queue ``rbak.lease`` in every vhost it reads, on a connection of its own named after the
backup (``connection_name``: backup id, host, pid). The broker allows one owner per exclusive
queue: a second declare gets ``405 RESOURCE_LOCKED``, and the queue dies with its connection, so
a crashed holder (killed process, lost pod) frees it as soon as the broker sees the connection
go (at once for a closed socket, within two heartbeats for a silent peer). Nothing is stored
anywhere, so it works across processes, machines and pods, whatever the storage.

The lease queue is never backed up (``LEASE_QUEUE`` is left out of the queue selection) and
RabbitMQ leaves exclusive queues out of its definitions export. It holds no messages.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Callable

from ..broker.wire import Connection
from ..errors import BackupLeaseError, ChannelClosedByBroker, ConfigError, ManagementApiError
from ..config import Config
from ..broker.management import ManagementClient, q

log = logging.getLogger(__name__)

LEASE_QUEUE = "rbak.lease"
"""Reserved: the exclusive queue that is a backup's lease on a vhost (never backed up)."""
ARCHIVE_LEASE_QUEUE = "rbak.lease.archive"
"""Reserved: the lease of ``rbak archive`` (one archiver per vhost; never backed up either)."""
POLL_SECS = 1.0
HOLDER_WAIT_SECS = 5.0  # how long the management API may take to report the lease's owner


def holder_name(backup_id: str) -> str:
    """The connection name the broker shows for a lease (and the error of a second backup quotes)."""
    return f"rbak-backup {backup_id} lease (pid {os.getpid()} on {socket.gethostname()})"


class Lease:
    """The leases of one run, one connection per vhost; ``release`` (or the process ending) frees them.

    A connection answers the broker's heartbeats only while something drives its I/O (``wire``),
    so a keeper thread does that for all lease connections (no other thread uses them). A lease the
    broker drops (its connection closed, a restart) is taken again at once when no one else holds
    it; while this run holds none (a *gap*), another backup can start and hold messages unacked that
    a read starting then cannot see, so such reads are recorded partial (``at_risk``)."""

    def __init__(self, retake: Callable[[str], Connection | str] | None = None, queue: str = LEASE_QUEUE) -> None:
        self.connections: dict[str, Connection] = {}
        self.queue = queue  # each of ``connections`` owns it in its vhost (deleted on release)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: list[str] = []
        self.waited = False  # another backup held a lease first
        # ``retake(vhost)``: a new connection owning the vhost's lease again, or why not (e.g. its holder)
        self._retake = retake
        self._gaps: dict[str, list[list]] = {}  # vhost -> [[lost at, taken again at or None, why], ...]
        self._lock = threading.Lock()

    def at_risk(self, vhost: str, started: float, ended: float | None = None) -> str | None:
        """Why a read of a queue in ``vhost`` that measured its depth at ``started`` (monotonic; or at
        some time up to ``ended``) cannot be trusted complete, or None when this run held the lease then."""
        last = started if ended is None else ended
        with self._lock:
            for lost, back, why in self._gaps.get(vhost, []):
                if lost <= last and (back is None or started < back):
                    return (f"the backup lease on vhost {vhost!r} was lost when this queue's read started "
                            f"({why}): another backup may have held messages unacked that this read could not see")
        return None

    def start(self) -> None:
        if self.connections and self._thread is None:
            self._thread = threading.Thread(target=self._keep, name="rbak-lease", daemon=True)
            self._thread.start()

    def _keep(self) -> None:
        vhosts = list(self.connections)
        while not self._stop.is_set():
            for vhost in vhosts:
                conn = self.connections.get(vhost)
                if conn is None:
                    self._take_again(vhost)
                    continue
                try:
                    conn.sleep(0)
                except Exception as e:  # noqa: BLE001 - a lost lease is taken again, or what it risks recorded
                    self.connections.pop(vhost, None)
                    if vhost not in self.lost:
                        self.lost.append(vhost)
                    with self._lock:
                        self._gaps.setdefault(vhost, []).append([time.monotonic(), None, "not taken again yet"])
                    log.warning("the backup lease on vhost %r was lost (%r); taking it again", vhost, e)
                    self._take_again(vhost)
            self._stop.wait(POLL_SECS)

    def _take_again(self, vhost: str) -> None:
        try:
            got = self._retake(vhost) if self._retake is not None else "this run cannot take it again"
        except Exception as e:  # noqa: BLE001 - the broker may be away; the readers say so themselves
            got = f"taking it again failed: {e}"
        with self._lock:
            gap = self._gaps[vhost][-1]
            if isinstance(got, str):
                if gap[2] != got:
                    log.warning("vhost %r: the backup lease is not back: %s; queues whose read starts now are "
                                "recorded partial", vhost, got)
                gap[2] = got
                return
            gap[1] = time.monotonic()
            self.connections[vhost] = got
        log.warning("vhost %r: the backup lease was taken again (no other backup held it)", vhost)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for vhost, conn in self.connections.items():
            try:
                if conn.is_open:
                    # Deleted before the close: the broker drops a closed connection's exclusive queue when it
                    # has finished with the connection, which a loaded broker did after this returned (CI,
                    # 3.10.8: the next backup refused, naming this run as holder). Delete-Ok: it is gone.
                    ch = conn.channel()
                    ch.delete(self.queue)
                    ch.close()
            except Exception as e:  # noqa: BLE001 - closing the socket frees the lease anyway, a little later
                log.debug("vhost %r: deleting the lease queue: %r", vhost, e)
            try:
                conn.close()
            except Exception as e:  # noqa: BLE001 - closing the socket frees the lease anyway
                log.debug("closing a lease connection: %r", e)
        self.connections.clear()


def acquire(cfg: Config, client: ManagementClient, vhosts: list[str],
            connect: Callable[[str, str], Connection],
            sleep: Callable[[float], None] = time.sleep, queue: str = LEASE_QUEUE,
            name: str | None = None) -> Lease:
    """Take the lease on every vhost, waiting up to ``backup.lease_wait_secs`` for a holder to finish.

    ``connect(vhost, connection_name)`` opens the lease connection (it also proves the AMQP port,
    credentials and vhost access before anything is written). ``queue``: the lease queue (an
    archiver holds ``ARCHIVE_LEASE_QUEUE``, so it never blocks scheduled backups); ``name``: the
    holder's connection name."""
    name = name or holder_name(cfg.backup_id or "")

    def retake(vhost: str) -> Connection | str:
        conn = connect(vhost, name)
        held, holder = _declare(conn, vhost, client, cfg, queue)
        if not held:
            return conn
        conn.close()
        return f"{holder or 'another connection'} holds it now"

    lease = Lease(retake, queue)
    deadline = time.monotonic() + cfg.backup.lease_wait_secs
    conn: Connection | None = None  # a vhost's connection until it owns the lease; then the lease's
    try:
        for vhost in vhosts:
            conn = connect(vhost, name)
            waited = False
            while True:
                held, holder = _declare(conn, vhost, client, cfg, queue)
                if not held:
                    lease.connections[vhost], conn = conn, None
                    break
                lease.waited = True
                if holder is None:
                    continue  # released while we asked who held it
                if time.monotonic() >= deadline:
                    how = f" (waited {cfg.backup.lease_wait_secs:g}s, backup.lease_wait_secs)" if waited else ""
                    raise BackupLeaseError(
                        f"vhost {vhost!r}: another {'archiver' if queue == ARCHIVE_LEASE_QUEUE else 'backup'} of "
                        f"this source is running: {holder} holds its lease "
                        f"(exclusive queue {queue!r}){how}; nothing was written. Retry when it has finished, "
                        "or set backup.lease_wait_secs to wait for it")
                if not waited:
                    log.warning("vhost %r: waiting up to %gs for %s to finish (backup.lease_wait_secs)", vhost,
                                cfg.backup.lease_wait_secs, holder)
                    waited = True
                sleep(POLL_SECS)
    except BaseException:
        if conn is not None:
            conn.close()  # it owns nothing: the release below must not delete another holder's lease queue
        lease.release()
        raise
    lease.start()
    return lease


def _declare(conn: Connection, vhost: str, client: ManagementClient,
             cfg: Config, queue: str = LEASE_QUEUE) -> tuple[bool, str | None]:
    """Declare the lease queue: (False, None) when this connection now owns it, else (True, who
    holds it, or None when it went meanwhile)."""
    ch = conn.channel()
    try:
        ch.declare(queue, exclusive=True, durable=False, auto_delete=False,
                   arguments={"x-queue-type": "classic"})
        ch.close()
        return False, None
    except ChannelClosedByBroker as e:
        if e.code == 405:
            return True, _holder(client, vhost, queue=queue)
        if e.code == 403:
            raise ConfigError(
                f"backup.lease: user {cfg.source.username if cfg.source else '?'!r} may not declare the lease queue {LEASE_QUEUE!r} in "
                f"vhost {vhost!r} ({e.code} {e.text}): grant it configure permission on "
                f"'^rbak\\.lease$' (e.g. rabbitmqctl set_permissions -p VHOST USER '^rbak\\.lease$' '' '.*'), "
                "or set backup.lease: false to run without a lease (backups of one source may then overlap "
                "and read short)") from None
        raise ConfigError(f"backup.lease: vhost {vhost!r}: declaring the lease queue {LEASE_QUEUE!r} failed: "
                          f"{e.code} {e.text}") from None


def _holder(client: ManagementClient, vhost: str, wait_secs: float = HOLDER_WAIT_SECS,
            sleep: Callable[[float], None] = time.sleep, queue: str = LEASE_QUEUE) -> str | None:
    """The holder's connection name, as the management API reports the lease queue's owner
    (its ``owner_pid_details`` appear a statistics interval after the declare: waited for, bounded);
    None when the lease queue is gone meanwhile."""
    deadline = time.monotonic() + wait_secs
    while True:
        try:
            info = client.request("GET", f"queues/{q(vhost)}/{q(queue)}") or {}
            owner = (info.get("owner_pid_details") or {}).get("name")
            if owner:
                conn = client.request("GET", f"connections/{q(owner)}") or {}
                props = conn.get("client_properties") or {}
                named = props.get("connection_name") or conn.get("user_provided_name")
                if named:
                    return f"{named!r} (connection {owner}, user {conn.get('user', '?')!r})"
        except ManagementApiError as e:
            if e.status == 404 and "connections/" not in str(e):
                return None  # the lease queue is gone: its holder has finished (declare again)
            log.debug("vhost %r: cannot name the lease holder yet: %s", vhost, e)
        if time.monotonic() >= deadline:
            return "another connection (the management API does not name it)"
        sleep(0.5)
