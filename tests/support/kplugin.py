"""``kubectl rbak`` as a user runs it: the console script pyproject.toml declares, written into a
directory for the ``PATH``, and the environment it runs in against a ``kube_api`` server."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def console_script(bin_dir: Path) -> Path:
    """``kubectl-rbak`` as pip writes a console script: the entry point pyproject.toml declares."""
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["kubectl-rbak"]
    module, func = entry.split(":")
    path = bin_dir / "kubectl-rbak"
    path.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
    path.chmod(0o755)
    return path


def plugin_env(kube_api, bin_dir: Path) -> dict[str, str]:
    """The user's shell: KUBECONFIG of the server, ``kubectl-rbak`` on the PATH, this checkout's code."""
    return {**kube_api.env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "operator")]),
            "RBAK_KUBECTL_POLL_SECONDS": "0.3"}
