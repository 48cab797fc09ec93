"""What docker/slim-venv takes out of the images never takes what rbak needs.

The images ship the dependencies without parts rbak does not use (botocore's models of other AWS
services, the kubernetes client's generated API classes and asyncio copy, pygments, pyspark's
Hive/MLlib/Connect jars, ...). These tests read rbak's own sources, so a new use of a removed
part fails here, in CI, before a user meets it:

- every boto3 client rbak or the operator creates, and every client botocore's credential chain
  creates (IRSA, assume-role and SSO profiles), loads in the image;
- every import statement of rbak, the operator and the Spark jobs resolves in the image, names
  included (``from kubernetes.client import CoreV1Api`` would fail here, not in a pod).

The images are ``.ci/image``'s, as in test_image_roles.py (skip without podman, fail with CI=true).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from support import container
from support.container import IMAGE, SPARK_IMAGE, Role
from support.require import require_that

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_SOURCES = [ROOT / "rbak", ROOT / "operator"]
SPARK_SOURCES = [ROOT / "spark"]
SPARK_JOBS_DIR = "/opt/rbak/spark"  # where the spark image has spark/ (Dockerfile)


def python_files(roots: list[Path]) -> list[Path]:
    return sorted(p for r in roots for p in r.rglob("*.py") if "__pycache__" not in p.parts)


def boto3_services(roots: list[Path]) -> set[str]:
    """The service names of every ``<session or boto3>.client("name", ...)`` call in the sources."""
    found = set()
    for path in python_files(roots):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "client"):
                continue
            args = [a for a in node.args[:1]] + [k.value for k in node.keywords if k.arg == "service_name"]
            found |= {a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return found


def _optional(handlers: list[ast.ExceptHandler]) -> bool:
    """An ``except ImportError`` (or ModuleNotFoundError): the import is allowed to fail."""
    names = set()
    for h in handlers:
        for t in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]) if h.type else []:
            if isinstance(t, ast.Name):
                names.add(t.id)
    return bool(names & {"ImportError", "ModuleNotFoundError"})


def imports_in(tree: ast.Module, where: str) -> list[tuple[str, list[str], str]]:
    """(module, names imported from it, file:line) of every absolute import a module runs: not
    those under ``if TYPE_CHECKING:`` nor in a ``try`` that handles ImportError."""
    out: list[tuple[str, list[str], str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Try) and _optional(node.handlers):
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, [], f"{where}:{node.lineno}") for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            out.append((node.module or "", [a.name for a in node.names if a.name != "*"], f"{where}:{node.lineno}"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def runtime_imports(roots: list[Path]) -> list[tuple[str, list[str], str]]:
    return [i for p in python_files(roots) for i in imports_in(ast.parse(p.read_text(), str(p)), str(p.relative_to(ROOT)))]


CHECK_IMPORTS = r"""
import importlib, json, sys
sys.path[:0] = json.loads(sys.argv[2])
bad = []
for module, names, where in json.loads(sys.argv[1]):
    try:
        m = importlib.import_module(module)
        for n in names:
            if not hasattr(m, n):
                importlib.import_module(f"{module}.{n}")
    except Exception as e:
        bad.append(f"{where}: {module} {names}: {type(e).__name__}: {e}")
print(json.dumps(bad))
"""


def missing_imports(image: str, imports: list[tuple[str, list[str], str]], path: list[str]) -> list[str]:
    # The spark scripts import their own package by a path the job adds: their top-level modules
    # resolve from SPARK_JOBS_DIR here. Each module is imported once, with all its names.
    merged: dict[str, tuple[set[str], str]] = {}
    for module, names, where in imports:
        merged.setdefault(module, (set(), where))[0].update(names)
    todo = [(m, sorted(n), w) for m, (n, w) in sorted(merged.items())]
    res = Role("import check", image).run(["-c", CHECK_IMPORTS, json.dumps(todo), json.dumps(path)],
                                          entrypoint=["python"])
    return json.loads(res.output.strip().splitlines()[-1])


def test_the_source_scans_find_what_they_look_for():
    """The scans below are live: they find the clients and imports rbak is known to have."""
    assert {"s3", "kms"} <= boto3_services(RUNTIME_SOURCES)
    imports = {m for m, _, _ in runtime_imports(RUNTIME_SOURCES)}
    assert {"boto3", "kopf", "kubernetes.client", "rich.table", "numpy", "zstandard"} <= imports, imports
    assert "pyspark.sql.datasource" in {m for m, _, _ in runtime_imports(SPARK_SOURCES)}
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import typing_only\n"
                     "try:\n    import optional\nexcept ImportError:\n    pass\nfrom a.b import c, d\n")
    assert imports_in(tree, "m.py") == [("typing", ["TYPE_CHECKING"], "m.py:1"), ("a.b", ["c", "d"], "m.py:8")]


def test_every_boto3_client_rbak_and_the_credential_chain_create_loads_in_the_image():
    require_that(container.image_problem(IMAGE))
    ours = boto3_services(RUNTIME_SOURCES)
    code = r"""
import json, re, sys, pathlib, boto3, botocore
# The clients botocore's own credential providers create (web identity, assume-role, SSO, login).
src = "".join(p.read_text() for p in pathlib.Path(botocore.__file__).parent.glob("*.py"))
named = r"['\"]([a-z0-9-]+)['\"]"
chain = sorted(set(re.findall(r"(?:create_client|client_creator)\(\s*" + named, src))
               | set(re.findall(r"create_nested_client\([^,()]+,\s*" + named, src)))
loaded = {}
for service in sorted(set(json.loads(sys.argv[1])) | set(chain)):
    c = boto3.session.Session().client(service, region_name="us-east-1", aws_access_key_id="x",
                                       aws_secret_access_key="x")
    loaded[service] = len(c.meta.service_model.operation_names)
print(json.dumps({"chain": chain, "loaded": loaded}))
"""
    res = Role("boto3 clients", IMAGE).run(["-c", code, json.dumps(sorted(ours))], entrypoint=["python"])
    got = json.loads(res.output.strip().splitlines()[-1])
    assert {"sts", "sso", "sso-oidc", "signin"} <= set(got["chain"]), got  # the scan of botocore found its chain
    assert set(got["loaded"]) == ours | set(got["chain"]), got
    assert all(n > 0 for n in got["loaded"].values()), got


def test_every_import_of_rbak_and_the_operator_resolves_in_the_runtime_image():
    require_that(container.image_problem(IMAGE))
    bad = missing_imports(IMAGE, runtime_imports(RUNTIME_SOURCES), [])
    assert bad == [], "imports the runtime image cannot satisfy:\n" + "\n".join(bad)


def test_every_import_of_the_spark_jobs_resolves_in_the_spark_image():
    require_that(container.image_problem(SPARK_IMAGE))
    bad = missing_imports(SPARK_IMAGE, runtime_imports(RUNTIME_SOURCES + SPARK_SOURCES), [SPARK_JOBS_DIR])
    assert bad == [], "imports the spark image cannot satisfy:\n" + "\n".join(bad)
