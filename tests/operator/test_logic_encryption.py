"""spec.encryption: the keyring Secret reaches every run's pod as RBAK_ENCRYPTION_KEYS (a secretKeyRef,
no RBAC), the backup's config asks rbak to encrypt with keyId, S3 SSE goes into the storage section,
and the CRD schema accepts exactly that."""

from __future__ import annotations

import base64
import os

import jsonschema
import kubernetes_validate
import pytest
import yaml

from rbak.config import Config
from rbak.crypto import DEFAULT_KEYS_ENV
from rbak.errors import ConfigError
from rbak_operator import bodies, crds, rbakconfig

from support.operator_specs import CLUSTER_SPEC, K8S, OWNER, SECRET_ENV, URL_SPEC

ENC = {"keyId": "2026-11", "keysSecretRef": {"name": "rbak-keys"},
       "serverSide": {"mode": "aws:kms", "kmsKeyId": "arn:aws:kms:eu-west-1:1:key/x"}}


def test_the_env_name_is_the_one_rbak_reads():
    assert rbakconfig.ENV_KEYS == DEFAULT_KEYS_ENV


def test_encrypted_backup_config_loads_with_the_keyring_from_the_secret_env():
    spec = {**CLUSTER_SPEC, "encryption": ENC}
    cfg, env = rbakconfig.backup_config(spec, "prod", "nightly-1")
    assert ("RBAK_ENCRYPTION_KEYS", "rbak-keys", "keyring") in {(e.env, e.secret, e.key) for e in env}
    text = yaml.safe_dump(cfg)
    assert "2026-11" in text and "keyring" not in text  # the key id, never a key
    key = base64.b64encode(os.urandom(32)).decode()
    loaded = Config.from_dict(cfg, env=SECRET_ENV)
    assert loaded.encryption.enabled and loaded.encryption.key_id == "2026-11"
    assert (loaded.storage.sse, loaded.storage.sse_kms_key_id) == ("aws:kms", "arn:aws:kms:eu-west-1:1:key/x")
    from rbak.crypto import load_keyring

    assert load_keyring(loaded.encryption.keys_file, loaded.encryption.keys_env, loaded.encryption.key_id,
                        environ={"RBAK_ENCRYPTION_KEYS": f"2026-11: {key}"}) == {"2026-11": base64.b64decode(key)}
    job = bodies.job_body(name="nightly-1", namespace="prod", owner=OWNER, spec=spec, storage=spec["storage"],
                          secret_env=env, args=bodies.backup_args(), labels=bodies.backup_run_labels("nightly", "manual"),
                          validate_args=bodies.validate_args("s3://b", "nightly-1", True))
    kubernetes_validate.validate(job, K8S, strict=True)
    pod = job["spec"]["template"]["spec"]
    for c in pod["initContainers"] + pod["containers"]:  # backup and its validation both get the keys
        assert {"name": "RBAK_ENCRYPTION_KEYS",
                "valueFrom": {"secretKeyRef": {"name": "rbak-keys", "key": "keyring"}}} in c["env"]


def test_plain_backups_get_no_encryption_and_sse_alone_only_asks_s3():
    cfg, env = rbakconfig.backup_config(CLUSTER_SPEC, "prod", "b")
    assert "encryption" not in cfg and all(e.env != "RBAK_ENCRYPTION_KEYS" for e in env)
    cfg, env = rbakconfig.backup_config({**CLUSTER_SPEC, "encryption": {"serverSide": {"mode": "AES256"}}}, "prod", "b")
    assert "encryption" not in cfg and cfg["storage"]["sse"] == "AES256"


@pytest.mark.parametrize("enc, match", [
    ({"keyId": "k"}, "keyId and keysSecretRef go together"),
    ({"keysSecretRef": {"name": "s"}}, "keyId and keysSecretRef go together"),
    ({"keyId": "k", "keysSecretRef": {}}, r"spec.encryption.keysSecretRef.name: required"),
    ({"serverSide": {"mode": "AES256", "kmsKeyId": "x"}}, "kmsKeyId: only with mode aws:kms"),
])
def test_bad_encryption_specs_name_the_field(enc, match):
    with pytest.raises(ConfigError, match=match):
        rbakconfig.backup_config({**CLUSTER_SPEC, "encryption": enc}, "prod", "b")


def test_sse_needs_s3_storage():
    with pytest.raises(ConfigError, match="serverSide: only for spec.storage.s3"):
        rbakconfig.backup_config({**URL_SPEC, "encryption": {"serverSide": {"mode": "AES256"}}}, "prod", "b")


def test_restore_config_carries_the_keys_env():
    spec = {"encryption": {"keysSecretRef": {"name": "old-keys", "key": "ring"}}}
    cfg, env = rbakconfig.restore_config(spec, "prod", "b-1", CLUSTER_SPEC["broker"], CLUSTER_SPEC["storage"])
    assert ("RBAK_ENCRYPTION_KEYS", "old-keys", "ring") in {(e.env, e.secret, e.key) for e in env}
    assert "encryption" not in cfg  # restores only need the keys


def _spec_schema(crd):
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_crd_schemas_accept_the_encryption_fields():
    backup = _spec_schema(crds.backup_crd())
    jsonschema.validate({**CLUSTER_SPEC, "encryption": ENC}, backup)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**CLUSTER_SPEC, "encryption": {"serverSide": {"mode": "DES"}}}, backup)
    restore = _spec_schema(crds.restore_crd())
    jsonschema.validate({"backupRef": {"name": "x"}, "encryption": {"keysSecretRef": {"name": "k"}}}, restore)
    assert "keyId" not in restore["properties"]["encryption"]["properties"]


def test_object_lock_reaches_the_storage_section_and_the_crd():
    spec = {**CLUSTER_SPEC, "objectLock": {"mode": "COMPLIANCE", "retainDays": 30}}
    cfg, _ = rbakconfig.backup_config(spec, "prod", "b-1")
    loaded = Config.from_dict(cfg, env=SECRET_ENV)
    assert (loaded.storage.object_lock_mode, loaded.storage.object_lock_retain_days) == ("COMPLIANCE", 30)
    assert loaded.storage.open().write_once
    with pytest.raises(ConfigError, match="spec.objectLock: only for spec.storage.s3"):
        rbakconfig.backup_config({**URL_SPEC, "objectLock": {"mode": "GOVERNANCE", "retainDays": 1}}, "prod", "b")
    schema = _spec_schema(crds.backup_crd())
    jsonschema.validate(spec, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**CLUSTER_SPEC, "objectLock": {"mode": "FOREVER", "retainDays": 1}}, schema)


def test_spark_executors_get_the_keyring_too():
    """Executors open the segments (rbak_spark.datasource reads RBAK_ENCRYPTION_KEYS on each executor), so the
    keyring Secret must reach the executor pods of the SparkApplication, not only the driver."""
    spec = {"encryption": {"keysSecretRef": {"name": "old-keys", "key": "ring"}}}
    _cfg, env = rbakconfig.restore_config(spec, "prod", "b-1", CLUSTER_SPEC["broker"], CLUSTER_SPEC["storage"])
    app = bodies.spark_application_body(
        name="r-restore", namespace="prod", owner=OWNER, spark={}, script="restore.py",
        arguments=["--path", "s3://b", "--backup-id", "b-1"], secret_env=env, config_name="r-restore",
        labels=bodies.restore_labels("r"))
    for role in ("driver", "executor"):
        refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in app["spec"][role]["env"]}
        assert refs.get(DEFAULT_KEYS_ENV) == {"name": "old-keys", "key": "ring"}, role


def test_envelope_and_kms_reach_the_backup_config_and_the_crd():
    enc = {"keyId": "2026-11", "keysSecretRef": {"name": "rbak-keys"}, "envelope": True,
           "kms": {"keyId": "arn:aws:kms:eu-west-1:1:key/x", "endpointUrl": "https://kms.internal"}}
    spec = {**CLUSTER_SPEC, "encryption": enc}
    cfg, env = rbakconfig.backup_config(spec, "prod", "b-1")
    loaded = Config.from_dict(cfg, env=SECRET_ENV)
    e = loaded.encryption
    assert (e.enabled, e.envelope, e.key_id, e.kms_key_id, e.kms_endpoint_url, e.kms_region) == (
        True, True, "2026-11", "arn:aws:kms:eu-west-1:1:key/x", "https://kms.internal", None)
    jsonschema.validate(spec, _spec_schema(crds.backup_crd()))
    # KMS alone wraps the data key: no keyring Secret needed
    kms_only = {**CLUSTER_SPEC, "encryption": {"envelope": True, "kms": {"keyId": "alias/rbak"}}}
    cfg, env = rbakconfig.backup_config(kms_only, "prod", "b-2")
    e = Config.from_dict(cfg, env=SECRET_ENV).encryption
    assert (e.enabled, e.envelope, e.key_id, e.kms_key_id) == (True, True, None, "alias/rbak")
    assert all(x.env != "RBAK_ENCRYPTION_KEYS" for x in env)
    with pytest.raises(ConfigError, match="spec.encryption.kms: a KMS key only wraps data keys: set "
                                          "spec.encryption.envelope: true"):
        rbakconfig.backup_config({**CLUSTER_SPEC, "encryption": {"kms": {"keyId": "alias/rbak"}}}, "prod", "b")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**CLUSTER_SPEC, "encryption": {"envelope": True, "kms": {"endpointUrl": "x"}}},
                            _spec_schema(crds.backup_crd()))
