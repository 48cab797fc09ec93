"""A cluster for the operator tests: kmock's KubernetesEmulator over HTTP, or a real API server
(``RealServer`` over ``support.kubeapi.KubeApi``), plus a local "kubelet" that runs each Job's pod
command as a local process.

The emulator stores objects and streams watches but runs nothing; the
``PodRunner`` here plays kubelet + Job controller: for a new Job it resolves
the pod's env (``secretKeyRef`` from the emulator's Secrets), writes mounted
ConfigMaps to a temp dir and maps the mount paths, runs init containers then
containers (same command and args, ``python`` being this interpreter), creates
a Pod object carrying the termination message, and writes the Job's status.
A failing init container fails the pod; the containers after it never run.
``PodRunner(container_mode=True)`` runs each container in the pod's image with podman instead,
as a kubelet would (``support.container``; tests/support/README.md, "The image").

``PodRunner.extra_env`` adds variables to every pod (``PYTHONPATH`` is
prepended), e.g. a ``sitecustomize`` that holds a run at a chosen point.
Tests may register ``PodRunner.hooks``: ``hook(run_name, container_name)``
is called just before a container (or a SparkApplication's driver,
``spark-kubernetes-driver``) starts, e.g. to damage storage between a
backup and its validation.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Callable

import aiohttp.web
import kmock
import yaml

REPO = Path(__file__).resolve().parents[2]
NS = "default"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _selector(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (the only form the operator sends); anything else is refused, not ignored."""
    out = {}
    for term in filter(None, text.split(",")):
        key, eq, value = term.partition("=")
        if not eq or key.endswith("!") or value.startswith("="):
            raise ValueError(f"emulator: unsupported label selector term {term!r}")
        out[key] = value
    return out


class WatchFaults:
    """The emulator's watch faults, for what a real server will not produce on demand.

    ``expire(plural, times)``: the next ``times`` watch requests of that resource (e.g. ``jobs``)
    are answered with a stream holding one ``ERROR`` event, ``410 Expired``: what a real server
    sends for a resourceVersion older than its watch cache (kopf then lists again and re-watches).
    ``times=0`` disarms. ``served[plural]`` counts the 410s served. Watches already open are not
    touched: kmock ignores ``timeoutSeconds``, so an open watch ends only by the client's own
    timeout (the operator's ``RBAK_OPERATOR_WATCH_TIMEOUT_SECONDS`` + 30 s)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # armed from the test's thread, taken on the emulator's loop
        self._armed: dict[str, int] = {}
        self.served: dict[str, int] = {}

    def expire(self, plural: str, times: int = 1) -> None:
        with self._lock:
            self._armed[plural] = times

    def take(self, plural: str) -> bool:
        with self._lock:
            if self._armed.get(plural, 0) <= 0:
                return False
            self._armed[plural] -= 1
            self.served[plural] = self.served.get(plural, 0) + 1
            return True


_EXPIRED = {"type": "ERROR", "object": {
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
    "message": "too old resource version: 1 (2)"}}


class _Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus ``metadata.generateName`` (kopf names its Events so),
    equality label selectors on lists (kmock ignores ``labelSelector``; a real server
    filters, and the operator relies on it) and the watch faults of ``faults``."""

    faults: WatchFaults | None = None  # set by Emulator

    async def _handle(self, request):
        if (request.action == kmock.action.WATCH and request.resource is not None and self.faults is not None
                and self.faults.take(request.resource.plural)):
            return aiohttp.web.Response(text=json.dumps(_EXPIRED) + "\n", content_type="application/json")
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:8]
        if request.action == kmock.action.LIST and request.params.get("labelSelector"):
            want = _selector(request.params["labelSelector"])
            items = [obj.raw for key, obj in list(self.objects.items())
                     if key[0] == request.resource and (request.namespace is None or key[1] == request.namespace)
                     and not obj.deleted
                     and all(((obj.raw.get("metadata") or {}).get("labels") or {}).get(k) == v
                             for k, v in want.items())]
            return aiohttp.web.json_response({"metadata": {"resourceVersion": "..."}, "items": items})
        return await super()._handle(request)


class Emulator:
    """KubernetesEmulator + Server on 127.0.0.1 in a background event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.kmock: kmock.KubernetesEmulator | None = None
        self.faults = WatchFaults()
        self.url = ""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with _Emulator() as k, kmock.Server(k) as srv:
            k.faults = self.faults
            k.resources.load_bundled()
            for plural, kind, short in (("rabbitmqbackups", "RabbitMQBackup", ["rbak"]),
                                        ("rabbitmqrestores", "RabbitMQRestore", ["rbakr"])):
                k.resources[f"rbak.io/v1alpha1/{plural}"] = {
                    "kind": kind, "singular": kind.lower(), "namespaced": True, "shortnames": short,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "subresources": ["status"],
                }
            k.resources["rabbitmq.com/v1beta1/rabbitmqclusters"] = {  # the RabbitMQ cluster operator's CRD
                "kind": "RabbitmqCluster", "singular": "rabbitmqcluster", "namespaced": True, "shortnames": ["rmq"],
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "subresources": ["status"],
            }
            k.resources["sparkoperator.k8s.io/v1beta2/sparkapplications"] = {
                "kind": "SparkApplication", "singular": "sparkapplication", "namespaced": True,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "subresources": ["status"],
            }
            self.kmock = k
            self.url = str(srv.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def start(self) -> "Emulator":
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("kmock emulator did not start")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test", "namespace": NS}}],
            "current-context": "kmock",
        }))
        return path

    def request_count(self) -> int:
        assert self.kmock is not None
        return len(list(self.kmock))

    def api_calls(self, exclude_agent: str = "python-requests", since: int = 0) -> set[tuple[str, str, str]]:
        """(group, resource[/subresource], verb) of the requests the emulator received (from the
        ``since``-th on), except those of the test itself and its kubelet (``requests``' User-Agent)."""
        out = set()
        assert self.kmock is not None
        for req in list(self.kmock)[since:]:  # every request the emulator received, in order
            headers = {k.lower(): v for k, v in dict(req.headers or {}).items()}
            if headers.get("user-agent", "").startswith(exclude_agent):
                continue
            res = req.resource
            if res is None or not getattr(res, "plural", None):
                continue
            verb = {"list": "list", "watch": "watch", "fetch": "get", "create": "create", "update": "patch",
                    "delete": "delete"}.get(str(getattr(req.action, "value", req.action)).lower())
            if verb == "patch" and str(getattr(req.method, "value", req.method)).upper() == "PUT":
                verb = "update"  # a replace (where a test serves PUT as kmock's update)
            if verb is None:
                continue
            plural = res.plural + (f"/{req.subresource}" if getattr(req, "subresource", None) else "")
            out.add((res.group or "", plural, verb))
        return out


class Http:
    """Minimal JSON client for the emulator (the test's own kubectl)."""

    def __init__(self, base: str, ns: str = NS) -> None:
        import requests

        self.base = base
        self.ns = ns  # the namespace of every call that names none (``ns=None``: cluster-scoped)
        self.s = requests.Session()

    @staticmethod
    def path(api: str, plural: str, ns: str | None = NS, name: str | None = None, sub: str | None = None) -> str:
        root = "/api/v1" if api == "v1" else f"/apis/{api}"
        p = root + (f"/namespaces/{ns}" if ns else "") + f"/{plural}"
        if name:
            p += f"/{name}"
        if sub:
            p += f"/{sub}"
        return p

    def server_time(self) -> datetime:
        """The server's own clock (the ``Date`` header of any answer, whole seconds): a real server
        stamps creationTimestamp with it."""
        return parsedate_to_datetime(self.s.get(self.base + "/version").headers["Date"]).astimezone(timezone.utc)

    def get(self, api, plural, name=None, ns=...):
        ns = self.ns if ns is ... else ns
        r = self.s.get(self.base + self.path(api, plural, ns, name))
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return r.json()

    def items(self, api, plural, ns=...) -> list[dict]:
        ns = self.ns if ns is ... else ns
        return (self.get(api, plural, None, ns) or {}).get("items", [])

    def create(self, api, plural, body, ns=...):
        ns = self.ns if ns is ... else ns
        meta = body.setdefault("metadata", {})
        meta.setdefault("namespace", ns)
        meta.setdefault("resourceVersion", "1")
        meta.setdefault("uid", f"uid-{meta['name']}-{time.monotonic_ns()}")
        meta.setdefault("creationTimestamp", _now())
        meta.setdefault("generation", 1)
        r = self.s.post(self.base + self.path(api, plural, ns), json=body)
        r.raise_for_status()
        return r.json()

    def patch(self, api, plural, name, body, ns=..., sub=None):
        ns = self.ns if ns is ... else ns
        r = self.s.patch(self.base + self.path(api, plural, ns, name, sub), json=body,
                         headers={"Content-Type": "application/merge-patch+json"})
        r.raise_for_status()
        return r.json()

    def delete(self, api, plural, name, ns=...):
        ns = self.ns if ns is ... else ns
        r = self.s.delete(self.base + self.path(api, plural, ns, name))
        if r.status_code != 404:
            r.raise_for_status()

    def secret(self, name: str, data: dict[str, str], ns=...):
        ns = self.ns if ns is ... else ns
        return self.create("v1", "secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}, ns)


class KubeHttp(Http):
    """The same client for a real API server (``support.kubeapi.KubeApi``): its CA, its token, and
    no made-up metadata (the server sets uid, resourceVersion, creationTimestamp and generation)."""

    def __init__(self, kube, ns: str = NS) -> None:
        super().__init__(kube.server, ns)
        self.s.trust_env = False  # else REQUESTS_CA_BUNDLE replaces the session's CA (requests' rule)
        settings = kube.requests_settings()
        self.s.verify, self.s.cert = settings["verify"], settings["cert"]
        self.s.headers.update(settings["headers"])

    def create(self, api, plural, body, ns=...):
        ns = self.ns if ns is ... else ns
        body.setdefault("metadata", {}).setdefault("namespace", ns)
        r = self.s.post(self.base + self.path(api, plural, ns), json=body)
        if not r.ok:
            raise AssertionError(f"create {plural}: {r.status_code} {r.text}")
        return r.json()


# CRDs of the other operators the rbak operator reads or creates objects of. spark-operator's
# is its real schema (the server validates our SparkApplications as a cluster would); the
# RabbitMQ cluster operator's is reduced to what we read (status.defaultUser).
_SPARK_SCHEMA = REPO / "tests" / "operator" / "data" / "sparkapplication-v1beta2.schema.json"


TEST_COPY_LABEL = "rbak.io/e2e-test-copy"


def _crd(group: str, version: str, kind: str, plural: str, short: list[str], schema: dict) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        # *.k8s.io groups need it (spark-operator's own CRD carries its approval PR)
        "metadata": {"name": f"{plural}.{group}", "labels": {TEST_COPY_LABEL: "true"}, "annotations": {
            "api-approved.kubernetes.io": "unapproved, a test copy of another project's CRD"}},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "shortNames": short,
                           "listKind": f"{kind}List"},
                 "versions": [{"name": version, "served": True, "storage": True, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": schema}}]},
    }


def foreign_crds() -> list[dict]:
    free = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    spark = json.loads(_SPARK_SCHEMA.read_text())["openAPIV3Schema"]
    return [
        _crd("rabbitmq.com", "v1beta1", "RabbitmqCluster", "rabbitmqclusters", ["rmq"],
             {"type": "object", "properties": {"spec": free, "status": free}}),
        _crd("sparkoperator.k8s.io", "v1beta2", "SparkApplication", "sparkapplications", ["sparkapp"], spark),
    ]


# On a cluster with a Job controller and kubelets (kind, ...), the local kubelet must stay the only
# one running the test namespace's Jobs: the Job controller's pods are refused there. (The local
# kubelet's own Pods carry no ownerReference and a scheduling gate, so no kubelet runs them.)
LOCAL_KUBELET_LABEL = "rbak.io/e2e-local-kubelet"
LOCAL_KUBELET_POLICY = [
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
     "metadata": {"name": "rbak-e2e-local-kubelet"},
     "spec": {"failurePolicy": "Fail",
              "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                      "operations": ["CREATE"], "resources": ["pods"]}]},
              "validations": [{
                  "expression": "!has(object.metadata.ownerReferences) || "
                                "!object.metadata.ownerReferences.exists(r, r.kind == 'Job')",
                  "message": "rbak e2e: the test harness runs this namespace's Jobs itself "
                             "(tests/support/opcluster.py PodRunner)"}]}},
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
     "metadata": {"name": "rbak-e2e-local-kubelet"},
     "spec": {"policyName": "rbak-e2e-local-kubelet", "validationActions": ["Deny"],
              "matchResources": {"namespaceSelector": {"matchLabels": {LOCAL_KUBELET_LABEL: "true"}}}}},
]
SCHEDULING_GATE = "rbak.io/local-kubelet"


class RealServer:
    """What ``Cluster`` needs of its API server, from a real one (``kube_api``, or an existing
    cluster, ``support.kubeapi.ExternalKube``): the CRDs installed as shipped, and ``api_calls``
    from the server's audit log.

    On an existing cluster (``kube.external``) the tests get a namespace of their own
    (``namespace``, deleted by ``stop``), the CRDs of other operators are only created when
    absent (``preexisting`` names those that were there: their controllers may act on the test's
    objects), and the Job controller's pods are refused in that namespace (``LOCAL_KUBELET_POLICY``,
    where the server serves ValidatingAdmissionPolicies)."""

    def __init__(self, kube) -> None:
        self.kube = kube
        self.url = kube.server
        self.external = bool(getattr(kube, "external", False))
        self.since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        foreign = foreign_crds()
        names = [c["metadata"]["name"] for c in foreign]
        self.preexisting: set[str] = set()
        if self.external:  # another operator's CRD, not a test copy an earlier run left
            got = json.loads(kube.kubectl("get", "crd", "-o", "json").stdout)["items"]
            self.preexisting = {c["metadata"]["name"] for c in got if c["metadata"]["name"] in names
                                and TEST_COPY_LABEL not in (c["metadata"].get("labels") or {})}
        kube.kubectl("apply", "-f", str(REPO / "crds"))
        ours = [c for c in foreign if c["metadata"]["name"] not in self.preexisting]
        if ours:
            kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": ours}))
        kube.wait_established("rabbitmqbackups.rbak.io", "rabbitmqrestores.rbak.io", "rabbitmqarchives.rbak.io", *names)
        self.namespace = NS
        if self.external:
            self.namespace = f"rbak-e2e-{uuid.uuid4().hex[:8]}"
            kube.kubectl("apply", "-f", "-", input=json.dumps({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": self.namespace, "labels": {LOCAL_KUBELET_LABEL: "true"}}}))
            if kube.serves("admissionregistration.k8s.io/v1", "validatingadmissionpolicies"):
                kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                  "items": LOCAL_KUBELET_POLICY}))

    def kubeconfig(self, path: Path) -> Path:
        if self.external:  # as it is: it may name files relative to its own directory
            return Path(self.kube.kubeconfig)
        shutil.copyfile(self.kube.kubeconfig, path)
        return path

    def api_calls(self, exclude_agent: str = "python-requests") -> set[tuple[str, str, str]]:
        """(group, resource[/subresource], verb) of the requests since this cluster started, except
        the test's own (``requests``' default User-Agent, kubectl) and the server's own."""
        if self.external:
            return set()  # no audit log of an existing cluster (tests that need one skip there)
        out = set()
        for ev in self.kube.audit_events():
            agent = ev.get("userAgent", "")
            if agent.startswith((exclude_agent, "kubectl/")) or ev["requestReceivedTimestamp"] < self.since:
                continue
            if (ev.get("user") or {}).get("username") == "system:apiserver":  # the server's own controllers
                continue
            ref = ev.get("objectRef") or {}
            if not ref.get("resource"):
                continue
            plural = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            out.add((ref.get("apiGroup", ""), plural, ev["verb"]))
        return out

    def stop(self) -> None:
        if self.external:
            self.kube.kubectl("delete", "namespace", self.namespace, "--wait=false", "--ignore-not-found", check=False)


@dataclass
class DeploymentPod:
    """The one pod a Deployment runs here: a process."""

    name: str
    template: str
    proc: subprocess.Popen
    log: Path
    grace: int
    started: float = field(default_factory=time.monotonic)
    log_from: int = 0  # where this run's output starts in ``log`` (a restart in place appends)
    killed: bool = False  # by kill_deployment_pod: the pod is replaced, not restarted
    restarts: int = 0
    exited: float | None = None  # when its container exited: restarted in place after the back-off
    last_state: dict = field(default_factory=dict)  # the container status' lastState


def _template_key(dep: dict) -> str:
    return json.dumps(dep["spec"]["template"], sort_keys=True)


class PodRunner:
    """Plays kubelet and the Job controller for Jobs in the emulator."""

    def __init__(self, http: Http, ns: str | None = None, container_mode: bool = False) -> None:
        self.http, self.ns = http, ns or http.ns
        # Container mode: each Job's containers run in their image with podman, as a kubelet runs
        # them (``_in_container``); SparkApplications still run locally.
        self.container_mode = container_mode
        self.container_runs: list[tuple[str, str, str]] = []  # (Job, container, image) run by podman
        self.seen: set[str] = set()
        self.started: list[str] = []  # Job names in start order
        self.outputs: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._tmp = Path(tempfile.mkdtemp(prefix="rbak-kubelet-"))
        self._running: dict[str, threading.Thread] = {}
        self.errors: list[str] = []
        self.hooks: list[Callable[[str, str], None]] = []
        self.extra_env: dict[str, str] = {}  # added to every pod (PYTHONPATH: prepended), like a mutating webhook
        # the images this node has (the operator's RBAK_IMAGE, its -spark variant): any other cannot be pulled
        self.images: set[str] = {"rbak:test", "rbak:test-spark"}
        self.runs_deployments = isinstance(http, KubeHttp)  # kmock's emulator serves no Deployments
        self.deployment_pods: dict[str, DeploymentPod] = {}  # Deployment name -> its running pod
        self.pod_starts: list[str] = []  # pod names of Deployments, in start order (replacements too)

    def _before(self, run: str, container: str) -> None:
        for hook in list(self.hooks):
            hook(run, container)

    def start(self) -> "PodRunner":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for name in list(self.deployment_pods):
            self._stop_deployment_pod(name)
        for t in list(self._running.values()):
            t.join(60)
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for job in self.http.items("batch/v1", "jobs", self.ns):
                    name = job["metadata"]["name"]
                    if name in self.seen or (job.get("status") or {}).get("conditions"):
                        continue
                    self.seen.add(name)
                    self.started.append(name)
                    t = threading.Thread(target=self._run_job, args=(job,), daemon=True)
                    self._running[name] = t
                    t.start()
                for app in self.http.items("sparkoperator.k8s.io/v1beta2", "sparkapplications", self.ns):
                    name = "spark:" + app["metadata"]["name"]
                    if name in self.seen or (app.get("status") or {}).get("applicationState"):
                        continue
                    self.seen.add(name)
                    self.started.append(name)
                    t = threading.Thread(target=self._run_spark, args=(app,), daemon=True)
                    self._running[name] = t
                    t.start()
            except Exception as e:  # noqa: BLE001 - the emulator going away at teardown
                self.errors.append(repr(e))
            if self.runs_deployments:
                try:
                    self._sync_deployments()
                except Exception as e:  # noqa: BLE001 - the emulator going away at teardown
                    self.errors.append(repr(e))
            self._stop.wait(0.3)

    # -- Deployments: one long-running pod each, as the Deployment and ReplicaSet controllers and a
    # kubelet run it (restartPolicy Always): replaced when it exits or is killed, stopped (SIGTERM, then
    # SIGKILL after terminationGracePeriodSeconds) when the Deployment is deleted, scaled to 0, or its
    # pod template changes (strategy Recreate: the old pod is gone before the new one starts).
    def _sync_deployments(self) -> None:
        deps = {d["metadata"]["name"]: d for d in self.http.items("apps/v1", "deployments", self.ns)}
        for name in list(self.deployment_pods):
            d = deps.get(name)
            cur = self.deployment_pods[name]
            if d is None or int(d["spec"].get("replicas", 1)) < 1 or cur.template != _template_key(d):
                self._stop_deployment_pod(name)
        for name, d in deps.items():
            if int(d["spec"].get("replicas", 1)) < 1:
                continue
            cur = self.deployment_pods.get(name)
            if cur is not None and cur.proc.poll() is None:
                continue
            if cur is not None and not cur.killed:  # its container exited: restarted in the same pod
                self._restart_in_place(cur, d)
                continue
            if cur is not None:  # it was killed (a node lost, an eviction): a new pod, as the ReplicaSet makes one
                self._stop_deployment_pod(name)
                if time.monotonic() - cur.started < 1.0:
                    continue  # a crash loop backs off
            self._start_deployment_pod(name, d)

    def _start_deployment_pod(self, name: str, dep: dict) -> None:
        if self.container_mode:
            self.errors.append(f"deployment {name}: container mode runs Jobs only")
            return
        pod_spec = dep["spec"]["template"]["spec"]
        pod_name = f"{name}-{uuid.uuid4().hex[:5]}"
        workdir = self._tmp / pod_name
        workdir.mkdir(parents=True, exist_ok=True)
        labels = dict((dep["spec"]["template"].get("metadata") or {}).get("labels") or {})
        self.http.create("v1", "pods", {"apiVersion": "v1", "kind": "Pod",
                                        "metadata": {"name": pod_name, "labels": labels},
                                        "spec": {**pod_spec, "schedulingGates": [{"name": SCHEDULING_GATE}]},
                                        "status": {"phase": "Pending"}}, self.ns)
        try:
            proc = self._launch(dep, workdir, workdir / "output.log")
        except LookupError as e:  # a missing Secret or ConfigMap: the pod waits (CreateContainerConfigError)
            self.outputs[pod_name] = f"{pod_name}: CreateContainerConfigError: {e}"
            self.http.delete("v1", "pods", pod_name, self.ns)
            return
        self.deployment_pods[name] = DeploymentPod(pod_name, _template_key(dep), proc, workdir / "output.log",
                                                   int(pod_spec.get("terminationGracePeriodSeconds") or 30))
        self.pod_starts.append(pod_name)
        self.http.patch("v1", "pods", pod_name, {"status": {"phase": "Running"}}, self.ns, "status")

    def _launch(self, dep: dict, workdir: Path, log_path: Path) -> subprocess.Popen:
        """The Deployment's container as a process, its output appended to ``log_path``."""
        pod_spec = dep["spec"]["template"]["spec"]
        c = pod_spec["containers"][0]
        mounts = self._mounts(pod_spec, workdir)
        env = {k: self._map(v, mounts) for k, v in self._env(c).items()}
        cmd = list(c.get("command") or []) + list(c.get("args") or [])
        if cmd and cmd[0] == "python":
            cmd[0] = sys.executable
        cmd = [self._map(a, mounts) for a in cmd]
        with open(log_path, "ab") as log:
            return subprocess.Popen(cmd, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)

    def _restart_in_place(self, pod: DeploymentPod, dep: dict) -> None:
        """As a kubelet restarts a container that exited (restartPolicy Always): its exit is the container
        status' ``lastState.terminated`` (the message: FallbackToLogsOnError's last 80 lines or 2048 bytes),
        ``waiting: CrashLoopBackOff`` for a 1 s back-off, then it runs again in the same pod."""
        c = dep["spec"]["template"]["spec"]["containers"][0]
        if pod.exited is None:
            pod.exited = time.monotonic()
            out = pod.log.read_bytes()[pod.log_from:].decode(errors="replace") if pod.log.exists() else ""
            term = {"exitCode": pod.proc.returncode, "reason": "Completed" if pod.proc.returncode == 0 else "Error",
                    "finishedAt": _now()}
            if pod.proc.returncode != 0:
                term["message"] = "\n".join(out.splitlines()[-80:]).encode()[-2048:].decode(errors="replace")
            pod.last_state = {"terminated": term}
            self._container_status(pod, c, {"waiting": {"reason": "CrashLoopBackOff", "message": (
                f"back-off 1s restarting failed container={c['name']} pod={pod.name}")}})
            return
        if time.monotonic() - pod.exited < 1.0:
            return
        pod.log_from = pod.log.stat().st_size if pod.log.exists() else 0
        pod.proc = self._launch(dep, pod.log.parent, pod.log)
        pod.exited, pod.restarts = None, pod.restarts + 1
        self._container_status(pod, c, {"running": {"startedAt": _now()}})

    def _container_status(self, pod: DeploymentPod, c: dict, state: dict) -> None:
        self.http.patch("v1", "pods", pod.name, {"status": {"containerStatuses": [{
            "name": c["name"], "state": state, "lastState": pod.last_state, "ready": "running" in state,
            "restartCount": pod.restarts, "image": c.get("image", ""), "imageID": "", "started": "running" in state}]}},
            self.ns, "status")

    def _stop_deployment_pod(self, name: str) -> None:
        pod = self.deployment_pods.pop(name, None)
        if pod is None:
            return
        if pod.proc.poll() is None:
            pod.proc.terminate()
            try:
                pod.proc.wait(pod.grace)
            except subprocess.TimeoutExpired:
                pod.proc.kill()
                pod.proc.wait(10)
        self.outputs[pod.name] = pod.log.read_text(errors="replace") if pod.log.exists() else ""
        try:
            self.http.delete("v1", "pods", pod.name, self.ns)
        except Exception as e:  # noqa: BLE001 - the emulator going away at teardown
            self.errors.append(f"{pod.name}: {e!r}")

    def kill_deployment_pod(self, name: str) -> str:
        """SIGKILL the Deployment's running pod (a node lost, an eviction); the runner replaces it.
        Returns the killed pod's name."""
        pod = self.deployment_pods[name]
        pod.killed = True
        pod.proc.kill()
        pod.proc.wait(10)
        return pod.name

    def deployment_output(self, name: str) -> str:
        pod = self.deployment_pods.get(name)
        return pod.log.read_text(errors="replace") if pod is not None and pod.log.exists() else ""

    def _env(self, container: dict) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self._tmp),
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "operator")]), "PYTHONUNBUFFERED": "1"}
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = e["value"]
                continue
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                sec = self.http.get("v1", "secrets", ref["name"], self.ns)
                if sec is None:
                    raise LookupError(f'secret "{ref["name"]}" not found')
                data = sec.get("data") or {}
                if ref["key"] not in data:
                    raise LookupError(f'couldn\'t find key {ref["key"]} in Secret {self.ns}/{ref["name"]}')
                env[e["name"]] = base64.b64decode(data[ref["key"]]).decode()
        for k, v in self.extra_env.items():
            env[k] = v + os.pathsep + env[k] if k == "PYTHONPATH" else v
        return env

    def _mounts(self, pod_spec: dict, workdir: Path) -> dict[str, str]:
        """mountPath -> local dir, with ConfigMaps written out."""
        vols = {v["name"]: v for v in pod_spec.get("volumes") or []}
        out: dict[str, str] = {}
        for c in (pod_spec.get("initContainers") or []) + pod_spec["containers"]:
            for m in c.get("volumeMounts") or []:
                if m["mountPath"] in out:
                    continue
                local = workdir / m["name"]
                local.mkdir(parents=True, exist_ok=True)
                v = vols[m["name"]]
                if "configMap" in v:
                    cm = self.http.get("v1", "configmaps", v["configMap"]["name"], self.ns)
                    if cm is None:
                        raise LookupError(f'configmap "{v["configMap"]["name"]}" not found')
                    for k, val in (cm.get("data") or {}).items():
                        (local / k).write_text(val)
                out[m["mountPath"]] = str(local)
        return out

    @staticmethod
    def _map(value: str, mounts: dict[str, str]) -> str:
        for mp in sorted(mounts, key=len, reverse=True):
            if value == mp or value.startswith(mp + "/"):
                return mounts[mp] + value[len(mp):]
        return value

    def _in_container(self, job: str, pod_spec: dict, c: dict, workdir: Path) -> subprocess.CompletedProcess:
        """One container of a Job's pod, run in its image by podman (``support.container``): the
        pod's env (Secrets resolved here, as a kubelet does), volumes, user and read-only root."""
        from support import container

        def get(plural: str, obj: str) -> dict | None:
            return self.http.get("v1", plural, obj, self.ns)

        container.run_as_root_check(pod_spec, c)
        env = container.pod_env(get, self.ns, c)
        if "PYTHONPATH" in self.extra_env:  # a host path: nothing the image can import from
            raise LookupError("PodRunner.extra_env PYTHONPATH does not reach a container (container mode)")
        env.update(self.extra_env)
        volumes = container.pod_volumes(get, pod_spec, workdir)
        name = f"rbak-kubelet-{job}-{c['name']}-{uuid.uuid4().hex[:6]}"[:120]
        argv = container.pod_container_args(pod_spec, c, env, volumes, name)
        # the termination-message file a kubelet gives every container (rbak writes its result there):
        # the same host file _run_job reads afterwards, writable by the container's user
        tlog = workdir / f"{c['name']}.termination-log"
        tlog.touch()
        tlog.chmod(0o666)
        argv[2:2] = ["--volume", f"{tlog}:{c.get('terminationMessagePath') or '/dev/termination-log'}:rw"]
        self.container_runs.append((job, c["name"], c["image"]))
        try:
            return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            subprocess.run(["podman", "rm", "--force", name], capture_output=True, timeout=120)
            raise

    def _started(self, name: str) -> None:
        """The Job's status as it starts. A cluster's Job controller may have set startTime already,
        and a server refuses to change it: set only when absent."""
        current = (self.http.get("batch/v1", "jobs", name, self.ns) or {}).get("status") or {}
        st: dict = {"active": 1}
        if not current.get("startTime"):
            st["startTime"] = _now()
        self.http.patch("batch/v1", "jobs", name, {"status": st}, self.ns, "status")

    def _cannot_start(self, pod_spec: dict, workdir: Path) -> tuple[str, dict, str, str] | None:
        """What keeps a real kubelet from starting the pod, as it reports it: (status key, container,
        waiting reason, message) for an image it cannot pull or a Secret/ConfigMap (key) that is missing."""
        for key, c in [("initContainerStatuses", c) for c in pod_spec.get("initContainers") or []] + [
                ("containerStatuses", c) for c in pod_spec["containers"]]:
            if c.get("image") and c["image"] not in self.images:
                return key, c, "ImagePullBackOff", f'Back-off pulling image "{c["image"]}"'
        try:
            self._mounts(pod_spec, workdir / "probe")
        except LookupError as e:
            return "containerStatuses", pod_spec["containers"][0], "CreateContainerConfigError", str(e)
        for key, c in [("initContainerStatuses", c) for c in pod_spec.get("initContainers") or []] + [
                ("containerStatuses", c) for c in pod_spec["containers"]]:
            try:
                self._env(c)
            except LookupError as e:
                return key, c, "CreateContainerConfigError", str(e)
        return None

    def _wait_to_start(self, name: str, pod_name: str, pod_spec: dict, workdir: Path) -> bool:
        """As a kubelet: a pod that cannot start stays Pending with its container waiting (reason and
        message), retried until it can (True) or, as the Job controller does once the Job's
        activeDeadlineSeconds is set, the Job fails with DeadlineExceeded and the pod goes (False)."""
        shown = None
        while not self._stop.is_set():
            problem = self._cannot_start(pod_spec, workdir)
            if problem is None:
                return True
            key, c, reason, message = problem
            if (key, reason, message) != shown:
                shown = (key, reason, message)
                self.http.patch("v1", "pods", pod_name, {"status": {"phase": "Pending", key: [{
                    "name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""), "imageID": "",
                    "started": False, "state": {"waiting": {"reason": reason, "message": message}}}]}}, self.ns, "status")
                self.outputs[name] = f"{pod_name}: {reason}: {message}"
            job = self.http.get("batch/v1", "jobs", name, self.ns)
            if job is None:
                return False
            if job["spec"].get("activeDeadlineSeconds") is not None:
                self.http.delete("v1", "pods", pod_name, self.ns)
                self.http.patch("batch/v1", "jobs", name, {"status": {"active": 0, "failed": 1, "conditions": [{
                    "type": "Failed", "status": "True", "lastTransitionTime": _now(), "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline"}]}}, self.ns, "status")
                return False
            self._stop.wait(0.5)
        return False

    def _run_job(self, job: dict) -> None:
        name = job["metadata"]["name"]
        workdir = self._tmp / name
        workdir.mkdir(parents=True, exist_ok=True)
        pod_spec = job["spec"]["template"]["spec"]
        pod_name = f"{name}-pod"
        self._started(name)
        # A scheduling gate: on a cluster with kubelets no scheduler binds it and no kubelet runs it.
        gated = {**pod_spec, "schedulingGates": [{"name": SCHEDULING_GATE}]}
        self.http.create("v1", "pods", {"apiVersion": "v1", "kind": "Pod",
                                        "metadata": {"name": pod_name, "labels": {"job-name": name}},
                                        "spec": gated, "status": {"phase": "Pending"}}, self.ns)
        if not self._wait_to_start(name, pod_name, pod_spec, workdir):
            return
        self.http.patch("v1", "pods", pod_name, {"status": {"phase": "Running"}}, self.ns, "status")
        statuses: list[dict] = []
        ok = True
        output = ""
        try:
            mounts = self._mounts(pod_spec, workdir)
            for kind, c in [("init", c) for c in pod_spec.get("initContainers") or []] + [("main", c) for c in pod_spec["containers"]]:
                # the termination-message file: what the container writes there becomes its message
                tlog_path = c.get("terminationMessagePath") or "/dev/termination-log"
                tlog = workdir / f"{c['name']}.termination-log"
                env = {k: str(tlog) if v == tlog_path else self._map(v, mounts) for k, v in self._env(c).items()}
                cmd = list(c.get("command") or []) + list(c.get("args") or [])
                if cmd and cmd[0] == "python":
                    cmd[0] = sys.executable
                cmd = [self._map(a, mounts) for a in cmd]
                self._before(name, c["name"])
                p = (self._in_container(name, pod_spec, c, workdir) if self.container_mode else
                     subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=300))
                out = (p.stdout or "") + (p.stderr or "")
                output += f"$ {' '.join(c.get('args') or [])}\n{out}"
                term = {"exitCode": p.returncode, "reason": "Completed" if p.returncode == 0 else "Error",
                        "finishedAt": _now()}
                written = tlog.read_text(errors="replace") if tlog.exists() else ""
                if written:  # the file wins, exit code 0 or not (at most 4096 bytes)
                    term["message"] = written.encode()[:4096].decode(errors="replace")
                elif p.returncode != 0:  # FallbackToLogsOnError: the last 80 lines or 2048 bytes, the smaller
                    term["message"] = "\n".join(out.splitlines()[-80:]).encode()[-2048:].decode(errors="replace")
                statuses.append({"name": c["name"], "_kind": kind, "state": {"terminated": term}, "ready": False,
                                 "restartCount": 0, "image": c.get("image", ""), "imageID": "", "started": False})
                if p.returncode != 0:
                    ok = False
                    break
        except Exception as e:  # noqa: BLE001 - a Secret deleted between the start check and the container: a crash here
            ok = False
            statuses.append({"name": "setup", "_kind": "main", "ready": False, "restartCount": 0, "image": "",
                             "imageID": "", "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": str(e)}}})
            output += repr(e)
        self.outputs[name] = output
        init = [{k: v for k, v in s.items() if k != "_kind"} for s in statuses if s["_kind"] == "init"]
        main = [{k: v for k, v in s.items() if k != "_kind"} for s in statuses if s["_kind"] == "main"]
        try:
            self.http.patch("v1", "pods", pod_name, {"status": {
                "phase": "Succeeded" if ok else "Failed", "initContainerStatuses": init, "containerStatuses": main}},
                self.ns, "status")
            cond = {"type": "Complete" if ok else "Failed", "status": "True", "lastTransitionTime": _now(),
                    **({} if ok else {"reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"})}
            st = {"active": 0, "conditions": [cond], **({"succeeded": 1, "completionTime": _now()} if ok else {"failed": 1})}
            self.http.patch("batch/v1", "jobs", name, {"status": st}, self.ns, "status")
        except Exception as e:  # noqa: BLE001 - the Job was deleted meanwhile (Replace)
            self.errors.append(f"{name}: {e!r}")


def _spark_main(app: dict) -> Path:
    """local:///opt/rbak/spark/x.py -> this checkout's spark/x.py (what the -spark image holds)."""
    f = app["spec"]["mainApplicationFile"]
    prefix = "local:///opt/rbak/spark/"
    assert f.startswith(prefix), f
    return REPO / "spark" / f[len(prefix):]


def _run_spark_app(runner: "PodRunner", app: dict) -> None:
    """spark-operator's part: run the driver's program (Spark in local mode), then set applicationState."""
    name = app["metadata"]["name"]
    api = "sparkoperator.k8s.io/v1beta2"
    runner.http.patch(api, "sparkapplications", name, {"status": {
        "applicationState": {"state": "SUBMITTED"}, "driverInfo": {"podName": f"{name}-driver"},
        "lastSubmissionAttemptTime": _now(), "submissionAttempts": 1}}, runner.ns, "status")
    driver = app["spec"]["driver"]
    workdir = runner._tmp / name
    workdir.mkdir(parents=True, exist_ok=True)  # the driver's working directory, volumes or not
    pod_spec = {"volumes": app["spec"].get("volumes") or [], "containers": [driver]}
    try:
        mounts = runner._mounts(pod_spec, workdir)
        env = {k: runner._map(v, mounts) for k, v in runner._env(driver).items()}
        env["PYSPARK_PYTHON"] = sys.executable
        cmd = [sys.executable, str(_spark_main(app))] + [runner._map(a, mounts) for a in app["spec"].get("arguments") or []]
        runner.http.patch(api, "sparkapplications", name, {"status": {"applicationState": {"state": "RUNNING"}}},
                          runner.ns, "status")
        runner._before(name, "spark-kubernetes-driver")
        p = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=300)
        out = (p.stdout or "") + (p.stderr or "")
        # spark-operator's own words: the driver's exit code, never its output.
        ok, err = p.returncode == 0, f"driver container failed with ExitCode: {p.returncode}, Reason: Error"
    except Exception as e:  # noqa: BLE001 - any failure reading the driver pod is the run's failure
        ok, out, err = False, repr(e), "driver pod not found"
    runner.outputs["spark:" + name] = out
    state = {"state": "COMPLETED"} if ok else {"state": "FAILED", "errorMessage": err}
    runner.http.patch(api, "sparkapplications", name, {"status": {"applicationState": state, "terminationTime": _now()}},
                      runner.ns, "status")


PodRunner._run_spark = _run_spark_app  # type: ignore[attr-defined]


class Operator:
    """The real operator: ``python -m rbak_operator`` as a subprocess."""

    def __init__(self, kubeconfig: Path, clock_file: Path, log_path: Path, extra_env: dict[str, str] | None = None):
        self.kubeconfig, self.clock_file, self.log_path = kubeconfig, clock_file, log_path
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> "Operator":
        env = dict(os.environ)
        env.update({
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)]),
            "RBAK_OPERATOR_STANDALONE": "1",
            "RBAK_OPERATOR_PROGRESS_SECONDS": "0.5",  # Jobs store progress and the operator reads it this often
            "RBAK_OPERATOR_CLOCK_FILE": str(self.clock_file),
            "RBAK_METRICS_PORT": "0",
            "RBAK_IMAGE": "rbak:test",
            **self.extra_env,
        })
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "rbak_operator"], env=env, cwd=REPO,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self._log:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log:
            self._log.close()
            self._log = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def wait_for(pred, timeout: float = 60, interval: float = 0.25, what: str = "condition", diag=None):
    """Poll ``pred`` until truthy; ``timeout`` is a margin of at least ``brokers.MIN_WAIT`` seconds."""
    from support.brokers import MIN_WAIT

    timeout = max(timeout, MIN_WAIT)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    extra = f"\n{diag()}" if diag else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}{extra}")
