"""Helpers shared by the scale benchmarks: brokers, throwaway vhosts, confirmed fills, rbak backups, ratios.

Every benchmark prints a ratio against a baseline measured in the same run,
the target, PASS/BELOW, and the load average (the machine is shared).
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import contextmanager

import pika
import requests

AUTH = ("guest", "guest")
BODY = 1024
BROKERS = {  # id -> (AMQP port, management port), as in the CI broker table
    "rmq310": (5672, 15672),
    "rmq40": (5673, 15673),
    "rmq43": (5674, 15674),
}
STREAM_PORTS = {"rmq310": 5552, "rmq40": 5553, "rmq43": 5554}
BROKER_HELP = ("a CI broker by id, not a URL: rmq310 = amqp://guest:guest@localhost:5672 (3.10), rmq40 = :5673 "
               "(4.0), rmq43 = :5674 (4.3), management on 15672/15673/15674; the benchmark makes and deletes "
               "its own vhost")


class Broker:
    def __init__(self, bid: str):
        self.id = bid
        self.amqp_port, self.mgmt_port = BROKERS[bid]
        self.api = f"http://localhost:{self.mgmt_port}/api"
        self.stream_port = STREAM_PORTS[bid]

    def params(self, vh: str) -> pika.ConnectionParameters:
        return pika.ConnectionParameters("localhost", self.amqp_port, vh, pika.PlainCredentials(*AUTH),
                                         heartbeat=0)

    def amqp_url(self, vh: str = "") -> str:
        return f"amqp://guest:guest@localhost:{self.amqp_port}/{vh}"

    @property
    def mgmt_url(self) -> str:
        return f"http://localhost:{self.mgmt_port}"

    def version(self) -> str:
        return requests.get(f"{self.api}/overview", auth=AUTH, timeout=30).json().get("rabbitmq_version", "?")

    @contextmanager
    def vhost(self):
        vh = "bench-" + uuid.uuid4().hex[:8]
        requests.put(f"{self.api}/vhosts/{vh}", auth=AUTH, timeout=30).raise_for_status()
        requests.put(f"{self.api}/permissions/{vh}/guest", auth=AUTH, timeout=30,
                     json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
        try:
            yield vh
        finally:
            requests.delete(f"{self.api}/vhosts/{vh}", auth=AUTH, timeout=120)


def broker_pid(broker: Broker) -> int | None:
    """The beam.smp serving the broker's AMQP port (``ss -ltnp``), or None."""
    port = f":{broker.amqp_port} "
    try:
        import subprocess

        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return None
    for line in out.splitlines():
        if port in line and "pid=" in line:
            return int(line.split("pid=")[1].split(",")[0])
    return None


def cpu_secs(pid: int | None) -> float:
    """User+system CPU seconds of a process from /proc (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> str:
    a, b, c = os.getloadavg()
    return f"load {a:.2f} {b:.2f} {c:.2f}"


def verdict(name: str, ratio: float, target: float, *, at_most: bool = False, detail: str = "") -> str:
    ok = ratio <= target if at_most else ratio >= target
    line = (f"RESULT {name}: ratio {ratio:.2f} (target {'<=' if at_most else '>='} {target}) "
            f"{'PASS' if ok else 'BELOW' if not at_most else 'ABOVE'}  [{load()}]" + (f"  {detail}" if detail else ""))
    print(line, flush=True)
    return line


def publish_confirmed(port: int, vh: str, messages, window: int = 2000, host: str = "localhost",
                      exchange: str = "") -> int:
    """Publish ``(queue, body)`` messages as persistent octet-streams with publisher confirms, up to
    ``window`` unconfirmed (pika's blocking confirm mode waits for each: too slow to fill big queues).
    On rbak's own connection, which the benchmarks do not measure here. Raises on a nack. With
    ``exchange``, each ``queue`` is the routing key through it."""
    from rbak.broker.wire import Connection, Params

    raw = b"".join(pika.BasicProperties(delivery_mode=2, content_type="application/octet-stream").encode())
    pending: set[int] = set()
    sent = 0
    with Connection.open(Params(host=host, port=port, vhost=vh, username=AUTH[0], password=AUTH[1],
                                heartbeat=0)) as conn:
        ch = conn.channel()
        ch.select_confirms()

        def settle() -> None:
            # confirms for different queues come out of order: count the acked tags, never a watermark
            for ack, tag, multiple in ch.acks:
                done = {t for t in pending if t <= tag} if multiple else {tag}
                if not ack:
                    raise SystemExit(f"{len(done)} publishes nacked")
                pending.difference_update(done)
            ch.acks.clear()

        for q, body in messages:
            ch.publish(exchange, q, raw, body, flush=False)
            sent += 1
            pending.add(sent)
            if sent % 200 == 0:
                conn.flush()
            while len(pending) >= window:
                conn.pump(lambda: bool(ch.acks), timeout=0.05)
                settle()
        while pending:
            conn.pump(lambda: bool(ch.acks), timeout=0.05)
            settle()
    return sent


def fill(broker: Broker, vh: str, queues: list[str], n: int, args: dict | None = None) -> None:
    """Declare each queue (durable, ``args``) and publish n persistent 1 KiB messages into each, confirmed."""
    body = os.urandom(BODY // 2).hex().encode()
    with pika.BlockingConnection(broker.params(vh)) as conn:
        ch = conn.channel()
        for q in queues:
            ch.queue_declare(q, durable=True, arguments=args or {})
    publish_confirmed(broker.amqp_port, vh, ((q, body) for q in queues for _ in range(n)))


def rbak_backup(broker: Broker, vh: str, store: str, cpu_log: list | None = None,
                **backup) -> tuple[float, int, float]:
    """One rbak backup of every queue of ``vh`` into ``store``: (wall s, messages, CPU s).

    ``cpu_log`` gets (wall, rbak CPU, broker CPU) seconds of the run appended."""
    from rbak.backup import BackupEngine
    from rbak.config import Config

    cfg = Config.from_dict({
        "mode": "backup", "backup_id": "b-" + uuid.uuid4().hex[:8],
        "source": {"amqp_url": broker.amqp_url(vh), "management_url": broker.mgmt_url,
                   "stream_port": broker.stream_port, "queues": {"vhosts": [vh]}},
        "storage": {"backend": "filesystem", "path": store},
        "backup": {"include_definitions": False, **backup},
        "offset_storage": {"path": os.path.join(store, "state.db"), "sync_interval_secs": 0},
    }, env={})
    bpid = broker_pid(broker) if cpu_log is not None else None
    b0 = cpu_secs(bpid)
    t0, c0 = time.perf_counter(), time.process_time()
    eng = BackupEngine(cfg)
    s = eng.run()
    # reader processes (backup.reader_processes) are not children this process waits for: add their CPU
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0 + getattr(eng, "reader_cpu_secs", 0.0)
    if cpu_log is not None:
        cpu_log.append((wall, cpu, cpu_secs(bpid) - b0))
    return wall, s.total_messages, cpu


def peak_rss_mib() -> float:
    """VmHWM of this process image (not inherited across exec, unlike ru_maxrss)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
