"""The operator's Kubernetes API calls, through the official ``kubernetes`` client.

Connection: the in-cluster service account, else the kubeconfig's current
context (``KUBECONFIG`` or ``~/.kube/config``), both read by the client's own
loaders, so ``exec`` and OIDC credential plugins (EKS, GKE, AKS), token files
and client certificates work, and tokens are refreshed when they expire. The
same configuration logs kopf in (``connection_info``). TLS is urllib3's with
the CA of that configuration and nothing else: ``REQUESTS_CA_BUNDLE`` and
``CURL_CA_BUNDLE`` (which ``requests`` lets replace a session's CA) play no part.

The calls go through ``ApiClient``'s generic request methods with plain JSON,
so none of the client's generated models is imported (start-up time), and
every method below maps to one entry of ``api_calls.USED_API_CALLS``. Label
selectors are the server's to apply. A failed call raises the typed errors of
``kube.errors`` (``NotFound``, ``Conflict``, under ``RbakError``); the methods
that expect one say what they return instead. No side effect besides the call:
the gauges that follow a status write are the caller's (``metrics.resources``).

``kubernetes`` and ``kopf`` are imported inside the functions that need them:
importing ``kubernetes.client`` takes about 1.8 s and ``kopf`` 4.3 s
(``python -X importtime``, this machine), which ``kubectl rbak`` and the pure
modules' importers need not pay.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import urllib3

from rbak_operator.crds.schema import (
    ARCHIVE_PLURAL,
    BACKUP_PLURAL,
    GROUP,
    RABBITMQ_CLUSTERS,
    RABBITMQ_GROUP,
    RABBITMQ_VERSION,
    RESTORE_PLURAL,
    SPARK_GROUP,
    SPARK_PLURAL,
    SPARK_VERSION,
    VERSION,
)
from rbak_operator.kube.errors import ApiError, Conflict, NotFound, api_error

if TYPE_CHECKING:
    import kopf
    from kubernetes.client import ApiClient, Configuration

SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
TIMEOUT = float(os.environ.get("RBAK_OPERATOR_API_TIMEOUT", "30"))
USER_AGENT = "rbak-operator"


@dataclass(frozen=True)
class Connection:
    """A loaded client configuration and the namespace of its context (kopf's default namespace)."""

    config: Configuration
    namespace: str | None


def load_connection() -> Connection:
    """In-cluster service account, else the kubeconfig's current context."""
    from kubernetes import config as kconfig  # noqa: PLC0415 - lazy: about 1.8 s (module docstring)
    from kubernetes.client import Configuration  # noqa: PLC0415 - lazy, as the line above

    cfg = Configuration()
    try:
        kconfig.load_incluster_config(client_configuration=cfg)
    except kconfig.ConfigException as not_in_cluster:
        try:
            kconfig.load_kube_config(client_configuration=cfg)
            _, active = kconfig.list_kube_config_contexts()
        except (kconfig.ConfigException, OSError, ValueError) as e:
            where = os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise RuntimeError(f"cannot reach Kubernetes: not in a cluster ({not_in_cluster}) "
                               f"and the kubeconfig {where} is unusable: {e}") from None
        namespace = ((active or {}).get("context") or {}).get("namespace")
    else:
        namespace = Path(SA_NAMESPACE).read_text().strip() if os.path.exists(SA_NAMESPACE) else None
    # GETs retry on 429/5xx answers that carry Retry-After, as client-go does; connection
    # errors get urllib3's default retries.
    cfg.client_go_retries = True
    return Connection(cfg, namespace)


_lock = threading.Lock()
_conn: Connection | None = None
_api: ApiClient | None = None
_agent = USER_AGENT


def use_connection(conn: Connection, user_agent: str = USER_AGENT) -> None:
    """Make ``conn`` the connection of every later call (the kubectl plugin's ``--kubeconfig``
    and ``--context``; the operator itself never calls this)."""
    global _conn, _api, _agent
    with _lock:
        _conn, _api, _agent = conn, None, user_agent


def connection() -> Connection:
    global _conn
    with _lock:
        if _conn is None:
            _conn = load_connection()
        return _conn


def _client() -> ApiClient:
    """One ApiClient for every thread (urllib3's pool manager is thread-safe)."""
    global _api
    conn = connection()
    with _lock:
        if _api is None:
            from kubernetes.client import ApiClient  # noqa: PLC0415 - lazy: about 1.8 s (module docstring)

            _api = ApiClient(conn.config)
            _api.user_agent = _agent
        return _api


def _sel(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def resource_path(group: str, version: str, plural: str, namespace: str, name: str | None = None,
                  sub: str | None = None) -> str:
    """The URL path of a namespaced resource (``group`` "" is the core API), of one object, of a subresource."""
    root = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    p = f"{root}/namespaces/{quote(namespace, safe='')}/{plural}"
    if name is not None:
        p += "/" + quote(name, safe="")
    if sub:
        p += "/" + sub
    return p


LEASES = ("coordination.k8s.io", "v1", "leases")


class Kube:
    """The operator's API calls; every method maps to one entry of USED_API_CALLS."""

    def request(self, method: str, path: str, body: Any = None, params: dict | None = None,
                content_type: str = "application/json", raw: bool = False) -> Any:
        """The decoded JSON answer (``raw``: the bytes, e.g. a pod's log). Raises ``ApiError``, typed by
        status (``NotFound``, ``Conflict``). Public for callers with calls of their own (``kubectl rbak``)."""
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415 - lazy: about 1.8 s (module docstring)

        api = _client()
        headers = {"Accept": "*/*" if raw else "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = api.param_serialize(method, path, query_params=list((params or {}).items()) or None,
                                      header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            r = api.call_api(*request, _request_timeout=TIMEOUT)
        except ApiException as e:  # a TLS failure, status 0
            raise ApiError(e.status or 0, str(e.reason)[:300], method, path) from None
        except urllib3.exceptions.HTTPError as e:  # unreachable after urllib3's retries
            raise ApiError(0, str(e)[:300], method, path) from None
        data = r.read()
        if r.status >= 400:
            try:
                reason = json.loads(data).get("message") or r.reason
            except (ValueError, AttributeError):
                reason = r.reason
            raise api_error(r.status, str(reason)[:300], method, path)
        if raw:
            return data
        return json.loads(data) if data else {}

    def _get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except NotFound:
            return None

    def _create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The created object, or None when one of that name exists already."""
        try:
            return self.request("POST", path, body)
        except Conflict:
            return None

    def _gone_ok(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> None:
        """A DELETE or PATCH of an object that may be gone already (then nothing to do)."""
        try:
            self.request(method, path, body, content_type=content_type)
        except NotFound:
            pass

    # -- our custom resources -------------------------------------------------
    def get_cr(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(resource_path(GROUP, VERSION, plural, namespace, name))

    def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """The object as the server wrote it (for the caller's per-resource gauges)."""
        return self.request("PATCH", resource_path(GROUP, VERSION, plural, namespace, name, "status"),
                            {"status": status}, content_type="application/merge-patch+json")

    def get_backup(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_cr(BACKUP_PLURAL, namespace, name)

    def get_restore(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_cr(RESTORE_PLURAL, namespace, name)

    def get_archive(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_cr(ARCHIVE_PLURAL, namespace, name)

    # -- a RabbitMQArchive's Deployment and ConfigMap -------------------------
    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(resource_path("apps", "v1", "deployments", namespace, name))

    def create_deployment(self, body: dict[str, Any]) -> bool:
        """False when a Deployment of that name exists already."""
        return self._create(resource_path("apps", "v1", "deployments", body["metadata"]["namespace"]), body) is not None

    def replace_deployment(self, body: dict[str, Any]) -> bool:
        """PUT (``body`` carries the resourceVersion read): False when it changed since."""
        meta = body["metadata"]
        try:
            self.request("PUT", resource_path("apps", "v1", "deployments", meta["namespace"], meta["name"]), body)
        except Conflict:
            return False
        return True

    def delete_deployment(self, namespace: str, name: str) -> None:
        self._gone_ok("DELETE", resource_path("apps", "v1", "deployments", namespace, name),
                      {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"})

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(resource_path("", "v1", "configmaps", namespace, name))

    def replace_configmap(self, body: dict[str, Any]) -> bool:
        """PUT (``body`` carries the resourceVersion read): False when it changed since."""
        meta = body["metadata"]
        try:
            self.request("PUT", resource_path("", "v1", "configmaps", meta["namespace"], meta["name"]), body)
        except Conflict:
            return False
        return True

    # -- jobs, pods, configmaps, secrets -------------------------------------
    def list_jobs(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        res = self.request("GET", resource_path("batch", "v1", "jobs", namespace), params={"labelSelector": _sel(labels)})
        return res.get("items") or []

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(resource_path("batch", "v1", "jobs", namespace, name))

    def create_job(self, body: dict[str, Any]) -> bool:
        """False when a Job of that name already exists (the slot ran already)."""
        return self._create(resource_path("batch", "v1", "jobs", body["metadata"]["namespace"]), body) is not None

    def delete_job(self, namespace: str, name: str) -> None:
        self._gone_ok("DELETE", resource_path("batch", "v1", "jobs", namespace, name),
                      {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"})

    def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A merge patch of a Job (a run whose pod cannot start: its failure mark and deadline)."""
        self._gone_ok("PATCH", resource_path("batch", "v1", "jobs", namespace, name), patch,
                      content_type="application/merge-patch+json")

    def job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        return self.list_pods(namespace, {"job-name": job_name})

    def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        res = self.request("GET", resource_path("", "v1", "pods", namespace), params={"labelSelector": _sel(labels)})
        return res.get("items") or []

    def create_configmap(self, body: dict[str, Any]) -> bool:
        return self._create(resource_path("", "v1", "configmaps", body["metadata"]["namespace"]), body) is not None

    def delete_configmap(self, namespace: str, name: str) -> None:
        self._gone_ok("DELETE", resource_path("", "v1", "configmaps", namespace, name))

    def secret_values(self, namespace: str, name: str) -> dict[str, str] | None:
        """Decoded data of a Secret, or None when it does not exist."""
        s = self._get(resource_path("", "v1", "secrets", namespace, name))
        if s is None:
            return None
        out = {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}
        out.update(s.get("stringData") or {})
        return out

    # -- RabbitMQ cluster-operator ---------------------------------------------
    def get_rabbitmq_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A RabbitmqCluster, or None when it (or its CRD) does not exist."""
        return self._get(resource_path(RABBITMQ_GROUP, RABBITMQ_VERSION, RABBITMQ_CLUSTERS, namespace, name))

    # -- spark-operator --------------------------------------------------------
    def create_spark_app(self, body: dict[str, Any]) -> bool:
        path = resource_path(SPARK_GROUP, SPARK_VERSION, SPARK_PLURAL, body["metadata"]["namespace"])
        return self._create(path, body) is not None

    def get_spark_app(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(resource_path(SPARK_GROUP, SPARK_VERSION, SPARK_PLURAL, namespace, name))

    # -- leader election ---------------------------------------------------------
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(resource_path(*LEASES, namespace, name))

    def create_lease(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The created Lease, or None when another replica created it first."""
        return self._create(resource_path(*LEASES, body["metadata"]["namespace"]), body)

    def update_lease(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The Lease as written, or None when it changed since ``body``'s resourceVersion was read."""
        meta = body["metadata"]
        try:
            return self.request("PUT", resource_path(*LEASES, meta["namespace"], meta["name"]), body)
        except Conflict:
            return None


def connection_info() -> kopf.ConnectionInfo:
    """The same connection as a ``kopf.ConnectionInfo`` (the login handler's answer).

    kopf calls its login handlers again when the server answers 401, so an
    expired exec-plugin or service-account token is read afresh here (the
    client's refresh hook runs inside ``get_api_key_with_prefix``).
    """
    import kopf  # noqa: PLC0415 - lazy: about 4.3 s (module docstring); only the operator logs kopf in

    conn = connection()
    cfg = conn.config
    header = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    scheme, _, token = (header or "").partition(" ")
    if not token:  # a bare token without a scheme
        scheme, token = "", scheme
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, ca_data=cfg.ca_cert_data, insecure=not cfg.verify_ssl,
        scheme=scheme or None, token=token or None, username=cfg.username or None, password=cfg.password or None,
        certificate_path=cfg.cert_file, private_key_path=cfg.key_file, proxy_url=cfg.proxy or None,
        default_namespace=conn.namespace,
    )
