"""The chart's Deployment really starts the operator: its env, through the image entrypoint.

kmock's Kubernetes emulator (the operator tests' harness) plays the API server;
the operator runs as `rbak-entrypoint operator` with exactly the env the chart
renders (plus a kubeconfig instead of the in-cluster token). Checked: the
liveness probe and metrics ports the chart points at answer, a two-replica
operator creates and renews the Lease the chart names (holder: its pod name,
given by the downward API in a cluster and by the test here), and every API
call the process made is one the chart's RBAC grants.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
import requests

from support.ship import ROOT, find, granted, manifests, render_chart
from support.opcluster import Emulator, Http, wait_for


def list_namespaces_fix(monkeypatch) -> None:
    """kmock 0.8 cannot parse the bare `/api/v1/namespaces` path (namespace list/create/watch),
    which kopf uses in namespaced mode; route it to the cluster-scoped `namespaces` resource."""
    from kmock._internal import parsing

    original = parsing.parse_path

    def parse_path(path: str):
        if path.split("?")[0].strip("/") == "api/v1/namespaces":
            return parsing.ParsedPath("", "v1", "namespaces", None, None, None)
        return original(path)

    monkeypatch.setattr(parsing, "parse_path", parse_path)


def put_fix(monkeypatch) -> None:
    """kmock 0.8 serves no PUT (replace) on a named object, which leader election renews its Lease
    with; serve it as an update (the emulator merges the body into the stored object). The
    emulator's request log still tells it apart: ``Emulator.api_calls`` names it "update"."""
    from kmock._internal import enums, parsing

    original = parsing.guess_k8s

    def guess_k8s(k8s, method, query):
        if k8s.group is not None and k8s.name is not None and method == enums.method.PUT:
            return enums.action.UPDATE
        return original(k8s, method, query)

    monkeypatch.setattr(parsing, "guess_k8s", guess_k8s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("watch", [[], ["default"]], ids=["all-namespaces", "namespaced"])
def test_chart_env_starts_an_elected_operator_that_stays_inside_its_rbac(tmp_path, watch, monkeypatch):
    list_namespaces_fix(monkeypatch)
    put_fix(monkeypatch)
    health, metrics = free_port(), free_port()
    values = {"operator": {"replicas": 2, "healthPort": health, "resyncSeconds": 60}, "metrics": {"port": metrics},
              "watchNamespaces": watch}
    release_ns = "rbak-system"
    objs = manifests(render_chart(values, namespace=release_ns))
    container = find(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    chart_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    # what the downward API fills in, in a cluster: this pod's name and namespace
    downward = {"metadata.name": "rbak-operator-5d8f7c9b4-x2x7q", "metadata.namespace": release_ns}
    pod_env = {e["name"]: downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
               for e in container["env"] if "valueFrom" in e}
    assert set(pod_env) == {"POD_NAME", "POD_NAMESPACE"}
    lease_name, lease_ns = chart_env["RBAK_LEASE_NAME"], chart_env["RBAK_LEASE_NAMESPACE"]
    assert lease_ns == release_ns and "RBAK_OPERATOR_STANDALONE" not in chart_env

    em = Emulator().start()
    proc = None
    log = tmp_path / "operator.log"
    try:
        assert em.kmock is not None
        em.kmock.resources["coordination.k8s.io/v1/leases"] = {
            "kind": "Lease", "singular": "lease", "namespaced": True,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}
        http = Http(em.url)
        for ns in watch:
            http.create("v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                        ns=None)
        before = em.request_count()  # the test's own requests are not the operator's
        env = {**os.environ, **chart_env,
               "KUBECONFIG": str(em.kubeconfig(tmp_path / "kubeconfig")),
               "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)]),
               **pod_env}
        with open(log, "wb") as out:
            proc = subprocess.Popen(["sh", str(ROOT / "docker" / "rbak-entrypoint"), *container["args"]],
                                    env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)

        def diag() -> str:
            return log.read_text(errors="replace")[-4000:]

        def get(url):
            try:
                return requests.get(url, timeout=2)
            except requests.RequestException:
                return None

        probe = container["livenessProbe"]["httpGet"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        wait_for(lambda: (r := get(f"http://127.0.0.1:{ports[probe['port']]}{probe['path']}")) is not None
                 and r.status_code == 200, timeout=90, what="the liveness endpoint", diag=diag)
        r = wait_for(lambda: get(f"http://127.0.0.1:{ports['metrics']}/metrics"), timeout=30,
                     what="metrics", diag=diag)
        assert r.status_code == 200 and "rbak_operator_runs_total" in r.text

        def lease():
            return http.get("coordination.k8s.io/v1", "leases", lease_name, ns=lease_ns) or {}

        def held():
            spec = lease().get("spec") or {}
            return spec.get("holderIdentity") == pod_env["POD_NAME"] and spec.get("renewTime")
        first = wait_for(held, timeout=60, what=f"the operator holding Lease {lease_ns}/{lease_name}", diag=diag)
        wait_for(lambda: (t := held()) and t != first, timeout=30, what="the Lease renewed", diag=diag)
        assert proc.poll() is None, diag()

        cluster, per_ns = granted(objs)
        used = em.api_calls(since=before)
        assert {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")} <= used
        # the Lease is granted only in the release namespace, where the operator was told to keep it
        assert ("coordination.k8s.io", "leases", "update") in per_ns[lease_ns]
        assert not any(g == "coordination.k8s.io" for g, _, _ in cluster)
        lease_requests = [req for req in list(em.kmock)[before:]
                          if req.resource is not None and req.resource.plural == "leases"]
        assert lease_requests and {req.namespace for req in lease_requests} == {lease_ns}
        # the emulator's log has no namespaces: a call is inside RBAC if some grant covers it
        allowed = cluster | set().union(*per_ns.values()) if per_ns else cluster
        outside = used - allowed
        assert outside == set(), f"calls the chart's ClusterRole does not grant: {sorted(outside)}"
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        em.stop()
