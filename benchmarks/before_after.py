"""rbak at two commits on the same broker, in the same run, pairs interleaved: did a change cost speed?

    python benchmarks/before_after.py --before /path/to/old/tree --after /path/to/new/tree \
        [--broker rmq43] [--rounds 3] [--messages 50000]

Each tree is a checkout of rbak with its C helpers built (``python setup.py build_ext --inplace``).
Every case runs in a child process whose ``sys.path`` starts with the tree, so the two versions
never share a module; the pairs alternate which goes first. Cases (1 KiB persistent messages):

- ``backup-classic`` / ``backup-quorum``: one queue of ``--messages``, backed up (msg/s);
- ``backup-many``: 300 classic queues of 50 (msg/s: per-queue cost);
- ``restore-091``: those ``--messages`` restored into a fresh queue over AMQP 0-9-1 (msg/s).

Prints each round, the medians and the ratio after/before per case (1.00: no change; the
issue-32 bar is no case below 0.95).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # rbak, for filling the queues (the measured runs import their own tree)

from bench_common import BROKER_HELP, BROKERS, Broker, fill, load

CASES = ("backup-classic", "backup-quorum", "backup-many", "restore-091")

CHILD = r"""
import json, os, sys, time, uuid
tree, case, port, mport, sport, vh, store, n = sys.argv[1:9]
sys.path.insert(0, tree)
from rbak.config import Config
amqp = f"amqp://guest:guest@localhost:{port}/{vh}"
mgmt = f"http://localhost:{mport}"
if case.startswith("backup"):
    from rbak.backup import BackupEngine
    cfg = Config.from_dict({"mode": "backup", "backup_id": "b-" + uuid.uuid4().hex[:8],
        "source": {"amqp_url": amqp, "management_url": mgmt, "stream_port": int(sport),
                   "queues": {"vhosts": [vh], "include": [case.split("-", 1)[1] + "-*"]}},
        "storage": {"backend": "filesystem", "path": store},
        "backup": {"include_definitions": False},
        "offset_storage": {"path": os.path.join(store, "state-" + uuid.uuid4().hex[:6] + ".db"), "sync_interval_secs": 0}},
        env={})
    t = time.perf_counter()
    s = BackupEngine(cfg).run()
    secs = time.perf_counter() - t
    assert s.completed, s.to_json_obj()
    print(json.dumps({"secs": secs, "messages": s.total_messages, "id": cfg.backup_id}))
else:
    from rbak.config import ConnectionConfig
    from rbak.restore import run_restore
    from rbak.restore.options import RestoreOptions
    from rbak.storage import open_storage
    import pika
    target = "restored-" + uuid.uuid4().hex[:8]
    with pika.BlockingConnection(pika.URLParameters(amqp)) as c:
        c.channel().queue_declare(target, durable=True)
    opts = RestoreOptions(backup_id=os.environ["BENCH_BACKUP_ID"], protocol="amqp091",
                          target=ConnectionConfig(amqp_url=amqp, management_url=mgmt),
                          queue_mapping=((f"{vh}/classic-0", target),))
    t = time.perf_counter()
    s = run_restore(open_storage(store), opts)
    secs = time.perf_counter() - t
    assert s.confirmed == int(n), s.confirmed
    print(json.dumps({"secs": secs, "messages": s.confirmed}))
"""


def run(tree: str, case: str, broker: Broker, vh: str, store: str, n: int, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, tree, case, str(broker.amqp_port), str(broker.mgmt_port),
                          str(broker.stream_port), vh, store, str(n)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": tree, **env}, timeout=1800)
    if out.returncode:
        raise SystemExit(f"{case} in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--broker", default="rmq43", choices=sorted(BROKERS), help=BROKER_HELP)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    broker = Broker(a.broker)
    trees = {"before": os.path.abspath(a.before), "after": os.path.abspath(a.after)}
    print(f"{a.broker} ({broker.version()}); {a.messages} x 1 KiB; {a.rounds} rounds; {load()}")
    for k, t in trees.items():
        rev = subprocess.run(["git", "-C", t, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        print(f"  {k}: {t} at {rev or '?'}")
    rates: dict[tuple[str, str], list[float]] = {}
    with broker.vhost() as vh, tempfile.TemporaryDirectory() as tmp:
        if {"backup-classic", "restore-091"} & set(cases):
            fill(broker, vh, ["classic-0"], a.messages)
        if "backup-quorum" in cases:
            fill(broker, vh, ["quorum-0"], a.messages, {"x-queue-type": "quorum"})
        if "backup-many" in cases:
            fill(broker, vh, [f"many-{i:03d}" for i in range(300)], 50)
        restore_from: dict[str, str] = {}
        for r in range(a.rounds):
            for case in cases:
                order = ["before", "after"] if (r + cases.index(case)) % 2 == 0 else ["after", "before"]
                for k in order:
                    store = os.path.join(tmp, k)
                    env = {}
                    if case == "restore-091":
                        if k not in restore_from:  # the backup it restores: taken by the same tree
                            restore_from[k] = run(trees[k], "backup-classic", broker, vh, store, a.messages, {})["id"]
                        env = {"BENCH_BACKUP_ID": restore_from[k]}
                    res = run(trees[k], case, broker, vh, store, a.messages, env)
                    rate = res["messages"] / res["secs"]
                    rates.setdefault((case, k), []).append(rate)
                    print(f"round {r + 1} {case:15s} {k:6s} {rate:10,.0f} msg/s  ({res['messages']} in {res['secs']:.2f} s)",
                          flush=True)
    print(f"medians ({load()}):")
    worst = None
    for case in cases:
        b, af = statistics.median(rates[(case, "before")]), statistics.median(rates[(case, "after")])
        worst = af / b if worst is None else min(worst, af / b)
        print(f"  {case:15s} before {b:10,.0f}  after {af:10,.0f}  ratio after/before {af / b:.2f}")
    print(f"lowest ratio {worst:.2f}  ({'PASS' if worst is not None and worst >= 0.95 else 'BELOW'} 0.95)")


if __name__ == "__main__":
    main()
