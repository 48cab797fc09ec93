"""A private Mosquitto broker for tests: own config, port and persistence dir.

Never touches the system service: it runs ``/usr/sbin/mosquitto -c <tmp conf>``
on a free loopback port, and ``stop()`` sends SIGTERM so the broker writes
``mosquitto.db`` (Mosquitto saves on SIGTERM/SIGINT).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MosquittoBroker:
    def __init__(self, workdir: Path, extra_conf: str = ""):
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
            [MOSQUITTO, "-c", str(self.conf)],
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


def mosquitto_version() -> tuple[int, ...]:
    """(2, 0, 11) for Debian bookworm's broker; () if it cannot be told."""
    try:
        out = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    for line in out.splitlines():
        if line.startswith("mosquitto version "):
            return tuple(int(x) for x in line.split()[2].split(".") if x.isdigit())
    return ()
