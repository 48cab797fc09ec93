"""Codec throughput against raw zstandard on the same payload, in the same run.

Records are realistic: 1 KiB JSON bodies with properties and headers. Encode
is records -> finished segment bytes (zstd level 3); decode is segment bytes ->
records. Both are compared with raw ``zstandard`` compress/decompress of the
very same uncompressed payload, as ratios (targets: >= 0.3 each).

    python benchmarks/codec.py [--records 20000] [--repeat 5]

CPU time (``time.process_time``) is used so that a busy machine distorts the
ratio less; the best of ``--repeat`` runs is kept for every measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import time

import zstandard

from rbak.format.batch import HAVE_SPEEDUPS, encode_records
from rbak.format.compression import Compression
from rbak.format.record import BackupProperties, BackupRecord, Long, LongString, Timestamp
from rbak.format.segment import decode_segment, encode_segment


def realistic_records(n: int, seed: int = 7) -> list[BackupRecord]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        doc = {
            "order_id": f"ORD-{i:08d}", "customer": {"id": rnd.randrange(10**6), "tier": rnd.choice("ABC")},
            "items": [{"sku": f"SKU-{rnd.randrange(9999):04d}", "qty": rnd.randrange(1, 9),
                       "price": round(rnd.uniform(1, 500), 2)} for _ in range(rnd.randrange(3, 8))],
            "note": os.urandom(rnd.randrange(40, 120)).hex(),
        }
        body = json.dumps(doc).encode()
        body = (body + b" " * 1024)[:1024]
        out.append(BackupRecord(
            body=body,
            properties=BackupProperties(content_type="application/json", delivery_mode=2,
                                        message_id=f"msg-{i}", timestamp=1712756400 + i, app_id="orders-api"),
            headers=(("x-retry-count", Long(rnd.randrange(3))), ("x-source", LongString("api-gateway")),
                     ("x-created", Timestamp(1712756400 + i))),
            exchange="orders.exchange", routing_key="order.created", delivery_tag=i + 1,
            backed_up_at=1712756400000 + i, source_queue="orders", source_vhost="/",
        ))
    return out


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    records = realistic_records(args.records)
    payload = b"".join(struct.pack("<I", len(j)) + j for j in encode_records(records))
    mb = len(payload) / 1e6
    cctx, dctx = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
    compressed = cctx.compress(payload)
    segment = encode_segment(records, Compression.ZSTD, 3)
    assert decode_segment(segment).records == records

    t_zc = best(lambda: cctx.compress(payload), args.repeat)
    t_zd = best(lambda: dctx.decompress(compressed), args.repeat)
    t_enc = best(lambda: encode_segment(records, Compression.ZSTD, 3), args.repeat)
    t_dec = best(lambda: decode_segment(segment), args.repeat)

    print(f"payload: {args.records} records, {mb:.1f} MB uncompressed record bytes "
          f"(C speedups: {'on' if HAVE_SPEEDUPS else 'OFF'})")
    print(f"raw zstd-3 compress   {mb / t_zc:8.1f} MB/s")
    print(f"raw zstd   decompress {mb / t_zd:8.1f} MB/s")
    print(f"rbak encode           {mb / t_enc:8.1f} MB/s   ratio {t_zc / t_enc:.2f}x raw zstd (target >= 0.3)")
    print(f"rbak decode           {mb / t_dec:8.1f} MB/s   ratio {t_zd / t_dec:.2f}x raw zstd (target >= 0.3)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
