"""A thin synchronous Kubernetes client for the handlers (kubernetes-client).

Only the calls listed in ``api_calls.USED_API_CALLS``. Label selectors are
sent (a real API server filters) and applied again here (so results are right
even against a server that ignores them, like the test emulator).
"""

from __future__ import annotations

import base64
import threading
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from .crds import BACKUP_PLURAL, GROUP, RESTORE_PLURAL, VERSION

_lock = threading.Lock()
_client: kubernetes.client.ApiClient | None = None


def api_client() -> kubernetes.client.ApiClient:
    global _client
    with _lock:
        if _client is None:
            try:
                kubernetes.config.load_incluster_config()
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config()
            _client = kubernetes.client.ApiClient()
        return _client


def _sel(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def _match(obj: dict[str, Any], labels: dict[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def _plain(obj: Any) -> dict[str, Any]:
    return api_client().sanitize_for_serialization(obj)


class Kube:
    def __init__(self) -> None:
        c = api_client()
        self.custom = kubernetes.client.CustomObjectsApi(c)
        self.batch = kubernetes.client.BatchV1Api(c)
        self.core = kubernetes.client.CoreV1Api(c)

    # -- our custom resources -------------------------------------------------
    def get_cr(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, plural, name, {"status": status})

    def get_backup(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_cr(BACKUP_PLURAL, namespace, name)

    def get_restore(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_cr(RESTORE_PLURAL, namespace, name)

    # -- jobs, pods, configmaps, secrets -------------------------------------
    def list_jobs(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        res = self.batch.list_namespaced_job(namespace, label_selector=_sel(labels))
        return [j for j in (_plain(i) for i in res.items) if _match(j, labels)]

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _plain(self.batch.read_namespaced_job(name, namespace))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_job(self, body: dict[str, Any]) -> bool:
        """False when a Job of that name already exists (the slot ran already)."""
        try:
            self.batch.create_namespaced_job(body["metadata"]["namespace"], body)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise

    def job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        labels = {"job-name": job_name}
        res = self.core.list_namespaced_pod(namespace, label_selector=_sel(labels))
        return [p for p in (_plain(i) for i in res.items) if _match(p, labels)]

    def create_configmap(self, body: dict[str, Any]) -> bool:
        try:
            self.core.create_namespaced_config_map(body["metadata"]["namespace"], body)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def delete_configmap(self, namespace: str, name: str) -> None:
        try:
            self.core.delete_namespaced_config_map(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def secret_values(self, namespace: str, name: str) -> dict[str, str] | None:
        """Decoded data of a Secret, or None when it does not exist."""
        try:
            s = self.core.read_namespaced_secret(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        out = {k: base64.b64decode(v).decode() for k, v in (s.data or {}).items()}
        out.update(s.string_data or {})
        return out

    # -- spark-operator --------------------------------------------------------
    def create_spark_app(self, body: dict[str, Any]) -> bool:
        try:
            self.custom.create_namespaced_custom_object(
                "sparkoperator.k8s.io", "v1beta2", body["metadata"]["namespace"], "sparkapplications", body)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def get_spark_app(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                "sparkoperator.k8s.io", "v1beta2", namespace, "sparkapplications", name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
