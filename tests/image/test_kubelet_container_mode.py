"""The local kubelet's container mode, what it makes of a pod spec (no podman needed): the env a
kubelet resolves (envFrom and secretKeyRef/configMapKeyRef), the volumes it writes out and the
``podman run`` arguments (command/args, user, read-only root, mounts). That the image really runs
such pods: tests/operator/test_operator_image_e2e.py."""

from __future__ import annotations

import base64
import json

import pytest

from support import container

NS = "ns"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


OBJECTS = {
    ("secrets", "creds"): {"data": {"username": b64("guest"), "password": b64("s3cr3t")}},
    ("secrets", "keys"): {"data": {"keyring": b64("k1: AAAA")}},
    ("configmaps", "settings"): {"data": {"LEVEL": "debug", "rbak.yaml": "mode: backup\n"}},
}


def get(plural: str, name: str):
    return OBJECTS.get((plural, name))


POD = {
    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
    "volumes": [{"name": "config", "configMap": {"name": "settings"}}, {"name": "state", "emptyDir": {}},
                {"name": "keys", "secret": {"secretName": "keys"}}],
}
CONTAINER = {
    "name": "rbak", "image": "rbak:ci", "command": ["python", "-m", "rbak"], "args": ["backup", "--json"],
    "env": [{"name": "RABBITMQ_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "LEVEL", "value": "info"},
            {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LEVEL"}}}],
    "envFrom": [{"secretRef": {"name": "creds"}, "prefix": "RMQ_"}, {"configMapRef": {"name": "settings"}}],
    "volumeMounts": [{"name": "config", "mountPath": "/etc/rbak", "readOnly": True},
                     {"name": "state", "mountPath": "/var/run/rbak"},
                     {"name": "keys", "mountPath": "/etc/rbak-keys", "readOnly": True}],
    "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]}},
}


def test_env_is_resolved_as_a_kubelet_does():
    env = container.pod_env(get, NS, CONTAINER)
    assert env == {"RMQ_username": "guest", "RMQ_password": "s3cr3t", "LEVEL": "info", "rbak.yaml": "mode: backup\n",
                   "RABBITMQ_PASSWORD": "s3cr3t", "FROM_CM": "debug"}  # env wins over envFrom


def test_a_missing_secret_or_key_is_named():
    missing = {**CONTAINER, "envFrom": [], "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]}
    with pytest.raises(LookupError, match='secret "nope" not found'):
        container.pod_env(get, NS, missing)
    nokey = {**CONTAINER, "envFrom": [], "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}}]}
    with pytest.raises(LookupError, match="couldn't find key k in Secret ns/creds"):
        container.pod_env(get, NS, nokey)


def test_volumes_and_the_podman_arguments(tmp_path):
    vols = container.pod_volumes(get, POD, tmp_path)
    assert (vols["config"] / "rbak.yaml").read_text() == "mode: backup\n"
    assert (vols["keys"] / "keyring").read_text() == "k1: AAAA"
    assert oct(vols["state"].stat().st_mode & 0o777) == "0o777" and list(vols["state"].iterdir()) == []
    env = container.pod_env(get, NS, CONTAINER)
    argv = container.pod_container_args(POD, CONTAINER, env, vols, "pod-x")
    joined = " ".join(argv)
    assert "--user 1000" in joined and "--group-add 1000" in joined
    assert "--read-only --read-only-tmpfs=false" in joined and "--tmpfs" not in argv  # no /tmp a cluster would not give
    assert "--cap-drop all" in joined and "--security-opt no-new-privileges" in joined
    assert f"{vols['config']}:/etc/rbak:ro" in argv and f"{vols['state']}:/var/run/rbak:rw" in argv
    assert f"{vols['keys']}:/etc/rbak-keys:ro" in argv
    assert "RABBITMQ_PASSWORD=s3cr3t" in argv and "--network" in argv and argv[argv.index("--network") + 1] == "host"
    # command replaces the image's ENTRYPOINT, args follow the image
    i = argv.index("--entrypoint")
    assert json.loads(argv[i + 1]) == ["python", "-m", "rbak"]
    assert argv[-3:] == ["rbak:ci", "backup", "--json"]


def test_args_only_go_through_the_image_entrypoint(tmp_path):
    c = {"name": "op", "image": "rbak:ci", "args": ["operator"]}
    argv = container.pod_container_args({}, c, {}, {}, "pod-y")
    assert "--entrypoint" not in argv and argv[-2:] == ["rbak:ci", "operator"]
    assert "--user" not in argv and "--read-only" not in argv


def test_root_is_refused_under_run_as_non_root():
    with pytest.raises(LookupError, match="non-root"):
        container.run_as_root_check({"securityContext": {"runAsNonRoot": True, "runAsUser": 0}}, {})
