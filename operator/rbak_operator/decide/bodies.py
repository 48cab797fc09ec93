"""Kubernetes objects the operator creates: ConfigMap, Job, SparkApplication.

Pure builders: given the owner and the decided run, return the dict to POST.
Every object is owner-referenced to its custom resource (so ``kubectl delete``
of the CR garbage-collects its Jobs), labelled for listing, and carries no
credential: pods get them from ``secretKeyRef`` env vars.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import yaml

from rbak_operator.crds.schema import BACKUP_PLURAL, GROUP, SPARK_GROUP, SPARK_VERSION, VERSION
from rbak_operator.decide import naming
from rbak_operator.decide.progress import INTERVAL, INTERVAL_ENV, RUN_ID_ENV
from rbak_operator.decide.rbakconfig import CONFIG_DIR, CONFIG_FILE, ENV_STATE, PVC_MOUNT, STATE_DIR, PodEnv, ValueEnv

DEFAULT_IMAGE = os.environ.get("RBAK_IMAGE", "ghcr.io/rbak/rbak:0.1.0")
# Spark pods need pyspark and a JRE: the image's "-spark" variant (see Dockerfile).
DEFAULT_SPARK_IMAGE = os.environ.get("RBAK_SPARK_IMAGE") or f"{DEFAULT_IMAGE}-spark"
SPARK_FILES = "/opt/rbak/spark"

L_NAME = "app.kubernetes.io/name"
L_MANAGED = "app.kubernetes.io/managed-by"
L_COMPONENT = "app.kubernetes.io/component"
L_BACKUP = "rbak.io/backup"
L_RESTORE = "rbak.io/restore"
L_TRIGGER = "rbak.io/trigger"
L_VALIDATES = "rbak.io/validates"
L_DRILLS = "rbak.io/drills"  # a restore drill Job of this RabbitMQBackup (never L_BACKUP: not a backup run)
A_BACKUP_ID = "rbak.io/backup-id"
A_SLOT = "rbak.io/scheduled-time"
A_TRIGGER_VALUE = "rbak.io/trigger-value"


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": owner.get("apiVersion") or f"{GROUP}/{VERSION}",
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def common_labels(component: str) -> dict[str, str]:
    return {L_NAME: "rbak", L_MANAGED: "rbak-operator", L_COMPONENT: component}


def backup_run_labels(backup_name: str, trigger: str) -> dict[str, str]:
    return {**common_labels("backup"), L_BACKUP: naming.label_value(backup_name), L_TRIGGER: trigger}


def restore_labels(restore_name: str) -> dict[str, str]:
    return {**common_labels("restore"), L_RESTORE: naming.label_value(restore_name)}


def configmap_body(name: str, namespace: str, owner: dict[str, Any], config: dict[str, Any],
                   labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                     "ownerReferences": [owner_reference(owner)]},
        "data": {CONFIG_FILE: yaml.safe_dump(config, sort_keys=False)},
    }


def env_var(e: PodEnv) -> dict[str, Any]:
    """A container env entry: a plain value, or a ``secretKeyRef`` (the credential stays in its Secret)."""
    if isinstance(e, ValueEnv):
        return {"name": e.env, "value": e.value}
    return {"name": e.env, "valueFrom": {"secretKeyRef": {"name": e.secret, "key": e.key}}}


TERMINATION_LOG = "/dev/termination-log"  # the containers' terminationMessagePath (Kubernetes' default)


def _env(secret_env: list[PodEnv]) -> list[dict[str, Any]]:
    env = [env_var(s) for s in secret_env]
    env.append({"name": ENV_STATE, "value": STATE_DIR})
    # a restore writes what it published and confirmed there: the pod's status keeps it for the operator
    env.append({"name": "RBAK_RESULT_FILE", "value": TERMINATION_LOG})
    return env


def _container(name: str, spec: dict[str, Any], args: list[str], env: list[dict[str, Any]],
               mounts: list[dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": spec.get("image") or DEFAULT_IMAGE,
        "command": ["python", "-m", "rbak"],
        "args": args,
        "env": env,
        "volumeMounts": mounts,
        # The last lines of output become the pod's termination message, so a
        # failed run's status names the cause (the CLI prints one error line).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if spec.get("imagePullPolicy"):
        c["imagePullPolicy"] = spec["imagePullPolicy"]
    if spec.get("resources"):
        c["resources"] = spec["resources"]
    return c


def _volumes(config_name: str | None, storage: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes; ``config_name`` None: no rbak config (a command run from flags alone)."""
    vols: list[dict[str, Any]] = [{"name": "state", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "state", "mountPath": STATE_DIR}]
    if config_name is not None:
        vols.insert(0, {"name": "config", "configMap": {"name": config_name}})
        mounts.insert(0, {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
    pvc = (storage or {}).get("pvc")
    if pvc:
        vols.append({"name": "backups", "persistentVolumeClaim": {"claimName": pvc["claimName"]}})
        mounts.append({"name": "backups", "mountPath": PVC_MOUNT})
    return vols, mounts


@dataclass(frozen=True)
class JobRun:
    """What a run's Job is made of: its identity and owner, the pod's settings, the container's command.

    ``validate_args``: the run is an init container and validation the main one. ``progress_id``: the run
    stores progress records under that id in the storage (``RBAK_PROGRESS_ID``), which the operator shows
    in the status while the Job runs. ``with_config=False`` (a validation Job, whose command takes flags
    only) mounts no ConfigMap, so it cannot hang on a run's ConfigMap that the Job history limit already
    deleted."""

    name: str
    namespace: str
    owner: dict[str, Any]
    spec: dict[str, Any]  # the object's spec: pod overrides (resources, serviceAccountName, deadline, ...)
    storage: dict[str, Any]
    secret_env: list[PodEnv]
    args: list[str]
    labels: dict[str, str]
    annotations: dict[str, str] | None = None
    validate_args: list[str] | None = None
    config_name: str | None = None
    with_config: bool = True
    progress_id: str | None = None


def job_body(run: JobRun) -> dict[str, Any]:
    """A run's Job (see ``JobRun``)."""
    name, namespace, owner, spec, storage = run.name, run.namespace, run.owner, run.spec, run.storage
    secret_env, args, labels, annotations = run.secret_env, run.args, run.labels, run.annotations
    validate_args, config_name, with_config, progress_id = run.validate_args, run.config_name, run.with_config, run.progress_id
    vols, mounts = _volumes((config_name or name) if with_config else None, storage)
    env = _env(secret_env)
    run_env = env + progress_env(progress_id) if progress_id else env
    main = _container("rbak", spec, args, run_env, mounts)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
        "volumes": vols,
    }
    if validate_args:
        pod_spec["initContainers"] = [main]
        pod_spec["containers"] = [_container("validate", spec, validate_args, env, mounts)]
    else:
        pod_spec["containers"] = [main]
    if spec.get("serviceAccountName"):
        pod_spec["serviceAccountName"] = spec["serviceAccountName"]
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,  # a failed run is reported, not silently retried; the next slot runs again
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
    }
    if spec.get("activeDeadlineSeconds"):
        job_spec["activeDeadlineSeconds"] = int(spec["activeDeadlineSeconds"])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": dict(annotations or {}),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": job_spec,
    }


def progress_env(run_id: str) -> list[dict[str, Any]]:
    return [{"name": RUN_ID_ENV, "value": run_id}, {"name": INTERVAL_ENV, "value": f"{INTERVAL:g}"}]


def backup_args(config_path: str = f"{CONFIG_DIR}/{CONFIG_FILE}") -> list[str]:
    return ["backup", "--config", config_path, "--json"]


def validate_args(storage_url: str, backup_id: str, deep: bool, prefix: str = "") -> list[str]:
    return ["validate", "--path", storage_url, "--backup-id", backup_id, *(["--prefix", prefix] if prefix else []),
            *(["--deep"] if deep else []), "--write-report"]


def restore_args(config_path: str = f"{CONFIG_DIR}/{CONFIG_FILE}") -> list[str]:
    return ["restore", "--config", config_path, "--json"]


def spark_application_body(*, name: str, namespace: str, owner: dict[str, Any], spark: dict[str, Any],
                           script: str, arguments: list[str], secret_env: list[PodEnv], config_name: str | None,
                           labels: dict[str, str]) -> dict[str, Any]:
    """A SparkApplication running ``spark/<script>`` (restore.py or validate.py)."""
    env = [env_var(s) for s in secret_env]  # driver and executors alike: executors unwrap data keys too
    env.append({"name": ENV_STATE, "value": "/tmp"})
    vols: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if config_name:
        vols.append({"name": "config", "configMap": {"name": config_name}})
        mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
    pod = {"labels": dict(labels), "env": env, "volumeMounts": mounts}
    body: dict[str, Any] = {
        "apiVersion": f"{SPARK_GROUP}/{SPARK_VERSION}",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                     "ownerReferences": [owner_reference(owner)]},
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": spark.get("image") or DEFAULT_SPARK_IMAGE,
            "sparkVersion": spark.get("sparkVersion") or "4.0.0",
            "mainApplicationFile": f"local://{SPARK_FILES}/{script}",
            "arguments": list(arguments),
            "restartPolicy": {"type": "Never"},
            "timeToLiveSeconds": 86400,
            "volumes": vols,
            "driver": {"cores": 1, "memory": spark.get("driverMemory") or "1g", **pod,
                       **({"serviceAccount": spark["serviceAccount"]} if spark.get("serviceAccount") else {})},
            "executor": {
                "instances": int(spark.get("executorInstances") or 2),
                "cores": int(spark.get("executorCores") or 1),
                "memory": spark.get("executorMemory") or "1g",
                **pod,
            },
        },
    }
    return body


def backup_owner_api() -> tuple[str, str, str]:
    return GROUP, VERSION, BACKUP_PLURAL
