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


def test_architecture_layers_are_the_import_contract():
    """ARCHITECTURE.md's layer table lists rbak's packages in the order and grouping lint-imports enforces."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in cfg["contracts"] if c["type"] == "layers")
    contract = [sorted(n.strip() for n in layer.split("|")) for layer in layers]
    arch = (ROOT / "ARCHITECTURE.md").read_text()
    table = arch[arch.index("## The packages of `rbak/`"):arch.index("## A backup, step by step")]
    cells = [re.split(r"(?<!\\)\|", line) for line in table.splitlines() if line.startswith("| ")]
    drawn = [sorted(re.findall(r"`([a-z_]+)/?`", c[2])) for c in cells if "`" in c[2]]
    entry = sorted(sum(contract[:3], []))  # __main__, cli and commands share the table's first row
    assert drawn == [entry, *contract[3:]]
