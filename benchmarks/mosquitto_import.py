"""``rbak import mosquitto-db`` throughput against a plain sequential read of the same file, in the same run.

A ``mosquitto.db`` of ``--messages`` stored messages of ``--size`` bytes, each
queued for one persistent client, is written once with rbak's own v6 writer.
Then, best of ``--repeat`` (CPU time, ``time.process_time``, so a busy machine
distorts the ratios less):

- plain: read the file sequentially in 1 MiB blocks;
- parse: ``read_db`` (every chunk decoded);
- import: ``import_mosquitto_db`` into a temporary directory (zstd level 3).

Prints MB/s and messages/s for each and the ratios parse/plain and import/plain.

    python benchmarks/mosquitto_import.py [--messages 100000] [--size 1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from rbak.offline.mosquitto import ClientChunk, ClientMsgChunk, Direction, MsgState, MsgStoreChunk, read_db, write_db
from rbak.offline.mosquitto import import_mosquitto_db


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="rbak-bench-mosq-")
    try:
        path = os.path.join(work, "mosquitto.db")
        body = os.urandom(args.size)
        n = args.messages
        chunks = [MsgStoreChunk(i + 1, f"sensors/dev{i % 100}/temp", body, 1, False) for i in range(n)]
        chunks.append(ClientChunk("durable", session_expiry_interval=0xFFFFFFFF))
        chunks += [ClientMsgChunk(i + 1, "durable", i % 65535 + 1, 1, MsgState.QUEUED, Direction.OUT) for i in range(n)]
        size = write_db(path, chunks)
        del chunks

        def plain() -> None:
            with open(path, "rb") as f:
                while f.read(1 << 20):
                    pass

        runs = [0]

        def do_import() -> None:
            runs[0] += 1
            import_mosquitto_db(path, f"file://{work}/out", f"bench-{runs[0]}")

        t_plain = best(plain, args.repeat)
        t_parse = best(lambda: read_db(path), args.repeat)
        t_import = best(do_import, args.repeat)
        mb = size / 1e6
        print(f"mosquitto.db: {mb:.1f} MB, {n} messages of {args.size} B")
        for name, t in (("plain read", t_plain), ("parse", t_parse), ("import", t_import)):
            print(f"  {name:10s} {t:8.3f} s  {mb / t:9.1f} MB/s  {n / t:10.0f} msg/s")
        print(f"  ratio parse/plain  {t_plain / t_parse:.4f}")
        print(f"  ratio import/plain {t_plain / t_import:.4f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
