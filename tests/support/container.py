"""The rbak image run as Kubernetes runs it: podman (runc) with the pod's user, a read-only root
filesystem, the config mounted read-only and credentials in the environment.

``.ci/image`` builds ``rbak:ci`` and ``rbak:ci-spark`` (``RBAK_TEST_IMAGE`` /
``RBAK_TEST_SPARK_IMAGE`` name others). ``image_problem(image)`` says why the image cannot run
here (no podman, not built), for ``support.require.require_that``: a skip on a developer's
machine, a failure with ``CI=true``.

``Role`` runs one pod role in a container with ``--network host`` (the CI brokers, moto and the
API server listen on loopback); a failing role raises an ``AssertionError`` naming the role,
the command and the container's last log lines. ``pod_container_args`` turns a Job's pod spec
(one container of it) into ``podman run`` arguments: the local kubelet's container mode
(``opcluster.PodRunner(container_image=...)``).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

IMAGE = os.environ.get("RBAK_TEST_IMAGE", "rbak:ci")
SPARK_IMAGE = os.environ.get("RBAK_TEST_SPARK_IMAGE", f"{IMAGE}-spark")
BUILD_HINT = "build it with `bash .ci/image` (as root; podman + runc)"
LOG_LINES = 40


def podman() -> str | None:
    return shutil.which("podman")


def image_problem(image: str = IMAGE) -> str | None:
    """None when ``image`` can be run here, else what is missing."""
    exe = podman()
    if exe is None:
        return f"podman is not installed; {BUILD_HINT}"
    p = subprocess.run([exe, "image", "exists", image], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return f"image {image} is not built here ({p.stderr.strip() or 'podman image exists: no'}); {BUILD_HINT}"
    return None


def tail(text: str, lines: int = LOG_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Result:
    role: str
    argv: list[str]
    returncode: int
    output: str  # stdout and stderr, interleaved as the container wrote them

    def describe(self) -> str:
        return (f"role {self.role}: `{shlex.join(self.argv)}` exited {self.returncode}; "
                f"the container's last log lines:\n{tail(self.output)}")


@dataclass
class Role:
    """One pod role in the image, as a Job's pod runs it: ``--user 1000:1000``, ``--read-only``
    with a tmpfs ``/tmp`` (an emptyDir), ``mounts`` read-only (ConfigMaps, Secrets), ``env`` (what
    secretKeyRefs give), ``writable`` paths as world-writable tmpfs (emptyDirs)."""

    role: str
    image: str = IMAGE
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, str] = field(default_factory=dict)  # container path -> host path, read-only
    writable: list[str] = field(default_factory=list)
    user: str = "1000:1000"
    name: str = field(default_factory=lambda: f"rbak-role-{uuid.uuid4().hex[:10]}")

    def argv(self, args: list[str], entrypoint: list[str] | None = None, detach: bool = False) -> list[str]:
        exe = podman()
        assert exe is not None, f"podman is not installed; {BUILD_HINT}"
        cmd = [exe, "run", "--name", self.name, "--network", "host", "--user", self.user,
               "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,mode=1777",
               "--cap-drop", "all", "--security-opt", "no-new-privileges", "--pull", "never"]
        cmd += ["--detach"] if detach else ["--rm"]
        for path in self.writable:  # an emptyDir: a world-writable directory, as a kubelet makes it
            cmd += ["--tmpfs", f"{path}:rw,mode=0777"]
        for target, source in self.mounts.items():
            cmd += ["--volume", f"{source}:{target}:ro"]
        for k, v in self.env.items():
            cmd += ["--env", f"{k}={v}"]
        if entrypoint is not None:
            cmd += ["--entrypoint", json.dumps(entrypoint)]
        return cmd + [self.image, *args]

    def run(self, args: list[str], entrypoint: list[str] | None = None, expect: int | None = 0,
            timeout: float = 600) -> Result:
        """Run to completion; ``expect`` the exit code (None: any), else an AssertionError naming it all."""
        argv = self.argv(args, entrypoint)
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            self.remove()
            raise AssertionError(Result(self.role, argv, -1, out + f"\n(timed out after {timeout}s)").describe())
        res = Result(self.role, argv, p.returncode, p.stdout)
        if expect is not None and p.returncode != expect:
            raise AssertionError(res.describe() + f"\n(expected exit {expect})")
        return res

    def start(self, args: list[str], entrypoint: list[str] | None = None) -> "Role":
        """Start detached (a Deployment's long-running pod); ``logs()``, ``alive()``, ``remove()``."""
        argv = self.argv(args, entrypoint, detach=True)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"role {self.role}: `{shlex.join(argv)}` did not start: {p.stderr}"
        self._argv = argv
        return self

    def logs(self) -> str:
        p = subprocess.run([podman() or "podman", "logs", self.name], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        return p.stdout

    def alive(self) -> bool:
        p = subprocess.run([podman() or "podman", "inspect", "--format", "{{.State.Running}}", self.name],
                           capture_output=True, text=True, timeout=60)
        return p.stdout.strip() == "true"

    def describe(self) -> str:
        """For a failing wait on a detached role: the role, the command, its last log lines."""
        return Result(self.role, getattr(self, "_argv", []), -1, self.logs()).describe()

    def remove(self) -> None:
        subprocess.run([podman() or "podman", "rm", "--force", "--time", "5", self.name],
                       capture_output=True, text=True, timeout=120)


# ---- the local kubelet's container mode --------------------------------------------------------

Lookup = Callable[[str, str], "dict[str, Any] | None"]  # (plural, name) -> the object, or None


def _secret_value(get: Lookup, ns: str, name: str, key: str) -> str:
    sec = get("secrets", name)
    if sec is None:
        raise LookupError(f'secret "{name}" not found')
    data = sec.get("data") or {}
    if key not in data:
        raise LookupError(f"couldn't find key {key} in Secret {ns}/{name}")
    return base64.b64decode(data[key]).decode()


def pod_env(get: Lookup, ns: str, container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as a kubelet resolves it: envFrom first, then env (which wins)."""
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        if "secretRef" in src:
            ref = src["secretRef"]
            sec = get("secrets", ref["name"])
            if sec is None:
                if ref.get("optional"):
                    continue
                raise LookupError(f'secret "{ref["name"]}" not found')
            env.update({prefix + k: base64.b64decode(v).decode() for k, v in (sec.get("data") or {}).items()})
        elif "configMapRef" in src:
            ref = src["configMapRef"]
            cm = get("configmaps", ref["name"])
            if cm is None:
                if ref.get("optional"):
                    continue
                raise LookupError(f'configmap "{ref["name"]}" not found')
            env.update({prefix + k: v for k, v in (cm.get("data") or {}).items()})
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
            continue
        frm = e.get("valueFrom") or {}
        if "secretKeyRef" in frm:
            ref = frm["secretKeyRef"]
            env[e["name"]] = _secret_value(get, ns, ref["name"], ref["key"])
        elif "configMapKeyRef" in frm:
            ref = frm["configMapKeyRef"]
            cm = get("configmaps", ref["name"])
            if cm is None or ref["key"] not in (cm.get("data") or {}):
                raise LookupError(f'configmap "{ref["name"]}" (key {ref["key"]}) not found')
            env[e["name"]] = cm["data"][ref["key"]]
        else:
            raise LookupError(f"env {e['name']}: valueFrom {sorted(frm)} is not supported by the local kubelet")
    return env


def pod_volumes(get: Lookup, pod_spec: dict[str, Any], workdir: Path) -> dict[str, Path]:
    """Each volume of the pod as a host directory under ``workdir``: ConfigMaps and Secrets
    written out (their files world-readable, as a kubelet's default mode 0644), emptyDirs and
    PVCs as empty directories the pod's user may write."""
    out: dict[str, Path] = {}
    for v in pod_spec.get("volumes") or []:
        d = workdir / "volumes" / v["name"]
        d.mkdir(parents=True, exist_ok=True)
        if "configMap" in v:
            cm = get("configmaps", v["configMap"]["name"])
            if cm is None:
                raise LookupError(f'configmap "{v["configMap"]["name"]}" not found')
            for k, val in (cm.get("data") or {}).items():
                (d / k).write_text(val)
                (d / k).chmod(0o644)
        elif "secret" in v:
            name = v["secret"]["secretName"]
            sec = get("secrets", name)
            if sec is None:
                raise LookupError(f'secret "{name}" not found')
            for k, val in (sec.get("data") or {}).items():
                (d / k).write_bytes(base64.b64decode(val))
                (d / k).chmod(0o644)
        elif "emptyDir" in v or "persistentVolumeClaim" in v:
            d.chmod(0o777)  # what fsGroup gives the pod's user on a cluster
        else:
            raise LookupError(f"volume {v['name']}: {sorted(k for k in v if k != 'name')} is not supported")
        d.chmod(d.stat().st_mode | 0o755)
        out[v["name"]] = d
    return out


def pod_container_args(pod_spec: dict[str, Any], container: dict[str, Any], env: dict[str, str],
                       volumes: dict[str, Path], name: str, image: str | None = None) -> list[str]:
    """``podman run`` for one container of a pod: command/args with Kubernetes' meaning (command
    replaces the image's ENTRYPOINT, args its CMD), env, volume mounts (readOnly as given),
    ``runAsUser``/``runAsGroup``/``fsGroup``, ``readOnlyRootFilesystem`` (no tmpfs added: a
    cluster gives none), dropped capabilities, ``workingDir``; host network (the brokers)."""
    exe = podman() or "podman"
    pod_sc = pod_spec.get("securityContext") or {}
    sc = {**pod_sc, **(container.get("securityContext") or {})}
    cmd = [exe, "run", "--rm", "--name", name, "--network", "host", "--pull", "never"]
    uid = sc.get("runAsUser")
    if uid is not None:
        cmd += ["--user", f"{uid}:{sc['runAsGroup']}" if sc.get("runAsGroup") is not None else str(uid)]
    if pod_sc.get("fsGroup") is not None:
        cmd += ["--group-add", str(pod_sc["fsGroup"])]
    if sc.get("readOnlyRootFilesystem"):
        cmd += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("allowPrivilegeEscalation") is False:
        cmd += ["--security-opt", "no-new-privileges"]
    for cap in (sc.get("capabilities") or {}).get("drop") or []:
        cmd += ["--cap-drop", cap.lower()]
    if container.get("workingDir"):
        cmd += ["--workdir", container["workingDir"]]
    for m in container.get("volumeMounts") or []:
        if m["name"] not in volumes:
            raise LookupError(f"volumeMount {m['name']}: no such volume in the pod")
        cmd += ["--volume", f"{volumes[m['name']]}:{m['mountPath']}:{'ro' if m.get('readOnly') else 'rw'}"]
    for k, v in env.items():
        cmd += ["--env", f"{k}={v}"]
    if container.get("command"):
        cmd += ["--entrypoint", json.dumps(list(container["command"]))]
    return cmd + [image or container["image"], *(container.get("args") or [])]


def run_as_root_check(pod_spec: dict[str, Any], container: dict[str, Any]) -> None:
    """The kubelet's runAsNonRoot check (the image's USER is numeric: 1000)."""
    sc = {**(pod_spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
    if sc.get("runAsNonRoot") and sc.get("runAsUser") == 0:
        raise LookupError("container's runAsUser breaks non-root policy")
