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
selectors are the server's to apply.
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

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration

SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
TIMEOUT = float(os.environ.get("RBAK_OPERATOR_API_TIMEOUT", "30"))
USER_AGENT = "rbak-operator"


class ApiError(Exception):
    def __init__(self, status: int, reason: str, method: str, path: str):
        self.status, self.reason = status, reason
        super().__init__(f"{method} {path}: HTTP {status} {reason}")


@dataclass(frozen=True)
class Connection:
    """A loaded client configuration and the namespace of its context (kopf's default namespace)."""

    config: Configuration
    namespace: str | None


def load_connection() -> Connection:
    """In-cluster service account, else the kubeconfig's current context."""
    from kubernetes import config as kconfig
    from kubernetes.client import Configuration

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
            from kubernetes.client import ApiClient

            _api = ApiClient(conn.config)
            _api.user_agent = _agent
        return _api


def _sel(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def _path(group: str, version: str, plural: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
    root = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    p = f"{root}/namespaces/{quote(namespace, safe='')}/{plural}"
    if name is not None:
        p += "/" + quote(name, safe="")
    if sub:
        p += "/" + sub
    return p


class Kube:
    """The operator's API calls; every method maps to one entry of USED_API_CALLS."""

    def _call(self, method: str, path: str, body: Any = None, params: dict | None = None,
              content_type: str = "application/json", ok_missing: bool = False, ok_conflict: bool = False,
              raw: bool = False):
        """The decoded JSON answer (``raw``: the bytes, e.g. a pod's log)."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

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
        if r.status == 404 and ok_missing:
            return None
        if r.status == 409 and ok_conflict:
            return False
        if r.status >= 400:
            try:
                reason = json.loads(data).get("message") or r.reason
            except (ValueError, AttributeError):
                reason = r.reason
            raise ApiError(r.status, str(reason)[:300], method, path)
        if raw:
            return data
        return json.loads(data) if data else {}

    # -- our custom resources -------------------------------------------------
    def get_cr(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", _path(GROUP, VERSION, plural, namespace, name), ok_missing=True)

    def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        obj = self._call("PATCH", _path(GROUP, VERSION, plural, namespace, name, "status"), {"status": status},
                         content_type="application/merge-patch+json")
        from rbak_operator.metrics.resources import observe

        observe(plural, obj)  # the per-resource gauges follow every status the operator writes

    def get_backup(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_cr(BACKUP_PLURAL, namespace, name)

    def get_restore(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_cr(RESTORE_PLURAL, namespace, name)

    def get_archive(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_cr(ARCHIVE_PLURAL, namespace, name)

    # -- a RabbitMQArchive's Deployment and ConfigMap -------------------------
    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", _path("apps", "v1", "deployments", namespace, name), ok_missing=True)

    def create_deployment(self, body: dict[str, Any]) -> bool:
        res = self._call("POST", _path("apps", "v1", "deployments", body["metadata"]["namespace"]), body,
                         ok_conflict=True)
        return res is not False

    def replace_deployment(self, body: dict[str, Any]) -> bool:
        """PUT (``body`` carries the resourceVersion read): False when it changed since."""
        meta = body["metadata"]
        res = self._call("PUT", _path("apps", "v1", "deployments", meta["namespace"], meta["name"]), body,
                         ok_conflict=True)
        return res is not False

    def delete_deployment(self, namespace: str, name: str) -> None:
        self._call("DELETE", _path("apps", "v1", "deployments", namespace, name),
                   {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}, ok_missing=True)

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", _path("", "v1", "configmaps", namespace, name), ok_missing=True)

    def replace_configmap(self, body: dict[str, Any]) -> bool:
        meta = body["metadata"]
        res = self._call("PUT", _path("", "v1", "configmaps", meta["namespace"], meta["name"]), body,
                         ok_conflict=True)
        return res is not False

    # -- jobs, pods, configmaps, secrets -------------------------------------
    def list_jobs(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        res = self._call("GET", _path("batch", "v1", "jobs", namespace), params={"labelSelector": _sel(labels)})
        return res.get("items") or []

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", _path("batch", "v1", "jobs", namespace, name), ok_missing=True)

    def create_job(self, body: dict[str, Any]) -> bool:
        """False when a Job of that name already exists (the slot ran already)."""
        res = self._call("POST", _path("batch", "v1", "jobs", body["metadata"]["namespace"]), body, ok_conflict=True)
        return res is not False

    def delete_job(self, namespace: str, name: str) -> None:
        self._call("DELETE", _path("batch", "v1", "jobs", namespace, name),
                   {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}, ok_missing=True)

    def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A merge patch of a Job (a run whose pod cannot start: its failure mark and deadline)."""
        self._call("PATCH", _path("batch", "v1", "jobs", namespace, name), patch,
                   content_type="application/merge-patch+json", ok_missing=True)

    def job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        res = self._call("GET", _path("", "v1", "pods", namespace), params={"labelSelector": _sel({"job-name": job_name})})
        return res.get("items") or []

    def create_configmap(self, body: dict[str, Any]) -> bool:
        res = self._call("POST", _path("", "v1", "configmaps", body["metadata"]["namespace"]), body, ok_conflict=True)
        return res is not False

    def delete_configmap(self, namespace: str, name: str) -> None:
        self._call("DELETE", _path("", "v1", "configmaps", namespace, name), ok_missing=True)

    def secret_values(self, namespace: str, name: str) -> dict[str, str] | None:
        """Decoded data of a Secret, or None when it does not exist."""
        s = self._call("GET", _path("", "v1", "secrets", namespace, name), ok_missing=True)
        if s is None:
            return None
        out = {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}
        out.update(s.get("stringData") or {})
        return out

    # -- RabbitMQ cluster-operator ---------------------------------------------
    def get_rabbitmq_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A RabbitmqCluster, or None when it (or its CRD) does not exist."""
        return self._call("GET", _path(RABBITMQ_GROUP, RABBITMQ_VERSION, RABBITMQ_CLUSTERS, namespace, name),
                          ok_missing=True)

    # -- spark-operator --------------------------------------------------------
    def create_spark_app(self, body: dict[str, Any]) -> bool:
        res = self._call("POST", _path(SPARK_GROUP, SPARK_VERSION, SPARK_PLURAL,
                                       body["metadata"]["namespace"]), body, ok_conflict=True)
        return res is not False

    def get_spark_app(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", _path(SPARK_GROUP, SPARK_VERSION, SPARK_PLURAL, namespace, name),
                          ok_missing=True)

    # -- leader election ---------------------------------------------------------
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", _path("coordination.k8s.io", "v1", "leases", namespace, name), ok_missing=True)

    def create_lease(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The created Lease, or None when another replica created it first."""
        res = self._call("POST", _path("coordination.k8s.io", "v1", "leases", body["metadata"]["namespace"]), body,
                         ok_conflict=True)
        return None if res is False else res

    def update_lease(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The Lease as written, or None when it changed since ``body``'s resourceVersion was read."""
        meta = body["metadata"]
        res = self._call("PUT", _path("coordination.k8s.io", "v1", "leases", meta["namespace"], meta["name"]), body,
                         ok_conflict=True)
        return None if res is False else res


def connection_info():
    """The same connection as a ``kopf.ConnectionInfo`` (the login handler's answer).

    kopf calls its login handlers again when the server answers 401, so an
    expired exec-plugin or service-account token is read afresh here (the
    client's refresh hook runs inside ``get_api_key_with_prefix``).
    """
    import kopf

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
