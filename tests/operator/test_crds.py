"""The CRDs: generated files up to date, valid Kubernetes, and their schemas
accept the examples and reject bad objects (jsonschema for the OpenAPI part,
cel-python for the x-kubernetes-validations rules, as the API server would)."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from rbak_operator.crds import schema as crds
from support.crds import cel_failures
from support.dotted import DEL, set_path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "docs" / "examples").glob("*.yaml"))
CRD_FILES = sorted((REPO / "crds").glob("*.yaml"))
K8S = "1.33"


def test_generated_files_are_current():
    for name, crd in crds.all_crds().items():
        assert (REPO / "crds" / name).read_text() == crds.render(crd), f"crds/{name} is stale: run python -m rbak_operator.crds.schema crds/"


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: p.name)
def test_crd_files_are_valid_kubernetes(path):
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, K8S, strict=True)


def _schema(kind: str) -> dict:
    for crd in crds.all_crds().values():
        if crd["spec"]["names"]["kind"] == kind:
            return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    raise KeyError(kind)


def check(obj: dict) -> list[str]:
    """Every problem the API server would report for this object (empty: accepted)."""
    schema = _schema(obj["kind"])
    v = jsonschema.Draft7Validator(schema)
    errs = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(obj)]
    return errs + cel_failures(schema, obj)


def _structural(schema: dict, path: str = "") -> None:
    """Structural-schema rules: every node typed (or int-or-string/preserve-unknown), no type in oneOf/anyOf."""
    assert "type" in schema or schema.get("x-kubernetes-int-or-string") or schema.get(
        "x-kubernetes-preserve-unknown-fields"), f"{path}: no type"
    for k in ("oneOf", "anyOf", "allOf"):
        for alt in schema.get(k) or []:
            assert "type" not in alt, f"{path}.{k}: type inside {k}"
    for name, sub in (schema.get("properties") or {}).items():
        _structural(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        _structural(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        _structural(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("kind", ["RabbitMQBackup", "RabbitMQRestore"])
def test_schemas_are_structural_with_status_subresource_and_columns(kind):
    _structural(_schema(kind))
    crd = next(c for c in crds.all_crds().values() if c["spec"]["names"]["kind"] == kind)
    ver = crd["spec"]["versions"][0]
    assert ver["subresources"] == {"status": {}}
    cols = {c["name"] for c in ver["additionalPrinterColumns"]}
    assert {"Phase", "Size", "Age"} <= cols
    # a restore's column is what it restored (confirmed by the target), and whether it was a dry run
    assert {"Messages"} <= cols if kind == "RabbitMQBackup" else {"Restored", "Dry-Run", "Target"} <= cols
    if kind == "RabbitMQBackup":
        assert {"Schedule", "Last Backup", "Next Run"} <= cols
        assert crd["spec"]["names"]["shortNames"] == ["rbak"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(path):
    assert check(yaml.safe_load(path.read_text())) == []


def _backup() -> dict:
    return yaml.safe_load((REPO / "docs/examples/rabbitmqbackup-cluster-s3.yaml").read_text())


def _restore() -> dict:
    return yaml.safe_load((REPO / "docs/examples/rabbitmqrestore-pitr.yaml").read_text())





BAD_BACKUPS = [
    ("spec.schedule", "0 30 2 * * *", "6-field values with a leading seconds field are not supported"),
    ("spec.schedule", "30 2 * *", "5-field cron"),
    ("spec.concurrencyPolicy", "Sometimes", "'Sometimes' is not one of"),
    ("spec.compression", "gzip", "'gzip' is not one of"),
    ("spec.compressionLevel", 23, "23 is greater than the maximum of 22"),
    ("spec.startingDeadlineSeconds", -1, "-1 is less than the minimum of 0"),
    ("spec.successfulJobsHistoryLimit", -1, "less than the minimum"),
    ("spec.retention.keepLast", 0, "0 is less than the minimum of 1"),
    ("spec.retention.maxAge", "1 month", "does not match"),
    ("spec.deletionPolicy", "Delete", "'Delete' is not one of"),
    ("spec.storage", DEL, "'storage' is a required property"),
    ("spec.broker", DEL, "'broker' is a required property"),
    ("spec.storage.pvc", {"claimName": "x"}, "set exactly one of storage.s3 or storage.pvc"),
    ("spec.storage.s3.bucket", DEL, "'bucket' is a required property"),
    ("spec.broker.amqpUrl", "amqp://h:5672/%2f", "set exactly one of broker.rabbitmqClusterReference or broker.amqpUrl"),
    ("spec.broker.rabbitmqClusterReference.name", "Bad_Name", "does not match"),
    ("spec.queues.types", ["classic", "lazy"], "'lazy' is not one of"),
    ("spec.timeZone", "Europe Berlin", "does not match"),
    ("spec.validate.sparkThresholdBytes", -5, "less than the minimum"),
    ("spec.verify.restoreDrill.schedule", "0 30 2 * * *", "6-field values with a leading seconds field"),
    ("spec.verify.restoreDrill.schedule", DEL, "'schedule' is a required property"),
    ("spec.verify.restoreDrill.readTimeoutSeconds", 0, "0 is less than the minimum of 1"),
    ("spec.verify.restoreDrill.target", {"amqpUrl": "amqp://h:5672/%2f"},
     "broker.amqpUrl needs broker.managementUrl and broker.credentialsSecretRef"),
    ("spec.suspend", "yes", "'yes' is not of type 'boolean'"),
]


@pytest.mark.parametrize("field, value, message", BAD_BACKUPS, ids=[f"{f}={v!r}"[:60] for f, v, _ in BAD_BACKUPS])
def test_bad_backups_are_rejected(field, value, message):
    errors = check(set_path(_backup(), field, value))
    assert any(message in e for e in errors), errors


def test_amqp_url_needs_management_and_credentials():
    obj = _backup()
    obj["spec"]["broker"] = {"amqpUrl": "amqp://h:5672/%2f"}
    errors = check(obj)
    assert any("needs broker.managementUrl and broker.credentialsSecretRef" in e for e in errors), errors
    obj["spec"]["broker"] = {"amqpUrl": "amqp://user:pw@h/%2f", "managementUrl": "http://h",
                             "credentialsSecretRef": {"name": "s"}}
    assert any("amqpUrl" in e and "does not match" in e for e in check(obj))


BAD_RESTORES = [
    ("spec.engine", "flink", "'flink' is not one of"),
    ("spec.pitr.end", "yesterday", "does not match"),
    ("spec.pitr.start", "2026-11-22T09:00:00", "does not match"),  # no zone
    ("spec.backupRef.name", DEL, "'name' is a required property"),
    ("spec.backupRef.backupId", "../x", "does not match"),
    ("spec.sparkThresholdBytes", -1, "less than the minimum"),
    ("spec.vhostMapping", {"a": ""}, "should be non-empty"),
]


@pytest.mark.parametrize("field, value, message", BAD_RESTORES, ids=[f"{f}={v!r}"[:60] for f, v, _ in BAD_RESTORES])
def test_bad_restores_are_rejected(field, value, message):
    errors = check(set_path(_restore(), field, value))
    assert any(message in e for e in errors), errors


def test_restore_needs_exactly_one_source_and_a_target_for_storage():
    obj = _restore()
    obj["spec"]["storage"] = {"s3": {"bucket": "bkt"}}
    assert any("exactly one of spec.backupRef, spec.storage or spec.archiveRef" in e for e in check(obj))
    del obj["spec"]["backupRef"]
    assert any("spec.target is required" in e for e in check(obj))
    obj["spec"]["target"] = {"rabbitmqClusterReference": {"name": "r"}}
    assert check(obj) == []


def test_epoch_ms_accepted_as_int_or_string():
    for v in (1795341600000, "1795341600000", "2026-11-22T10:00:00.5+02:00"):
        assert check(set_path(_restore(), "spec.pitr.start", v)) == []


def _rules(schema: dict, path: str = ""):
    for r in schema.get("x-kubernetes-validations") or []:
        yield path or ".", r["rule"]
    for key, sub in (schema.get("properties") or {}).items():
        yield from _rules(sub, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _rules(schema[key], f"{path}[]")


# CEL's escapes in a quoted (non-raw) string literal; anything else after a backslash is a
# syntax error for the API server ("token recognition error"), which refuses the whole CRD.
_CEL_STRING = re.compile(r"""(?<![rR])('(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")""")
_CEL_ESCAPE = re.compile(r"""\\([\\'"`?abfnrtv]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-3][0-7]{2})""")


@pytest.mark.parametrize("kind", ["RabbitMQBackup", "RabbitMQRestore"])
def test_cel_string_literals_use_only_valid_escapes(kind):
    """Offline guard for what the real server checks (tests/kube): `\\s` in a CEL string is refused."""
    bad = []
    for path, rule in _rules(_schema(kind)):
        for lit in _CEL_STRING.findall(rule):
            rest = _CEL_ESCAPE.sub("", lit)
            if "\\" in rest:
                bad.append(f"{path}: {rule}")
    assert bad == []


def _archive(**spec) -> dict:
    base = {"broker": {"rabbitmqClusterReference": {"name": "rabbitmq"}},
            "storage": {"s3": {"bucket": "archive-bucket"}}}
    return {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQArchive", "metadata": {"name": "a"},
            "spec": {**base, **spec}}


def test_archive_crd_columns_short_name_and_rules():
    _structural(_schema("RabbitMQArchive"))
    crd = crds.archive_crd()
    assert crd["spec"]["names"]["shortNames"] == ["rmqarchive"]
    ver = crd["spec"]["versions"][0]
    assert ver["subresources"] == {"status": {}}
    assert [c["name"] for c in ver["additionalPrinterColumns"]] == [
        "Phase", "RPO", "Lag", "Recoverable Until", "Streams", "Gaps", "Age", "Drill RPO", "Last Drill"]
    spec = _schema("RabbitMQArchive")["properties"]["spec"]["properties"]
    assert spec["rpoSeconds"]["default"] == 30 and spec["maxDelaySeconds"]["default"] == 5
    assert check(_archive(rpoSeconds=10, maxDelaySeconds=5, suspend=True)) == []
    assert check(_archive(rpoSeconds=3, maxDelaySeconds=5)) == [
        ".spec: spec.maxDelaySeconds must not exceed spec.rpoSeconds: the objective could never be met"]
    assert any("rpoSeconds" in p for p in check(_archive(rpoSeconds=0)))
    assert any("deletionPolicy" in p for p in check(_archive(deletionPolicy="purge")))


def test_restore_takes_exactly_one_source_and_archive_ref_refuses_pitr():
    base = {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQRestore", "metadata": {"name": "r"}}
    ok = {**base, "spec": {"archiveRef": {"name": "orders", "pointInTime": "2026-12-06T08:12:19.5Z"}}}
    assert check(ok) == []
    assert check({**base, "spec": {"archiveRef": {"name": "orders", "pointInTime": "recoverable"}}}) == []
    assert check({**base, "spec": {"archiveRef": {"name": "orders"}, "backupRef": {"name": "nightly"}}}) == [
        ".spec: set exactly one of spec.backupRef, spec.storage or spec.archiveRef"]
    assert check({**base, "spec": {"archiveRef": {"name": "orders"}, "pitr": {"end": 5}}}) == [
        ".spec: spec.pitr: not with spec.archiveRef (set spec.archiveRef.pointInTime)"]
    assert any("pointInTime" in p for p in check({**base, "spec": {"archiveRef": {"name": "o", "pointInTime": "soon"}}}))
