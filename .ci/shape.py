"""The code-shape measures of issue #46, computed the same way on any commit.

Run from a checkout's root: ``python .ci/shape.py`` (or ``--json``). Each measure is a plain count over the
source's syntax trees, so two commits compare line by line; the closing note's before/after table comes from here.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

ROOTS = {"rbak": Path("rbak"), "rbak_operator": Path("operator/rbak_operator"), "rbak_spark": Path("spark/rbak_spark")}
SELF_NAMES = {"self", "cls"}


def modules() -> dict[str, tuple[Path, ast.Module]]:
    """Every module of the three packages, by dotted name."""
    found: dict[str, tuple[Path, ast.Module]] = {}
    for pkg, root in ROOTS.items():
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = [pkg, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = (path, ast.parse(path.read_text(), str(path)))
    return found


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def resolve(importer: str, path: Path, node: ast.ImportFrom | ast.Import, known: set[str]) -> list[str]:
    """The project modules one import statement names (a `from pkg import mod` names the module)."""
    targets: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                targets.append(name)
        return targets
    if node.level:
        base = importer if is_package(path) else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        full = f"{base}.{node.module}" if node.module else base
    else:
        full = node.module or ""
    for alias in node.names:
        sub = f"{full}.{alias.name}"
        if sub in known:
            targets.append(sub)
            continue
        name = full
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            targets.append(name)
    return targets


def function_level(tree: ast.Module) -> list[ast.stmt]:
    """Import statements inside a function body."""
    out: list[ast.stmt] = []

    def walk(node: ast.AST, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if in_func and isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append(child)
            walk(child, inside)

    walk(tree, False)
    return out


def top_level_imports(tree: ast.Module) -> list[ast.stmt]:
    """Import statements run at import time (module body, including under if/try, excluding TYPE_CHECKING)."""
    out: list[ast.stmt] = []

    def walk(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                out.append(stmt)
            elif isinstance(stmt, ast.If):
                if "TYPE_CHECKING" in ast.unparse(stmt.test):
                    continue
                walk(stmt.body)
                walk(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                walk(stmt.body)
                for h in stmt.handlers:
                    walk(h.body)
                walk(stmt.orelse)
                walk(stmt.finalbody)

    walk(tree.body)
    return out


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def operator_unit(module: str) -> str:
    """The operator's top-level unit a module belongs to: its folder (``runtime``, ``kube``...) or, for a
    loose module (``handlers``, ``__main__``, every module of the flat operator), the module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def functions(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def n_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    count = sum(1 for p in names if p.arg not in SELF_NAMES)
    return count + (1 if a.vararg else 0) + (1 if a.kwarg else 0)


def unannotated(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]
    return fn.returns is None and all(p.annotation is None for p in params)


def selected_rules() -> list[str]:
    cfg = tomllib.loads(Path("pyproject.toml").read_text())
    lint = cfg.get("tool", {}).get("ruff", {}).get("lint", {})
    return list(lint.get("select", [])) + list(lint.get("extend-select", []))


def measure() -> dict[str, object]:
    mods = modules()
    known = set(mods)
    selected = selected_rules()
    op_edges: set[tuple[str, str]] = set()
    graph: dict[str, set[str]] = defaultdict(set)
    fl_imports = 0
    fl_by_pkg: dict[str, int] = defaultdict(int)
    many_params: list[str] = []
    skipped: list[str] = []
    private_calls: list[str] = []
    restore_wire = 0
    noqa_unselected = 0
    largest = ("", 0)
    for name, (path, tree) in mods.items():
        pkg = name.split(".")[0]
        lines = len(path.read_text().splitlines())
        if lines > largest[1]:
            largest = (str(path), lines)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in resolve(name, path, node, known):
                    if target == name or name.startswith(target + ".") and is_package(mods[target][0]):
                        pass
                    if pkg == "rbak_operator" and target.startswith("rbak_operator") and target != name:
                        op_edges.add((name, target))
                if name.startswith("rbak.restore"):
                    text = ast.unparse(node)
                    if "proton" in text or "broker.wire" in text or re.search(r"from \.+broker import .*\bwire\b", text):
                        restore_wire += 1
                if isinstance(node, ast.ImportFrom):
                    for alias in node.names:
                        if alias.name.startswith("_") and not alias.name.startswith("__") and (
                            node.level or (node.module or "").split(".")[0] in ROOTS
                        ):
                            private_calls.append(f"{name}: from {node.module} import {alias.name}")
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id not in SELF_NAMES:
                    private_calls.append(f"{name}: {node.value.id}.{node.attr}")
        for stmt in top_level_imports(tree):
            for target in resolve(name, path, stmt, known):  # type: ignore[arg-type]
                if target != name:
                    graph[name].add(target)
        fl = function_level(tree)
        fl_imports += len(fl)
        fl_by_pkg[pkg] += len(fl)
        for fn in functions(tree):
            if n_params(fn) >= 10:
                many_params.append(f"{name}.{fn.name}({n_params(fn)})")
            if unannotated(fn):
                skipped.append(f"{name}.{fn.name}")
        for m in re.finditer(r"#\s*noqa:\s*([A-Z0-9, ]+)", path.read_text()):
            codes = [c.strip() for c in m.group(1).split(",") if c.strip()]
            if any(not any(c.startswith(s) for s in selected) for c in codes):
                noqa_unselected += 1
    # A package importing its own child at import time is not a cycle if the child never imports the package
    # back; Tarjan finds the real ones among rbak's modules.
    rbak_graph = {k: {t for t in v if t.startswith("rbak.") or t == "rbak"} for k, v in graph.items() if k.startswith("rbak")}
    cycles = sccs(rbak_graph)
    engine_path = Path("rbak/backup/engine.py")
    engine_cls = engine_file = read_queue = 0
    if engine_path.exists():
        tree = ast.parse(engine_path.read_text())
        engine_file = len(engine_path.read_text().splitlines())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "BackupEngine":
                engine_cls = (node.end_lineno or 0) - node.lineno + 1
    for name, (path, tree) in mods.items():
        if name.startswith("rbak.backup"):
            for fn in functions(tree):
                if fn.name == "read_queue":
                    read_queue = max(read_queue, (fn.end_lineno or 0) - fn.lineno + 1)
    loose = sorted(p.stem for p in Path("rbak").glob("*.py") if p.name != "__init__.py")
    cfg = tomllib.loads(Path("pyproject.toml").read_text()).get("tool", {}).get("importlinter", {})
    op_contracts = sum(
        1
        for c in cfg.get("contracts", [])
        if any(("rbak_operator" in str(v) or "rbak_spark" in str(v)) for k, v in c.items() if k != "name")
    )
    # The goal is folders that show the flow: with ~45 small modules a module count cannot go below
    # 44 (a tree), so the arrows between the operator's folders and loose modules are counted too.
    op_unit_edges = {(operator_unit(a), operator_unit(b)) for a, b in op_edges if operator_unit(a) != operator_unit(b)}
    return {
        "operator import arrows between its modules": len(op_edges),
        "operator import arrows between its folders and loose modules": len(op_unit_edges),
        "operator/spark contracts in CI": op_contracts,
        "BackupEngine lines / backup/engine.py lines": f"{engine_cls} / {engine_file}",
        "read_queue lines": read_queue,
        "functions with >= 10 parameters": len(many_params),
        "private cross-module names (attr or import)": len(private_calls),
        "imports of Proton or broker/wire from restore/": restore_wire,
        "function-level imports (rbak, operator, spark)": f"{fl_imports} ({fl_by_pkg['rbak']}, {fl_by_pkg['rbak_operator']}, {fl_by_pkg['rbak_spark']})",
        "noqa naming rules CI never runs": noqa_unselected,
        "functions mypy skips (no annotation at all)": len(skipped),
        "largest Python module (lines)": f"{largest[1]} ({largest[0]})",
        "loose top-level modules in rbak/": f"{len(loose)} ({', '.join(loose)})",
        "module cycles in rbak": len(cycles),
        "_detail": {"many_params": many_params, "private": private_calls, "cycles": cycles,
                    "operator_unit_arrows": sorted(f"{a} -> {b}" for a, b in op_unit_edges)},
    }


def main() -> None:
    result = measure()
    if "--json" in sys.argv:
        print(json.dumps(result, indent=2))
        return
    verbose = "-v" in sys.argv
    for key, value in result.items():
        if key == "_detail":
            if verbose:
                print(json.dumps(value, indent=2))
            continue
        print(f"| {key} | {value} |")


if __name__ == "__main__":
    main()
