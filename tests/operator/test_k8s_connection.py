"""How the operator's own client (rbak_operator.kube.client) and kopf's login connect to a cluster.

A small TLS "API server" here (the CI's test CA, tests/support/tls.py) answers
the few paths the checks need and logs what it was sent; the client runs in a
fresh process with exactly the environment under test. Checked: the kubeconfig's
CA is the one trusted even when ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` point
elsewhere (issue 28: the old requests client failed every call there), a server
the kubeconfig's CA did not sign is refused, an ``exec`` credential plugin's
token is what the server receives (EKS/GKE/AKS kubeconfigs), kopf's login gets
the same CA and token, and a missing kubeconfig is a clear error.
The same checks against a real API server: test_k8s_real_server.py.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BACKUP_PATH = "/apis/rbak.io/v1alpha1/namespaces/default/rabbitmqbackups/nightly"
JOBS_PATH = "/apis/batch/v1/namespaces/default/jobs"


class FakeApi(BaseHTTPRequestHandler):
    """Answers a RabbitMQBackup GET and Job create/list; 401 without the expected token."""

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, method: str) -> None:
        srv = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        srv.log.append((method, self.path, self.headers.get("Authorization"), self.headers.get("User-Agent")))
        if self.headers.get("Authorization") != f"Bearer {srv.token}":
            return self._reply(401, {"kind": "Status", "code": 401, "message": "Unauthorized"})
        path = self.path.split("?")[0]
        if method == "GET" and path == BACKUP_PATH:
            return self._reply(200, {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQBackup",
                                     "metadata": {"name": "nightly", "namespace": "default"}})
        if method == "POST" and path == JOBS_PATH:
            srv.jobs.append(body)
            return self._reply(201, body)
        if method == "GET" and path == JOBS_PATH:
            return self._reply(200, {"kind": "JobList", "items": srv.jobs})
        return self._reply(404, {"kind": "Status", "code": 404, "message": f"{path} not found"})

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")


@pytest.fixture
def api_server(tls):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls.server_cert, tls.server_key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.log, srv.jobs, srv.token = [], [], "static-token"
    srv.url = f"https://localhost:{srv.server_address[1]}"
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def kubeconfig(path: Path, server: str, ca: Path, user: dict) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "default"}}],
    }))
    return path


# Runs in a fresh process: the operator's calls and kopf's login answer, as JSON.
CLIENT = """
import json, sys
from rbak_operator.kube.client import ApiError, Kube, connection_info
out = {}
try:
    k = Kube()
    out["backup"] = k.get_backup("default", "nightly")["metadata"]["name"]
    out["created"] = k.create_job({"apiVersion": "batch/v1", "kind": "Job",
                                   "metadata": {"name": "run-1", "namespace": "default", "labels": {"l": "v"}}})
    out["jobs"] = [j["metadata"]["name"] for j in k.list_jobs("default", {"l": "v"})]
except ApiError as e:
    out["error"] = [e.status, str(e)]
info = connection_info()
out["login"] = {"server": info.server, "scheme": info.scheme, "token": info.token,
                "ca": open(info.ca_path).read() if info.ca_path else None, "insecure": info.insecure,
                "namespace": info.default_namespace}
print(json.dumps(out))
"""


def run_client(kubeconfig_path: Path | None, **env_extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "operator"), str(ROOT)])
    env["HOME"] = str(Path(kubeconfig_path or "/nonexistent").parent)  # no ~/.kube/config of the machine
    if kubeconfig_path:
        env["KUBECONFIG"] = str(kubeconfig_path)
    env.update(env_extra)
    p = subprocess.run([sys.executable, "-c", CLIENT], check=False, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_kubeconfig_ca_is_trusted_despite_requests_ca_bundle(api_server, tls, tmp_path):
    """Issue 28, defect 3: REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE name the machine's bundle (which does not
    hold the cluster's CA); the operator's calls still verify the server with the kubeconfig's CA."""
    assert Path(SYSTEM_BUNDLE).is_file()
    kc = kubeconfig(tmp_path / "kubeconfig", api_server.url, tls.ca_cert, {"token": "static-token"})
    out = run_client(kc, REQUESTS_CA_BUNDLE=SYSTEM_BUNDLE, CURL_CA_BUNDLE=SYSTEM_BUNDLE)
    assert "error" not in out, out
    assert (out["backup"], out["created"], out["jobs"]) == ("nightly", True, ["run-1"])
    assert [(m, p.split("?")[0], a) for m, p, a, _ in api_server.log] == [
        ("GET", BACKUP_PATH, "Bearer static-token"), ("POST", JOBS_PATH, "Bearer static-token"),
        ("GET", JOBS_PATH, "Bearer static-token")]
    assert api_server.log[-1][1].endswith("?labelSelector=l%3Dv")  # the server filters, not the client
    assert {ua for *_, ua in api_server.log} == {"rbak-operator"}  # tells the operator's calls apart
    login = out["login"]
    assert (login["server"], login["scheme"], login["token"]) == (api_server.url, "Bearer", "static-token")
    assert login["ca"] == tls.ca_cert.read_text() and login["insecure"] is False
    assert login["namespace"] == "default"


def test_a_server_the_kubeconfig_ca_did_not_sign_is_refused(api_server, tls, tmp_path):
    """The other side of the check above: verification is on, with the kubeconfig's CA and nothing else,
    even when REQUESTS_CA_BUNDLE names the CA that did sign the server (the old client then trusted it)."""
    kc = kubeconfig(tmp_path / "kubeconfig", api_server.url, tls.wrong_ca_cert, {"token": "static-token"})
    out = run_client(kc, REQUESTS_CA_BUNDLE=str(tls.ca_cert))
    assert out["error"][0] == 0 and "CERTIFICATE_VERIFY_FAILED" in out["error"][1], out
    assert BACKUP_PATH in out["error"][1]
    assert api_server.log == []  # no request got through the handshake


def test_exec_credential_plugin_token_reaches_the_server(api_server, tls, tmp_path):
    """A kubeconfig whose user is an ``exec`` plugin (as EKS, GKE and AKS write them) works outside a
    cluster: the plugin's token is what the server receives, and what kopf logs in with."""
    api_server.token = "from-the-plugin"
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import json\nprint(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', "
                      "'kind': 'ExecCredential', 'status': {'token': 'from-the-plugin'}}))\n")
    kc = kubeconfig(tmp_path / "kubeconfig", api_server.url, tls.ca_cert, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable, "args": [str(plugin)],
        "interactiveMode": "Never"}})
    out = run_client(kc)
    assert "error" not in out, out
    assert (out["backup"], out["created"]) == ("nightly", True)
    assert {a for _, _, a, _ in api_server.log} == {"Bearer from-the-plugin"}
    assert (out["login"]["scheme"], out["login"]["token"]) == ("Bearer", "from-the-plugin")


def test_no_cluster_and_no_kubeconfig_is_a_clear_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "operator"), str(ROOT)]), HOME=str(tmp_path),
               KUBECONFIG=str(tmp_path / "missing-kubeconfig"))
    p = subprocess.run([sys.executable, "-c", "from rbak_operator.kube.client import Kube; Kube().get_backup('d', 'b')"],
                       check=False, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "cannot reach Kubernetes: not in a cluster" in p.stderr
    assert str(tmp_path / "missing-kubeconfig") in p.stderr
