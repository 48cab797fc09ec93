"""Docs that are generated must match what generates them (one place per fact)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"bash \.ci/setup && (python -m pytest [^\n#]*?)\s+#", readme)
    assert m, "README must show the test command"
    assert m.group(1).replace("python", '"$PY"', 1) in ci


def test_readme_links_exist():
    readme = (ROOT / "README.md").read_text()
    for link in re.findall(r"\]\(([^)#]+)\)", readme):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link
