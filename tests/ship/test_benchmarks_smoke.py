"""Benchmarks that keep working (issue 45): every ``benchmarks/*.py`` at its smallest size, against
the CI brokers, as a user runs it. Each must finish (exit 0, no traceback) and print its ratio line
(against the baseline it measures in the same run); the figures themselves are not asserted: a
loaded machine makes them anything. The two measurement scripts (``live_consumer``,
``return_costs``) print their result lines instead of a ratio. Each benchmark's ``--help`` says
what it connects to: a CI broker id, or the URL form it takes.

A new benchmark without an entry here fails ``test_every_benchmark_is_in_the_lane``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
SLOW = pytest.mark.slow  # starts a JVM (Spark), a private RabbitMQ node or a Kubernetes API server

#: script -> (smallest arguments, the line it must print, marks). Sizes: the least that still runs
#: every phase (a baseline and rbak) once.
LANE: dict[str, tuple[list[str], str, tuple]] = {
    "archive": (["--only", "throughput", "--messages", "500"], r"rbak archive .*: ratio \d+\.\d+ \(target >= 0\.8\)", ()),
    "codec": (["--records", "300", "--repeat", "1"], r"rbak decode .* ratio \d+\.\d+x raw zstd", ()),
    "mosquitto_import": (["--messages", "300", "--repeat", "1"], r"ratio import/plain \d+\.\d+", ()),
    "backup": (["--messages", "300", "--repeat", "1", "--skip-rss"],
               r"backup throughput ratio rbak/bare pika consumer: median of paired runs \d+\.\d+", ()),
    "restore": (["--messages", "300", "--sync-messages", "100", "--amqp-url", "amqp://guest:guest@localhost:5674/%2f",
                 "--management-url", "http://localhost:15674"],
                r"ratio rbak / pika-pipelined \(mean of the runs before and after\): \d+\.\d+", ()),
    "quorum_one_channel": (["--messages", "300", "--repeat", "1"], r"median ratio \d+\.\d+", ()),
    "quorum_settle": (["--queues", "5", "--messages", "2", "--repeat", "1"], r"ratio without/with \d+\.\d+", ()),
    "amqp10_read": (["--messages", "300", "--repeat", "1"], r"median ratio 1\.0/0-9-1 \d+\.\d+", ()),
    "restore_scale": (["parallel", "--per-queue", "200", "--repeat", "1"],
                      r"RESULT restore 4 queues in parallel vs one publisher rmq310: ratio \d+\.\d+", ()),
    "backup_scale": (["many", "--queues", "3", "--per-queue", "20", "--repeat", "1"],
                     r"RESULT backup many queues 3x20 rmq310: ratio \d+\.\d+", ()),
    "before_after": (["--before", str(REPO), "--after", str(REPO), "--rounds", "1", "--messages", "300",
                      "--cases", "backup-classic"],
                     r"lowest ratio \d+\.\d+", ()),
    "restore_protocol": (["--brokers", "rmq43", "--sizes", "100", "--queues", "1", "--messages", "200", "--repeat", "1"],
                         r"ratio 1\.0/0-9-1: lowest median \d+\.\d+", ()),
    "return_costs": (["rmq43"], r"rmq43 [\d.]+: no limit set, 21 closes: messages left \d", ()),
    "live_consumer": (["rmq43", "classic"], r"rmq43 .*classic.*received", ()),
    "tap_cost": (["rmq43", "--messages", "300"], r"RESULT tap publish rate with/without rmq43 .*: ratio \d+\.\d+", ()),
    "import": (["--size-mb", "2", "--qs-size-mb", "1", "--repeat", "1"], r"best full-import ratio: \d+\.\d+", (SLOW,)),
    "spark_validate": (["--gb", "0.005", "--repeat", "1"], r"local\[2\] / local\[1\] = \d+\.\d+x", (SLOW,)),
    "spark_restore": (["--per-queue", "100", "--masters", "local[1]", "--per-task", "1", "--repeat", "1"],
                      r"RESULT Spark local\[1\] x1 publishers per task, .* ratio \d+\.\d+", (SLOW,)),
    "operator_scale": (["--n", "5", "--window", "5", "--runs", "2", "--skip", "burst"], r"latency: events/poll ratio \d+\.\d+", (SLOW,)),
}


def scripts() -> list[str]:
    return sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "bench_common")


def run(name: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    return subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_every_benchmark_is_in_the_lane():
    assert sorted(LANE) == scripts(), "add the new benchmark to LANE with its smallest size and ratio line"


#: The benchmarks that need no CI broker (a private node, a Kubernetes API server, files only).
NO_CI_BROKER = {"codec", "mosquitto_import", "import", "spark_validate", "operator_scale"}


@pytest.mark.parametrize("name", scripts())
def test_help_says_what_it_connects_to(name):
    p = run(name, "--help", timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    text = " ".join(p.stdout.split())
    if name not in NO_CI_BROKER:  # which broker, and how it is named
        assert "a CI broker by id, not a URL" in text or "amqp://USER:PASS@HOST:PORT[/VHOST]" in text, text


@pytest.mark.parametrize("name", [pytest.param(n, marks=LANE[n][2]) for n in sorted(LANE)])
def test_benchmark_finishes_and_prints_its_ratio(name, rmq310, rmq40, rmq43):
    args, line, _marks = LANE[name]
    p = run(name, *args)
    assert p.returncode == 0 and "Traceback" not in p.stderr, (p.stdout[-3000:], p.stderr[-3000:])
    assert re.search(line, p.stdout), p.stdout[-3000:]
