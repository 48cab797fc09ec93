"""A small synchronous Kubernetes REST client for the handlers (``requests``).

Why not kubernetes-client: importing its generated models costs seconds of
start-up, and the handlers only need a dozen JSON calls (listed in
``api_calls.USED_API_CALLS``). Connection settings come from the in-cluster
service account or a kubeconfig (``KUBECONFIG`` or ``~/.kube/config``); the
same settings log kopf in (``connection_info``). Label selectors are sent (a
real API server filters) and applied again here (the test emulator ignores
them).
"""

from __future__ import annotations

import base64
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests
import yaml

from .crds import (BACKUP_PLURAL, GROUP, RABBITMQ_CLUSTERS, RABBITMQ_GROUP, RABBITMQ_VERSION, RESTORE_PLURAL,
                   VERSION)

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT = float(os.environ.get("RBAK_OPERATOR_API_TIMEOUT", "30"))


class ApiError(Exception):
    def __init__(self, status: int, reason: str, method: str, path: str):
        self.status, self.reason = status, reason
        super().__init__(f"{method} {path}: HTTP {status} {reason}")


@dataclass(frozen=True)
class Connection:
    server: str
    token: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = None
    namespace: str | None = None


def _data_file(data: str, suffix: str) -> str:
    fd, path = tempfile.mkstemp(prefix="rbak-kube-", suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(data))
    return path


def load_connection() -> Connection:
    """In-cluster service account, else the kubeconfig's current context."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if host and os.path.exists(f"{SA_DIR}/token"):
        h = f"[{host}]" if ":" in host else host
        ns = open(f"{SA_DIR}/namespace").read().strip() if os.path.exists(f"{SA_DIR}/namespace") else None
        return Connection(server=f"https://{h}:{port}", token_file=f"{SA_DIR}/token", ca_file=f"{SA_DIR}/ca.crt",
                          namespace=ns)
    path = (os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")).split(os.pathsep)[0]
    try:
        cfg = yaml.safe_load(open(path, encoding="utf-8")) or {}
    except OSError as e:
        raise RuntimeError(f"no in-cluster service account and no kubeconfig at {path}: {e}") from None
    ctx_name = cfg.get("current-context")
    ctx = next((c["context"] for c in cfg.get("contexts") or [] if c.get("name") == ctx_name), None)
    if ctx is None:
        raise RuntimeError(f"{path}: current-context {ctx_name!r} not found")
    cluster = next((c["cluster"] for c in cfg.get("clusters") or [] if c.get("name") == ctx.get("cluster")), {})
    user = next((u["user"] for u in cfg.get("users") or [] if u.get("name") == ctx.get("user")), {}) or {}
    if not cluster.get("server"):
        raise RuntimeError(f"{path}: cluster {ctx.get('cluster')!r} has no server")
    ca = cluster.get("certificate-authority") or (
        _data_file(cluster["certificate-authority-data"], ".crt") if cluster.get("certificate-authority-data") else None)
    cert = user.get("client-certificate") or (
        _data_file(user["client-certificate-data"], ".crt") if user.get("client-certificate-data") else None)
    key = user.get("client-key") or (_data_file(user["client-key-data"], ".key") if user.get("client-key-data") else None)
    return Connection(server=cluster["server"].rstrip("/"), token=user.get("token"), token_file=user.get("tokenFile"),
                      ca_file=ca, insecure=bool(cluster.get("insecure-skip-tls-verify")), cert_file=cert, key_file=key,
                      username=user.get("username"), password=user.get("password"), namespace=ctx.get("namespace"))


_lock = threading.Lock()
_conn: Connection | None = None
_local = threading.local()


def connection() -> Connection:
    global _conn
    with _lock:
        if _conn is None:
            _conn = load_connection()
        return _conn


def _session() -> requests.Session:
    s = getattr(_local, "session", None)
    if s is None:
        c = connection()
        s = requests.Session()
        s.verify = False if c.insecure else (c.ca_file or True)
        if c.cert_file and c.key_file:
            s.cert = (c.cert_file, c.key_file)
        if c.username and c.password:
            s.auth = (c.username, c.password)
        s.headers["User-Agent"] = "rbak-operator"
        _local.session = s
    return s


def _token() -> str | None:
    c = connection()
    if c.token_file:  # re-read: projected tokens rotate
        return open(c.token_file, encoding="utf-8").read().strip()
    return c.token


def _sel(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def _match(obj: dict[str, Any], labels: dict[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


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
              content_type: str = "application/json", ok_missing: bool = False, ok_conflict: bool = False):
        headers = {"Accept": "application/json"}
        tok = _token()
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        if body is not None:
            headers["Content-Type"] = content_type
        r = _session().request(method, connection().server + path, json=body, params=params, headers=headers,
                               timeout=TIMEOUT)
        if r.status_code == 404 and ok_missing:
            return None
        if r.status_code == 409 and ok_conflict:
            return False
        if r.status_code >= 400:
            try:
                reason = r.json().get("message") or r.reason
            except ValueError:
                reason = r.reason
            raise ApiError(r.status_code, str(reason)[:300], method, path)
        return r.json() if r.content else {}

    # -- our custom resources -------------------------------------------------
    def get_cr(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", _path(GROUP, VERSION, plural, namespace, name), ok_missing=True)

    def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        obj = self._call("PATCH", _path(GROUP, VERSION, plural, namespace, name, "status"), {"status": status},
                         content_type="application/merge-patch+json")
        from .resource_metrics import observe

        observe(plural, obj)  # the per-resource gauges follow every status the operator writes

    def get_backup(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_cr(BACKUP_PLURAL, namespace, name)

    def get_restore(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_cr(RESTORE_PLURAL, namespace, name)

    # -- jobs, pods, configmaps, secrets -------------------------------------
    def list_jobs(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        res = self._call("GET", _path("batch", "v1", "jobs", namespace), params={"labelSelector": _sel(labels)})
        return [j for j in res.get("items") or [] if _match(j, labels)]

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", _path("batch", "v1", "jobs", namespace, name), ok_missing=True)

    def create_job(self, body: dict[str, Any]) -> bool:
        """False when a Job of that name already exists (the slot ran already)."""
        res = self._call("POST", _path("batch", "v1", "jobs", body["metadata"]["namespace"]), body, ok_conflict=True)
        return res is not False

    def delete_job(self, namespace: str, name: str) -> None:
        self._call("DELETE", _path("batch", "v1", "jobs", namespace, name),
                   {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}, ok_missing=True)

    def job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        labels = {"job-name": job_name}
        res = self._call("GET", _path("", "v1", "pods", namespace), params={"labelSelector": _sel(labels)})
        return [p for p in res.get("items") or [] if _match(p, labels)]

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
        res = self._call("POST", _path("sparkoperator.k8s.io", "v1beta2", "sparkapplications",
                                       body["metadata"]["namespace"]), body, ok_conflict=True)
        return res is not False

    def get_spark_app(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call("GET", _path("sparkoperator.k8s.io", "v1beta2", "sparkapplications", namespace, name),
                          ok_missing=True)


def connection_info():
    """The same connection as a ``kopf.ConnectionInfo`` (used by the login handler)."""
    import kopf

    c = connection()
    return kopf.ConnectionInfo(
        server=c.server, ca_path=c.ca_file, insecure=c.insecure, token=_token(), certificate_path=c.cert_file,
        private_key_path=c.key_file, username=c.username, password=c.password, default_namespace=c.namespace,
    )
