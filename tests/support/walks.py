"""Follow one argument through rbak's call graph, from the source alone (issue 32's "walks").

``walk("rbak.restore.engine", "run_restore", "storage")`` lists, in call order, every function
that receives the value passed as ``storage``: by name, positionally or by keyword, directly or
inside a lambda or nested function. Calls are resolved through imports (re-exports followed);
``obj.method(storage)`` on an object of unknown type resolves to every method of that name in the
caller's module and the modules it imports from, so the walk overcounts rather than misses. Calls made *on* the value (``storage.get(...)``) end the walk:
that is the storage package's own code.

A value stored on an object in ``__init__`` (``self._storage = storage``) is followed into
every method of that class, in source order.

A "climb back up": taking the modules in the order the walk first reaches them, one that lies
in a higher layer (the order of ``[tool.importlinter]``'s layers contract) than the one before
it: the value went down into, say, the catalog and then on to another restore module.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
Func = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Module:
    name: str
    tree: ast.Module
    is_package: bool
    funcs: dict[str, Func] = field(default_factory=dict)       # "f" and "Class.m"
    imported: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # local -> (module, name|None)


def load_tree(root: Path = ROOT, package: str = "rbak") -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for p in sorted((root / package).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        pkg = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if pkg else parts)
        mods[name] = Module(name, ast.parse(p.read_text(), str(p)), pkg)
    for m in mods.values():
        for node in m.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                m.funcs[node.name] = node
            elif isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        m.funcs[f"{node.name}.{sub.name}"] = sub
        for node in ast.walk(m.tree):  # imports inside functions count too
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = m.name.split(".") if m.is_package else m.name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for a in node.names:
                    target = f"{base}.{a.name}"
                    m.imported[a.asname or a.name] = (target, None) if target in mods else (base, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        m.imported[a.asname] = (a.name, None)
    return mods


def _layers() -> list[str]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(c for c in conf if c["type"] == "layers")["layers"]


def layer_of(module: str) -> int:
    """0 for the top layer (``__main__``), growing downwards."""
    sub = module.split(".")[1] if "." in module else module
    for i, layer in enumerate(_layers()):
        if sub in [s.strip() for s in layer.split("|")]:
            return i
    raise KeyError(module)


@dataclass(frozen=True)
class Step:
    module: str
    function: str
    param: str


class Walker:
    def __init__(self, mods: dict[str, Module] | None = None):
        self.mods = mods or load_tree()
        self.methods: dict[str, list[tuple[str, str]]] = {}
        for m in self.mods.values():
            for q in m.funcs:
                if "." in q:
                    self.methods.setdefault(q.split(".", 1)[1], []).append((m.name, q))

    def _resolve_name(self, mod: str, name: str, depth: int = 0) -> list[tuple[str, str]]:
        m = self.mods.get(mod)
        if m is None or depth > 5:
            return []
        if name in m.funcs:
            return [(mod, name)]
        if f"{name}.__init__" in m.funcs:
            return [(mod, f"{name}.__init__")]
        cls = [q for q in m.funcs if q.startswith(f"{name}.")]
        if cls:  # a class without __init__ (a dataclass): the value lands in its module
            return [(mod, f"{name}.<fields>")]
        if name in m.imported:
            target, attr = m.imported[name]
            return self._resolve_name(target, attr, depth + 1) if attr else []
        return []

    def _annotated_class(self, mod: str, fn: Func, name: str) -> list[tuple[str, str]]:
        """The class a parameter is annotated with (``codec: ObjectCodec | None``), resolved."""
        for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
            if a.arg == name and a.annotation is not None:
                names = [n.id for n in ast.walk(a.annotation) if isinstance(n, ast.Name) and n.id != "None"]
                if len(names) == 1:
                    return self._resolve_name(mod, names[0])
        return []

    def _callees(self, mod: str, call: ast.Call, fn: Func | None = None) -> list[tuple[str, str]]:
        f = call.func
        if isinstance(f, ast.Name):
            return self._resolve_name(mod, f.id)
        if isinstance(f, ast.Attribute):
            base = f.value
            if isinstance(base, ast.Name):
                imp = self.mods[mod].imported.get(base.id)
                if imp and imp[1] is None:  # module.func
                    return self._resolve_name(imp[0], f.attr)
                cls = self._resolve_name(mod, base.id) or (  # Class.method, or a parameter's annotated class
                    self._annotated_class(mod, fn, base.id) if fn is not None else [])
                if cls:
                    owner, q = cls[0]
                    klass = q.split(".")[0]
                    return self._resolve_name(owner, f"{klass}.{f.attr}") if f"{klass}.{f.attr}" in self.mods[owner].funcs else []
            near = {mod} | {t for t, _ in self.mods[mod].imported.values()}
            return [c for c in self.methods.get(f.attr, []) if c[0] in near]
        return []

    @staticmethod
    def _params(fn: Func, method: bool) -> list[str]:
        names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        return names[1:] if method and names and names[0] in ("self", "cls") else names

    def _receiving(self, callee: tuple[str, str], call: ast.Call, value: str) -> list[str]:
        mod, q = callee
        if q.endswith(".<fields>"):
            return ["<field>"] if any(_is(a, value) for a in call.args) or any(_is(k.value, value) for k in call.keywords) else []
        fn = self.mods[mod].funcs[q]
        params = self._params(fn, "." in q)
        got = []
        for i, a in enumerate(call.args):
            if _is(a, value):
                if i < len(params):
                    got.append(params[i])
                elif fn.args.vararg:
                    got.append(fn.args.vararg.arg)
        for k in call.keywords:
            if k.arg and _is(k.value, value):
                got.append(k.arg)
        return got

    def walk(self, module: str, function: str, param: str) -> list[Step]:
        """Depth-first, in source order: each function that receives the value, once."""
        out: list[Step] = []
        seen: set[Step] = set()

        def visit(step: Step) -> None:
            if step in seen:
                return
            seen.add(step)
            out.append(step)
            if step.function.endswith(".<fields>"):
                return
            fn = self.mods[step.module].funcs[step.function]
            calls = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
            for call in calls:
                if isinstance(call.func, ast.Attribute) and _is(call.func.value, step.param):
                    continue  # a call on the value itself
                for callee in self._callees(step.module, call, fn):
                    for p in self._receiving(callee, call, step.param):
                        visit(Step(callee[0], callee[1], p))
            if step.function.endswith(".__init__"):  # stored on the object: every method that uses it
                klass = step.function.rsplit(".", 1)[0]
                for node in ast.walk(fn):
                    if (isinstance(node, ast.Assign) and _is(node.value, step.param) and len(node.targets) == 1
                            and isinstance(node.targets[0], ast.Attribute) and _is(node.targets[0].value, "self")):
                        for q in self.mods[step.module].funcs:
                            if q.startswith(klass + ".") and q != step.function:
                                visit(Step(step.module, q, f"self.{node.targets[0].attr}"))

        visit(Step(module, function, param))
        return out


def _is(node: ast.AST, name: str) -> bool:
    """``node`` is the value: a name, or ``self.<attr>`` once it was stored on an object."""
    if "." in name:
        obj, attr = name.split(".", 1)
        return isinstance(node, ast.Attribute) and node.attr == attr and _is(node.value, obj)
    return isinstance(node, ast.Name) and node.id == name


def modules_of(steps: list[Step]) -> list[str]:
    seen: list[str] = []
    for s in steps:
        if s.module not in seen:
            seen.append(s.module)
    return seen


def climbs(steps: list[Step]) -> list[tuple[str, str]]:
    """(from, to) for each module the walk reaches, in the order it first reaches them, that lies in a
    higher layer than the module reached just before it: the value went down and came back up."""
    mods = modules_of(steps)
    return [(a, b) for a, b in zip(mods, mods[1:]) if layer_of(b) < layer_of(a)]
