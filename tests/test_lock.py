"""The test environment is the lock: what `.ci/setup` installs is `requirements/test.lock`, exactly.

Issue 42: `moto[server]>=5.0` let a fresh machine take moto 5.2.6, whose IAM check denies a correct
policy, and the suite's verdict came to depend on the day it was installed. These checks keep the
lock complete (everything the tests and CI's tools import), consistent with pyproject.toml and the
image's pins, hashed, and the only source `.ci/setup` installs from.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "test.lock"
sys.path.insert(0, str(ROOT / "requirements"))
import freeze  # noqa: E402  (requirements/freeze.py)

BUILD_TOOLS = {"setuptools", "wheel"}  # requirements/lock.in: pinned for --no-build-isolation
# .ci/latest runs the suite on the newest releases on purpose: what is installed there is not the lock
unlocked = pytest.mark.skipif(bool(os.environ.get("RBAK_UNLOCKED")),
                              reason="RBAK_UNLOCKED: .ci/latest tests the newest releases, not the lock")


def parse_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """{canonical name: (version, hashes)} of a `uv pip compile --generate-hashes` file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)( \\)?", line)
            if not m:
                raise ValueError(f"{LOCK.name}:{lineno}: {line!r} is not a `name==version` pin")
            current = freeze.canonical(m.group(1))
            entries[current] = (m.group(3), [])
        else:
            h = re.fullmatch(r"\s+--hash=(sha256:[0-9a-f]{64})( \\)?", line)
            if not h or current is None:
                raise ValueError(f"{LOCK.name}:{lineno}: {line!r} is neither a hash nor a comment")
            entries[current][1].append(h.group(1))
    return entries


def locked() -> dict[str, tuple[str, list[str]]]:
    return parse_lock(LOCK.read_text())


def test_every_entry_is_pinned_and_hashed():
    entries = locked()
    assert len(entries) > 50, entries  # a parse that found nothing must not pass
    assert [n for n, (_, hashes) in entries.items() if not hashes] == []


def test_the_parser_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="is not a `name==version` pin"):
        parse_lock("moto>=5.0\n")
    with pytest.raises(ValueError, match="neither a hash nor a comment"):
        parse_lock("moto==5.2.5 \\\n    --hash=md5:abc\n")


def test_every_pyproject_requirement_is_locked_at_a_version_it_allows():
    reqs = freeze.project_requirements(("operator", "spark", "test"))
    reqs += [Requirement(line) for line in (ROOT / "requirements" / "lock.in").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    entries = locked()
    problems = []
    for r in reqs:
        name = freeze.canonical(r.name)
        if name not in entries:
            problems.append(f"{r} is not in the lock: run `bash .ci/lock`")
        elif not r.specifier.contains(entries[name][0], prereleases=True):
            problems.append(f"{r}: the lock has {entries[name][0]}: run `bash .ci/lock`")
    assert problems == []


@unlocked
def test_the_lock_is_exactly_the_closure_of_the_test_extra():
    """Nothing the tests pull in comes from outside the lock, and the lock carries nothing else.
    The closure is read from the installed metadata, which `.ci/setup` installed from the lock."""
    try:
        closure = freeze.closure(freeze.project_requirements(("operator", "spark", "test")))
    except SystemExit as e:  # freeze names the package it cannot find installed
        pytest.fail(f"{e}: the environment is not the lock's; run `bash .ci/setup` (it installs the lock)",
                    pytrace=False)
    names = set(locked()) - BUILD_TOOLS
    assert sorted(set(closure) - names) == [], "installed by the test extra but not locked: run `bash .ci/lock`"
    assert sorted(names - set(closure)) == [], "locked but pulled in by nothing: run `bash .ci/lock`"


@pytest.mark.parametrize("pins", ["image.txt", "spark.txt"])
def test_the_image_ships_what_the_tests_ran(pins):
    """The runtime pins of the image (requirements/freeze.py) and the test lock agree, boto3 and
    botocore included, so the suite tests the versions the image ships."""
    entries = locked()
    image = freeze.parse((ROOT / "requirements" / pins).read_text())
    differ = {n: (v, entries[n][0] if n in entries else None) for n, v in image.items()
              if n not in entries or entries[n][0] != v}
    assert differ == {}, (f"{pins} pin -> test.lock pin: after an upgrade of the lock, `bash .ci/setup` then "
                          "`python requirements/freeze.py`; otherwise `bash .ci/lock` brings the lock back to the image")


@unlocked
def test_everything_locked_is_installed_at_its_locked_version():
    """What `.ci/setup` left in this environment is the lock (another version means setup installed
    from somewhere else, or someone upgraded by hand: rerun `bash .ci/setup`)."""
    wrong = {}
    for name, (want, _) in locked().items():
        try:
            got = version(name)
        except PackageNotFoundError:
            got = None
        if got != want:
            wrong[name] = (want, got)
    assert wrong == {}, "lock version -> installed version: run `bash .ci/setup`, which installs the lock"


def pip_installs(script: str) -> list[str]:
    """The `pip install` command lines of a shell script (continuations joined)."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [line.strip() for line in joined.splitlines()
            if re.search(r"\bpip\s+install\b", line) and not line.lstrip().startswith("#")]


def test_setup_installs_from_the_lock_only():
    """Every `pip install` in .ci/setup takes hashed pins from the lock, or is rbak itself without
    its dependencies: nothing resolves a range on the day it runs."""
    lines = pip_installs((ROOT / ".ci" / "setup").read_text())
    assert len(lines) == 3, lines
    for line in lines:
        hashed = "--require-hashes" in line and "--no-deps" in line and re.search(r'-r "\$(lock|build)"', line)
        itself = "--no-deps" in line and re.search(r'-e "\$REPO"', line)
        assert hashed or itself, f".ci/setup installs outside the lock: {line}"


def test_the_setup_check_can_fail():
    assert pip_installs('    "$py" -m pip install -q -e "${REPO}[test]" </dev/null\n') == [
        '"$py" -m pip install -q -e "${REPO}[test]" </dev/null']
    line = pip_installs('"$py" -m pip install -q -e "${REPO}[test]"\n')[0]
    assert not ("--require-hashes" in line or "--no-deps" in line)
