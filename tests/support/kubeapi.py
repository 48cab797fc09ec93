"""A real Kubernetes API server for the tests (envtest-style): etcd + rbak-kube-apiserver.

``.ci/setup`` builds the binaries from ``.ci/kube-apiserver/main.go`` (the upstream
apiextensions/apiserver packages Debian ships) and caches them, with Debian's etcd and
kubectl, in ``/var/lib/rbak-ci/kube/current`` (override: ``RBAK_CI_KUBE_DIR``). The
server validates CRD schemas and CEL rules, renders printer columns, serves ``/status``,
OpenAPI v2/v3, discovery and server-side apply, as a cluster does; there is no kubelet
and no controller (nothing runs a Pod, deletes dependents or finishes a namespace).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / ".ci" / "kube-apiserver" / "main.go"
BINARIES = ("etcd", "rbak-kube-apiserver", "kubectl")
# Every request when it completes (a watch also when it starts): who (user agent) made which call.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
"""


def kube_dir() -> Path:
    return Path(os.environ.get("RBAK_CI_KUBE_DIR", "/var/lib/rbak-ci/kube")) / "current"


def binaries_problem() -> str | None:
    """None when the cached binaries are there and were built from this checkout's main.go."""
    d = kube_dir()
    missing = [b for b in BINARIES if not os.access(d / b, os.X_OK)]
    if missing:
        return f"Kubernetes API server binaries missing in {d} ({', '.join(missing)}); run .ci/setup"
    want = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    have = (d / "SOURCE_SHA256").read_text().strip() if (d / "SOURCE_SHA256").exists() else ""
    if have != want:
        return f"{d}/rbak-kube-apiserver was built from another {SOURCE.relative_to(REPO)}; run .ci/setup to rebuild"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Kubectl:
    """kubectl and its waits, for any cluster a kubeconfig names."""

    kubeconfig: Path
    external = False  # True: a cluster the tests did not start (and must leave as they found it)

    def kubectl_path(self) -> str:
        raise NotImplementedError

    def wait_established(self, *crds: str, timeout: float = 60) -> None:
        """Until every named CRD is Established (``kubectl wait`` errors while a new CRD has no
        conditions yet)."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.kubectl("get", "crd", *crds, "-o", "json", check=False)
            items = json.loads(r.stdout)["items"] if r.returncode == 0 else []
            ok = {i["metadata"]["name"] for i in items
                  if any(c["type"] == "Established" and c["status"] == "True"
                         for c in (i.get("status") or {}).get("conditions") or [])}
            if ok >= set(crds):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRDs not Established after {timeout}s: {sorted(set(crds) - ok)}")
            time.sleep(0.2)

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG, for subprocesses (kubectl, kopf, the operator)."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,  # noqa: A002 - subprocess.run's name for it
                timeout: float = 120) -> subprocess.CompletedProcess:
        """Run kubectl against this cluster; ``check`` raises with its stderr on failure."""
        cmd = [self.kubectl_path(), "--kubeconfig", str(self.kubeconfig), *args]
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, env=self.env,
                           check=False)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {r.returncode}\nstdout: {r.stdout}\n"
                                 f"stderr: {r.stderr}")
        return r

    def delete_rbak_objects(self, namespace: str) -> None:
        """Delete a test's RabbitMQBackups/Restores (finalizers dropped first: no operator may be
        there to release them), so later operators on this server do not reconcile leftovers."""
        kinds = "rabbitmqbackups.rbak.io,rabbitmqrestores.rbak.io,rabbitmqarchives.rbak.io"
        names = self.kubectl("-n", namespace, "get", kinds, "-o", "name", check=False).stdout.split()
        for name in names:
            self.kubectl("-n", namespace, "patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                         check=False)
        if names:
            self.kubectl("-n", namespace, "delete", *names, "--wait=false", "--ignore-not-found", check=False)

    def serves(self, group_version: str, plural: str) -> bool:
        """Whether the server serves ``plural`` of ``group_version`` (e.g. ``admissionregistration.k8s.io/v1``)."""
        r = self.kubectl("api-resources", f"--api-group={group_version.split('/')[0]}", "-o", "name", check=False)
        return r.returncode == 0 and any(line.split(".")[0] == plural for line in r.stdout.split())


@dataclass
class KubeApi(_Kubectl):
    """A running etcd + API server; ``kubeconfig`` points kubectl, kopf and clients at it."""

    workdir: Path
    server: str = ""
    kubeconfig: Path = field(init=False)
    ca_file: Path = field(init=False)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    bin_dir: Path = field(default_factory=kube_dir)
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.kubeconfig = self.workdir / "kubeconfig"
        self.ca_file = self.workdir / "pki" / "apiserver.crt"
        self.audit_log = self.workdir / "audit.log"

    # ------------------------------------------------------------------ running
    @classmethod
    def start(cls, workdir: Path, timeout: float = 120) -> KubeApi:
        api = cls(workdir)
        try:
            api._start(timeout)
        except BaseException:
            api.stop()
            raise
        return api

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "wb") as log:
            p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        self._procs.append(p)
        return p

    def _start(self, timeout: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        client, peer, port = _free_port(), _free_port(), _free_port()
        etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            str(self.bin_dir / "etcd"), "--name", "rbak", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"rbak=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ])
        deadline = time.monotonic() + timeout
        self._wait(deadline, "etcd /health", lambda: json.loads(
            urllib.request.urlopen(f"{etcd_url}/health", timeout=5).read()).get("health") == "true")
        (self.workdir / "pki").mkdir(exist_ok=True)
        (self.workdir / "token").write_text(self.token + "\n")
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        self._spawn("apiserver", [
            str(self.bin_dir / "rbak-kube-apiserver"), "--etcd-servers", etcd_url,
            "--secure-port", str(port), "--cert-dir", str(self.workdir / "pki"),
            "--token-file", str(self.workdir / "token"),
            "--audit-log-path", str(self.audit_log), "--audit-policy-file", str(self.workdir / "audit-policy.yaml"),
        ])
        self.server = f"https://127.0.0.1:{port}"
        self._wait(deadline, "the serving certificate", self.ca_file.exists)
        self._write_kubeconfig()
        # kopf waits (silently) until namespaces are in discovery: ready means that.
        self._wait(deadline, "namespaces in /api/v1 discovery",
                   lambda: any(r["name"] == "namespaces" for r in self.get("/api/v1")["resources"]))
        self._wait(deadline, "/readyz", lambda: self.get("/readyz", raw=True) == b"ok")
        for ns in ("default", "kube-system"):
            self.kubectl("create", "namespace", ns)

    def _wait(self, deadline: float, what: str, probe) -> None:
        last: object = None
        while time.monotonic() < deadline:
            for p in self._procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode} while waiting for {what}\n"
                                       + self.logs())
            try:
                if probe():
                    return
            except (OSError, ValueError, KeyError) as e:  # not up yet (URLError is an OSError)
                last = e
            time.sleep(0.2)
        raise TimeoutError(f"timed out waiting for {what} (last error: {last!r})\n" + self.logs())

    def logs(self, tail: int = 40) -> str:
        out = []
        for name in ("etcd", "apiserver"):
            f = self.workdir / f"{name}.log"
            if f.exists():
                lines = f.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {f} (last {len(lines)} lines)\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        for p in reversed(self._procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self._procs.clear()
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)

    # ------------------------------------------------------------------ clients
    def _write_kubeconfig(self) -> None:
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "rbak-test",
            "clusters": [{"name": "rbak-test", "cluster": {"server": self.server,
                                                             "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "rbak-test", "context": {"cluster": "rbak-test", "user": "admin",
                                                           "namespace": "default"}}],
        }
        self.kubeconfig.write_text(json.dumps(cfg, indent=1))

    def get(self, path: str, raw: bool = False):
        """GET ``path`` with the admin token; JSON-decoded unless ``raw``."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.token}"})
        body = urllib.request.urlopen(req, context=ctx, timeout=10).read()
        return body if raw else json.loads(body)

    def audit_events(self) -> list[dict]:
        """The audit events so far (``verb``, ``objectRef``, ``userAgent``, ``responseStatus``, ...)."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]

    # ------------------------------------------------------------------ clients
    def kubectl_path(self) -> str:
        return str(self.bin_dir / "kubectl")

    def requests_settings(self) -> dict:
        """``verify``, ``cert`` and ``headers`` for a requests session talking to this server."""
        return {"verify": str(self.ca_file), "cert": None, "headers": {"Authorization": f"Bearer {self.token}"}}


class ExternalKube(_Kubectl):
    """An existing cluster named by a kubeconfig (``RBAK_E2E_KUBECONFIG``): kind, any cluster, or a
    ``KubeApi`` started on its own (``python -m support.kubeapi DIR``). The tests read no audit log
    there (``audit_log`` is None) and never stop it."""

    external = True
    audit_log = None

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        self.kubeconfig = kubeconfig
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)  # exec plugins too
        self.server = cfg.host.rstrip("/")
        self._cfg = cfg

    def kubectl_path(self) -> str:
        cached = kube_dir() / "kubectl"
        return shutil.which("kubectl") or str(cached)

    def requests_settings(self) -> dict:
        cfg = self._cfg
        headers = {a["key"]: a["value"] for a in cfg.auth_settings().values() if a.get("in") == "header"}
        return {"verify": (cfg.ssl_ca_cert or True) if cfg.verify_ssl else False,
                "cert": (cfg.cert_file, cfg.key_file) if cfg.cert_file else None, "headers": headers}

    def audit_events(self) -> list[dict]:
        raise RuntimeError(f"no audit log of the cluster of {self.kubeconfig}")

    def stop(self) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    """``python -m support.kubeapi DIR``: start etcd + the API server in DIR, print the kubeconfig's
    path, serve until SIGTERM/SIGINT (then stop both). For ``RBAK_E2E_KUBECONFIG`` runs."""
    import argparse
    import signal

    ap = argparse.ArgumentParser(prog="python -m support.kubeapi", description=main.__doc__)
    ap.add_argument("workdir", type=Path)
    args = ap.parse_args(argv)
    problem = binaries_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    api = KubeApi.start(args.workdir.resolve())
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    print(f"KUBECONFIG={api.kubeconfig}", flush=True)
    try:
        while not stop:
            time.sleep(0.5)
    finally:
        api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
