"""What every ``kubectl rbak`` command stands on: the user's connection and client, the namespace and flags
(``Ctx``), output, and the wait for the operator to act on a request.

The client is the operator's (``rbak_operator.kube.client.Kube``) through its public API (``request``,
``resource_path``), plus the calls only a user makes (the operator's RBAC has none of them).
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from rbak.errors import RbakError
from rbak_operator.crds.schema import BACKUP_PLURAL, GROUP, VERSION
from rbak_operator.decide import rbakconfig
from rbak_operator.kube.client import SA_NAMESPACE, Connection, Kube, resource_path
from rbak_operator.kube.errors import ApiError
from rbak_operator.reconcile.storage import open_backup_storage

PROG = "kubectl rbak"
USER_AGENT = "kubectl-rbak"
POLL_SECONDS = float(os.environ.get("RBAK_KUBECTL_POLL_SECONDS", "1"))
DEFAULT_TIMEOUT = 3600.0
DEFAULT_PICKUP_TIMEOUT = 30.0  # an operator acts on a request in about a second; a dead one never does
# The chart's operator pods (templates/_helpers.tpl: rbak.labels + component), whatever the release is called.
OPERATOR_PODS = "kubectl get pods -A -l app.kubernetes.io/part-of=rbak,app.kubernetes.io/component=operator"


class PluginError(Exception):
    """One line for the user; exit code 1."""


class PluginKube(Kube):
    """The operator's client plus the calls only a user makes (the operator's RBAC has none of them)."""

    def list_cr(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        return self.request("GET", resource_path(GROUP, VERSION, plural, namespace)).get("items") or []

    def patch_cr(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", resource_path(GROUP, VERSION, plural, namespace, name), patch,
                          content_type="application/merge-patch+json")

    def create_cr(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", resource_path(GROUP, VERSION, plural, namespace), body)

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        data = self.request("GET", resource_path("", "v1", "pods", namespace, pod, "log"), params={"container": container},
                          raw=True)
        return data.decode("utf-8", errors="replace")


def connect(kubeconfig: str | None, context: str | None) -> Connection:
    """The kubeconfig (``--kubeconfig``, else ``KUBECONFIG``, else ``~/.kube/config``) and its context
    (``--context``, else the current one), as kubectl reads them; in a pod without a kubeconfig the
    service account."""
    # lazy: importing kubernetes.client takes about 1.8 s (rbak_operator.kube.client's docstring)
    from kubernetes import config as kconfig  # noqa: PLC0415 - start-up (comment above)
    from kubernetes.client import Configuration  # noqa: PLC0415 - start-up (comment above)

    cfg = Configuration()
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    has_file = bool(kubeconfig) or any(os.path.exists(os.path.expanduser(p))
                                       for p in where.split(os.pathsep) if p)
    if not has_file and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kconfig.load_incluster_config(client_configuration=cfg)
        ns = open(SA_NAMESPACE).read().strip() if os.path.exists(SA_NAMESPACE) else None
        return Connection(cfg, ns)
    if kubeconfig and not os.path.exists(kubeconfig):
        raise PluginError(f"--kubeconfig: {kubeconfig} does not exist")
    try:
        contexts, active = kconfig.list_kube_config_contexts(config_file=kubeconfig)
        if context is not None:
            chosen = next((c for c in contexts or [] if c.get("name") == context), None)
            if chosen is None:
                names = ", ".join(sorted(c.get("name", "") for c in contexts or [])) or "none"
                raise PluginError(f"--context: no context {context!r} in the kubeconfig {where} (it has: {names})")
            active = chosen
        kconfig.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (kconfig.ConfigException, OSError, ValueError) as e:
        raise PluginError(f"the kubeconfig {where} is unusable: {e}") from None
    return Connection(cfg, ((active or {}).get("context") or {}).get("namespace"))


def out(line: str = "") -> None:
    print(line, flush=True)


def table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    """kubectl's layout: left-aligned columns, three spaces apart, no trailing blanks."""
    cells = [headers] + [["-" if v is None or v == "" else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def unique_value() -> str:
    """An annotation value never used before: each one runs once."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


class Ctx:
    """What every command gets: the client, the namespace and the output format."""

    def __init__(self, kube: PluginKube, namespace: str, args: argparse.Namespace):
        self.kube, self.ns, self.args = kube, namespace, args

    def backup(self, name: str) -> dict[str, Any]:
        body = self.kube.get_backup(self.ns, name)
        if body is None:
            raise PluginError(f'RabbitMQBackup "{name}" not found in namespace "{self.ns}"')
        return body

    def archive(self, name: str) -> dict[str, Any]:
        body = self.kube.get_archive(self.ns, name)
        if body is None:
            raise PluginError(f'RabbitMQArchive "{name}" not found in namespace "{self.ns}"')
        return body

    def storage(self, body: dict[str, Any]):
        """(storage, prefix) of a RabbitMQBackup or RabbitMQArchive, opened with the credentials its Secret holds."""
        name, kind = body["metadata"]["name"], body.get("kind") or "RabbitMQBackup"
        spec = body.get("spec") or {}
        try:
            st = open_backup_storage(self.kube, self.ns, spec.get("storage"))
        except ApiError:
            raise  # the API's own error line (ApiError is a RbakError too)
        except RbakError as e:
            raise PluginError(f"{kind} {self.ns}/{name}: {e}") from None
        if st is None:
            raise PluginError(f"{kind} {self.ns}/{name}: spec.storage is a PersistentVolumeClaim, which is "
                              "only readable inside the cluster (use rbak list in a pod that mounts it)")
        return st, rbakconfig.storage_prefix(spec.get("storage"))

    @staticmethod
    def where(body: dict[str, Any]) -> str:
        """The storage as a user names it: ``s3://bucket/prefix`` (and a non-AWS endpoint)."""
        s3 = ((body.get("spec") or {}).get("storage") or {}).get("s3") or {}
        url = f"s3://{s3.get('bucket')}/{(s3.get('prefix') or '').strip('/')}".rstrip("/")
        return url + (f" at {s3['endpoint']}" if s3.get("endpoint") else "")

    def wait(self, what: str, step: Callable[[], int | None],
             unpicked: Callable[[], str | None] | None = None) -> int:
        """Call ``step`` every POLL_SECONDS until it returns an exit code (or ``--timeout`` passes).

        ``unpicked`` is asked once, ``--pickup-timeout`` seconds in: None when an operator has acted on
        the request, else what shows it has not, so a cluster without a running operator is named in
        seconds rather than after an hour's ``--timeout``."""
        start = time.monotonic()
        deadline = start + self.args.timeout
        pickup = start + self.args.pickup_timeout if unpicked is not None else None
        while True:
            code = step()
            if code is not None:
                return code
            now = time.monotonic()
            if pickup is not None and now > pickup and unpicked is not None:
                why = unpicked()
                if why is not None:
                    raise PluginError(f"no rbak operator acted on the request within {self.args.pickup_timeout:g}s: "
                                      f"{why}. Is the operator running? {OPERATOR_PODS}")
                pickup = None
            if now > deadline:
                raise PluginError(f"timed out after {self.args.timeout:g}s waiting for {what} "
                                  "(is the rbak operator running?); it goes on without this command")
            time.sleep(POLL_SECONDS)

    def request_now(self, name: str, annotation: str, what: str, run_name: Callable[[str], str],
                    plural: str = BACKUP_PLURAL) -> tuple[str, str, dict[str, Any]]:
        """Ask the operator to act now, the way a user does: a new value of ``annotation`` on NAME (a
        RabbitMQBackup, or the object of ``plural``). Prints the request and the Job it will make; returns
        (value, Job name, status as the patch left it)."""
        value = unique_value()
        body = self.kube.patch_cr(plural, self.ns, name, {"metadata": {"annotations": {annotation: value}}})
        run = run_name(value)
        out(f"{plural[:-1]}/{name}: {what} requested ({annotation}={value})")
        out(f"job/{run}")
        return value, run, body.get("status") or {}

    def unpicked_request(self, name: str, annotation: str, value: str, before: dict[str, Any],
                         acted: Callable[[dict[str, Any]], bool], ack: str) -> str | None:
        return request_unpicked(self.ns, self.backup(name), annotation, value, before, acted, ack)


def request_unpicked(ns: str, body: dict[str, Any], annotation: str, value: str, before: dict[str, Any],
                     acted: Callable[[dict[str, Any]], bool], ack: str) -> str | None:
    """None when an operator acted on ``annotation=value`` (``acted`` on the status, or any change of the
    status since the request: an operator is watching the object, e.g. a run the request waits for);
    else what the object shows, naming ``ack``, the status field the operator sets when it acts."""
    st = body.get("status") or {}
    if acted(st) or st != before:
        return None
    name = body["metadata"]["name"]
    now = (body["metadata"].get("annotations") or {}).get(annotation)
    kind = body.get("kind") or "RabbitMQBackup"
    if now != value:
        return (f"{kind} {ns}/{name}: {annotation} is now {now!r}, another request replaced {value!r}, "
                "and its status is unchanged")
    return (f"{kind} {ns}/{name} still has {annotation}={value} and its status is unchanged since it was "
            f"set ({ack} is {shown(st, ack)}); the request stays: an operator that starts runs it")


def shown(status: dict[str, Any], dotted: str) -> str:
    v: Any = status
    for part in dotted.split(".")[1:]:
        v = v.get(part) if isinstance(v, dict) else None
    return repr(v) if v is not None else "unset"
