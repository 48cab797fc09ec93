"""The three CI brokers (see tests/support/README.md) and helpers to drive them in tests.

``Broker`` wraps one RabbitMQ node: URLs, management API calls (requests), AMQP
publishing and non-destructive reads (pika), and ``rabbitmqctl``. Every helper takes
the vhost explicitly because tests run concurrently against the same brokers and
must stay inside their own vhost (fixture ``vhost``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TypeVar
from urllib.parse import quote

import pika
import requests

REPO = Path(__file__).resolve().parents[2]
CHROOT = Path(os.environ.get("RBAK_CI_CHROOT", "/var/lib/rbak-ci/trixie"))
CHROOT43 = Path(os.environ.get("RBAK_CI_CHROOT43", "/var/lib/rbak-ci/sid"))


def _q(name: str) -> str:
    """Percent-encode one path segment of a management API URL (``/`` -> ``%2F``)."""
    return quote(name, safe="")


@dataclass(frozen=True)
class Message:
    """One message as read back from a queue; ``properties`` is pika's BasicProperties."""

    body: bytes
    properties: pika.BasicProperties
    routing_key: str
    exchange: str
    redelivered: bool

    @property
    def headers(self) -> dict:
        return dict(self.properties.headers or {})


@dataclass(frozen=True)
class Broker:
    name: str  # "rmq310" | "rmq40" | "rmq43" (the pytest id)
    version: str  # expected RabbitMQ version, e.g. "3.10.8"
    amqp_port: int
    mgmt_port: int
    stream_port: int
    node: str  # Erlang node name, for rabbitmqctl -n
    data_dir: Path  # the node's data directory (mnesia dir) as seen from this machine
    host: str = "127.0.0.1"
    user: str = "guest"
    password: str = "guest"
    amqps_port: int | None = None  # TLS listeners, rmq310 only
    mgmt_tls_port: int | None = None
    timeout: float = field(default=30.0, compare=False)

    # ------------------------------------------------------------------ URLs
    def amqp_url(self, vhost: str = "/") -> str:
        """``amqp://guest:guest@127.0.0.1:PORT/VHOST`` with the vhost percent-encoded."""
        return f"amqp://{self.user}:{self.password}@{self.host}:{self.amqp_port}/{_q(vhost)}"

    def server_url(self) -> str:
        """``amqp://guest:guest@127.0.0.1:PORT``: names no vhost (a restore target that keeps each vhost's name)."""
        return f"amqp://{self.user}:{self.password}@{self.host}:{self.amqp_port}"

    def amqps_url(self, vhost: str = "/") -> str:
        if self.amqps_port is None:
            raise ValueError(f"broker {self.name} has no TLS listener")
        return f"amqps://{self.user}:{self.password}@localhost:{self.amqps_port}/{_q(vhost)}"

    @property
    def management_url(self) -> str:
        return f"http://{self.host}:{self.mgmt_port}"

    @property
    def management_tls_url(self) -> str:
        if self.mgmt_tls_port is None:
            raise ValueError(f"broker {self.name} has no management TLS listener")
        return f"https://localhost:{self.mgmt_tls_port}"

    # ------------------------------------------------------------ reachability
    def unreachable_reason(self) -> str | None:
        """None when AMQP, stream and the management API all answer, else why not."""
        for port in (self.amqp_port, self.stream_port):
            try:
                socket.create_connection((self.host, port), timeout=3).close()
            except OSError as e:
                return f"{self.name}: port {port} refuses connections ({e}); run .ci/setup"
        try:
            version = self.api("GET", "/api/overview")["rabbitmq_version"]
        except Exception as e:  # noqa: BLE001 - any failure means "not usable"
            return f"{self.name}: management API at {self.management_url} fails: {e}"
        if version != self.version:
            return f"{self.name}: expected RabbitMQ {self.version} on port {self.mgmt_port}, found {version}"
        return None

    # ---------------------------------------------------------- management API
    def api(self, method: str, path: str, json: Any = None, ok: Iterable[int] = (), **kw) -> Any:
        """Call the management API; raises on HTTP errors except statuses in ``ok``.

        Returns decoded JSON, or None for empty bodies.
        """
        r = requests.request(
            method, self.management_url + path, json=json, auth=(self.user, self.password),
            timeout=self.timeout, **kw,
        )
        if r.status_code >= 400 and r.status_code not in ok:
            raise RuntimeError(f"{self.name}: {method} {path} -> HTTP {r.status_code}: {r.text[:500]}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            return r.text

    def create_vhost(self, vhost: str, user: str | None = None) -> None:
        """Create ``vhost`` and give ``user`` (default guest) full permissions on it."""
        self.api("PUT", f"/api/vhosts/{_q(vhost)}", json={})
        self.api(
            "PUT", f"/api/permissions/{_q(vhost)}/{_q(user or self.user)}",
            json={"configure": ".*", "write": ".*", "read": ".*"},
        )

    def delete_vhost(self, vhost: str) -> None:
        self.api("DELETE", f"/api/vhosts/{_q(vhost)}", ok=(404,))

    def vhost_exists(self, vhost: str) -> bool:
        r = requests.get(self.management_url + f"/api/vhosts/{_q(vhost)}", auth=(self.user, self.password),
                         timeout=self.timeout)
        if r.status_code not in (200, 404):
            r.raise_for_status()
        return r.status_code == 200

    def declare_queue(
        self, vhost: str, queue: str, durable: bool = True, auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """Declare via the management API; ``arguments={"x-queue-type": "quorum"}`` etc."""
        self.api(
            "PUT", f"/api/queues/{_q(vhost)}/{_q(queue)}",
            json={"durable": durable, "auto_delete": auto_delete, "arguments": dict(arguments or {})},
        )

    def delete_queue(self, vhost: str, queue: str) -> None:
        self.api("DELETE", f"/api/queues/{_q(vhost)}/{_q(queue)}", ok=(404,))

    def list_queues(self, vhost: str) -> list[dict]:
        """Management API queue objects of ``vhost`` (stats lag by up to ~1 s)."""
        return self.api("GET", f"/api/queues/{_q(vhost)}")

    def queue_info(self, vhost: str, queue: str) -> dict | None:
        """The management API object of one queue, or None if it does not exist.

        Its ``messages`` counters come from stats sampled every second, so they lag
        behind publishes; use ``message_count`` for an exact, immediate figure.
        """
        r = requests.get(
            self.management_url + f"/api/queues/{_q(vhost)}/{_q(queue)}",
            auth=(self.user, self.password), timeout=self.timeout,
        )
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return r.json()

    def definitions(self, vhost: str | None = None) -> dict:
        """Exported definitions of the whole broker or of one vhost."""
        return self.api("GET", "/api/definitions" + (f"/{_q(vhost)}" if vhost else ""))

    # ------------------------------------------------------------------- AMQP
    def connection_parameters(self, vhost: str = "/") -> pika.ConnectionParameters:
        return pika.ConnectionParameters(
            host=self.host, port=self.amqp_port, virtual_host=vhost,
            credentials=pika.PlainCredentials(self.user, self.password),
            blocked_connection_timeout=self.timeout, socket_timeout=self.timeout,
        )

    def wire(self, vhost: str = "/", user: str | None = None, password: str | None = None, heartbeat: int = 60):
        """rbak's own connection (``rbak.broker.wire``) to ``vhost``, as rbak's code takes it (a context manager)."""
        from rbak.broker.wire import Connection, Params

        return Connection.open(Params(host=self.host, port=self.amqp_port, vhost=vhost, username=user or self.user,
                                      password=password or self.password, connect_timeout=self.timeout,
                                      heartbeat=heartbeat, client_properties={"connection_name": "rbak-tests"}))

    def publish_raw(self, vhost: str, messages: list[tuple[str, str, bytes, bytes]]) -> None:
        """Publish ``(exchange, routing key, raw properties, body)`` messages as given, with confirms and
        ``mandatory``: the properties are the exact content-header bytes from the property flags on
        (pika cannot encode every header type). Raises unless every one was routed and confirmed."""
        with self.wire(vhost) as conn:
            ch = conn.channel()
            ch.select_confirms()
            for ex, rk, raw, body in messages:
                ch.publish(ex, rk, raw, body, mandatory=True)
            n = len(messages)

            def settled() -> bool:
                covered: set[int] = set()
                for _a, t, m in ch.acks:
                    covered.update(range(1, t + 1) if m else (t,))
                return len(covered) >= n or not ch.is_open

            assert conn.pump(settled, timeout=self.timeout), f"{vhost}: {len(ch.acks)} confirms of {n}"
            assert all(a for a, _t, _m in ch.acks) and not ch.returns, (ch.acks, ch.returns)

    def connect(self, vhost: str = "/") -> pika.BlockingConnection:
        """A pika BlockingConnection to ``vhost`` (use as a context manager)."""
        return pika.BlockingConnection(self.connection_parameters(vhost))

    def message_count(self, vhost: str, queue: str) -> int:
        """Exact count of messages ready in ``queue`` (AMQP passive declare; no stats lag).

        Messages delivered to a consumer and not yet acknowledged are not counted.
        """
        with self.connect(vhost) as conn:
            return conn.channel().queue_declare(queue, passive=True).method.message_count

    def publish(
        self, vhost: str, queue: str, bodies: Iterable[bytes | str],
        properties: pika.BasicProperties | None = None, exchange: str = "",
        routing_key: str | None = None, declare: Mapping[str, Any] | None = None,
    ) -> int:
        """Publish every body with publisher confirms; returns how many were published.

        Routes through ``exchange`` (default exchange: straight to ``queue``). With
        ``declare`` (a dict of queue arguments, ``{}`` for a classic queue) the durable
        queue is declared first. Returns only once the broker confirmed every message,
        so a following read sees them all.
        """
        props = properties or pika.BasicProperties(delivery_mode=2)
        n = 0
        with self.connect(vhost) as conn:
            ch = conn.channel()
            if declare is not None:
                ch.queue_declare(queue, durable=True, arguments=dict(declare))
            ch.confirm_delivery()
            for body in bodies:
                if isinstance(body, str):
                    body = body.encode()
                ch.basic_publish(exchange, queue if routing_key is None else routing_key, body, props, mandatory=True)
                n += 1
        return n

    def publish_n(self, vhost: str, queue: str, n: int, declare: Mapping[str, Any] | None = None,
                  prefix: str = "msg-") -> list[bytes]:
        """Publish ``n`` persistent messages ``b"msg-0" .. b"msg-{n-1}"``; returns the bodies."""
        bodies = [f"{prefix}{i}".encode() for i in range(n)]
        self.publish(vhost, queue, bodies, declare=declare)
        return bodies

    def read_queue(self, vhost: str, queue: str, limit: int | None = None) -> list[Message]:
        """Read a classic or quorum queue's ready messages WITHOUT removing them.

        Fetches with ``basic.get`` (manual ack) until the queue reports empty or
        ``limit`` is reached, then closes the channel without acking, so the broker
        requeues everything; repeated reads come back ``redelivered=True``.
        Order (measured by tests/test_infra.py and a 200-message probe):
        - classic queues (3.10 and 4.0): requeued messages keep their order.
        - quorum queues (3.10 and 4.0): requeueing SCRAMBLES the queue order, whatever
          the style (channel close, per-message nack, multiple nack). The first read of
          a never-requeued queue is in order; later ones are not. Compare sorted
          bodies, or ``drain_queue`` (destructive) once at the end of a test.
        - quorum queues on 4.0 also count every read as a return: ``x-delivery-count``
          rises by one per read, and after 20 reads (4.0's default delivery-limit)
          the broker DROPS the messages.
        Messages other consumers hold unacked are not seen. Streams: ``read_stream``.
        """
        out: list[Message] = []
        with self.connect(vhost) as conn:
            ch = conn.channel()
            while limit is None or len(out) < limit:
                method, props, body = ch.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                out.append(Message(body, props, method.routing_key, method.exchange, method.redelivered))
            ch.close()  # unacked -> requeued, in original order
        return out

    def read_bodies(self, vhost: str, queue: str) -> list[bytes]:
        """Bodies of ``read_queue`` (non-destructive), in queue order."""
        return [m.body for m in self.read_queue(vhost, queue)]

    def drain_queue(self, vhost: str, queue: str) -> list[Message]:
        """Destructively consume every ready message (acks them); for queues a test owns."""
        out: list[Message] = []
        with self.connect(vhost) as conn:
            ch = conn.channel()
            while True:
                method, props, body = ch.basic_get(queue, auto_ack=True)
                if method is None:
                    return out
                out.append(Message(body, props, method.routing_key, method.exchange, method.redelivered))

    def read_stream(self, vhost: str, queue: str, offset: Any = "first", idle_seconds: float = 1.0) -> list[Message]:
        """Read a stream queue from ``offset`` until no message arrived for ``idle_seconds``.

        Streams are never consumed destructively, so this changes nothing on the broker.
        """
        out: list[Message] = []
        with self.connect(vhost) as conn:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=1000)
            for method, props, body in ch.consume(
                queue, auto_ack=False, arguments={"x-stream-offset": offset}, inactivity_timeout=idle_seconds,
            ):
                if method is None:
                    break
                out.append(Message(body, props, method.routing_key, method.exchange, method.redelivered))
                ch.basic_ack(method.delivery_tag)
            ch.cancel()
        return out

    # ------------------------------------------------------------ rabbitmqctl
    def rabbitmqctl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run rabbitmqctl against this node (inside its chroot for rmq40 and rmq43)."""
        cmd = [str(REPO / ".ci" / "brokers"), "ctl", self.name, *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)


RMQ310 = Broker(
    name="rmq310", version="3.10.8", amqp_port=5672, mgmt_port=15672, stream_port=5552,
    node=f"rabbit@{socket.gethostname().split('.')[0]}",
    data_dir=Path("/var/lib/rabbitmq/mnesia") / f"rabbit@{socket.gethostname().split('.')[0]}",
    amqps_port=5671, mgmt_tls_port=15671,
)
RMQ40 = Broker(
    name="rmq40", version="4.0.5", amqp_port=5673, mgmt_port=15673, stream_port=5553,
    node="rabbit4@localhost", data_dir=CHROOT / "var/lib/rabbitmq/mnesia/rabbit4@localhost",
)
def chroot_package_version(root: Path, package: str, default: str) -> str:
    """The upstream version of a Debian package installed in a chroot (sid moves on: 4.3.6 today)."""
    try:
        status = (root / "var/lib/dpkg/status").read_text(errors="replace")
    except OSError:
        return default
    for stanza in status.split("\n\n"):
        if f"Package: {package}\n" in stanza + "\n" and "Version: " in stanza:
            version = stanza.split("Version: ", 1)[1].split("\n", 1)[0]
            return version.split(":", 1)[-1].rsplit("-", 1)[0]
    return default


RMQ43 = Broker(
    name="rmq43", version=chroot_package_version(CHROOT43, "rabbitmq-server", "4.3.6"), amqp_port=5674, mgmt_port=15674, stream_port=5554,
    node="rabbit43@localhost", data_dir=CHROOT43 / "var/lib/rabbitmq/mnesia/rabbit43@localhost",
)
BROKERS: dict[str, Broker] = {b.name: b for b in (RMQ310, RMQ40, RMQ43)}


def unique_name(prefix: str = "test") -> str:
    """``prefix-<12 hex digits>``: a vhost/queue name no concurrent test will pick."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


T = TypeVar("T")


#: The shortest wait for a condition (support.brokers.wait_until, support.opcluster.wait_for): a
#: positive wait costs nothing when the condition comes true, so its margin is generous.
MIN_WAIT = 120.0


def wait_until(probe: Callable[[], T], timeout: float = 30.0, interval: float = 0.2, what: str = "condition") -> T:
    """Poll ``probe`` until it returns something truthy; return that, or fail after ``timeout``.

    For eventually-consistent facts only (management stats, consumers appearing);
    the last value is shown in the failure. ``timeout`` is a margin, never what a test is about:
    at least ``MIN_WAIT`` seconds, so a loaded machine (load 8 on 2 cores) does not fail a test.
    """
    timeout = max(timeout, MIN_WAIT)
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {value!r}")
        time.sleep(interval)
