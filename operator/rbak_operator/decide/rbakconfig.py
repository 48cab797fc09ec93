"""The ``rbak`` YAML config a run's pod reads, built from a custom resource.

Credentials never enter this file (it goes into a ConfigMap): it holds
``${RBAK_*}`` references that ``rbak.config`` interpolates from the pod's
environment, which Kubernetes fills from the referenced Secrets. S3 keys
reach boto3 the same way (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from rbak.errors import ConfigError
from rbak.format.layout import normalize_prefix

ENV_USER = "RBAK_BROKER_USERNAME"
ENV_PASS = "RBAK_BROKER_PASSWORD"
ENV_HOST = "RBAK_BROKER_HOST"
ENV_PORT = "RBAK_BROKER_PORT"
ENV_STATE = "RBAK_STATE_DIR"
STATE_DIR = "/var/run/rbak"
PVC_MOUNT = "/var/lib/rbak"
CONFIG_DIR = "/etc/rbak"
CONFIG_FILE = "config.yaml"
ENV_KEYS = "RBAK_ENCRYPTION_KEYS"  # rbak.sealing.crypto.DEFAULT_KEYS_ENV: read by every rbak command
KEYRING_KEY = "keyring"
# boto3's per-service endpoint, read by every KMS client a pod makes: also the commands run from flags
# alone (a validation Job or init container, Spark executors unwrapping a data key), which have no config
ENV_KMS_ENDPOINT = "AWS_ENDPOINT_URL_KMS"


@dataclass(frozen=True, slots=True)
class SecretEnv:
    """One env var filled from a Secret key (becomes a pod ``secretKeyRef``)."""

    env: str
    secret: str
    key: str


@dataclass(frozen=True, slots=True)
class ValueEnv:
    """One env var with a plain value (no credential: a URL or a setting)."""

    env: str
    value: str


PodEnv = SecretEnv | ValueEnv


@dataclass(frozen=True, slots=True)
class ResolvedBroker:
    """What the operator looked up for a ``rabbitmqClusterReference`` (the pure input of
    ``broker_connection``): the RabbitmqCluster's ``status`` (None: no such object, or no
    status yet), or the ``uri`` of a messaging-topology-operator ``connectionSecret``."""

    cluster_status: dict[str, Any] | None = None
    connection_uri: str | None = None


def default_user_secret(name: str, status: dict[str, Any] | None) -> tuple[str, dict[str, str]]:
    """(Secret name, its key names) of a RabbitmqCluster's default user, as the cluster operator
    publishes them: ``status.defaultUser.secretReference`` (name and ``keys``), falling back to
    ``<name>-default-user`` with keys username/password/host/port only when the status has none."""
    keys = {"username": "username", "password": "password", "host": "host", "port": "port"}
    ref = ((status or {}).get("defaultUser") or {}).get("secretReference") or {}
    if not ref.get("name"):
        return f"{name}-default-user", keys
    keys.update({k: v for k, v in (ref.get("keys") or {}).items() if k in keys and v})
    return ref["name"], keys


def management_endpoint(uri: str, field: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a connectionSecret's ``uri`` (the management API; ``http://`` when
    it has no scheme, as the messaging-topology-operator reads it)."""
    if "://" not in uri:
        uri = "http://" + uri
    parts = urlsplit(uri.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{field}: uri {uri!r} must be the management API URL, e.g. https://rabbit.ns.svc:15671")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ConfigError(f"{field}: uri {uri!r} has an invalid port") from None
    return parts.scheme, parts.hostname, port


def _cluster_reference(ref: dict[str, Any], namespace: str, field: str,
                       resolved: ResolvedBroker | None, vhost_path: str = "/%2f") -> tuple[dict[str, Any], list[SecretEnv]]:
    name: str = ref.get("name") or ""
    cs: str = (ref.get("connectionSecret") or {}).get("name") or ""
    if bool(name) == bool(cs):
        raise ConfigError(f"{field}.rabbitmqClusterReference: set exactly one of name or connectionSecret.name")
    ns = ref.get("namespace") or namespace
    if ns != namespace:
        # A pod can only read Secrets of its own namespace.
        raise ConfigError(
            f"{field}.rabbitmqClusterReference.namespace: {ns!r} differs from this object's namespace "
            f"{namespace!r}; the run's pod can only read the cluster's Secret in its own namespace"
        )
    auth = {"management_username": f"${{{ENV_USER}}}", "management_password": f"${{{ENV_PASS}}}"}
    if cs:
        uri = resolved.connection_uri if resolved is not None else None
        if not uri:
            raise ConfigError(f"{field}.rabbitmqClusterReference.connectionSecret: Secret {cs!r} has no uri")
        scheme, host, mport = management_endpoint(uri, f"{field}.rabbitmqClusterReference.connectionSecret")
        aport = int(ref.get("amqpPort") or 5672)
        conn = {"amqp_url": f"amqp://{host}:{aport}{vhost_path}", "management_url": f"{scheme}://{host}:{mport}", **auth}
        return conn, [SecretEnv(ENV_USER, cs, "username"), SecretEnv(ENV_PASS, cs, "password")]
    secret, keys = default_user_secret(name, resolved.cluster_status if resolved is not None else None)
    scheme = ref.get("managementScheme") or "http"
    mport = int(ref.get("managementPort") or 15672)
    conn = {
        # No credentials in the URL: rbak takes them from management_* (any character works).
        "amqp_url": f"amqp://${{{ENV_HOST}}}:${{{ENV_PORT}}}{vhost_path}",
        "management_url": f"{scheme}://${{{ENV_HOST}}}:{mport}",
        **auth,
    }
    env = [SecretEnv(ENV_USER, secret, keys["username"]), SecretEnv(ENV_PASS, secret, keys["password"]),
           SecretEnv(ENV_HOST, secret, keys["host"]), SecretEnv(ENV_PORT, secret, keys["port"])]
    return conn, env


def broker_connection(broker: dict[str, Any] | None, namespace: str, field: str = "spec.broker",
                      resolved: ResolvedBroker | None = None,
                      vhost_path: str = "/%2f") -> tuple[dict[str, Any], list[SecretEnv]]:
    """The ``source``/``target`` section and the Secret-backed env it needs. ``vhost_path``: the URL path
    when the spec names no vhost (a restore target passes ``""``: a URL's vhost is where a restore goes,
    so one the user did not name must not be added)."""
    if not isinstance(broker, dict):
        raise ConfigError(f"{field}: required")
    ref = broker.get("rabbitmqClusterReference")
    port = broker.get("streamPort")
    stream = {} if port is None else {"stream_port": int(port)}  # absent: rbak's default, 5552
    if ref:
        conn, env = _cluster_reference(ref, namespace, field, resolved, vhost_path)
        return {**conn, **stream}, env
    url = broker.get("amqpUrl")
    creds = broker.get("credentialsSecretRef") or {}
    if not url:
        raise ConfigError(f"{field}: set rabbitmqClusterReference or amqpUrl")
    if not broker.get("managementUrl"):
        raise ConfigError(f"{field}.managementUrl: required with amqpUrl")
    if not creds.get("name"):
        raise ConfigError(f"{field}.credentialsSecretRef.name: required with amqpUrl")
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise ConfigError(f"{field}.amqpUrl: {url!r} must be amqp://host[:port]/vhost or amqps://...")
    if "@" in parts.netloc:
        raise ConfigError(f"{field}.amqpUrl: must not contain credentials (use credentialsSecretRef)")
    path = parts.path if parts.path not in ("", "/") else vhost_path
    conn = {
        "amqp_url": f"{parts.scheme}://{parts.netloc}{path}",
        "management_url": broker["managementUrl"],
        "management_username": f"${{{ENV_USER}}}",
        "management_password": f"${{{ENV_PASS}}}",
        **stream,
    }
    env = [SecretEnv(ENV_USER, creds["name"], creds.get("usernameKey") or "username"),
           SecretEnv(ENV_PASS, creds["name"], creds.get("passwordKey") or "password")]
    return conn, env


def storage_section(storage: dict[str, Any] | None, field: str = "spec.storage") -> tuple[dict[str, Any], list[SecretEnv]]:
    if not isinstance(storage, dict):
        raise ConfigError(f"{field}: required")
    s3: dict[str, Any] = storage.get("s3") or {}
    pvc: dict[str, Any] = storage.get("pvc") or {}
    if bool(s3) == bool(pvc):
        raise ConfigError(f"{field}: set exactly one of s3 or pvc")
    if s3:
        if not s3.get("bucket"):
            raise ConfigError(f"{field}.s3.bucket: required")
        sec: dict[str, Any] = {"backend": "s3", "bucket": s3["bucket"], "region": s3.get("region") or "us-east-1"}
        if s3.get("prefix"):
            sec["prefix"] = s3["prefix"]
        if s3.get("endpoint"):
            sec["endpoint"] = s3["endpoint"]
        if s3.get("pathStyle"):
            sec["path_style"] = True
        env: list[SecretEnv] = []
        ref = s3.get("credentialsSecretRef")
        if ref:
            env = [SecretEnv("AWS_ACCESS_KEY_ID", ref["name"], ref.get("accessKeyIdKey") or "AWS_ACCESS_KEY_ID"),
                   SecretEnv("AWS_SECRET_ACCESS_KEY", ref["name"], ref.get("secretAccessKeyKey") or "AWS_SECRET_ACCESS_KEY")]
        return sec, env
    if not pvc.get("claimName"):
        raise ConfigError(f"{field}.pvc.claimName: required")
    sub = (pvc.get("path") or "backups").strip("/")
    return {"backend": "filesystem", "path": f"{PVC_MOUNT}/{sub}" if sub else PVC_MOUNT}, []


def storage_prefix(storage: dict[str, Any] | None) -> str:
    """The key prefix backups live under (rbak keys carry it: ``{prefix}/{backup_id}/...``)."""
    return normalize_prefix(((storage or {}).get("s3") or {}).get("prefix") or "")


def storage_url(storage: dict[str, Any]) -> str:
    """The storage root as an rbak storage URL (as the pod sees it), for CLI args.

    The prefix is not part of it: manifests record keys relative to the bucket
    root, prefix included, so tools get it separately (``--prefix``)."""
    sec, _ = storage_section(storage)
    if sec["backend"] == "filesystem":
        return "file://" + sec["path"]
    q = [f"region={quote(sec['region'])}"]
    if sec.get("endpoint"):
        q.append(f"endpoint={quote(sec['endpoint'], safe='')}")
    if sec.get("path_style"):
        q.append("path_style=true")
    return f"s3://{sec['bucket']}?{'&'.join(q)}"


def encryption_env(enc: dict[str, Any] | None, field: str = "spec.encryption") -> list[SecretEnv]:
    """The keyring Secret as ``RBAK_ENCRYPTION_KEYS`` (no RBAC: the kubelet fills it); none without keys."""
    ref = (enc or {}).get("keysSecretRef")
    if ref is None:
        return []
    if not ref.get("name"):
        raise ConfigError(f"{field}.keysSecretRef.name: required")
    return [SecretEnv(ENV_KEYS, ref["name"], ref.get("key") or KEYRING_KEY)]


def kms_access(enc: dict[str, Any] | None) -> tuple[dict[str, str], list[PodEnv]]:
    """How a pod reaches the KMS of ``encryption.kms``: ``kms_region``/``kms_endpoint_url`` for a run's
    config, and ``AWS_ENDPOINT_URL_KMS`` for every container (validation and Spark executors read no
    config). Readers need no key id: each wrap object names its key and region."""
    kms = (enc or {}).get("kms") or {}
    cfg = {dst: kms[src] for src, dst in (("region", "kms_region"), ("endpointUrl", "kms_endpoint_url"))
           if kms.get(src)}
    env: list[PodEnv] = [ValueEnv(ENV_KMS_ENDPOINT, kms["endpointUrl"])] if kms.get("endpointUrl") else []
    return cfg, env


def backup_encryption(spec: dict[str, Any], storage: dict[str, Any]) -> tuple[dict[str, Any] | None, list[PodEnv]]:
    """The ``encryption`` section of a backup's config (None: not encrypted) and its env; S3 SSE goes
    into ``storage`` (which must be S3)."""
    enc = spec.get("encryption") or {}
    sse = enc.get("serverSide") or {}
    if sse:
        if storage.get("backend") != "s3":
            raise ConfigError("spec.encryption.serverSide: only for spec.storage.s3")
        storage["sse"] = sse.get("mode")
        if sse.get("kmsKeyId"):
            if sse.get("mode") != "aws:kms":
                raise ConfigError("spec.encryption.serverSide.kmsKeyId: only with mode aws:kms")
            storage["sse_kms_key_id"] = sse["kmsKeyId"]
    env: list[PodEnv] = list(encryption_env(enc))
    if bool(enc.get("keyId")) != bool(env) and not (enc.get("kms") and env):
        raise ConfigError("spec.encryption: keyId and keysSecretRef go together (one is missing)")
    kms = enc.get("kms") or {}
    if kms and not enc.get("envelope"):
        raise ConfigError("spec.encryption.kms: a KMS key only wraps data keys: set spec.encryption.envelope: true")
    if kms and not kms.get("keyId"):
        raise ConfigError("spec.encryption.kms.keyId: required")
    if not enc.get("keyId") and not kms:
        if enc.get("envelope"):  # never a silent plaintext backup
            raise ConfigError("spec.encryption.envelope: needs keyId (with keysSecretRef) or kms.keyId to wrap the "
                              "data keys; without one the backups would be stored in plaintext")
        return None, env
    out: dict[str, Any] = {"enabled": True}
    if enc.get("keyId"):
        out["key_id"] = enc["keyId"]
    if enc.get("envelope"):
        out["envelope"] = True
    if kms.get("keyId"):
        out["kms_key_id"] = kms["keyId"]
    kcfg, kenv = kms_access(enc)
    out.update(kcfg)
    return out, env + kenv


def url_vhost(broker: dict[str, Any] | None) -> str | None:
    """The vhost ``spec.broker.amqpUrl`` names (``amqp://host/%2f`` names ``/``), None when it names none."""
    url = (broker or {}).get("amqpUrl") if not (broker or {}).get("rabbitmqClusterReference") else None
    path = urlsplit(url).path if url else ""
    return unquote(path[1:]) if len(path) > 1 else None


def backup_vhosts(spec: Mapping[str, Any]) -> list[str]:
    """The vhosts a backup reads: ``spec.queues.vhosts``, else the vhost of ``spec.broker.amqpUrl``; empty:
    every vhost the credentials can see."""
    chosen = list((spec.get("queues") or {}).get("vhosts") or [])
    if chosen:
        return chosen
    v = url_vhost(spec.get("broker"))
    return [v] if v is not None else []


def queue_selection(sel: dict[str, Any] | None) -> dict[str, Any]:
    """The spec's queue selection as rbak's config keys (``queues:`` of the YAML)."""
    out: dict[str, Any] = {}
    sel = sel or {}
    for k in ("include", "exclude", "vhosts", "types"):
        if sel.get(k):
            out[k] = list(sel[k])
    if sel.get("minMessages") is not None:
        out["min_messages"] = int(sel["minMessages"])
    return out


def backup_config(spec: dict[str, Any], namespace: str, backup_id: str,
                  resolved: ResolvedBroker | None = None,
                  owner: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[PodEnv]]:
    """Config for ``rbak backup`` of one run, and the Secret env the pod needs. ``owner``: the
    RabbitMQBackup's metadata, recorded in the manifest (``backup.owner``)."""
    source, env1 = broker_connection(spec.get("broker"), namespace, "spec.broker", resolved)
    queues = queue_selection(spec.get("queues"))
    if backup_vhosts(spec):  # the URL's vhost scopes the backup when spec.queues.vhosts is absent
        queues["vhosts"] = backup_vhosts(spec)
    if queues:
        source["queues"] = queues
    storage, env2 = storage_section(spec.get("storage"))
    backup: dict[str, Any] = {
        "compression": spec.get("compression") or "zstd",
        "compression_level": int(spec.get("compressionLevel") or 3),
        "include_definitions": bool(spec.get("includeDefinitions", True)),
    }
    if spec.get("segmentMaxBytes"):
        backup["segment_max_bytes"] = int(spec["segmentMaxBytes"])
    if spec.get("segmentMaxIntervalMs"):
        backup["segment_max_interval_ms"] = int(spec["segmentMaxIntervalMs"])
    if owner is not None:
        backup["owner"] = {"namespace": namespace, "name": owner["name"],
                           **({"uid": owner["uid"]} if owner.get("uid") else {})}
    encryption, env3 = backup_encryption(spec, storage)
    lock = spec.get("objectLock") or {}
    if lock:
        if storage.get("backend") != "s3":
            raise ConfigError("spec.objectLock: only for spec.storage.s3")
        storage["object_lock_mode"] = lock.get("mode")
        storage["object_lock_retain_days"] = lock.get("retainDays")
    cfg = {
        "mode": "backup",
        "backup_id": backup_id,
        "source": source,
        "storage": storage,
        "backup": backup,
        "offset_storage": {"path": f"${{{ENV_STATE}}}/offsets.db"},
    }
    if encryption:
        cfg["encryption"] = encryption
    return cfg, _dedupe([*env1, *env2, *env3])


def restore_config(spec: dict[str, Any], namespace: str, backup_id: str, target: dict[str, Any],
                   storage: dict[str, Any], resolved: ResolvedBroker | None = None) -> tuple[dict[str, Any], list[PodEnv]]:
    """Config for ``rbak restore``; ``target``/``storage`` already resolved from a backupRef."""
    tgt, env1 = broker_connection(target, namespace, "spec.target", resolved, vhost_path="")
    st, env2 = storage_section(storage)
    restore: dict[str, Any] = {
        "restore_definitions": bool(spec.get("restoreDefinitions", False)),
        "overwrite_users": bool(spec.get("overwriteUsers", False)),
        "definitions_strict": bool(spec.get("definitionsStrict", False)),
        "transient_queues": spec.get("transientQueues") or "durable",
        "dry_run": bool(spec.get("dryRun", False)),
        "checkpoint_state": f"${{{ENV_STATE}}}/restore-checkpoint.db",
    }
    if spec.get("allowLossyTarget"):
        restore["allow_lossy_target"] = True
    pitr = spec.get("pitr") or {}
    if pitr.get("start") is not None:
        restore["time_window_start"] = pitr["start"]
    if pitr.get("end") is not None:
        restore["time_window_end"] = pitr["end"]
    if spec.get("vhostMapping"):
        restore["vhost_mapping"] = dict(spec["vhostMapping"])
    if spec.get("queueMapping"):
        restore["queue_mapping"] = dict(spec["queueMapping"])
    q = queue_selection(spec.get("queues"))
    if q:
        restore["queues"] = q
    cfg = {
        "mode": "restore",
        "backup_id": backup_id,
        "target": tgt,
        "storage": st,
        "restore": restore,
        "offset_storage": {"path": f"${{{ENV_STATE}}}/offsets.db"},
    }
    kcfg, kenv = kms_access(spec.get("encryption"))
    if kcfg:  # reading only: no `enabled`, the manifest says how the backup is encrypted
        cfg["encryption"] = kcfg
    return cfg, _dedupe([*env1, *env2, *encryption_env(spec.get("encryption")), *kenv])


def validation_env(spec: dict[str, Any]) -> list[PodEnv]:
    """Env of a validation run after the backup (a command from flags alone): the storage credentials,
    and for a deep validation of an encrypted backup the keyring and the KMS endpoint of its data key."""
    _, env = storage_section(spec.get("storage"))
    return _dedupe([*env, *encryption_env(spec.get("encryption")), *kms_access(spec.get("encryption"))[1]])


def _dedupe(envs: list[PodEnv]) -> list[PodEnv]:
    seen: dict[str, PodEnv] = {}
    for e in envs:
        seen.setdefault(e.env, e)
    return list(seen.values())
