"""The API server's ``pods/log`` for the tests: a plain-HTTP front of ``kube_api`` that answers
``GET .../pods/<pod>/log`` from the local kubelet's captured output and forwards every other
request to the real server unchanged.

In a cluster the API server proxies ``pods/log`` to the kubelet that ran the pod; the test server
has no kubelet (it answers 404), and the local one (``opcluster.PodRunner``) keeps what each Job's
pod printed in ``outputs[job]`` (its pod is ``<job>-pod``), one block per container, which this
front splits per container. So ``kubectl rbak logs`` makes the same calls here as against a cluster.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

LOG_PATH = re.compile(r"^/api/v1/namespaces/[^/]+/pods/([^/?]+)/log(\?.*)?$")


class LogFront:
    def __init__(self, kube, outputs: dict[str, str], namespace: str = "default") -> None:
        self.kube, self.outputs, self.namespace = kube, outputs, namespace
        self.log_requests: list[str] = []
        ctx = self._ctx = ssl.create_default_context(cafile=str(kube.ca_file))
        front = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _forward(self) -> None:
                m = LOG_PATH.match(self.path)
                if m and self.command == "GET":
                    front.log_requests.append(self.path)
                    text = front.container_log(m.group(1), parse_qs(urlsplit(self.path).query).get("container", [""])[0])
                    if text is not None:
                        return self._answer(200, "text/plain", text.encode())
                    return self._answer(404, "application/json", json.dumps(
                        {"kind": "Status", "status": "Failure", "message": f"pod {m.group(1)} has no log"}).encode())
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                req = urllib.request.Request(front.kube.server + self.path, data=body, method=self.command,
                                             headers=headers)
                try:
                    r = urllib.request.urlopen(req, context=ctx, timeout=60)
                    status, data, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
                except urllib.error.HTTPError as e:
                    status, data, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
                self._answer(status, ctype, data)

            def _answer(self, status: int, ctype: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def container_log(self, pod: str, container: str) -> str | None:
        """What ``container`` of ``pod`` printed: the kubelet's output of the pod's Job is one
        ``$ ARGS`` block per container that ran, in the pod's order (init containers first)."""
        job = pod.removesuffix("-pod")
        output = self.outputs.get(job)
        if output is None:
            return None
        spec = json.loads(self._get(f"/api/v1/namespaces/{self.namespace}/pods/{pod}"))["spec"]
        markers = [(c["name"], f"$ {' '.join(c.get('args') or [])}\n")
                   for c in (spec.get("initContainers") or []) + spec["containers"]]
        at, blocks = 0, []  # (container, where its output starts, where its marker starts)
        for name, marker in markers:
            start = output.find(marker, at)
            if start < 0:
                break  # it never ran
            at = start + len(marker)
            blocks.append((name, at, start))
        for i, (name, begin, _) in enumerate(blocks):
            if name == container:
                return output[begin:blocks[i + 1][2] if i + 1 < len(blocks) else len(output)]
        return ""

    def _get(self, path: str) -> bytes:
        req = urllib.request.Request(self.kube.server + path, headers={"Authorization": f"Bearer {self.kube.token}"})
        return urllib.request.urlopen(req, context=self._ctx, timeout=60).read()

    def kubeconfig(self, path: Path) -> Path:
        """The kube_api kubeconfig with this front as the server."""
        cfg = json.loads(Path(self.kube.kubeconfig).read_text())
        cfg["clusters"][0]["cluster"] = {"server": self.url}
        path.write_text(json.dumps(cfg))
        return path

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
