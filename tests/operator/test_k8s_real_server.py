"""The operator's own client (rbak_operator.kube.client) against a real Kubernetes API server.

Issue 28, defect 3: on a machine that sets ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``
the old requests client failed every call with CERTIFICATE_VERIFY_FAILED. Here
both point at the machine's bundle, which does not hold the server's CA; the calls
the reconcilers make must still work, the server (not the client) must apply label
selectors, and a failed status write must be a clear ApiError. kopf's login must
get the same server, CA and token.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from support.require import unavailable

if importlib.util.find_spec("support.kubeapi") is None:  # the kube_api fixture and its server (issue 28)
    unavailable("tests/support/kubeapi.py (the kube_api fixture: a real API server) is not in this checkout")

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

CLIENT = """
import json, sys
from rbak_operator.kube.client import ApiError, Kube, connection_info
ns = sys.argv[1]

def job(name, run):
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": {"rbak.io/backup": run}},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "run", "image": "busybox:1.36"}]}}}}

k = Kube()
out = {"secret": k.secret_values(ns, "creds"), "missing_secret": k.secret_values(ns, "nope")}
cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "nightly-1", "namespace": ns},
      "data": {"rbak.yaml": "x: 1"}}
out["created"] = [k.create_configmap(cm), k.create_job(job("nightly-1", "nightly")),
                  k.create_job(job("weekly-1", "weekly")), k.create_job(job("nightly-1", "nightly")),
                  k.create_configmap(cm)]
out["listed"] = sorted(j["metadata"]["name"] for j in k.list_jobs(ns, {"rbak.io/backup": "nightly"}))
out["pods"] = k.job_pods(ns, "nightly-1")
out["missing_job"] = k.get_job(ns, "nope")
try:
    k.patch_status("rabbitmqbackups", ns, "nope", {"phase": "Running"})
except ApiError as e:
    out["refused"] = [e.status, str(e)]
k.delete_job(ns, "weekly-1")
k.delete_configmap(ns, "nightly-1")
k.delete_configmap(ns, "nightly-1")  # already gone: not an error
out["after_delete"] = sorted(j["metadata"]["name"] for j in k.list_jobs(ns, {"rbak.io/backup": "weekly"}))
info = connection_info()
out["login"] = {"server": info.server, "token": info.token, "scheme": info.scheme,
                "ca": open(info.ca_path).read() if info.ca_path else None}
print(json.dumps(out))
"""


def test_operator_calls_work_with_requests_ca_bundle_set(kube_api):
    ns = f"k8sclient-{uuid.uuid4().hex[:8]}"
    kube_api.kubectl("create", "namespace", ns)
    kube_api.kubectl("-n", ns, "create", "secret", "generic", "creds", "--from-literal=username=backup",
                     "--from-literal=password=s3cret")
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST",)}
    env.update(KUBECONFIG=str(kube_api.kubeconfig), REQUESTS_CA_BUNDLE=SYSTEM_BUNDLE, CURL_CA_BUNDLE=SYSTEM_BUNDLE,
               PYTHONPATH=os.pathsep.join([str(ROOT / "operator"), str(ROOT)]))
    p = subprocess.run([sys.executable, "-c", CLIENT, ns], check=False, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["secret"] == {"username": "backup", "password": "s3cret"} and out["missing_secret"] is None
    assert out["created"] == [True, True, True, False, False]  # the second create of a name: 409, reported False
    assert out["listed"] == ["nightly-1"]  # the server applied the selector: weekly-1 is not there
    assert out["pods"] == [] and out["missing_job"] is None  # no kubelet here
    status, message = out["refused"]  # a status write to what does not exist is an error, not a silent None
    assert status == 404 and f"PATCH /apis/rbak.io/v1alpha1/namespaces/{ns}/rabbitmqbackups/nope/status" in message
    assert out["after_delete"] == []
    assert kube_api.kubectl("-n", ns, "get", "configmaps", "nightly-1", check=False).returncode != 0
    login = out["login"]
    assert login["server"] == kube_api.server and login["scheme"] == "Bearer" and login["token"] == kube_api.token
    assert login["ca"] == Path(kube_api.ca_file).read_text()


def test_operator_makes_an_on_demand_job_with_requests_ca_bundle_set(kube_api, tmp_path):
    """The whole operator (kopf's watches through its login, the reconciler's calls through k8s.py) on the
    real server with both variables set: an on-demand RabbitMQBackup gets its ConfigMap, Job and status.
    No kubelet here, so the Job never runs; the broker and bucket are never contacted."""
    from rbak_operator.decide.naming import manual_run_name
    from support.opcluster import wait_for

    kube_api.kubectl("apply", "-f", str(ROOT / "crds"))
    kube_api.kubectl("wait", "--for=condition=Established", "crd/rabbitmqbackups.rbak.io", "--timeout=60s")
    ns = f"k8sclient-{uuid.uuid4().hex[:8]}"
    kube_api.kubectl("create", "namespace", ns)
    for secret, data in (("s3", ("AWS_ACCESS_KEY_ID=a", "AWS_SECRET_ACCESS_KEY=b")), ("rmq", ("username=u", "password=p"))):
        kube_api.kubectl("-n", ns, "create", "secret", "generic", secret, *(f"--from-literal={d}" for d in data))
    backup = {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQBackup",
              "metadata": {"name": "nightly", "namespace": ns, "annotations": {"rbak.io/backup-now": "1"}},
              "spec": {"broker": {"amqpUrl": "amqp://rabbit.invalid:5672/%2f",
                                  "managementUrl": "http://rabbit.invalid:15672",
                                  "credentialsSecretRef": {"name": "rmq"}},
                       "storage": {"s3": {"bucket": "backups", "region": "us-east-1", "credentialsSecretRef": {"name": "s3"}}},
                       "validate": {"enabled": False}}}
    kube_api.kubectl("apply", "-f", "-", input=json.dumps(backup))
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST",)}
    env.update(KUBECONFIG=str(kube_api.kubeconfig), REQUESTS_CA_BUNDLE=SYSTEM_BUNDLE, CURL_CA_BUNDLE=SYSTEM_BUNDLE,
               PYTHONPATH=os.pathsep.join([str(ROOT / "operator"), str(ROOT)]), RBAK_OPERATOR_NAMESPACES=ns,
               RBAK_OPERATOR_STANDALONE="1", RBAK_METRICS_PORT="0",
               RBAK_IMAGE="rbak:test")
    log = tmp_path / "operator.log"
    run = manual_run_name("nightly", "1")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rbak_operator"], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            def made():
                r = kube_api.kubectl("-n", ns, "get", "job", run, "-o", "json", check=False)
                return json.loads(r.stdout) if r.returncode == 0 else None
            job = wait_for(made, 120, 1, what=f"Job {run}", diag=lambda: log.read_text(errors="replace")[-4000:])
        finally:
            proc.terminate()
            proc.wait(30)
    try:
        assert job["metadata"]["ownerReferences"][0]["name"] == "nightly"
        assert kube_api.kubectl("-n", ns, "get", "configmap", run, check=False).returncode == 0
        status = json.loads(kube_api.kubectl("-n", ns, "get", "rabbitmqbackup", "nightly", "-o", "json").stdout)["status"]
        assert status.get("lastManualTrigger") == "1", status
        assert "CERTIFICATE_VERIFY_FAILED" not in log.read_text(errors="replace")
    finally:
        kube_api.delete_rbak_objects(ns)  # later operators on this server must not reconcile it
