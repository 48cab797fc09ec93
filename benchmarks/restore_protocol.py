"""Restore publishing over AMQP 0-9-1 vs AMQP 1.0 on 4.x, by message size and queue count (issue 45).

    python benchmarks/restore_protocol.py [--brokers rmq40,rmq43] [--sizes 100,1024,65536] [--queues 1,4,16]
                                          [--messages 20000] [--big-messages 2000] [--repeat 2]

For each broker, message size and number of queues: a backup of ``--messages`` records (``--big-messages``
for sizes of 64 KiB and more) spread over that many classic queues is restored by ``run_restore`` into
a fresh vhost (queues declared, ``max_concurrent_queues`` = the queue count), once with
``protocol: amqp091`` and once with ``protocol: amqp10``, the order alternating per repeat. Prints
each pair and, per case, the median ratio 1.0 / 0-9-1 (above 1: 1.0 is faster), then the load average:
the machine may be shared. ``protocol: auto`` should pick the faster one where both are exact.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from urllib.parse import quote

import requests
from bench_common import AUTH, BROKER_HELP, Broker, load


def build_backup(store: str, backup_id: str, queues: int, n: int, size: int) -> None:
    from rbak.format.compression import Compression
    from rbak.format.manifest import BackupManifest, QueueBackup
    from rbak.format.record import BackupProperties, BackupRecord
    from rbak.format.segment_writer import SegmentWriter
    from rbak.format.layout import BackupLayout
    from rbak.storage import open_storage

    storage = open_storage(f"file://{store}")
    layout = BackupLayout(backup_id)
    now = int(time.time() * 1000)
    props = BackupProperties(delivery_mode=2, content_type="application/octet-stream", message_id="m")
    man = BackupManifest(backup_id=backup_id, created_at=now, completed_at=now)
    for q in range(queues):
        name = f"q{q}"
        qb = QueueBackup(vhost="/", name=name)

        def sink(seq, data, name=name):
            key = layout.segment("/", name, seq, Compression.ZSTD)
            storage.put(key, data)
            return key

        w = SegmentWriter(sink, Compression.ZSTD)
        for i in range(n // queues):
            body = (f"{name}-{i}-".encode() * (size // 4 + 1))[:size]
            if (m := w.append(BackupRecord(body=body, properties=props, routing_key=name, backed_up_at=now,
                                           source_queue=name))):
                qb.add_segment(m)
        if (m := w.flush()):
            qb.add_segment(m)
        man.queues.append(qb)
    man.recompute_totals()
    storage.put(layout.manifest, man.to_json())


def restore_once(b: Broker, store: str, backup_id: str, queues: int, protocol: str) -> tuple[float, int, set[str]]:
    """Seconds and messages of one restore into a fresh vhost, and the protocols the queues used."""
    from rbak.restore import run_restore
    from rbak.restore.options import RestoreOptions, local_target
    from rbak.storage import open_storage

    with b.vhost() as vh:
        for q in range(queues):
            requests.put(f"{b.api}/queues/{quote(vh, safe='')}/q{q}", auth=AUTH, timeout=30,
                         json={"durable": True, "arguments": {}}).raise_for_status()
        opts = RestoreOptions(backup_id=backup_id, publish_mode="queue", protocol=protocol,
                              max_concurrent_queues=queues, vhost_mapping=(("/", vh),),
                              checkpoint_state=f"{store}/cp-{uuid.uuid4().hex}.db",
                              target=local_target(b.amqp_url(quote(vh, safe="")), b.mgmt_url))
        t = time.perf_counter()
        s = run_restore(open_storage(f"file://{store}"), opts)
        secs = time.perf_counter() - t
        assert s.ok, s.to_json_obj()
        return secs, s.confirmed, {q.protocol for q in s.queues}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=f"Brokers: {BROKER_HELP}.")
    ap.add_argument("--brokers", default="rmq40,rmq43", help="comma-separated CI broker ids (4.x)")
    ap.add_argument("--sizes", default="100,1024,65536", help="message body sizes in bytes")
    ap.add_argument("--queues", default="1,4,16", help="numbers of queues restored at once")
    ap.add_argument("--messages", type=int, default=20_000, help="messages per case (spread over the queues)")
    ap.add_argument("--big-messages", type=int, default=2_000, help="messages per case for sizes >= 64 KiB")
    ap.add_argument("--repeat", type=int, default=2, help="pairs per case (order alternates)")
    a = ap.parse_args()
    table = []
    with tempfile.TemporaryDirectory(prefix="rbak-bench-proto-") as store:
        for bid in a.brokers.split(","):
            b = Broker(bid)
            print(f"{bid} {b.version()}; {load()}", flush=True)
            for size in (int(x) for x in a.sizes.split(",")):
                for queues in (int(x) for x in a.queues.split(",")):
                    n = a.big_messages if size >= 65536 else a.messages
                    n -= n % queues
                    backup_id = f"p-{size}-{queues}-{uuid.uuid4().hex[:6]}"
                    build_backup(store, backup_id, queues, n, size)
                    ratios = []
                    for r in range(a.repeat):
                        rate = {}
                        for proto in (("amqp091", "amqp10") if r % 2 == 0 else ("amqp10", "amqp091")):
                            secs, msgs, used = restore_once(b, store, backup_id, queues, proto)
                            assert msgs == n and used == {proto}, (msgs, n, used)
                            rate[proto] = msgs / secs
                        ratios.append(rate["amqp10"] / rate["amqp091"])
                        print(f"  {bid} {size:>6} B x {queues:>2} queue(s) pair {r + 1}: 0-9-1 "
                              f"{rate['amqp091']:8,.0f} msg/s, 1.0 {rate['amqp10']:8,.0f} msg/s, ratio 1.0/0-9-1 "
                              f"{ratios[-1]:.2f}", flush=True)
                    med = statistics.median(ratios)
                    table.append((bid, size, queues, med, ratios))
    print("| broker | body | queues | 1.0 ÷ 0-9-1 (median) | pairs |")
    print("|---|---|---|---|---|")
    for bid, size, queues, med, ratios in table:
        print(f"| {bid} | {size} B | {queues} | {med:.2f} | {', '.join(f'{x:.2f}' for x in ratios)} |")
    print(f"ratio 1.0/0-9-1: lowest median {min(t[3] for t in table):.2f}, highest {max(t[3] for t in table):.2f}; "
          f"{load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
