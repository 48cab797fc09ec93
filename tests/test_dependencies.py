"""Every import the project makes is declared, and every module imports (seconds, not a 7-minute run).

A package used but declared nowhere passes wherever someone installed it by hand
and fails on a user's fresh machine; this finds it from the source alone, naming
the module, the import and the distribution to declare.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Which requirements each tree may rely on: the runtime trees only their own extras.
TREES = {
    "rbak": ("",),
    "operator/rbak_operator": ("", "operator"),
    "operator/rbak_kubectl": ("", "operator"),
    "spark": ("", "spark"),
    "tests": ("", "operator", "spark", "test"),
    "benchmarks": ("", "operator", "spark", "test"),
    "requirements": ("", "test"),
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extras: tuple[str, ...]) -> set[str]:
    """Canonical names of the distributions the given extras ("" = core) declare, extras followed."""
    out: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop()
        reqs = PROJECT["dependencies"] if extra == "" else PROJECT["optional-dependencies"][extra]
        for r in map(Requirement, reqs):
            if canonical(r.name) == canonical(PROJECT["name"]):
                todo.extend(r.extras)
            else:
                out.add(canonical(r.name))
    return out


def local_names() -> set[str]:
    """Top-level names that are this repo's own modules (tests import helpers by bare name)."""
    names = {"rbak", "rbak_operator", "rbak_kubectl", "rbak_spark"}
    for p in ROOT.rglob("*.py"):
        if ".git" not in p.parts:
            names.add(p.stem)
            names.update(part for part in p.relative_to(ROOT).parts[:-1])
    return names


def third_party_imports(tree: str) -> dict[str, set[str]]:
    """{top-level import name: files importing it} for every absolute import under ``tree``."""
    local = local_names()
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / tree).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in local:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("tree", sorted(TREES))
def test_every_import_is_declared(tree):
    allowed = declared(TREES[tree])
    providers = packages_distributions()
    problems = []
    for name, files in sorted(third_party_imports(tree).items()):
        dists = providers.get(name)
        where = ", ".join(sorted(files)[:3])
        if not dists:
            problems.append(f"{name} (imported by {where}) is not installed: declare its distribution")
        elif not {canonical(d) for d in dists} & allowed:
            want = " or ".join(sorted(dists))
            extras = "/".join(e or "core" for e in TREES[tree])
            problems.append(f"{name} (imported by {where}) comes from {want}, declared in none of: {extras}")
    assert problems == [], "undeclared imports:\n" + "\n".join(problems)


def package_modules() -> list[str]:
    mods = []
    for base, pkg in ((ROOT, "rbak"), (ROOT / "operator", "rbak_operator"), (ROOT / "operator", "rbak_kubectl"), (ROOT / "spark", "rbak_spark")):
        for p in sorted((base / pkg).rglob("*.py")):
            if p.stem == "__main__":  # runs the program on import
                continue
            rel = p.relative_to(base).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            mods.append(".".join(parts))
    return mods


def test_every_module_imports():
    """In a fresh interpreter (nothing imported by other tests helps), with the repo's import paths."""
    code = (
        "import importlib, sys\n"
        "bad = []\n"
        f"for m in {package_modules()!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{m}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad)); sys.exit(1 if bad else 0)\n"
    )
    env_path = f"{ROOT}:{ROOT / 'operator'}:{ROOT / 'spark'}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": env_path}, cwd=ROOT)
    assert proc.returncode == 0, f"modules that do not import:\n{proc.stdout}{proc.stderr[-2000:]}"


def test_the_checker_names_an_undeclared_import(tmp_path, monkeypatch):
    """The check above can fail: a tree importing something its extras do not declare is reported."""
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "m.py").write_text("import kopf\nimport yaml\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setitem(TREES, "fake", ("",))
    with pytest.raises(AssertionError, match=r"kopf \(imported by fake/m.py\) comes from kopf, declared in none of: core"):
        test_every_import_is_declared("fake")
    importlib.invalidate_caches()


def test_pika_is_pinned_to_the_range_it_was_tested_with():
    """``rbak.broker.wire`` uses pika's codec (``pika.spec``, ``pika.frame``): pyproject allows only the
    tested minor series, and the pika these tests run against is inside it (so the suite tests what users get)."""
    from importlib.metadata import version

    (req,) = [r for r in map(Requirement, PROJECT["dependencies"]) if canonical(r.name) == "pika"]
    assert req.specifier.contains(version("pika")), (version("pika"), str(req.specifier))
    assert any(s.operator == "<" for s in req.specifier), f"pika needs an upper bound: {req}"


CLIENTS = ("pika", "proton", "rstream")
# private attributes of pika's objects that rbak's old fast path used: found on any object (a channel or
# connection is not a module name, so the chain check below cannot see them)
KNOWN_PRIVATE = {"_impl", "_frame_buffer", "_read_frame", "_process_frame", "_transport", "_flush_output",
                 "_output_marshaled_frames", "_has_pending_callbacks", "_queue_consumer_generator",
                 "_consumer_infos", "_heartbeat_checker", "_check_interval", "_body_max_length", "_on_data_available"}


def _private_uses(path: Path) -> list[str]:
    """Names starting with ``_`` that ``path`` takes from pika, proton or rstream (imported, or read as an
    attribute of one of their modules), and assignments to their modules' or objects' attributes."""
    tree = ast.parse(path.read_text(), str(path))
    mods: set[str] = set()  # local names bound to a client module
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in CLIENTS:
                    mods.add((a.asname or a.name).split(".")[0])
                    if any(p.startswith("_") for p in a.name.split(".")):
                        found.append(f"{path.name}:{node.lineno} import {a.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in CLIENTS:
            for a in node.names:
                if a.name.startswith("_") or any(p.startswith("_") for p in (node.module or "").split(".")):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in KNOWN_PRIVATE and mods:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.Attribute):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in mods and any(c.startswith("_") and not c.startswith("__")
                                                                      for c in chain):
                found.append(f"{path.name}:{node.lineno} {base.id}.{'.'.join(reversed(chain))}")
            if isinstance(node.ctx, ast.Store) and isinstance(base, ast.Name) and base.id in mods:
                found.append(f"{path.name}:{node.lineno} assigns {base.id}.{'.'.join(reversed(chain))}")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in mods:
                found.append(f"{path.name}:{node.lineno} assigns into {ast.unparse(node.value)}[...]")
    return found


@pytest.mark.parametrize("tree", ["rbak", "operator", "spark", "tests", "benchmarks"])
def test_no_private_names_of_the_clients(tree):
    """Issue 32: pika, Qpid Proton and rstream are used through their public names only, and nothing
    assigns to their modules' attributes (no process-wide patch of another library)."""
    found = [x for p in sorted((ROOT / tree).rglob("*.py")) if ".ci" not in p.parts for x in _private_uses(p)]
    assert found == []


def test_the_private_name_check_can_fail(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import pika\nimport pika.spec as s\nfrom pika.adapters.blocking_connection import _IoloopTimerContext\n"
                 "x = pika.connection.Connection._has_pending_callbacks\npika.spec.BasicProperties.decode = None\n"
                 "pika.spec.props[1] = None\n")
    got = _private_uses(p)
    assert "_IoloopTimerContext" in got[0] and "pika.connection.Connection._has_pending_callbacks" in " ".join(got)
    assert "assigns pika.spec.BasicProperties.decode" in got[-2] and "assigns into pika.spec.props" in got[-1], got
