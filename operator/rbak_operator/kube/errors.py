"""The Kubernetes API's errors, typed once (as kopf's ``_cogs/clients/errors.py`` does): every failed call
raises an ``ApiError`` under ``rbak.errors.RbakError``, and the answers a caller expects and handles have
their own class to catch instead of a flag to pass: ``NotFound`` (404) and ``Conflict`` (409: a name
taken, or a resourceVersion that moved on). A call that got no answer at all (TLS refused, connection
lost after retries) is ``ApiError`` with status 0.

A caller that catches ``RbakError`` for its own reasons (a storage it cannot read, a spec it cannot
resolve) lets ``ApiError`` through first where the API's failure must retry the pass instead.
"""

from __future__ import annotations

from rbak.errors import RbakError


class ApiError(RbakError):
    """A call the API server refused or never answered; ``status`` 0 when there was no answer."""

    prefix = "Kubernetes API error"

    def __init__(self, status: int, reason: str, method: str, path: str):
        self.status, self.reason, self.method, self.path = status, reason, method, path
        super().__init__(f"{method} {path}: HTTP {status} {reason}")

    def __str__(self) -> str:
        return str(self.args[0])  # the request and the server's answer say it all; no prefix


class NotFound(ApiError):
    """404: the object (or its kind: a CRD not installed) does not exist."""


class Conflict(ApiError):
    """409: the name is taken, or the object changed since the resourceVersion written was read."""


def api_error(status: int, reason: str, method: str, path: str) -> ApiError:
    """The most specific class for an HTTP status."""
    cls = {404: NotFound, 409: Conflict}.get(status, ApiError)
    return cls(status, reason, method, path)
