"""Slot names, the rbak config a run reads, and the Job/ConfigMap/SparkApplication bodies.

Every body is validated offline and strictly with kubernetes-validate (k8s 1.33);
every config is loaded by rbak's own config loader, as the pod will.
"""

from __future__ import annotations


import kubernetes_validate
import pytest
import yaml

from rbak.config import Config
from rbak.errors import ConfigError
from rbak_operator.decide import bodies, naming, rbakconfig
from support.operator_specs import CLUSTER_SPEC, DNS_LABEL, K8S, OWNER, SECRET_ENV, SLOT, URL_SPEC


# -- names -------------------------------------------------------------------

def test_scheduled_name_is_deterministic_and_readable():
    assert naming.scheduled_run_name("nightly", SLOT) == "nightly-20261122-2300"
    assert naming.scheduled_run_name("nightly", SLOT) == naming.scheduled_run_name("nightly", SLOT)
    assert naming.scheduled_run_name("nightly", SLOT.replace(minute=5)) != naming.scheduled_run_name("nightly", SLOT)


@pytest.mark.parametrize("name", ["a" * 63, "b" * 253, "x.y.z" * 20, "Upper.Case_name"])
def test_long_or_odd_names_become_distinct_dns_labels(name):
    n1 = naming.scheduled_run_name(name, SLOT)
    n2 = naming.scheduled_run_name(name + "x", SLOT)
    assert len(n1) <= 63 and DNS_LABEL.match(n1) and n1.endswith("20261122-2300")
    assert n1 != n2
    m = naming.manual_run_name(name, "2026-11-22T23:00:00Z")
    assert len(m) <= 63 and DNS_LABEL.match(m)


def test_manual_names_follow_the_trigger_value():
    a = naming.manual_run_name("nightly", "now-1")
    assert a == naming.manual_run_name("nightly", "now-1") != naming.manual_run_name("nightly", "now-2")
    assert a.startswith("nightly-manual-")


def test_label_values_fit():
    assert naming.label_value("nightly") == "nightly"
    v = naming.label_value("n" * 200)
    assert len(v) <= 63 and DNS_LABEL.match(v)


# -- the rbak config -----------------------------------------------------------

def test_cluster_reference_config_loads_and_holds_no_secret():
    cfg, env = rbakconfig.backup_config(CLUSTER_SPEC, "prod", "nightly-20261122-2300")
    text = yaml.safe_dump(cfg)
    for value in ("u", "p"):
        assert f":{value}@" not in text
    loaded = Config.from_dict(cfg, env=SECRET_ENV)
    assert loaded.mode == "backup" and loaded.backup_id == "nightly-20261122-2300"
    assert loaded.source.amqp_url == "amqp://rmq.prod.svc:5672/%2f"  # no secret in the URL
    assert (loaded.source.username, loaded.source.password) == ("u", "p")
    assert loaded.source.management_url == "http://rmq.prod.svc:15672"
    assert loaded.source.mgmt_password == "p"
    assert loaded.source.queues.vhosts == ["/"] and loaded.source.queues.exclude == ["tmp.*"]
    assert loaded.source.queues.min_messages == 1
    assert (loaded.storage.backend, loaded.storage.bucket, loaded.storage.prefix) == ("s3", "backups", "rmq/prod")
    assert loaded.storage.endpoint == "http://minio:9000" and loaded.storage.path_style is True
    assert loaded.storage.access_key_id is None  # from the pod env via boto3, not the file
    assert loaded.backup.compression == "lz4" and loaded.backup.segment_max_bytes == 1048576
    assert loaded.offset_storage.path == "/var/run/rbak/offsets.db"
    assert {(e.env, e.secret, e.key) for e in env} == {
        ("RBAK_BROKER_USERNAME", "rmq-default-user", "username"), ("RBAK_BROKER_PASSWORD", "rmq-default-user", "password"),
        ("RBAK_BROKER_HOST", "rmq-default-user", "host"), ("RBAK_BROKER_PORT", "rmq-default-user", "port"),
        ("AWS_ACCESS_KEY_ID", "s3-creds", "AWS_ACCESS_KEY_ID"), ("AWS_SECRET_ACCESS_KEY", "s3-creds", "AWS_SECRET_ACCESS_KEY")}


def test_url_config_and_pvc():
    cfg, env = rbakconfig.backup_config(URL_SPEC, "prod", "b-1")
    loaded = Config.from_dict(cfg, env=SECRET_ENV)
    assert loaded.source.amqp_url == "amqps://rmq.example.com:5671/%2f"
    assert (loaded.source.username, loaded.source.password) == ("u", "p")
    assert loaded.source.management_url == "https://rmq.example.com:15671"
    assert (loaded.storage.backend, loaded.storage.path) == ("filesystem", "/var/lib/rbak/rmq")
    assert {(e.env, e.secret, e.key) for e in env} == {
        ("RBAK_BROKER_USERNAME", "rmq-user", "user"), ("RBAK_BROKER_PASSWORD", "rmq-user", "pass")}


def test_broker_stream_port_reaches_the_config_of_every_kind():
    """``spec.broker.streamPort`` takes effect (a broker whose stream listener is not 5552); absent, rbak's default."""
    assert Config.from_dict(rbakconfig.backup_config(URL_SPEC, "prod", "b-1")[0], env=SECRET_ENV).source.stream_port == 5552
    for spec in (URL_SPEC, CLUSTER_SPEC):
        withport = {**spec, "broker": {**spec["broker"], "streamPort": 5554}}
        cfg, _ = rbakconfig.backup_config(withport, "prod", "b-1")
        assert Config.from_dict(cfg, env=SECRET_ENV).source.stream_port == 5554
    cfg, _ = rbakconfig.restore_config({}, "prod", "b", {**URL_SPEC["broker"], "streamPort": 5553}, CLUSTER_SPEC["storage"])
    assert cfg["target"]["stream_port"] == 5553


def test_unset_secret_env_is_a_config_error_naming_the_variable():
    cfg, _ = rbakconfig.backup_config(URL_SPEC, "prod", "b-1")
    with pytest.raises(ConfigError, match="RBAK_BROKER_PASSWORD"):
        Config.from_dict(cfg, env={"RBAK_BROKER_USERNAME": "u", "RBAK_STATE_DIR": "/x"})


@pytest.mark.parametrize("broker, match", [
    ({"amqpUrl": "amqp://u:p@h/%2f", "managementUrl": "http://h", "credentialsSecretRef": {"name": "s"}}, "must not contain credentials"),
    ({"amqpUrl": "amqp://h/%2f", "credentialsSecretRef": {"name": "s"}}, "managementUrl"),
    ({"amqpUrl": "amqp://h/%2f", "managementUrl": "http://h"}, "credentialsSecretRef"),
    ({"rabbitmqClusterReference": {"name": "r", "namespace": "other"}}, "own namespace"),
    ({"rabbitmqClusterReference": {"name": "r", "connectionSecret": {"name": "s"}}}, "exactly one of name or connectionSecret"),
    ({"rabbitmqClusterReference": {"connectionSecret": {"name": "s"}}}, "has no uri"),
    ({}, "spec.broker"),
])
def test_bad_brokers_name_the_field(broker, match):
    with pytest.raises(ConfigError, match=match):
        rbakconfig.backup_config({"broker": broker, "storage": URL_SPEC["storage"]}, "prod", "b")


def test_a_restore_target_url_keeps_the_vhost_the_user_named():
    broker = {"amqpUrl": "amqp://h:5672/staging", "managementUrl": "http://h:15672", "credentialsSecretRef": {"name": "s"}}
    cfg, _ = rbakconfig.restore_config({}, "prod", "b", broker, CLUSTER_SPEC["storage"])
    assert cfg["target"]["amqp_url"] == "amqp://h:5672/staging"
    cfg, _ = rbakconfig.restore_config({}, "prod", "b", {**broker, "amqpUrl": "amqp://h:5672"}, CLUSTER_SPEC["storage"])
    assert cfg["target"]["amqp_url"] == "amqp://h:5672"


def test_backup_encryption_envelope_without_a_key_is_refused():
    spec = {**URL_SPEC, "encryption": {"envelope": True}}
    with pytest.raises(ConfigError, match="spec.encryption.envelope: needs keyId"):
        rbakconfig.backup_config(spec, "prod", "b")


def test_restore_config_with_pitr_and_mapping():
    spec = {"pitr": {"start": "2026-11-22T10:00:00Z", "end": 1795348800000}, "vhostMapping": {"/": "staging"},
            "queueMapping": {"orders": "orders-restored"}, "restoreDefinitions": True, "dryRun": True}
    cfg, env = rbakconfig.restore_config(spec, "prod", "nightly-20261122-2300", CLUSTER_SPEC["broker"], CLUSTER_SPEC["storage"])
    loaded = Config.from_dict(cfg, env=SECRET_ENV)
    # a restore target names no vhost the spec did not: the URL's vhost is where a restore goes
    assert loaded.mode == "restore" and loaded.target.amqp_url == "amqp://rmq.prod.svc:5672"
    assert loaded.target.named_vhost is None
    assert (loaded.target.username, loaded.target.password) == ("u", "p")
    assert loaded.restore.window_ms() == (1795341600000, 1795348800000)
    assert loaded.restore.vhost_mapping == {"/": "staging"} and loaded.restore.queue_mapping == {"orders": "orders-restored"}
    assert loaded.restore.restore_definitions and loaded.restore.dry_run
    assert not loaded.restore.overwrite_users and not loaded.restore.definitions_strict
    assert loaded.restore.transient_queues == "durable"
    spec.update(overwriteUsers=True, definitionsStrict=True, transientQueues="skip")
    cfg, _ = rbakconfig.restore_config(spec, "prod", "b", CLUSTER_SPEC["broker"], CLUSTER_SPEC["storage"])
    r = Config.from_dict(cfg, env=SECRET_ENV).restore
    assert (r.overwrite_users, r.definitions_strict, r.transient_queues) == (True, True, "skip")


def test_storage_url_round_trips_through_open_storage():
    from rbak.storage.url import open_storage

    url = rbakconfig.storage_url(CLUSTER_SPEC["storage"])
    st = open_storage(url)
    # The root: manifests' keys carry the prefix, so tools get it as --prefix.
    assert st.bucket == "backups" and st.prefix == ""
    assert rbakconfig.storage_prefix(CLUSTER_SPEC["storage"]) == "rmq/prod"
    args = bodies.validate_args(url, "b-1", False, "rmq/prod")
    assert args == ["validate", "--path", url, "--backup-id", "b-1", "--prefix", "rmq/prod", "--write-report"]
    assert rbakconfig.storage_url(URL_SPEC["storage"]) == "file:///var/lib/rbak/rmq"


# -- bodies ------------------------------------------------------------------

def _job(spec, validate=True):
    cfg, env = rbakconfig.backup_config(spec, "prod", "nightly-20261122-2300")
    vargs = bodies.validate_args(rbakconfig.storage_url(spec["storage"]), "nightly-20261122-2300", True) if validate else None
    return cfg, bodies.job_body(bodies.JobRun(
        name="nightly-20261122-2300", namespace="prod", owner=OWNER, spec=spec, storage=spec["storage"],
        secret_env=env, args=bodies.backup_args(), labels=bodies.backup_run_labels("nightly", "schedule"),
        annotations={bodies.A_SLOT: "2026-11-22T23:00:00Z"}, validate_args=vargs))


@pytest.mark.parametrize("spec", [CLUSTER_SPEC, URL_SPEC], ids=["cluster-s3", "url-pvc"])
def test_job_body_is_valid_kubernetes(spec):
    _, job = _job(spec)
    kubernetes_validate.validate(job, K8S, strict=True)
    assert job["metadata"]["ownerReferences"][0] == {
        "apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQBackup", "name": "nightly",
        "uid": OWNER["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    init, main = pod["initContainers"][0], pod["containers"][0]
    assert init["command"] + init["args"] == ["python", "-m", "rbak", "backup", "--config", "/etc/rbak/config.yaml", "--json"]
    assert main["args"][:1] == ["validate"] and "--deep" in main["args"]
    assert main["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # Credentials only as secretKeyRefs.
    for e in init["env"]:
        assert "valueFrom" in e or e["name"] in ("RBAK_STATE_DIR", "RBAK_RESULT_FILE")
    assert {v["name"] for v in pod["volumes"]} >= {"config", "state"}


def test_job_without_validation_runs_backup_as_the_only_container():
    _, job = _job(CLUSTER_SPEC, validate=False)
    pod = job["spec"]["template"]["spec"]
    assert "initContainers" not in pod and pod["containers"][0]["args"][0] == "backup"
    kubernetes_validate.validate(job, K8S, strict=True)


def test_configmap_body_is_valid_and_secret_free():
    cfg, _ = _job(CLUSTER_SPEC)
    cm = bodies.configmap_body("nightly-20261122-2300", "prod", OWNER, cfg, bodies.backup_run_labels("nightly", "manual"))
    kubernetes_validate.validate(cm, K8S, strict=True)
    assert yaml.safe_load(cm["data"]["config.yaml"]) == cfg
    assert "${RBAK_BROKER_PASSWORD}" in cm["data"]["config.yaml"]


def test_spark_application_body():
    _, env = rbakconfig.backup_config(CLUSTER_SPEC, "prod", "b")
    app = bodies.spark_application_body(
        name="r-restore", namespace="prod", owner=OWNER, spark={"executorInstances": 4, "executorMemory": "4g"},
        script="restore.py", arguments=["--path", "s3://b", "--backup-id", "b"], secret_env=env,
        config_name="r-restore", labels=bodies.restore_labels("r"))
    spec = app["spec"]
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2" and app["kind"] == "SparkApplication"
    # spark-operator's required fields and enums
    for key in ("type", "sparkVersion", "mainApplicationFile", "driver", "executor"):
        assert key in spec
    assert spec["type"] == "Python" and spec["mode"] == "cluster" and spec["pythonVersion"] == "3"
    assert spec["restartPolicy"]["type"] in ("Never", "OnFailure", "Always")
    assert spec["mainApplicationFile"] == "local:///opt/rbak/spark/restore.py"
    assert spec["executor"]["instances"] == 4 and spec["executor"]["memory"] == "4g"
    envs = {e["name"] for e in spec["driver"]["env"]}
    assert {"RBAK_BROKER_PASSWORD", "AWS_SECRET_ACCESS_KEY", "RBAK_STATE_DIR"} <= envs
    # metadata/ownerReferences are ordinary Kubernetes metadata: validate them as a ConfigMap's.
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": app["metadata"]}, K8S, strict=True)


@pytest.mark.parametrize("status, secret, user_key", [
    ({"defaultUser": {"secretReference": {"name": "custom-creds", "keys": {"username": "u", "password": "p"}}}},
     "custom-creds", "u"),
    ({"defaultUser": {"secretReference": {"name": "custom-creds"}}}, "custom-creds", "username"),
    ({"defaultUser": {}}, "rmq-default-user", "username"),  # status without a reference: the fallback
    (None, "rmq-default-user", "username"),  # no RabbitmqCluster found
])
def test_cluster_reference_secret_from_the_cluster_status(status, secret, user_key):
    resolved = rbakconfig.ResolvedBroker(cluster_status=status)
    _, env = rbakconfig.backup_config(CLUSTER_SPEC, "prod", "b", resolved)
    by = {e.env: (e.secret, e.key) for e in env}
    assert by["RBAK_BROKER_USERNAME"] == (secret, user_key)
    assert by["RBAK_BROKER_HOST"][0] == by["RBAK_BROKER_PASSWORD"][0] == secret


@pytest.mark.parametrize("uri, mgmt, amqp", [
    ("https://rabbit.prod.svc:15671", "https://rabbit.prod.svc:15671", "amqp://rabbit.prod.svc:5672/%2f"),
    ("rabbit.prod.svc:15672", "http://rabbit.prod.svc:15672", "amqp://rabbit.prod.svc:5672/%2f"),
    ("http://10.0.0.7", "http://10.0.0.7:80", "amqp://10.0.0.7:5672/%2f"),
])
def test_connection_secret_as_the_topology_operator_uses_it(uri, mgmt, amqp):
    spec = dict(CLUSTER_SPEC, broker={"rabbitmqClusterReference": {"connectionSecret": {"name": "topo-conn"}}})
    cfg, env = rbakconfig.backup_config(spec, "prod", "b", rbakconfig.ResolvedBroker(connection_uri=uri))
    loaded = Config.from_dict(cfg, env=SECRET_ENV)
    assert loaded.source.management_url == mgmt and loaded.source.amqp_url == amqp
    assert (loaded.source.mgmt_username, loaded.source.mgmt_password) == ("u", "p")
    assert {(e.env, e.secret, e.key) for e in env if e.env.startswith("RBAK_")} == {
        ("RBAK_BROKER_USERNAME", "topo-conn", "username"), ("RBAK_BROKER_PASSWORD", "topo-conn", "password")}
    assert cfg["source"]["management_password"] == "${RBAK_BROKER_PASSWORD}"  # never the value itself
