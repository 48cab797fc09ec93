"""Running ``rbak archive`` in tests as users do (a subprocess with a config file) and reading back what
it stored: the helpers every archive test module shares (engine, drill, taps, preflight, restore
choice, Spark)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pika
from support.brokers import wait_until

MAX_DELAY = 1.0


def archive_config(tmp_path: Path, broker, vhost: str, storage: str, name: str = "arc", sections: dict | None = None,
                   **archive) -> Path:
    cfg = tmp_path / f"archive-{name}.yaml"
    cfg.write_text(json.dumps({
        "mode": "archive",
        "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                   "stream_port": broker.stream_port, "queues": {"vhosts": [vhost]}},
        "storage": json.loads(storage),
        "archive": {"name": name, "max_delay_secs": MAX_DELAY, "idle_tick_secs": 2, **archive},
        **(sections or {}),
    }))
    return cfg


def fs_storage(tmp_path: Path) -> str:
    return json.dumps({"backend": "filesystem", "path": str(tmp_path / "store")})


def s3_storage(bucket) -> str:
    return json.dumps({"backend": "s3", "bucket": bucket.bucket, "prefix": bucket.prefix, "endpoint": bucket.endpoint,
                       "path_style": True, "region": "us-east-1"})


class Archiver:
    """``rbak archive`` in a subprocess, as the operator's Deployment runs it."""

    def __init__(self, cfg: Path, log: Path):
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "rbak", "-v", "archive", "--config", str(cfg), "--json"],
                                     stdout=subprocess.PIPE, stderr=open(log, "ab"))

    def running(self) -> "Archiver":
        """Wait until it follows its streams (a SIGTERM before its handler is installed would just kill it)."""
        wait_until(lambda: "follows" in self.log.read_text() or self.proc.poll() is not None, timeout=120,
                   what="the archiver to start")
        return self

    def stop(self) -> dict:
        self.running()
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # what it was doing, for the failure's report
            threads = stacks(self.proc.pid)
            self.kill()
            raise AssertionError(f"rbak archive did not stop within 120 s of its SIGTERM\n--- its threads:\n"
                                 f"{threads}\n--- its log:\n{self.log.read_text()[-6000:]}") from None
        assert self.proc.returncode == 0, self.log.read_text()[-3000:]
        return json.loads(out)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def stacks(pid: int) -> str:
    """Every thread's stack of a running Python process (py-spy, where installed)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return "(py-spy is not installed)"
    r = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    return r.stdout + r.stderr


def rbak(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-3000:])
    return r


def generations(path: str, name: str = "arc") -> list[dict]:
    r = rbak("list", "--path", path, "--format", "json", check=False)
    if r.returncode and "does not exist" in r.stderr:
        return []  # nothing written yet
    assert r.returncode == 0, r.stderr[-3000:]
    entries = json.loads(r.stdout)
    return [e for e in entries if e["backup_id"].startswith(name + ".")]


def archived(path: str) -> int:
    """Records the archive holds: every generation holds only its own (the chain joins them)."""
    return sum(g["total_messages"] for g in generations(path))


def restore_into(tmp_path: Path, broker, path_cfg: str, backup_id: str, src: str, dst: str, *extra: str,
                 sections: dict | None = None) -> dict:
    cfg = tmp_path / f"restore-{dst}.yaml"
    cfg.write_text(json.dumps({
        "mode": "restore", "backup_id": backup_id,
        "target": {"amqp_url": broker.amqp_url(dst), "management_url": broker.management_url},
        "storage": json.loads(path_cfg),
        "restore": {"vhost_mapping": {src: dst}},
        **(sections or {}),
    }))
    return json.loads(rbak("restore", "--config", str(cfg), "--json", *extra).stdout)


class SteadyPublisher(threading.Thread):
    """Publishes ``msg-N`` one at a time with publisher confirms at a steady rate; keeps when each was confirmed."""

    def __init__(self, broker, vhost: str, queue: str, rate: float):
        super().__init__(daemon=True)
        self.broker, self.vhost, self.queue, self.rate = broker, vhost, queue, rate
        self.confirmed: list[tuple[bytes, float]] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.broker.amqp_url(self.vhost)))
            ch = conn.channel()
            ch.confirm_delivery()
            n, t0 = 0, time.monotonic()
            while not self.halt.is_set():
                body = b"msg-%d" % n
                ch.basic_publish("", self.queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
                self.confirmed.append((body, time.time()))
                n += 1
                time.sleep(max(0.0, t0 + n / self.rate - time.monotonic()))
            conn.close()
        except BaseException as e:  # noqa: BLE001 - the test asserts it
            self.error = e


def declare_stream(broker, vhost: str, name: str, **args) -> None:
    broker.declare_queue(vhost, name, arguments={"x-queue-type": "stream", **args})


def bodies(broker, vhost: str, queue: str) -> list[bytes]:
    return [m.body for m in broker.read_stream(vhost, queue, "first")]
