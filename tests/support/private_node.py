"""Private, throw-away RabbitMQ nodes whose data directories the import tests read.

Never the shared CI brokers: each node has its own name (``imp310-<hex>``),
data/log dirs, ports, cookie (HOME) and an empty plugin list. 3.10.8 runs on
this machine; 4.0.5 runs inside the trixie chroot and 4.3.6 inside the sid
chroot (data dir under the chroot, read from outside). ``stop()`` is a clean ``rabbitmqctl stop``; ``kill()``
is SIGKILL of the node's own BEAM process (a crash, for the journal tests).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pika
import pika.data

CHROOT = Path(os.environ.get("RBAK_CI_CHROOT", "/var/lib/rbak-ci/trixie"))
CHROOT43 = Path(os.environ.get("RBAK_CI_CHROOT43", "/var/lib/rbak-ci/sid"))


def chroot_for(version: str) -> Path | None:
    """The chroot a private node of this version runs in (None: this machine)."""
    if version.startswith("4.3"):
        return CHROOT43
    if version.startswith("4"):
        return CHROOT
    return None
HOST_BIN = Path("/usr/lib/rabbitmq/bin")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def chroot_ready(version: str = "4.0") -> str | None:
    """None when a node of this 4.x version can run in its chroot, else why not."""
    CHROOT = chroot_for(version)  # noqa: N806 - the messages below name it
    if not (CHROOT / "usr/lib/rabbitmq/bin/rabbitmq-server").exists():
        return f"no RabbitMQ in {CHROOT}"
    if not (CHROOT / ".rbak-ci-complete").exists():
        return f"{CHROOT} is not complete (run .ci/setup)"
    if not (CHROOT / "proc/self").exists():
        return f"{CHROOT}/proc is not mounted (run .ci/setup)"
    if not os.path.exists(CHROOT / "dev/null") or not (CHROOT / "dev/urandom").exists():
        return f"{CHROOT}/dev lacks null/urandom (run .ci/setup)"
    return None


START_ATTEMPTS = 3
NEVER_RAN_SECS = 30.0  # a VM that has not registered with epmd by then has exited


class PrivateNode:
    def __init__(self, version: str, base: Path, conf: list[str] = (), advanced: str | None = None,
                 plugins: tuple[str, ...] = ()):
        self.version = version
        self.chroot = chroot_for(version)
        self.in_chroot = self.chroot is not None
        tag = uuid.uuid4().hex[:8]
        self.node = f"imp{version.replace('.', '')[:2]}-{tag}@localhost"
        self.base = base  # as seen from this machine
        self.port = free_port()
        self.dist_port = free_port()
        self.conf = list(conf)
        self.advanced = advanced
        self.plugins = tuple(plugins)  # e.g. ("rabbitmq_management",): then management_port is listened on
        self.management_port = free_port() if "rabbitmq_management" in self.plugins else 0
        self.started = False
        self.pid = 0

    # paths as the node sees them
    def _inner(self, p: Path) -> str:
        if self.in_chroot:
            return "/" + str(p.relative_to(self.chroot))
        return str(p)

    @property
    def data_dir(self) -> Path:
        """The node's data directory on this machine."""
        return self.base / "mnesia" / self.node

    def _env(self) -> dict[str, str]:
        b = self.base
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": self._inner(b / "home"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_MNESIA_BASE": self._inner(b / "mnesia"),
            "RABBITMQ_LOG_BASE": self._inner(b / "log"),
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_ENABLED_PLUGINS_FILE": self._inner(b / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": self._inner(b / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": self._inner(b / "advanced.config"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": self._inner(b / "plugins-expand"),
            "RABBITMQ_PID_FILE": self._inner(b / "node.pid"),
        }
        return env

    def _cmd(self, tool: str, *args: str) -> list[str]:
        env = [f"{k}={v}" for k, v in self._env().items()]
        exe = f"/usr/lib/rabbitmq/bin/{tool}"
        if self.in_chroot:
            return ["chroot", str(self.chroot), "/usr/bin/env", "-i", *env, exe, *args]
        return ["/usr/bin/env", "-i", *env, exe, *args]

    def ctl(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(self._cmd("rabbitmqctl", "-n", self.node, *args), capture_output=True,
                              text=True, timeout=timeout, check=check)

    def start(self) -> "PrivateNode":
        b = self.base
        for d in ("home", "log", "mnesia"):
            (b / d).mkdir(parents=True, exist_ok=True)
        (b / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")
        lines = [f"listeners.tcp.default = {self.port}", "loopback_users = none", *self.conf]
        if self.management_port:
            lines += [f"management.tcp.port = {self.management_port}", "management.tcp.ip = 127.0.0.1"]
        (b / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        (b / "advanced.config").write_text(self.advanced or "[].\n")
        for attempt in range(1, START_ATTEMPTS + 1):
            launched = time.time()
            subprocess.run(self._cmd("rabbitmq-server", "-detached"), check=True, timeout=60,
                           capture_output=True)
            self.started = True
            end = launched + 120
            while True:
                r = self.ctl("await_startup", "--timeout", "10", timeout=60, check=False)
                if r.returncode == 0 or time.time() > end:
                    break
                if "not running at all" in r.stderr + r.stdout and time.time() - launched > NEVER_RAN_SECS:
                    break  # the VM never registered with epmd: it died at launch (a port taken meanwhile)
                time.sleep(0.5)
            if r.returncode == 0 or attempt == START_ATTEMPTS or "not running at all" not in r.stderr + r.stdout:
                break
            # free_port() only promises a port free when it was asked: another test may have taken it
            self.port, self.dist_port = free_port(), free_port()
            if self.management_port:
                self.management_port = free_port()
            lines = [f"listeners.tcp.default = {self.port}", "loopback_users = none", *self.conf]
            if self.management_port:
                lines += [f"management.tcp.port = {self.management_port}", "management.tcp.ip = 127.0.0.1"]
            (b / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        if r.returncode == 0:
            self.pid = self.os_pid()
        if r.returncode != 0:
            raise RuntimeError(f"private node {self.node} did not start: {r.stdout}{r.stderr}\n"
                               f"{self.log_tail()}")
        return self

    def log_tail(self) -> str:
        out = []
        for p in sorted((self.base / "log").glob("*.log")):
            out.append(f"--- {p}\n" + p.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def os_pid(self) -> int:
        r = self.ctl("eval", "os:getpid().")
        return int(r.stdout.strip().strip('"'))

    def stop(self) -> None:
        """Clean stop; returns when the node is gone."""
        pid = self.pid
        self.ctl("stop", timeout=180)
        self._wait_gone(pid)
        self.started = False

    def kill(self) -> None:
        """SIGKILL the node's BEAM process (a crash)."""
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        self._wait_gone(pid)
        self.started = False

    @staticmethod
    def _wait_gone(pid: int, timeout: float = 60) -> None:
        end = time.time() + timeout
        while time.time() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        raise RuntimeError(f"node process {pid} did not exit")

    def cleanup(self) -> None:
        if self.started:
            try:
                self.kill()
            except Exception:  # noqa: BLE001 - best effort
                pass
        shutil.rmtree(self.base, ignore_errors=True)

    def connect(self, vhost: str = "/") -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=self.port, virtual_host=vhost,
            credentials=pika.PlainCredentials("guest", "guest"), heartbeat=0,
            blocked_connection_timeout=60))

    def wire(self, vhost: str = "/"):
        """rbak's own connection (``rbak.broker.wire``) to the node: deliveries keep their header bytes."""
        from rbak.broker.wire import Connection, Params

        return Connection.open(Params(host="127.0.0.1", port=self.port, vhost=vhost, heartbeat=0,
                                      client_properties={"connection_name": "rbak-tests"}))

    def add_vhost(self, vhost: str) -> None:
        self.ctl("add_vhost", vhost)
        self.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")


@contextmanager
def private_node(version: str, conf: list[str] = (), plugins: tuple[str, ...] = ()):
    """A started private node (inside its chroot for 4.x), removed afterwards with its files."""
    chroot = chroot_for(version)
    root = (chroot / "tmp") if chroot is not None else Path(os.environ.get("TMPDIR", "/tmp"))
    base = root / f"rbak-private-{uuid.uuid4().hex[:8]}"
    node = PrivateNode(version, base, conf=conf, plugins=plugins)
    try:
        yield node.start()
    finally:
        node.cleanup()
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------
# Raw field-table values, so tests can publish every AMQP type (pika writes few).
# --------------------------------------------------------------------------


class Raw:
    """A field value given as its wire bytes (type octet + payload)."""

    def __init__(self, data: bytes):
        self.data = data


_HEADERS_FLAG = pika.spec.BasicProperties.FLAG_HEADERS
_BEFORE_HEADERS = ("content_type", "content_encoding")  # the properties encoded ahead of the headers table


class RawProperties(pika.spec.BasicProperties):
    """pika's properties whose headers may hold ``Raw`` values (their exact wire bytes, types pika never
    writes): the table is encoded here and joined to what pika encodes of the other properties, so
    nothing of pika's is replaced."""

    def encode(self) -> list[bytes]:
        fields = {k: v for k, v in vars(self).items() if v is not None and k != "headers"}
        head = pika.spec.BasicProperties(**{k: v for k, v in fields.items() if k in _BEFORE_HEADERS}).encode()
        tail = pika.spec.BasicProperties(**{k: v for k, v in fields.items() if k not in _BEFORE_HEADERS}).encode()
        head_b, tail_b = b"".join(head), b"".join(tail)
        flags = struct.unpack_from(">H", head_b)[0] | struct.unpack_from(">H", tail_b)[0]
        if self.headers is None:
            return [struct.pack(">H", flags) + head_b[2:] + tail_b[2:]]
        return [struct.pack(">H", flags | _HEADERS_FLAG) + head_b[2:] + _table(self.headers) + tail_b[2:]]


def rawable(props: pika.spec.BasicProperties) -> RawProperties:
    """``props`` as ``RawProperties`` (publish these where headers hold ``Raw`` values)."""
    return RawProperties(**{k: v for k, v in vars(props).items()})


def _table(d: dict) -> bytes:
    body = b"".join(bytes([len(k.encode())]) + k.encode() + _value(v) for k, v in d.items())
    return struct.pack(">I", len(body)) + body


def _value(v) -> bytes:
    if isinstance(v, Raw):
        return v.data
    if isinstance(v, dict):
        return b"F" + _table(v)
    if isinstance(v, list):
        inner = b"".join(_value(x) for x in v)
        return b"A" + struct.pack(">I", len(inner)) + inner
    pieces: list = []
    pika.data.encode_value(pieces, v)
    return b"".join(x if isinstance(x, bytes) else x.encode() for x in pieces)


def raw(t: str, fmt: str = "", *vals) -> Raw:
    return Raw(t.encode() + (struct.pack(">" + fmt, *vals) if fmt else b""))


def raw_bytes(t: str, payload: bytes) -> Raw:
    return Raw(t.encode() + struct.pack(">I", len(payload)) + payload)
