"""RBAK_SPEEDUPS chooses the codec backend, and the codec tests pass on both."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rbak.format import backend

ROOT = Path(__file__).resolve().parents[2]
PROBE = "import rbak.format.batch as b, rbak.format.record as r; print(b.HAVE_SPEEDUPS, r._c is not None)"


def probe(value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != backend.ENV}
    if value is not None:
        env[backend.ENV] = value
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)


def test_the_switch_chooses_one_backend_for_both_modules():
    assert probe("0").stdout.split() == ["False", "False"]
    if backend.BUILT:
        assert probe(None).stdout.split() == ["True", "True"]
        assert probe("1").stdout.split() == ["True", "True"]
    bad = probe("fast")
    assert bad.returncode != 0 and "RBAK_SPEEDUPS='fast'" in bad.stderr


@pytest.mark.slow
def test_codec_tests_pass_on_the_pure_python_backend():
    """The whole tests/format suite again with RBAK_SPEEDUPS=0 (CI runs both backends)."""
    if os.environ.get(backend.ENV) == "0":
        pytest.skip("this run already is the pure-Python one")
    env = {**os.environ, backend.ENV: "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/format",
         "--deselect", "tests/format/test_backend.py::test_codec_tests_pass_on_the_pure_python_backend"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900,
    )
    tail = proc.stdout[-3000:]
    assert proc.returncode == 0, f"tests/format fails with RBAK_SPEEDUPS=0:\n{tail}{proc.stderr[-2000:]}"
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("RBAK_SPEEDUPS=0" in line for line in skips), skips
    assert " passed" in tail
