"""The one Management API client (requests, TLS, no secrets in errors), for source and target.

Backups read the source's overview, queue list, policies and definitions; a
restore and ``rbak definitions-import`` read and write the target's
definitions and ask what it supports (version, feature flags, deprecated
features); ``rbak definitions-export`` reads the source. One TLS rule for all:
an ``https://`` URL verifies against ``tls.ca_cert`` (the system store when
unset) unless ``tls.verify: false`` (logged), sends the client certificate
when given, and a plain ``http://`` URL is refused when TLS was asked for
(never a silent plaintext fallback). Errors name the method, the path and the
HTTP status, never the credentials.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import requests

from ..errors import ManagementApiError

log = logging.getLogger("rbak.management")  # the name log filters know, kept when the module moved to broker/

DEFINITIONS_TIMEOUT_SECS = 60.0  # a large cluster's export takes a while


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
    priority_stats: dict[str, Any] = field(default_factory=dict)  # ready messages per priority (4.x quorum)
    unacked: int | None = None  # delivered to consumers, not yet acknowledged: a backup cannot read them


class ManagementClient:
    """``role`` (``source`` or ``target``) names the config section in error messages."""

    def __init__(self, base_url: str, username: str, password: str, *, timeout: float = 10.0,
                 tls_enabled: bool = False, ca_cert: str | None = None, client_cert: str | None = None,
                 client_key: str | None = None, verify: bool = True, role: str = "source"):
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        self.role = role
        self.username = username
        s = requests.Session()
        s.auth = (username, password)
        # verify/cert go on every request: requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE
        # override a Session's own verify setting, which would ignore tls.ca_cert
        self._tls: dict[str, Any] = {}
        if self.base.startswith("https://"):
            self._tls["verify"] = (ca_cert or True) if verify else False
            if not verify:
                log.warning("TLS verification is off for %s (%s.tls.verify: false)", self.base, role)
            if client_cert:
                self._tls["cert"] = (client_cert, client_key) if client_key else client_cert
        elif tls_enabled:
            raise ManagementApiError(
                f"{role}.management_url {self.base!r} is plain http but tls.enabled is true; "
                "use an https:// management URL (rbak never falls back to plaintext)")
        self._s = s

    @classmethod
    def for_connection(cls, conn: Any, role: str = "source") -> "ManagementClient":
        """From ``rbak.config.ConnectionConfig`` (a config's ``source`` or ``target``)."""
        tls = conn.tls
        return cls(conn.management_url, conn.mgmt_username, conn.mgmt_password,
                   timeout=conn.connection_timeout_secs, tls_enabled=conn.use_tls, ca_cert=tls.ca_cert,
                   client_cert=tls.client_cert, client_key=tls.client_key, verify=tls.verify, role=role)

    def close(self) -> None:
        self._s.close()

    def __enter__(self) -> "ManagementClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------
    def _send(self, method: str, path: str, timeout: float | None = None, **kw: Any) -> requests.Response:
        path = path.lstrip("/")
        if path.startswith("api/"):
            path = path[4:]
        url = f"{self.base}/api/{path}"
        try:
            r = self._s.request(method, url, timeout=timeout or self.timeout, **self._tls, **kw)
        except requests.exceptions.SSLError as e:
            raise ManagementApiError(f"TLS handshake with {self.base} failed ({_reason(e)}); "
                                     f"check {self.role}.tls.ca_cert / client_cert") from None
        except requests.exceptions.RequestException as e:
            raise ManagementApiError(f"{method} {url}: {type(e).__name__}: {_reason(e)}") from None
        if r.status_code == 401:
            raise ManagementApiError(f"{method} /api/{path}: 401 Unauthorized for user {self.username!r} "
                                     f"(check {self.role}.management_username/password)", status=401)
        if r.status_code >= 400:
            raise ManagementApiError(f"{method} /api/{path}: HTTP {r.status_code}: {_error_text(r)}",
                                     status=r.status_code)
        return r

    def request(self, method: str, path: str, body: Any = None, *, params: dict[str, Any] | None = None,
                timeout: float | None = None) -> Any:
        """``path`` relative to ``/api/`` (a leading ``/api/`` is accepted); JSON in, JSON out."""
        kw: dict[str, Any] = {}
        if body is not None:
            kw["json"] = body
        if params:
            kw["params"] = params
        r = self._send(method, path, timeout, **kw)
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise ManagementApiError(f"{method} /api/{path.lstrip('/')}: the response is not JSON") from None

    def exists(self, path: str) -> Any | None:
        """GET that answers None for 404 (an endpoint or object the broker does not have)."""
        try:
            return self.request("GET", path)
        except ManagementApiError as e:
            if e.status == 404:
                return None
            raise

    # ------------------------------------------------------------------
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
            if e.status == 404:
                return None
            raise
        return _queue_info(d or {"name": name}, vhost)

    def declare_queue(self, vhost: str, name: str, arguments: dict[str, Any]) -> None:
        """A durable queue (``x-queue-type`` in ``arguments``); an existing one with other arguments is refused."""
        self.request("PUT", f"queues/{q(vhost)}/{q(name)}", {"durable": True, "auto_delete": False,
                                                            "arguments": arguments})

    def queue_bindings(self, vhost: str, name: str) -> list[dict[str, Any]]:
        """Every binding of a queue, the default exchange's (``source`` ``""``) included."""
        return self.request("GET", f"queues/{q(vhost)}/{q(name)}/bindings") or []

    def bind_queue(self, vhost: str, exchange: str, queue: str, routing_key: str, arguments: dict[str, Any]) -> None:
        self.request("POST", f"bindings/{q(vhost)}/e/{q(exchange)}/q/{q(queue)}",
                     {"routing_key": routing_key, "arguments": arguments})

    def unbind_queue(self, vhost: str, exchange: str, queue: str, properties_key: str) -> bool:
        """Remove one binding (``properties_key`` as the bindings listing gives it); False: already gone."""
        return self.delete(f"bindings/{q(vhost)}/e/{q(exchange)}/q/{q(queue)}/{q(properties_key)}")

    def policies(self, vhost: str) -> list[dict[str, Any]]:
        return self.request("GET", f"policies/{q(vhost)}") or []

    def operator_policies(self, vhost: str) -> list[dict[str, Any]]:
        try:
            return self.request("GET", f"operator-policies/{q(vhost)}") or []
        except ManagementApiError:
            return []

    def feature_flags(self) -> list[dict[str, Any]] | None:
        return self.exists("feature-flags")

    def deprecated_features(self) -> list[dict[str, Any]] | None:
        """None on brokers without the endpoint (before 3.13)."""
        return self.exists("deprecated-features")

    def definitions_raw(self) -> bytes:
        """GET /api/definitions, as the broker's JSON bytes."""
        return self._send("GET", "definitions", max(self.timeout, DEFINITIONS_TIMEOUT_SECS)).content

    def get_definitions(self) -> dict[str, Any]:
        doc = self.request("GET", "definitions", timeout=max(self.timeout, DEFINITIONS_TIMEOUT_SECS))
        if not isinstance(doc, dict):
            raise ManagementApiError("GET /api/definitions: expected a JSON object")
        return doc

    def post_definitions(self, doc: dict[str, Any]) -> None:
        self.request("POST", "definitions", doc, timeout=max(self.timeout, DEFINITIONS_TIMEOUT_SECS))

    def delete(self, path: str) -> bool:
        """DELETE; False when it was already gone (404)."""
        try:
            self.request("DELETE", path)
        except ManagementApiError as e:
            if e.status == 404:
                return False
            raise
        return True


PRIORITY_FIELDS = ("messages_by_priority", "messages_ready_high", "messages_ready_normal")  # 4.3 / 4.0-4.2
QUEUE_COLUMNS = ("name,vhost,type,messages,arguments,policy,operator_policy,effective_policy_definition,"
                 "auto_delete,exclusive,consumers,durable,messages_by_priority,messages_ready_high,"
                 "messages_ready_normal,messages_unacknowledged")


def _queue_info(d: dict[str, Any], vhost: str | None) -> QueueInfo:
    return QueueInfo(
        vhost=d.get("vhost", vhost or "/"), name=d["name"], queue_type=d.get("type") or "classic",
        messages=d.get("messages"), arguments=d.get("arguments") or {},
        policy=d.get("policy") or None, effective_policy=d.get("effective_policy_definition") or {},
        operator_policy=d.get("operator_policy") or None, auto_delete=bool(d.get("auto_delete")),
        exclusive=bool(d.get("exclusive")), consumers=d.get("consumers"), reported=frozenset(d),
        priority_stats={k: d[k] for k in PRIORITY_FIELDS if k in d}, unacked=d.get("messages_unacknowledged"),
    )


def _error_text(r: requests.Response) -> str:
    """The broker's reason, readable: 3.x sends some reasons as Erlang strings (JSON lists of
    character codes, nested in error tuples), which are turned back into text."""
    def text(v: Any) -> str:
        if isinstance(v, list) and v and all(isinstance(c, int) and 0 <= c < 0x110000 for c in v):
            return "".join(map(chr, v))
        if isinstance(v, list):
            return ": ".join(t for t in (text(x) for x in v) if t and t != "none")
        return "" if v is None else str(v)

    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "reason" in body:
        out = text(body["reason"])
    else:
        out = r.text
    return out[:1000].replace("\n", " ")


def _reason(e: Exception) -> str:
    """A short cause without URLs carrying credentials (requests never puts auth in them)."""
    s = str(e)
    for marker in ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "Connection refused",
                   "timed out", "Name or service not known", "WRONG_VERSION_NUMBER", "record layer failure"):
        if marker in s:
            return marker
    return s[:200]
