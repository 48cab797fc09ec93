"""Restore throughput and memory on the local broker, against bare pika publishers in the same run.

    python benchmarks/restore.py [--messages 100000] [--size 1024] [--amqp-url URL] [--management-url URL]

Builds a backup of N messages of SIZE bytes (core SegmentWriter, default
128 MiB segments, zstd), then, each phase in its own child process (so peak
RSS is per phase), into a fresh queue of a throwaway vhost:

- ``pika-sync``: bare pika ``BlockingChannel`` with ``confirm_delivery()``
  (the idiomatic confirmed publisher: waits for each confirm), same bodies;
- ``pika-pipelined``: bare pika with up to 500 unconfirmed messages in flight
  (its asynchronous ``SelectConnection``, confirms counted in a callback), same
  bodies: the fastest plain-pika publisher with confirms we know;
- ``proton``: a bare Qpid Proton AMQP 1.0 sender (RabbitMQ 4.x only), up to
  500 unsettled messages, same bodies: the faster publisher path the issue
  asked to measure against pika;
- ``rbak``: ``run_restore`` (reads and decodes segments, encodes properties,
  confirms, checkpoint) at N/10 and N messages to show RSS against queue size,
  with ``restore.protocol: auto`` (AMQP 0-9-1 everywhere), and once more
  with ``amqp10`` on 4.x (``rbak-amqp10``; ``benchmarks/restore_protocol.py``
  compares the two by body size and queue count).

Prints msgs/s per phase, the ratios rbak / baseline (target >= 0.8) and peak
RSS beside the queue's byte size.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from urllib.parse import quote, urlsplit, urlunsplit

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def bodies(n: int, size: int):
    base = os.urandom(size)
    for i in range(n):
        tag = b"%010d" % i
        yield tag + base[len(tag):]


def rss_mib() -> float:
    """Peak RSS of this process (VmHWM: unlike ru_maxrss it is not inherited across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------- phases (child processes)


def phase_pika_sync(a) -> dict:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(a.vhost_url))
    ch = conn.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
    t = time.perf_counter()
    for b in bodies(a.messages, a.size):
        ch.basic_publish("", a.queue, b, props, mandatory=True)
    secs = time.perf_counter() - t
    conn.close()
    return {"secs": secs, "messages": a.messages}


def phase_pika_pipelined(a) -> dict:
    """pika's asynchronous connection (its public ``SelectConnection`` API): up to 500 messages in
    flight, confirms counted in a callback."""
    import pika

    props = pika.BasicProperties(delivery_mode=2)
    it = bodies(a.messages, a.size)
    st: dict = {"sent": 0, "acked": 0, "t": 0.0, "secs": 0.0, "ch": None}

    def on_open(conn) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch) -> None:
        st["ch"] = ch
        ch.confirm_delivery(ack_nack_callback=on_ack, callback=lambda _f: start())

    def on_ack(frame) -> None:
        m = frame.method
        st["acked"] = m.delivery_tag if m.multiple else max(st["acked"], m.delivery_tag)
        pump()

    def start() -> None:
        st["t"] = time.perf_counter()
        pump()

    def pump() -> None:
        while st["sent"] - st["acked"] < 500 and st["sent"] < a.messages:
            st["ch"].basic_publish("", a.queue, next(it), props, mandatory=True)
            st["sent"] += 1
        if st["sent"] == a.messages and st["acked"] >= st["sent"] and not st["secs"]:
            st["secs"] = time.perf_counter() - st["t"]
            conn.close()

    conn = pika.SelectConnection(pika.URLParameters(a.vhost_url), on_open_callback=on_open,
                                 on_close_callback=lambda c, _e: c.ioloop.stop())
    conn.ioloop.start()
    return {"secs": st["secs"], "messages": st["sent"]}


def phase_proton(a) -> dict:
    from collections import deque
    from urllib.parse import urlsplit

    from proton import Delivery
    from proton.utils import BlockingConnection

    from rbak.format.record import BackupProperties
    from rbak.format.amqp10 import data_section
    from rbak.restore.amqp10_message import encode_sections

    u = urlsplit(a.amqp_url)
    conn = BlockingConnection(f"amqp://{u.hostname}:{u.port}", timeout=30, virtual_host="vhost:" + a.vhost,
                              user="guest", password="guest", allowed_mechs="PLAIN")
    link = conn.create_sender("/queues/" + quote(a.queue, safe="")).link
    head = encode_sections(BackupProperties(delivery_mode=2), ())
    inflight: deque = deque()
    t = time.perf_counter()
    sent = 0
    for b in bodies(a.messages, a.size):
        while link.credit <= 0 or len(inflight) >= 500:
            conn.container.timeout = 0.05
            conn.container.process()
            while inflight and inflight[0].remote_state:
                d = inflight.popleft()
                assert d.remote_state == Delivery.ACCEPTED
                d.settle()  # frees the delivery in the engine
        sent += 1
        d = link.delivery(b"%x" % sent)
        link.stream(head + data_section(b))
        link.advance()
        inflight.append(d)
    while inflight:
        conn.container.timeout = 0.05
        conn.container.process()
        while inflight and inflight[0].remote_state:
            d = inflight.popleft()
            assert d.remote_state == Delivery.ACCEPTED
            d.settle()
    secs = time.perf_counter() - t
    conn.close()
    return {"secs": secs, "messages": sent}


def phase_rbak(a) -> dict:
    from rbak.restore import run_restore
    from rbak.restore.options import RestoreOptions, local_target
    from rbak.storage import open_storage

    storage = open_storage(f"file://{a.store}")
    opts = RestoreOptions(backup_id=a.backup_id, publish_mode="queue", produce_batch_size=500, protocol=a.protocol,
                          checkpoint_state=os.path.join(a.store, f"cp-{uuid.uuid4().hex}.db"),
                          queue_mapping=(("bench", a.queue),), vhost_mapping=(("/", a.vhost),),
                          target=local_target(a.amqp_url, a.management_url))
    t = time.perf_counter()
    s = run_restore(storage, opts)
    secs = time.perf_counter() - t
    assert s.ok, s.to_json_obj()
    return {"secs": secs, "messages": s.confirmed, "protocol": s.queues[0].protocol}


PHASES = {"pika-sync": phase_pika_sync, "pika-pipelined": phase_pika_pipelined, "proton": phase_proton,
          "rbak": phase_rbak}


# --------------------------------------------------------------------------- driver


def build_backup(store: str, backup_id: str, n: int, size: int) -> None:
    from rbak.format.compression import Compression
    from rbak.format.manifest import BackupManifest, QueueBackup
    from rbak.format.record import BackupProperties, BackupRecord
    from rbak.format.segment_writer import SegmentWriter
    from rbak.format.layout import BackupLayout
    from rbak.storage import open_storage

    storage = open_storage(f"file://{store}")
    layout = BackupLayout(backup_id)
    qb = QueueBackup(vhost="/", name="bench")

    def sink(seq, data):
        key = layout.segment("/", "bench", seq, Compression.ZSTD)
        storage.put(key, data)
        return key

    w = SegmentWriter(sink, Compression.ZSTD)
    now = int(time.time() * 1000)
    props = BackupProperties(delivery_mode=2)
    for i, b in enumerate(bodies(n, size)):
        m = w.append(BackupRecord(body=b, properties=props, routing_key="bench", backed_up_at=now + i // 1000,
                                  source_queue="bench"))
        if m:
            qb.add_segment(m)
    m = w.flush()
    if m:
        qb.add_segment(m)
    man = BackupManifest(backup_id=backup_id, created_at=now, completed_at=now, queues=[qb])
    man.recompute_totals()
    storage.put(layout.manifest, man.to_json())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--sync-messages", type=int, default=20_000, help="messages for the (slow) pika-sync baseline")
    p.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/",
                   help="the broker, as amqp://USER:PASS@HOST:PORT[/VHOST] (default the CI 3.10 broker; "
                        "4.0: port 5673, 4.3: 5674). A vhost in it is ignored: the benchmark makes and deletes "
                        "its own vhost (needs a user who may)")
    p.add_argument("--management-url", default="http://127.0.0.1:15672",
                   help="its management API, as http://HOST:PORT (CI: 15672, 15673, 15674)")
    p.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    p.add_argument("--vhost-url", help=argparse.SUPPRESS)
    p.add_argument("--queue", help=argparse.SUPPRESS)
    p.add_argument("--vhost", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--backup-id", help=argparse.SUPPRESS)
    p.add_argument("--protocol", default="auto", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.phase:
        out = PHASES[a.phase](a)
        out["rss_mib"] = rss_mib()
        print(json.dumps(out))
        return 0

    vhost = f"bench-{uuid.uuid4().hex[:8]}"
    auth = ("guest", "guest")
    api = a.management_url.rstrip("/")
    requests.put(f"{api}/api/vhosts/{quote(vhost, safe='')}", json={}, auth=auth, timeout=30).raise_for_status()
    requests.put(f"{api}/api/permissions/{quote(vhost, safe='')}/guest", json={"configure": ".*", "write": ".*", "read": ".*"},
                 auth=auth, timeout=30).raise_for_status()
    u = urlsplit(a.amqp_url)
    if u.path.strip("/"):
        print(f"note: the vhost in --amqp-url ({u.path}) is ignored; the benchmark uses its own vhost {vhost}",
              flush=True)
    base_url = urlunsplit((u.scheme, u.netloc, "", "", ""))
    vhost_url = f"{base_url}/{quote(vhost, safe='')}"
    results = {}
    try:
        import pika

        with tempfile.TemporaryDirectory() as tmp:
            small = max(1, a.messages // 10)
            t = time.perf_counter()
            build_backup(os.path.join(tmp, "full"), "full", a.messages, a.size)
            build_backup(os.path.join(tmp, "small"), "small", small, a.size)
            print(f"built backups of {a.messages} and {small} x {a.size} B in {time.perf_counter() - t:.1f} s", flush=True)

            def run(phase, n, store=None, backup_id=None, protocol="auto"):
                queue = f"q-{phase}-{n}"
                with pika.BlockingConnection(pika.URLParameters(vhost_url)) as c:
                    c.channel().queue_declare(queue, durable=True)
                cmd = [sys.executable, __file__, "--phase", phase, "--messages", str(n), "--size", str(a.size),
                       "--vhost-url", vhost_url, "--queue", queue, "--vhost", vhost, "--amqp-url", vhost_url,
                       "--management-url", a.management_url, "--protocol", protocol]
                if store:
                    cmd += ["--store", store, "--backup-id", backup_id]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
                if r.returncode:
                    raise SystemExit(f"phase {phase} failed:\n{r.stderr}")
                res = json.loads(r.stdout.strip().splitlines()[-1])
                with pika.BlockingConnection(pika.URLParameters(vhost_url)) as c:
                    depth = c.channel().queue_declare(queue, passive=True).method.message_count
                    c.channel().queue_delete(queue)
                assert depth == res["messages"] == n, (phase, depth, res)
                res["rate"] = n / res["secs"]
                label = phase if protocol == "auto" else f"{phase}-{protocol}"
                print(f"{label:15s} {n:>7d} msgs  {res['secs']:7.2f} s  {res['rate']:9.0f} msg/s  "
                      f"peak RSS {res['rss_mib']:7.1f} MiB  (queue {n * a.size / 2**20:.0f} MiB of bodies)"
                      f"{'  over ' + res['protocol'] if 'protocol' in res else ''}", flush=True)
                return res

            results["pika-sync"] = run("pika-sync", a.sync_messages)
            results["pika-pipelined"] = run("pika-pipelined", a.messages)
            results["rbak-small"] = run("rbak", small, os.path.join(tmp, "small"), "small")
            results["rbak"] = run("rbak", a.messages, os.path.join(tmp, "full"), "full")
            results["pika-pipelined-2"] = run("pika-pipelined", a.messages)
            v4 = requests.get(f"{api}/api/overview", auth=auth, timeout=30).json()["rabbitmq_version"] >= "4"
            if v4:
                results["proton"] = run("proton", a.messages)
                results["rbak-amqp10"] = run("rbak", a.messages, os.path.join(tmp, "full"), "full", "amqp10")
    finally:
        requests.delete(f"{api}/api/vhosts/{quote(vhost, safe='')}", auth=auth, timeout=60)
    pipelined = (results["pika-pipelined"]["rate"] + results["pika-pipelined-2"]["rate"]) / 2
    r = results["rbak"]["rate"]
    print(f"ratio rbak / pika-pipelined (mean of the runs before and after): {r / pipelined:.2f}  (target >= 0.8)")
    if "proton" in results:
        print(f"ratio proton / pika-pipelined (bare AMQP 1.0 vs bare 0-9-1):    {results['proton']['rate'] / pipelined:.2f}")
        print(f"ratio rbak over 1.0 (restore.protocol: amqp10) / pika-pipelined: "
              f"{results['rbak-amqp10']['rate'] / pipelined:.2f}")
        print(f"ratio rbak over 1.0 / rbak (auto: {results['rbak']['protocol']}): "
              f"{results['rbak-amqp10']['rate'] / r:.2f}")
    print(f"ratio rbak / pika-sync:                                           {r / results['pika-sync']['rate']:.2f}")
    print(f"peak RSS rbak: {results['rbak-small']['rss_mib']:.0f} MiB at {a.messages // 10} msgs, "
          f"{results['rbak']['rss_mib']:.0f} MiB at {a.messages} msgs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
