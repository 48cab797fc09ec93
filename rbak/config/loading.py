"""Reading a YAML config file: strict (duplicate keys refused), and errors that never echo a value."""

from __future__ import annotations

import os
import re
import typing

import yaml

from ..errors import ConfigError, DuplicateKeyError
from .model import Config


def yaml_error_text(e: Exception) -> str:
    """A YAML error without the offending text: line and column and what was wrong, never the
    line itself (it may hold a password), and never a value."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or type(e).__name__
    if isinstance(e, DuplicateKeyError):
        return str(e)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    # PyYAML's problems are fixed phrases ("found unexpected end of stream"); values never appear in them
    # except in "found character '...'" which names one character, which we keep out as well.
    problem = re.sub(r"'.*'", "a character", str(problem))
    return f"{where}{problem}"


def _strict_loader() -> type[yaml.SafeLoader]:
    """``yaml.SafeLoader`` that refuses duplicate mapping keys (naming the key and its line)."""
    class StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue
            if key in seen:
                raise DuplicateKeyError(f"line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                                        f"(first at line {seen[key] + 1})")
            seen[key] = key_node.start_mark.line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return StrictLoader


def load_config(path: str | os.PathLike[str], env: typing.Mapping[str, str] | None = None,
                overrides: typing.Mapping[str, typing.Any] | None = None) -> Config:
    """Read and validate a YAML config file; ``overrides``: top-level keys a command-line flag sets,
    validated with the file (``--backup-id`` with a restore config that names none)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            text = f.read().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read config file: {e}") from None
    try:
        data = yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except (yaml.YAMLError, DuplicateKeyError) as e:
        raise ConfigError(f"{p}: not valid YAML: {yaml_error_text(e)}") from None
    if data is None:
        data = {}
    if overrides and isinstance(data, dict):
        data = {**data, **overrides}
    return Config.from_dict(data, env=env, where=p)
