"""A small Management API client for the backup side (requests, TLS, no secrets in errors).

Only what a backup needs: the overview (cluster name, version), the queue list
with type, depth and arguments, policies (for delivery limits) and the
definitions export. Errors name the method, the path and the HTTP status, and
never the credentials.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import requests

from ..config import ConnectionConfig
from ..errors import ManagementApiError

log = logging.getLogger(__name__)


def q(name: str) -> str:
    """One path segment (``/`` -> ``%2F``)."""
    return quote(name, safe="")


@dataclass(slots=True)
class QueueInfo:
    vhost: str
    name: str
    queue_type: str
    messages: int | None
    arguments: dict[str, Any] = field(default_factory=dict)
    policy: str | None = None
    effective_policy: dict[str, Any] = field(default_factory=dict)
    operator_policy: str | None = None
    auto_delete: bool = False
    exclusive: bool = False
    consumers: int | None = None
    reported: frozenset[str] = frozenset()  # the fields the listing held (stats lag after a declare)


class ManagementClient:
    def __init__(self, conn: ConnectionConfig):
        self.base = conn.management_url.rstrip("/")
        self.timeout = conn.connection_timeout_secs
        s = requests.Session()
        s.auth = (conn.mgmt_username, conn.mgmt_password)
        tls = conn.tls
        # verify/cert go on every request: requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE
        # override a Session's own verify setting, which would ignore source.tls.ca_cert
        self._tls: dict[str, Any] = {}
        if self.base.startswith("https://"):
            self._tls["verify"] = (tls.ca_cert or True) if tls.verify else False
            if not tls.verify:
                log.warning("TLS verification is off for %s (source.tls.verify: false)", self.base)
            if tls.client_cert:
                self._tls["cert"] = (tls.client_cert, tls.client_key) if tls.client_key else tls.client_cert
        elif tls.enabled:
            raise ManagementApiError(
                f"source.management_url {self.base!r} is plain http but tls.enabled is true; "
                "use an https:// management URL (rbak never falls back to plaintext)")
        self._s = s

    def close(self) -> None:
        self._s.close()

    def request(self, method: str, path: str, **kw: Any) -> Any:
        url = f"{self.base}/api/{path}"
        try:
            r = self._s.request(method, url, timeout=self.timeout, **self._tls, **kw)
        except requests.exceptions.SSLError as e:
            raise ManagementApiError(f"TLS handshake with {self.base} failed ({_reason(e)}); "
                                     "check source.tls.ca_cert / client_cert") from None
        except requests.exceptions.RequestException as e:
            raise ManagementApiError(f"{method} {self.base}/api/{path}: {type(e).__name__}: {_reason(e)}") from None
        if r.status_code == 401:
            raise ManagementApiError(f"{method} /api/{path}: 401 Unauthorized (check management_username/password)")
        if r.status_code >= 400:
            text = r.text[:200].replace("\n", " ")
            raise ManagementApiError(f"{method} /api/{path}: HTTP {r.status_code}: {text}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise ManagementApiError(f"{method} /api/{path}: the response is not JSON") from None

    def overview(self) -> dict[str, Any]:
        return self.request("GET", "overview") or {}

    def vhosts(self) -> list[str]:
        return [v["name"] for v in self.request("GET", "vhosts") or []]

    def queues(self, vhost: str | None = None) -> list[QueueInfo]:
        path = f"queues/{q(vhost)}" if vhost is not None else "queues"
        return [_queue_info(d, vhost) for d in self.request("GET", path, params={"columns": QUEUE_COLUMNS}) or []]

    def queue(self, vhost: str, name: str) -> QueueInfo | None:
        """One queue, fresh (None: it does not exist)."""
        try:
            d = self.request("GET", f"queues/{q(vhost)}/{q(name)}", params={"columns": QUEUE_COLUMNS})
        except ManagementApiError as e:
            if "HTTP 404" in str(e):
                return None
            raise
        return _queue_info(d or {"name": name}, vhost)

    def policies(self, vhost: str) -> list[dict[str, Any]]:
        return self.request("GET", f"policies/{q(vhost)}") or []

    def operator_policies(self, vhost: str) -> list[dict[str, Any]]:
        try:
            return self.request("GET", f"operator-policies/{q(vhost)}") or []
        except ManagementApiError:
            return []

    def definitions_raw(self) -> bytes:
        """GET /api/definitions, as the broker's JSON bytes."""
        url = f"{self.base}/api/definitions"
        try:
            r = self._s.get(url, timeout=max(self.timeout, 60), **self._tls)
        except requests.exceptions.SSLError as e:
            raise ManagementApiError(f"TLS handshake with {self.base} failed ({_reason(e)})") from None
        except requests.exceptions.RequestException as e:
            raise ManagementApiError(f"GET {url}: {type(e).__name__}: {_reason(e)}") from None
        if r.status_code >= 400:
            raise ManagementApiError(f"GET /api/definitions: HTTP {r.status_code}: {r.text[:200]}")
        return r.content


QUEUE_COLUMNS = ("name,vhost,type,messages,arguments,policy,operator_policy,effective_policy_definition,"
                 "auto_delete,exclusive,consumers,durable")


def _queue_info(d: dict[str, Any], vhost: str | None) -> QueueInfo:
    return QueueInfo(
        vhost=d.get("vhost", vhost or "/"), name=d["name"], queue_type=d.get("type") or "classic",
        messages=d.get("messages"), arguments=d.get("arguments") or {},
        policy=d.get("policy") or None, effective_policy=d.get("effective_policy_definition") or {},
        operator_policy=d.get("operator_policy") or None, auto_delete=bool(d.get("auto_delete")),
        exclusive=bool(d.get("exclusive")), consumers=d.get("consumers"), reported=frozenset(d),
    )


def _reason(e: Exception) -> str:
    """A short cause without URLs carrying credentials (requests never puts auth in them)."""
    s = str(e)
    for marker in ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "Connection refused",
                   "timed out", "Name or service not known", "WRONG_VERSION_NUMBER", "record layer failure"):
        if marker in s:
            return marker
    return s[:200]
