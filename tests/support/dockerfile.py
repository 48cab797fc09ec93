"""A small Dockerfile reader for the tests: stages, instructions, inheritance.

Only what the tests need: line continuations, comments, global ARG defaults,
`FROM image AS name`, and each stage's instructions in order.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Instruction:
    keyword: str
    value: str
    line: int

    def words(self) -> list[str]:
        return shlex.split(self.value)


@dataclass
class Stage:
    name: str
    base: str  # image reference or an earlier stage's name (ARGs expanded)
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    args: dict[str, str]
    stages: dict[str, Stage]

    def lineage(self, name: str) -> list[Stage]:
        """The stage and the stages it is built FROM, nearest first."""
        chain = []
        while name in self.stages:
            chain.append(self.stages[name])
            name = self.stages[name].base
        return chain

    def effective(self, name: str, keyword: str) -> Instruction | None:
        """The last `keyword` instruction in force in a stage (inherited through FROM <stage>)."""
        for stage in self.lineage(name):
            found = stage.all(keyword)
            if found:
                return found[-1]
        return None

    def base_image(self, name: str) -> str:
        return self.lineage(name)[-1].base


def parse(path: Path) -> Dockerfile:
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append((start, buf + line))
        buf = ""
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None

    def expand(text: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)

    for n, text in logical:
        keyword, _, value = text.partition(" ")
        keyword = keyword.upper()
        value = value.strip()
        if keyword == "FROM":
            parts = value.split()
            parts = [p for p in parts if not p.startswith("--")]
            base = expand(parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else f"stage{len(stages)}"
            current = Stage(name=name, base=base)
            stages[name] = current
        elif current is None:
            if keyword == "ARG":
                k, _, v = value.partition("=")
                args[k] = v
        else:
            current.instructions.append(Instruction(keyword, value, n))
    return Dockerfile(args=args, stages=stages)


def _ignore_patterns(root: Path) -> list[tuple[bool, str]]:
    out = []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        out.append((negate, line.lstrip("!").rstrip("/")))
    return out


def _matches(pattern: str, rel: str) -> bool:
    """Docker semantics, enough for our file: a pattern matches a path or any of its parents; ** spans dirs."""
    regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
    parts = rel.split("/")
    return any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1))


def build_context(root: Path, dest: Path) -> list[str]:
    """Copy what `docker build` would send (per .dockerignore) into dest; returns the relative paths."""
    import shutil

    patterns = _ignore_patterns(root)
    sent = []
    for path in sorted(root.rglob("*")):
        if path.is_dir() or ".git" in path.relative_to(root).parts:
            continue
        rel = path.relative_to(root).as_posix()
        included = True
        for negate, pattern in patterns:
            if _matches(pattern, rel):
                included = negate
        if included:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            sent.append(rel)
    return sent
