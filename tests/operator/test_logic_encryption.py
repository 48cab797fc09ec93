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
from rbak.sealing.crypto import DEFAULT_KEYS_ENV
from rbak.errors import ConfigError
from rbak_operator.decide import bodies, rbakconfig
from rbak_operator.crds import schema as crds

from support.operator_specs import CLUSTER_SPEC, K8S, OWNER, SECRET_ENV, SLOT, URL_SPEC

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
    from rbak.sealing.crypto import load_keyring

    assert load_keyring(loaded.encryption.keys_file, loaded.encryption.keys_env, loaded.encryption.key_id,
                        environ={"RBAK_ENCRYPTION_KEYS": f"2026-11: {key}"}) == {"2026-11": base64.b64decode(key)}
    job = bodies.job_body(bodies.JobRun(name="nightly-1", namespace="prod", owner=OWNER, spec=spec, storage=spec["storage"],
                          secret_env=env, args=bodies.backup_args(), labels=bodies.backup_run_labels("nightly", "manual"),
                          validate_args=bodies.validate_args("s3://b", "nightly-1", True)))
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


KMS_ENC = {"keyId": "2026-11", "keysSecretRef": {"name": "rbak-keys"}, "envelope": True,
           "kms": {"keyId": "arn:aws:kms:eu-west-1:1:key/x", "region": "eu-west-1",
                   "endpointUrl": "https://kms.vpce.internal"}}
KMS_VAR = {"name": "AWS_ENDPOINT_URL_KMS", "value": "https://kms.vpce.internal"}


def _containers(obj: dict) -> dict[str, list[dict]]:
    """Every container's env of a Job or a SparkApplication, by container (role)."""
    if obj["kind"] == "SparkApplication":
        return {role: obj["spec"][role]["env"] for role in ("driver", "executor")}
    pod = obj["spec"]["template"]["spec"]
    return {c["name"]: c["env"] for c in pod.get("initContainers", []) + pod["containers"]}


def test_every_pod_of_an_envelope_kms_backup_reaches_the_same_kms():
    """spec.encryption.kms.region/endpointUrl: the backup Job (and its in-pod validation), a validation
    Job or SparkApplication after the run, a drill Job, and a RabbitMQRestore through backupRef (Job or
    Spark driver and executors) all reach the KMS endpoint the backup wrapped its data key at: in their
    config where the command reads one, and as AWS_ENDPOINT_URL_KMS in every container (validation and
    Spark executors run from flags alone)."""
    from rbak.drill.backup import options_from_config as drill_options
    from rbak.restore.options import options_from_config as restore_options
    from rbak_operator.reconcile import drill
    from rbak_operator.reconcile.restore import restore_encryption

    spec = {**CLUSTER_SPEC, "encryption": KMS_ENC,
            "verify": {"restoreDrill": {"schedule": "0 4 * * 0"}}}
    made: list[dict] = []
    cfg, env = rbakconfig.backup_config(spec, "prod", "b-1")
    e = Config.from_dict(cfg, env=SECRET_ENV).encryption
    assert (e.kms_region, e.kms_endpoint_url) == ("eu-west-1", "https://kms.vpce.internal")
    made.append(bodies.job_body(bodies.JobRun(name="b-1", namespace="prod", owner=OWNER, spec=spec, storage=spec["storage"],
                                secret_env=env, args=bodies.backup_args(), labels=bodies.backup_run_labels("n", "manual"),
                                validate_args=bodies.validate_args("s3://b", "b-1", True))))
    venv = rbakconfig.validation_env(spec)
    assert {x.env for x in venv} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "RBAK_ENCRYPTION_KEYS",
                                     "AWS_ENDPOINT_URL_KMS"}
    made.append(bodies.job_body(bodies.JobRun(name="b-1-validate", namespace="prod", owner=OWNER, spec=spec, storage=spec["storage"],
                                secret_env=venv, args=bodies.validate_args("s3://b", "b-1", True),
                                labels=bodies.common_labels("validate"), with_config=False)))
    made.append(bodies.spark_application_body(name="b-1-validate", namespace="prod", owner=OWNER, spark={},
                                              script="validate.py", arguments=["--backup-id", "b-1"],
                                              secret_env=venv, config_name=None, labels=bodies.common_labels("validate")))
    dcfg, denv = drill.drill_config(spec, "prod", "b-1")
    dopts = drill_options(Config.from_dict(dcfg, env=SECRET_ENV), drill_id="d-1")
    assert (dopts.kms_region, dopts.kms_endpoint_url) == ("eu-west-1", "https://kms.vpce.internal")
    made.append(drill.drill_job({**OWNER, "spec": spec}, "n-drill-1", "b-1", denv, SLOT))

    # a RabbitMQRestore through backupRef that names no encryption of its own
    renc = restore_encryption(None, KMS_ENC)
    assert renc == {"keysSecretRef": {"name": "rbak-keys"}, "kms": KMS_ENC["kms"]}
    rcfg, renv = rbakconfig.restore_config({"encryption": renc}, "prod", "b-1", CLUSTER_SPEC["broker"],
                                           CLUSTER_SPEC["storage"])
    assert rcfg["encryption"] == {"kms_region": "eu-west-1", "kms_endpoint_url": "https://kms.vpce.internal"}
    ropts = restore_options(Config.from_dict(rcfg, env=SECRET_ENV))
    assert (ropts.kms_region, ropts.kms_endpoint_url) == ("eu-west-1", "https://kms.vpce.internal")
    made.append(bodies.job_body(bodies.JobRun(name="r-restore", namespace="prod", owner=OWNER, spec={}, storage=CLUSTER_SPEC["storage"],
                                secret_env=renv, args=bodies.restore_args(), labels=bodies.restore_labels("r"))))
    made.append(bodies.spark_application_body(name="r-restore", namespace="prod", owner=OWNER, spark={},
                                              script="restore.py", arguments=["--backup-id", "b-1"], secret_env=renv,
                                              config_name="r-restore", labels=bodies.restore_labels("r")))
    import support.sparkcrd as sparkcrd

    for obj in made:
        if obj["kind"] == "Job":
            kubernetes_validate.validate(obj, K8S, strict=True)
        else:
            assert sparkcrd.problems(obj) == []  # what kubeflow spark-operator's CRD accepts
        for name, envs in _containers(obj).items():
            assert KMS_VAR in envs, (obj["kind"], obj["metadata"]["name"], name)
            assert {"name": "RBAK_ENCRYPTION_KEYS",
                    "valueFrom": {"secretKeyRef": {"name": "rbak-keys", "key": "keyring"}}} in envs, name


def test_a_restore_sets_its_own_kms_access_or_takes_the_backups():
    """Each of keysSecretRef and kms comes from the restore when it sets it, else from the backup; a
    restore from spec.storage (no backup to inherit from) sets its own; without kms nothing is added."""
    from rbak_operator.reconcile.restore import restore_encryption

    own_kms = {"endpointUrl": "https://kms.other.internal"}
    assert restore_encryption({"kms": own_kms}, KMS_ENC) == {"kms": own_kms, "keysSecretRef": {"name": "rbak-keys"}}
    assert restore_encryption({"keysSecretRef": {"name": "mine"}}, KMS_ENC) == {
        "keysSecretRef": {"name": "mine"}, "kms": KMS_ENC["kms"]}
    assert restore_encryption(None, {"serverSide": {"mode": "AES256"}}) is None
    cfg, env = rbakconfig.restore_config({"encryption": {"kms": own_kms}}, "prod", "b-1", CLUSTER_SPEC["broker"],
                                         CLUSTER_SPEC["storage"])
    assert cfg["encryption"] == {"kms_endpoint_url": "https://kms.other.internal"}
    assert rbakconfig.ValueEnv("AWS_ENDPOINT_URL_KMS", "https://kms.other.internal") in env
    cfg, env = rbakconfig.restore_config({"encryption": {"keysSecretRef": {"name": "k"}}}, "prod", "b-1",
                                         CLUSTER_SPEC["broker"], CLUSTER_SPEC["storage"])
    assert "encryption" not in cfg and all(x.env != "AWS_ENDPOINT_URL_KMS" for x in env)
    restore = _spec_schema(crds.restore_crd())
    jsonschema.validate({"backupRef": {"name": "x"}, "encryption": {"kms": {"region": "eu-west-1", **own_kms}}},
                        restore)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"backupRef": {"name": "x"}, "encryption": {"kms": {"endpointUrl": "kms.internal"}}},
                            restore)
