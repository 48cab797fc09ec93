"""A private Mosquitto broker for tests: own config, port and persistence dir.

Never touches the system service: it runs ``/usr/sbin/mosquitto -c <tmp conf>``
on a free loopback port, and ``stop()`` sends SIGTERM so the broker writes
``mosquitto.db`` (Mosquitto saves on SIGTERM/SIGINT).
"""

from __future__ import annotations

import os
import queue
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.request import urlopen

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MosquittoBroker:
    def __init__(self, workdir: Path, extra_conf: str = "", command: list[str] | None = None):
        self.command = command or [MOSQUITTO]
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.conf = self.dir / "mosquitto.conf"
        self.log = self.dir / "mosquitto.log"
        self.db = self.dir / "mosquitto.db"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {self.dir}/\n"
            "persistence_file mosquitto.db\n"
            "autosave_interval 0\n"
            f"log_dest file {self.log}\n"
            "log_type all\n"
            "max_queued_messages 100000\n"
            # As root Mosquitto would drop to user 'mosquitto', which cannot
            # write our temporary directory: stay the current user instead.
            + (f"user {pwd.getpwuid(os.geteuid()).pw_name}\n" if os.geteuid() == 0 else "")
            + extra_conf
        )
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> "MosquittoBroker":
        self.proc = subprocess.Popen(
            [*self.command, "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}: {err}\n{self.log_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"mosquitto did not listen on {self.port}: {self.log_text()}")

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (Mosquitto then saves its database) and wait."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.stderr:
                self.proc.stderr.close()
        self.proc = None
        return rc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> "MosquittoBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


def mosquitto_version(command: list[str] | None = None) -> tuple[int, ...]:
    """(2, 0, 11) for Debian bookworm's broker; () if it cannot be told."""
    try:
        out = subprocess.run([*(command or [MOSQUITTO]), "-h"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    for line in out.splitlines():
        if line.startswith("mosquitto version "):
            return tuple(int(x) for x in line.split()[2].split(".") if x.isdigit())
    return ()


# ---- a sample database written by the real broker (needs paho-mqtt) ----

V5_PAYLOAD = b"hello-v5 \x00\xff binary"
CORR = b"\x00\xffcorr"


def client(cid: str, port: int, *, v5: bool, clean: bool = True, username: str | None = None,
            session_expiry: int | None = None, inbox: "queue.Queue | None" = None):
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid,
                    protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311, clean_session=None if v5 else clean)
    if username:
        c.username_pw_set(username)
    if inbox is not None:
        c.on_message = lambda _c, _u, msg: inbox.put(msg)
    if v5:
        props = None
        if session_expiry is not None:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = session_expiry
        c.connect("127.0.0.1", port, clean_start=clean, properties=props)
    else:
        c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def subscribe(c, topic: str, qos: int) -> None:
    done = queue.Queue()
    c.on_subscribe = lambda *_a: done.put(True)
    c.subscribe(topic, qos=qos)
    done.get(timeout=5)


def close(c) -> None:
    c.disconnect()
    c.loop_stop()


def drain(inbox: "queue.Queue", n: int, timeout: float = 5.0) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        try:
            out.append(inbox.get(timeout=max(0.01, deadline - time.monotonic())))
        except queue.Empty:
            break
    return out


def write_sample_db(d: Path, command: list[str] | None = None) -> tuple[Path, int, int]:
    """Retained (QoS 0/1), queued QoS 0/1/2 for offline sessions, v5 properties.

    Returns (db path, unix time before publishing, broker port).
    """
    import paho.mqtt.client  # noqa: F401  (fail early with a clear ImportError)
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    b = MosquittoBroker(d, extra_conf="queue_qos0_messages true\n", command=command).start()
    try:
        t0 = int(time.time())
        # Persistent sessions, connected in this order (it is Mosquitto's save order):
        # a v3.1.1 client with a username, then two without (2.0.11's stale-username case).
        s1 = client("sub-311", b.port, v5=False, clean=False, username="alice")
        subscribe(s1, "a/#", 2)
        close(s1)
        s2 = client("sub-v5", b.port, v5=True, clean=False, session_expiry=3600)
        subscribe(s2, "a/#", 1)
        close(s2)
        s3 = client("sub-qos0", b.port, v5=False, clean=False)
        subscribe(s3, "a/q0", 0)
        close(s3)
        p = client("pub", b.port, v5=True, username="bob")
        pp = Properties(PacketTypes.PUBLISH)
        pp.ContentType = "application/octet-stream"
        pp.CorrelationData = CORR
        pp.ResponseTopic = "reply/to/me"
        pp.UserProperty = [("k1", "v1"), ("k2", "v2"), ("k1", "again")]
        pp.MessageExpiryInterval = 3600
        pp.PayloadFormatIndicator = 0
        p.publish("a/b.c", V5_PAYLOAD, qos=1, properties=pp).wait_for_publish(5)
        p.publish("a/x", b"hello-q2", qos=2).wait_for_publish(5)
        p.publish("a/ret", b"retained-q1", qos=1, retain=True).wait_for_publish(5)
        p.publish("a/q0", b"plain-q0", qos=0).wait_for_publish(5)
        rp = Properties(PacketTypes.PUBLISH)
        rp.ContentType = "text/plain"
        p.publish("r/other", b"retained-q0", qos=0, retain=True, properties=rp).wait_for_publish(5)
        time.sleep(0.3)  # QoS 0 has no acknowledgement
        close(p)
        time.sleep(0.2)
    finally:
        rc = b.stop()
    if rc != 0 or not b.db.exists():
        raise RuntimeError(f"mosquitto did not save {b.db} (exit {rc}): {b.log_text()}")
    return b.db, t0, b.port


# ---- a raw MQTT 3.1.1 client: to leave messages half-acknowledged on purpose ----


class RawMqtt:
    """Just enough MQTT 3.1.1 to stop mid-handshake (paho always completes QoS flows)."""

    def __init__(self, port: int, client_id: str, clean: bool = False):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        cid = client_id.encode()
        var = b"\x00\x04MQTT\x04" + bytes([0x02 if clean else 0x00]) + b"\x00\x3c"
        self.send(0x10, var + len(cid).to_bytes(2, "big") + cid)
        ptype, body = self.recv()
        if ptype != 0x20 or body[1] != 0:
            raise RuntimeError(f"CONNECT refused: {ptype:#x} {body!r}")

    def send(self, first: int, body: bytes) -> None:
        n, rl = len(body), bytearray()
        while True:
            b, n = n % 128, n // 128
            rl.append(b | 0x80 if n else b)
            if not n:
                break
        self.sock.sendall(bytes([first]) + bytes(rl) + body)

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise RuntimeError("connection closed by the broker")
            out += chunk
        return out

    def recv(self) -> tuple[int, bytes]:
        first = self._read(1)[0]
        n, mult = 0, 1
        while True:
            b = self._read(1)[0]
            n += (b & 0x7F) * mult
            mult *= 128
            if not b & 0x80:
                break
        return first, self._read(n)

    def subscribe(self, topic: str, qos: int) -> None:
        t = topic.encode()
        self.send(0x82, b"\x00\x01" + len(t).to_bytes(2, "big") + t + bytes([qos]))
        ptype, _ = self.recv()
        assert ptype == 0x90, ptype

    def publish(self, topic: str, payload: bytes, qos: int, pid: int) -> None:
        t = topic.encode()
        self.send(0x30 | qos << 1, len(t).to_bytes(2, "big") + t + pid.to_bytes(2, "big") + payload)

    def recv_publish(self) -> tuple[str, bytes, int, int]:
        """(topic, payload, qos, packet id) of the next PUBLISH."""
        first, body = self.recv()
        assert first >> 4 == 3, first
        qos = (first >> 1) & 3
        tl = int.from_bytes(body[:2], "big")
        topic, rest = body[2:2 + tl].decode(), body[2 + tl:]
        pid = int.from_bytes(rest[:2], "big") if qos else 0
        return topic, rest[2:] if qos else rest, qos, pid

    def abort(self) -> None:
        """Drop the TCP connection without DISCONNECT."""
        self.sock.close()


# ---- Mosquitto 2.0.21 from Debian trixie, run from the CI's trixie chroot libraries ----

TRIXIE_ROOT = Path(os.environ.get("RBAK_TRIXIE_ROOT", "/var/lib/rbak-ci/trixie"))
TEST_CACHE = Path(os.environ.get("RBAK_TEST_CACHE", Path.home() / ".cache" / "rbak-tests"))
TRIXIE_DEBS = ("mosquitto", "libmosquitto1", "libcjson1", "libdlt2", "libwebsockets19t64")


def trixie_mosquitto() -> list[str] | str:
    """The command that runs trixie's mosquitto, or why it cannot run.

    The broker is not installed anywhere: its .debs (named in the chroot's own
    apt lists) are fetched from the Debian mirror once, unpacked under
    ``TEST_CACHE`` and started with the chroot's dynamic loader and libraries,
    so neither this machine nor the chroot changes.
    """
    loader = TRIXIE_ROOT / "lib64" / "ld-linux-x86-64.so.2"
    if not loader.exists():
        return f"no trixie chroot at {TRIXIE_ROOT} (.ci/setup creates it)"
    dest = TEST_CACHE / "mosquitto-trixie"
    binary = dest / "usr" / "sbin" / "mosquitto"
    if not binary.exists():
        lists = sorted((TRIXIE_ROOT / "var" / "lib" / "apt" / "lists").glob("*_main_binary-amd64_Packages"))
        if not lists:
            return f"no apt lists in {TRIXIE_ROOT}"
        files: dict[str, str] = {}
        pkg = None
        for line in lists[0].read_text(errors="replace").splitlines():
            if line.startswith("Package: "):
                pkg = line[9:].strip()
            elif line.startswith("Filename: ") and pkg in TRIXIE_DEBS and pkg not in files:
                files[pkg] = line[10:].strip()
        if set(files) != set(TRIXIE_DEBS):
            return f"trixie apt lists lack {sorted(set(TRIXIE_DEBS) - set(files))}"
        mirror = "http://deb.debian.org/debian"
        src = TRIXIE_ROOT / "etc" / "apt" / "sources.list"
        if src.exists():
            for line in src.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "deb":
                    mirror = parts[1].rstrip("/")
                    break
        tmp = Path(str(dest) + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "debs").mkdir(parents=True)
        try:
            for name, rel in files.items():
                deb = tmp / "debs" / f"{name}.deb"
                with urlopen(f"{mirror}/{rel}", timeout=60) as r:
                    deb.write_bytes(r.read())
                subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True, capture_output=True)
        except Exception as e:  # noqa: BLE001 - no network, no dpkg-deb, ...
            shutil.rmtree(tmp, ignore_errors=True)
            return f"cannot fetch trixie's mosquitto: {e}"
        shutil.rmtree(tmp / "debs")
        try:
            tmp.rename(dest)
        except OSError:  # another worker won the race
            shutil.rmtree(tmp, ignore_errors=True)
    libs = ":".join(str(p) for p in (dest / "usr/lib/x86_64-linux-gnu", TRIXIE_ROOT / "usr/lib/x86_64-linux-gnu",
                                     TRIXIE_ROOT / "lib/x86_64-linux-gnu"))
    return [str(loader), "--library-path", libs, str(binary)]
