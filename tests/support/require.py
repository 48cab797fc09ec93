"""The one "skip locally, fail in CI" rule for anything a test needs from outside.

A developer's machine may lack a broker, a package or a tool and still run the rest;
CI must never pass by skipping, so with ``CI=true`` a missing requirement fails the
test naming what ``.ci/setup`` or the ``test`` extra should have provided.
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere: ``reason`` says what is missing and how to get it."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: infrastructure must be present)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module: str, distribution: str | None = None) -> ModuleType:
    """Import ``module`` or be ``unavailable``, naming the distribution that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        dist = distribution or module.split(".")[0]
        unavailable(f"{module} cannot be imported ({e}); install {dist} (declared in the test extra)")
        raise  # unreachable: unavailable() always raises


def require_tool(name: str, how: str = "run .ci/setup") -> str:
    """The path of executable ``name`` or be ``unavailable``."""
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not on PATH; {how}")
    return path  # type: ignore[return-value]


def require_that(reason: str | None) -> None:
    """``reason`` is None when a requirement is met, else why not (then unavailable)."""
    if reason:
        unavailable(reason)
