"""Peak resident memory of a child process, measured by the kernel.

``run_measured`` starts the command under a tiny Python wrapper that waits
for it and prints ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` of that
wrapper, so the figure is the peak of this one command (and its children),
never of an earlier child of the test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

BOUND_MIB = 512
"""The issue's fixed bound for validate --deep, restore and the imports, whatever the input."""

_WRAPPER = (
    "import json, resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "sys.stdout.buffer.write(json.dumps({'rc': p.returncode, 'peak_kib': peak, "
    "'out': p.stdout.decode('utf-8', 'replace'), 'err': p.stderr.decode('utf-8', 'replace')}).encode())\n"
)


def run_measured(args: list[str], env: dict | None = None, timeout: float = 300, cwd: str | None = None
                 ) -> tuple[subprocess.CompletedProcess, float]:
    """(the command's CompletedProcess with text output, its peak RSS in MiB)."""
    w = subprocess.run([sys.executable, "-c", _WRAPPER, *args], capture_output=True, timeout=timeout,
                       env={**os.environ, **(env or {})}, cwd=cwd)
    if w.returncode != 0:
        raise RuntimeError(f"measuring wrapper failed: {w.stderr.decode(errors='replace')}")
    d = json.loads(w.stdout)
    return subprocess.CompletedProcess(args, d["rc"], d["out"], d["err"]), d["peak_kib"] / 1024


def rbak_measured(*args: str, env: dict | None = None, timeout: float = 300, cwd: str | None = None
                  ) -> tuple[subprocess.CompletedProcess, float]:
    return run_measured([sys.executable, "-m", "rbak", *args], env=env, timeout=timeout, cwd=cwd)
