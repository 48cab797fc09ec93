"""One JSON object on stdout for every command run with ``--json`` or ``--format json``.

A script or a GitOps job parses stdout whatever happened, so the CLI (``rbak.cli.main``), not each
command, writes it: a command hands its result to ``emit`` instead of printing it, and the CLI
prints, once, either that result (exit 0: the command's own JSON, unchanged) or, when the command
failed, ``failure``: ``ok: false``, the exit code, the error's class and one-line message, and the
command's fields of whatever result exists (a partial backup's summary, a failed restore's
queues, a report that found problems). ``SCHEMA`` describes it (``rbak config-reference
--output-schema``; docs/cli-json.md).
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any

RESULT = "_json_result"  # the attribute of the parsed arguments holding the emitted result

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "rbak --json / --format json output",
    "description": (
        "Every rbak command run with --json or --format json writes exactly one JSON value on stdout. "
        "Exit code 0: the command's own result (an object; `rbak list`: an array). Any other exit code: "
        "the failure object below, whose other fields are those of the command's result when one exists "
        "(for example a partial backup's summary), else none."),
    "oneOf": [
        {"title": "success", "description": "the command's own result; documented per command",
         "type": ["object", "array"],
         "not": {"type": "object", "required": ["ok"], "properties": {"ok": {"const": False}}}},
        {"title": "failure", "type": "object", "required": ["ok", "exit_code", "error"],
         "properties": {
             "ok": {"const": False},
             "exit_code": {"type": "integer", "minimum": 1,
                           "description": "the process's exit code: 1 failure, 2 configuration or usage error, "
                                          "3 partial backup, 4 backup lease held, 5 validation unverified (not decrypted), "
                                          "130 interrupted, 143 terminated"},
             "error": {"type": "object", "required": ["class", "message"],
                       "properties": {
                           "class": {"type": "string",
                                     "description": "the error's class in rbak.errors (e.g. PartialBackupError, "
                                                    "RestoreError, AmqpAuthenticationError, BackupLeaseError, "
                                                    "UsageError); an unexpected error's Python class"},
                           "message": {"type": "string", "description": "the one line also printed on stderr"}},
                       "additionalProperties": False},
             "result": {"description": "a partial result that is not an object (an array)"}},
         "additionalProperties": True},
    ],
}


def wants_json(args: Any) -> bool:
    """The command was asked for JSON output (``--json`` or ``--format json``)."""
    return getattr(args, "json", False) is True or getattr(args, "format", None) == "json"


def emit(args: Any, result: Any) -> None:
    """The command's JSON result: printed by the CLI once the command has ended (see the module doc)."""
    setattr(args, RESULT, result)


def partial_of(err: BaseException | None) -> Any:
    """What an error carries of the run it ended, as JSON (a backup's summary, a queue's result), or None."""
    for attr in ("summary", "queue_result"):
        v = getattr(err, attr, None)
        if v is not None and hasattr(v, "to_json_obj"):
            return v.to_json_obj()
        if v is not None:
            if is_dataclass(v) and not isinstance(v, type):
                return asdict(v)
    return None


def one_line(text: str) -> str:
    return " ".join(text.split())


def failure(result: Any, exit_code: int, err: BaseException | None, message: str | None = None) -> dict[str, Any]:
    """The failure object: the result's own fields, then ``ok: false``, the exit code and the error."""
    out: dict[str, Any] = {}
    if isinstance(result, dict):
        out.update(result)
    elif result is not None:
        out["result"] = result
    out["ok"] = False
    out["exit_code"] = exit_code
    out["error"] = {"class": type(err).__name__ if err is not None else "Error",
                    "message": one_line(message if message is not None else str(err))}
    return out


def final(args: Any, exit_code: int, err: BaseException | None, message: str | None = None) -> Any:
    """What the CLI prints for a command that asked for JSON: its result, or the failure object."""
    result = getattr(args, RESULT, None)
    if exit_code == 0:
        return result
    return failure(result if result is not None else partial_of(err), exit_code, err, message)
