"""The chart's Deployment really starts the operator: its env, through the image entrypoint.

kmock's Kubernetes emulator (the operator tests' harness) plays the API server;
the operator runs as `rbak-entrypoint operator` with exactly the env the chart
renders (plus a kubeconfig instead of the in-cluster token). Checked: the
liveness probe and metrics ports the chart points at answer, two-replica peering
registers in the peering object the chart creates, and every API call the
process made is one the chart's RBAC grants.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
import requests

from support.ship import ROOT, find, granted, manifests, render_chart
from support.opcluster import Emulator, Http, wait_for  # noqa: E402


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("watch", [[], ["default"]], ids=["all-namespaces", "namespaced"])
def test_chart_env_starts_a_peering_operator_that_stays_inside_its_rbac(tmp_path, watch, monkeypatch):
    list_namespaces_fix(monkeypatch)
    health, metrics = free_port(), free_port()
    values = {"operator": {"replicas": 2, "healthPort": health, "resyncSeconds": 60}, "metrics": {"port": metrics},
              "watchNamespaces": watch}
    objs = manifests(render_chart(values))
    container = find(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    chart_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    peering = (find(objs, "KopfPeering") if watch else find(objs, "ClusterKopfPeering"))[0]
    plural = "kopfpeerings" if watch else "clusterkopfpeerings"
    peering_ns = peering["metadata"].get("namespace")

    em = Emulator().start()
    proc = None
    log = tmp_path / "operator.log"
    try:
        assert em.kmock is not None
        em.kmock.resources["kopf.dev/v1/clusterkopfpeerings"] = {
            "kind": "ClusterKopfPeering", "singular": "clusterkopfpeering", "namespaced": False,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
        em.kmock.resources["kopf.dev/v1/kopfpeerings"] = {
            "kind": "KopfPeering", "singular": "kopfpeering", "namespaced": True,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
        http = Http(em.url)
        for ns in watch:
            http.create("v1", "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                        ns=None)
        http.create("kopf.dev/v1", plural,
                    {"apiVersion": peering["apiVersion"], "kind": peering["kind"],
                     "metadata": {"name": peering["metadata"]["name"]}}, ns=peering_ns)
        before = em.request_count()  # the test's own requests are not the operator's
        env = {**os.environ, **chart_env,
               "KUBECONFIG": str(em.kubeconfig(tmp_path / "kubeconfig")),
               "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)]),
               "POD_ID": "rbak-operator-test"}
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

        def registered():
            obj = http.get("kopf.dev/v1", plural, peering["metadata"]["name"], ns=peering_ns) or {}
            return "rbak-operator-test" in (obj.get("status") or {})
        wait_for(registered, timeout=60, what="the operator in the chart's peering object", diag=diag)
        assert proc.poll() is None, diag()

        cluster, per_ns = granted(objs)
        used = em.api_calls(since=before)
        assert ("kopf.dev", plural, "patch") in used
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
