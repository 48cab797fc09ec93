"""Backup speed and scale against baselines measured in the same run (issue 20).

    python benchmarks/backup_scale.py quorum  --broker rmq43 [--messages 20000]
    python benchmarks/backup_scale.py stream  --broker rmq310 [--messages 50000]
    python benchmarks/backup_scale.py many    [--queues 100 --per-queue 100]      (issue: 1000 x 100)
    python benchmarks/backup_scale.py workers [--per-queue 5000]                  (issue: 8 x 50000)
    python benchmarks/backup_scale.py memory  [--messages 10000]                  (issue: 100,000 vs 1,000,000)

- quorum: baseline is a bare pika client doing the same non-destructive read of the
  same quorum queue: channels with a prefetch of exactly the messages they take
  (at most 65535 each), then on 4.3+ cancel and ``basic.nack(multiple, requeue)``
  per channel in order, on older brokers close the channels in order. Target >= 0.8.
- stream: baseline is a bare AMQP 0-9-1 consumer with ``x-stream-offset: first``,
  prefetch 1000, acking every 500, stopping at the known count. rbak asks the
  stream's end over the stream protocol first and stops there (no idle wait).
  Target >= 0.8. Then the same offsets read by a bare stream-protocol consumer
  (rstream, if installed), messages counted only and AMQP 1.0-decoded, against
  the bare AMQP 0-9-1 consumer (issue 20: which protocol is faster).
- many: N queues of M messages vs one queue of N x M, both by rbak with defaults.
  Ratio time(N queues) / time(one queue), target <= 1.5.
- workers: 8 queues of M, rbak with ``max_concurrent_queues`` 1 vs 8.
  Ratio time(1) / time(8), target >= 1.5 (both cores used).
- memory: peak RSS (VmHWM) of a backup subprocess (default 128 MiB segments) of a
  queue of 10 x N vs N messages of 1 KiB. Ratio big/small, target <= 1.3.

Each repeats ``--repeat`` times in back-to-back pairs and reports the median ratio,
with the load average (the machine is shared: only ratios mean anything).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pika

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_common import BROKER_HELP, Broker, fill, load, peak_rss_mib, rbak_backup, verdict


def _major_minor(v: str) -> tuple[int, int]:
    p = (v.split(".") + ["0", "0"])[:2]
    return int(p[0]), int(p[1])


def bare_quorum_read(broker: Broker, vh: str, queue: str, n: int, nack: bool) -> float:
    """Read n messages of a quorum queue unacked and give them all back in order; wall seconds."""
    t0 = time.perf_counter()
    with pika.BlockingConnection(broker.params(vh)) as conn:
        chans = []
        got = 0
        while got < n:
            want = min(65535, n - got)
            ch = conn.channel()
            ch.basic_qos(prefetch_count=want)
            taken = 0
            for method, _p, _b in ch.consume(queue, auto_ack=False, inactivity_timeout=30):
                assert method is not None, "bare quorum reader starved"
                taken += 1
                if taken == want:
                    break
            chans.append((ch, method.delivery_tag))
            got += taken
        if nack:
            for ch, _tag in chans:
                ch.cancel()
            for ch, tag in chans:
                ch.basic_nack(tag, multiple=True, requeue=True)
        for ch, _tag in chans:
            ch.close()
    secs = time.perf_counter() - t0
    _wait_depth(broker, vh, queue, n)
    return secs


def _wait_depth(broker: Broker, vh: str, queue: str, n: int, timeout: float = 10.0) -> None:
    """Untimed: until the queue holds n ready messages again. A quorum queue takes back what a closed
    channel held asynchronously (3.10.8: a passive declare right after the close saw 0 of 20,000, and
    the rbak run that followed backed up nothing and failed the benchmark's count check)."""
    end = time.monotonic() + timeout
    with pika.BlockingConnection(broker.params(vh)) as conn:
        ch = conn.channel()
        while ch.queue_declare(queue, passive=True).method.message_count < n and time.monotonic() < end:
            time.sleep(0.01)


def bare_stream_read(broker: Broker, vh: str, queue: str, n: int) -> float:
    t0 = time.perf_counter()
    with pika.BlockingConnection(broker.params(vh)) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        unacked = 0
        for got, (method, _p, _b) in enumerate(ch.consume(queue, auto_ack=False, arguments={"x-stream-offset": "first"},
                                                          inactivity_timeout=30), 1):
            assert method is not None, "bare stream reader starved"
            unacked += 1
            if unacked >= 500:
                ch.basic_ack(method.delivery_tag, multiple=True)
                unacked = 0
            if got == n:
                break
        ch.close()
    return time.perf_counter() - t0


def bare_stream_protocol_read(broker: Broker, vh: str, queue: str, n: int, decode: bool) -> float | None:
    """The same offsets over the stream protocol (rstream, when installed): wall seconds, None without it.
    ``decode``: each message decoded from AMQP 1.0 (what a backup needs), else only counted."""
    try:
        import asyncio

        from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder
    except ImportError:
        return None

    async def run() -> float:
        t0 = time.perf_counter()
        consumer = Consumer("localhost", broker.stream_port, vhost=vh, username="guest", password="guest")
        done = asyncio.Event()
        got = 0

        def on_message(_msg: AMQPMessage, _ctx) -> None:
            nonlocal got
            got += 1
            if got == n:
                done.set()

        await consumer.start()
        await consumer.subscribe(queue, on_message, decoder=amqp_decoder if decode else None,
                                 offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), 60)
        await consumer.close()
        return time.perf_counter() - t0

    return asyncio.run(run())


def paired(name: str, repeat: int, baseline, candidate, target: float, at_most: bool = False,
           ratio=lambda b, c: b / c, label=("baseline", "rbak"), n: int | None = None) -> str:
    ratios = []
    for i in range(repeat):
        b = baseline()
        c = candidate()
        r = ratio(b, c)
        ratios.append(r)
        rate = (lambda s: f" ({n / s:,.0f} msg/s)") if n else (lambda s: "")
        print(f"  run {i + 1}: {label[0]} {b:.2f}s{rate(b)}, {label[1]} {c:.2f}s{rate(c)} -> ratio {r:.2f}  [{load()}]",
              flush=True)
    return verdict(name, statistics.median(ratios), target, at_most=at_most,
                   detail="runs " + ", ".join(f"{r:.2f}" for r in ratios))


def print_cpu(cpu: dict[str, list]) -> None:
    """Where the 2 cores went in each run: rbak's process and the broker's beam.smp."""
    for label, runs in cpu.items():
        for wall, rbak, beam in runs:
            print(f"  CPU {label}: wall {wall:.2f}s, rbak {rbak:.2f}s ({rbak / wall:.2f} cores), broker {beam:.2f}s "
                  f"({beam / wall:.2f} cores), together {(rbak + beam) / wall:.2f} of {os.cpu_count()} cores")


def cmd_quorum(a, broker: Broker) -> None:
    ver = broker.version()
    nack = _major_minor(ver) >= (4, 3)
    n = a.messages
    with broker.vhost() as vh, tempfile.TemporaryDirectory(prefix="rbak-bench-") as tmp:
        fill(broker, vh, ["qq"], n, {"x-queue-type": "quorum"})
        print(f"quorum queue of {n} x 1 KiB on {broker.id} {ver} (return by {'nack' if nack else 'channel close'})")
        runs = iter(range(1000))

        def rbak():
            secs, got, _cpu = rbak_backup(broker, vh, os.path.join(tmp, f"s{next(runs)}"))
            assert got == n, (got, n)
            return secs

        paired(f"backup quorum {broker.id}", a.repeat, lambda: bare_quorum_read(broker, vh, "qq", n, nack), rbak,
               0.8, label=("bare pika", "rbak"), n=n)


def cmd_stream(a, broker: Broker) -> None:
    n = a.messages
    with broker.vhost() as vh, tempfile.TemporaryDirectory(prefix="rbak-bench-") as tmp:
        fill(broker, vh, ["st"], n, {"x-queue-type": "stream"})
        print(f"stream of {n} x 1 KiB on {broker.id} {broker.version()} (rbak stops at the end it asks over the "
              f"stream protocol)")
        runs = iter(range(1000))

        def rbak():
            secs, got, _cpu = rbak_backup(broker, vh, os.path.join(tmp, f"s{next(runs)}"), stream_incremental=False)
            assert got == n, (got, n)
            return secs

        paired(f"backup stream {broker.id}", a.repeat, lambda: bare_stream_read(broker, vh, "st", n), rbak, 0.8,
               label=("bare x-stream-offset consumer", "rbak"), n=n)
        # AMQP 0-9-1 vs the stream protocol for the same offsets (issue 20 asks which is faster)
        for decode in (False, True):
            times = []
            for _ in range(a.repeat):
                amqp = bare_stream_read(broker, vh, "st", n)
                sp = bare_stream_protocol_read(broker, vh, "st", n, decode)
                if sp is None:
                    print("  stream protocol: rstream is not installed (pip install rstream); not measured")
                    return
                times.append((amqp, sp))
                print(f"  bare AMQP 0-9-1 {amqp:.2f}s ({n / amqp:,.0f} msg/s), bare stream protocol (rstream"
                      f"{', AMQP 1.0 decoded' if decode else ', not decoded'}) {sp:.2f}s ({n / sp:,.0f} msg/s)  [{load()}]",
                      flush=True)
            r = statistics.median(a_ / s_ for a_, s_ in times)
            print(f"RESULT stream protocol vs AMQP 0-9-1 {broker.id} ({'decoded' if decode else 'not decoded'}): "
                  f"stream protocol is {r:.2f}x the AMQP 0-9-1 speed  [{load()}]", flush=True)


def cmd_many(a, broker: Broker) -> None:
    nq, m = a.queues, a.per_queue
    with broker.vhost() as many, broker.vhost() as one, tempfile.TemporaryDirectory(prefix="rbak-bench-") as tmp:
        fill(broker, many, [f"q{i:04d}" for i in range(nq)], m)
        fill(broker, one, ["all"], nq * m)
        print(f"{nq} queues of {m} vs one queue of {nq * m} (1 KiB) on {broker.id} {broker.version()}")
        runs = iter(range(1000))
        cpu: dict[str, list] = {"one queue": [], f"{nq} queues": []}

        def backup(vh, label):
            secs, got, _cpu = rbak_backup(broker, vh, os.path.join(tmp, f"s{next(runs)}"), cpu_log=cpu[label])
            assert got == nq * m, (got, nq * m)
            return secs

        paired(f"backup many queues {nq}x{m} {broker.id}", a.repeat, lambda: backup(one, "one queue"),
               lambda: backup(many, f"{nq} queues"), 1.5, at_most=True, ratio=lambda b, c: c / b,
               label=("one queue", f"{nq} queues"))
        print_cpu(cpu)


def cmd_workers(a, broker: Broker) -> None:
    m = a.per_queue
    with broker.vhost() as vh, tempfile.TemporaryDirectory(prefix="rbak-bench-") as tmp:
        fill(broker, vh, [f"q{i}" for i in range(8)], m)
        print(f"8 queues of {m} (1 KiB) on {broker.id} {broker.version()}: max_concurrent_queues 1 vs 8 "
              f"({os.cpu_count()} cores)")
        runs = iter(range(1000))
        cpu: dict[str, list] = {"1 worker": [], "8 workers": []}

        def backup(workers):
            secs, got, _cpu = rbak_backup(broker, vh, os.path.join(tmp, f"s{next(runs)}"),
                                          cpu_log=cpu[f"{workers} worker" + ("s" if workers > 1 else "")],
                                          max_concurrent_queues=workers)
            assert got == 8 * m, (got, 8 * m)
            return secs

        paired(f"backup 8 queues, 8 workers vs 1 {broker.id}", a.repeat, lambda: backup(1), lambda: backup(8), 1.5,
               label=("1 worker", "8 workers"), n=8 * m)
        print_cpu(cpu)


def cmd_memory(a, broker: Broker) -> None:
    small = a.messages
    peaks = {}
    for count in (small, small * 10):
        with broker.vhost() as vh, tempfile.TemporaryDirectory(prefix="rbak-rss-") as tmp:
            fill(broker, vh, ["rss"], count)
            out = subprocess.run([sys.executable, __file__, "_rss_child", "--broker", broker.id, "--vhost", vh,
                                  "--store", tmp], check=True, capture_output=True, text=True).stdout
            d = json.loads(out.strip().splitlines()[-1])
            assert d["messages"] == count, (d, count)
            peaks[count] = d["rss_mib"]
            print(f"  queue of {count:>8} x 1 KiB ({count / 1024:.0f} MiB): peak RSS {d['rss_mib']:.1f} MiB "
                  f"({d['secs']:.1f}s)  [{load()}]", flush=True)
    verdict(f"backup memory {small * 10} vs {small} msgs {broker.id}", peaks[small * 10] / peaks[small], 1.3,
            at_most=True, detail=f"{peaks[small]:.0f} -> {peaks[small * 10]:.0f} MiB")


def rss_child(a, broker: Broker) -> None:
    secs, n, _cpu = rbak_backup(broker, a.vhost, a.store)
    print(json.dumps({"messages": n, "secs": secs, "rss_mib": peak_rss_mib()}))


COMMANDS = {"quorum": cmd_quorum, "stream": cmd_stream, "many": cmd_many, "workers": cmd_workers,
            "memory": cmd_memory, "_rss_child": rss_child}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=sorted(COMMANDS))
    ap.add_argument("--broker", default="rmq310", choices=["rmq310", "rmq40", "rmq43"], help=BROKER_HELP)
    ap.add_argument("--messages", type=int, help="quorum 20000, stream 50000, memory 10000 (the small queue)")
    ap.add_argument("--queues", type=int, default=100)
    ap.add_argument("--per-queue", type=int)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--vhost", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.messages is None:
        a.messages = {"quorum": 20_000, "stream": 50_000, "memory": 10_000}.get(a.command, 10_000)
    if a.per_queue is None:
        a.per_queue = 100 if a.command == "many" else 5_000
    COMMANDS[a.command](a, Broker(a.broker))
    return 0


if __name__ == "__main__":
    sys.exit(main())
