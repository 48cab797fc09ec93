"""What a queue tap (``archive.taps``) costs the publishers of the tapped queue, and how soon it is archived.

On one CI broker (positional, default rmq43; a CI broker by id, not a URL: rmq310 = amqp://guest:guest@localhost:5672
(3.10), rmq40 = :5673 (4.0), rmq43 = :5674 (4.3)), in a vhost of its own deleted afterwards: a quorum queue bound to a
topic exchange. ``--messages`` (default 20,000) x 1 KiB are published through the exchange with confirms (2,000 in
flight) four times: without a tap, with ``rbak archive`` running with ``taps: {include: [q]}`` (the stream
``rbak.tap.q`` bound beside the queue, the archiver reading it; file backend, ``max_delay_secs: 1``), with the
tap still bound and the archiver stopped (the broker's share of the cost alone), and without again (the tap stream
deleted). Prints each rate, the ratio with / mean of without (a bar of this benchmark's own,
>= 0.8; the issue sets none: the broker routes and writes every message twice), and the time from the last confirm until the archive names
every record (ticks read from the storage). ``--repeat`` runs the four again.

    python benchmarks/tap_cost.py rmq43 --messages 20000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
from bench_common import AUTH, BODY, BROKER_HELP, BROKERS, Broker, load, publish_confirmed, verdict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rbak.repo.catalog import list_backups
from rbak.storage import open_storage


def archived(store: str) -> int:
    try:
        return sum(e.manifest.total_messages for e in list_backups(open_storage(store), "") if e.manifest)
    except Exception:  # noqa: BLE001 - nothing written yet
        return 0


def publish(b: Broker, vh: str, n: int) -> float:
    """msg/s of ``n`` confirmed publishes through the exchange."""
    body = b"x" * BODY
    t0 = time.monotonic()
    publish_confirmed(b.amqp_port, vh, (("k", body) for _ in range(n)), exchange="bench")
    return n / (time.monotonic() - t0)


def purge(b: Broker, vh: str) -> None:
    requests.delete(f"{b.api}/queues/{vh}/q/contents", auth=AUTH, timeout=60).raise_for_status()


def with_tap(b: Broker, vh: str, n: int, tmp: Path, total: int) -> tuple[float, float]:
    """(msg/s with the archiver and its tap, seconds from the last confirm until the archive names all ``total``)."""
    store = str(tmp / "store")
    cfg = tmp / "archive.json"
    cfg.write_text(json.dumps({
        "mode": "archive",
        "source": {"amqp_url": b.amqp_url(vh), "management_url": b.mgmt_url, "stream_port": b.stream_port,
                   "queues": {"vhosts": [vh], "include": ["rbak.tap.*"]}},
        "storage": {"backend": "filesystem", "path": store},
        "archive": {"name": "bench", "max_delay_secs": 1, "taps": {"include": ["q"]}},
    }))
    log = tmp / "archiver.log"
    proc = subprocess.Popen([sys.executable, "-m", "rbak", "-v", "archive", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"), cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while "follows" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the archiver did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        rate = publish(b, vh, n)
        done = time.monotonic()
        while archived(store) < total:
            if time.monotonic() > done + 300:
                raise SystemExit(f"archived {archived(store)} of {total} after 300 s")
            time.sleep(0.1)
        return rate, time.monotonic() - done
    finally:
        proc.terminate()
        proc.wait(120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("broker", nargs="?", default="rmq43", choices=list(BROKERS), help=BROKER_HELP)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    b = Broker(a.broker)
    print(f"{b.id} RabbitMQ {b.version()}, {a.messages} x {BODY} B through a topic exchange into a quorum queue; "
          f"{load()}", flush=True)
    ratios = []
    with b.vhost() as vh, tempfile.TemporaryDirectory() as d:
        requests.put(f"{b.api}/exchanges/{vh}/bench", auth=AUTH, json={"type": "topic", "durable": True},
                     timeout=30).raise_for_status()
        requests.put(f"{b.api}/queues/{vh}/q", auth=AUTH, json={"durable": True, "arguments": {"x-queue-type": "quorum"}},
                     timeout=30).raise_for_status()
        requests.post(f"{b.api}/bindings/{vh}/e/bench/q/q", auth=AUTH, json={"routing_key": "k"},
                      timeout=30).raise_for_status()
        for r in range(a.repeat):
            tmp = Path(d) / f"round{r}"
            tmp.mkdir()
            before = publish(b, vh, a.messages)
            purge(b, vh)
            tapped, drain = with_tap(b, vh, a.messages, tmp, a.messages)
            purge(b, vh)
            bound = publish(b, vh, a.messages)  # the tap stays bound when the archiver stops
            purge(b, vh)
            requests.delete(f"{b.api}/queues/{vh}/rbak.tap.q", auth=AUTH, timeout=60).raise_for_status()
            after = publish(b, vh, a.messages)
            purge(b, vh)
            ratio = tapped / ((before + after) / 2)
            ratios.append(ratio)
            print(f"round {r + 1}: without a tap {before:,.0f} msg/s, with the tap and the archiver {tapped:,.0f} "
                  f"msg/s, bound with the archiver stopped {bound:,.0f} msg/s, without again {after:,.0f} msg/s; every record archived {drain:.2f} s after the last "
                  f"confirm", flush=True)
    ratios.sort()
    verdict(f"tap publish rate with/without {b.id} (median of {len(ratios)})", ratios[len(ratios) // 2], 0.8)


if __name__ == "__main__":
    main()
