"""The YAML config model: validation collects every problem with its key path."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from rbak.config import Config, QueueSelection, config_reference_markdown, json_schema, load_config, mask_url
from rbak.errors import ConfigError

GOOD = """
mode: backup
backup_id: nightly-1
source:
  amqp_url: amqp://admin:${RB_PASS}@rabbit:5672/%2f
  management_url: http://rabbit:15672
  management_username: admin
  management_password: ${RB_PASS}
  queues:
    include: ["orders-*", "prod/payments"]
    exclude: [orders-tmp]
    types: [classic, quorum]
storage:
  backend: s3
  bucket: backups
  region: eu-west-1
  prefix: team-a
  endpoint: ${S3_ENDPOINT:-http://localhost:9000}
  path_style: true
backup:
  compression: lz4
  segment_max_bytes: 1048576
metrics:
  enabled: true
  port: 9090
"""


def test_good_file_loads_with_interpolation(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(GOOD)
    cfg = load_config(p, env={"RB_PASS": "s3cr3t"})
    assert cfg.mode == "backup" and cfg.backup_id == "nightly-1"
    assert cfg.source.password == "s3cr3t" and cfg.source.mgmt_password == "s3cr3t"
    assert cfg.storage.endpoint == "http://localhost:9000"
    assert cfg.storage.storage_url() == "s3://backups?region=eu-west-1&endpoint=http://localhost:9000&path_style=true"
    assert cfg.backup.compression == "lz4" and cfg.backup.compression_level == 3
    assert cfg.metrics.port == 9090 and cfg.metrics.path == "/metrics"
    assert cfg.layout().manifest == "team-a/nightly-1/manifest.json"
    # secrets never in repr / to_dict
    text = repr(cfg) + json.dumps(cfg.to_dict())
    assert "s3cr3t" not in text and "***" in text


def test_every_problem_is_reported_with_its_path(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("""
mode: backup
colour: blue
source:
  amqp_url: http://nope
  stream_port: 99999
  queues: {types: [classic, lake]}
storage: {backend: filesystem}
backup:
  compression_level: high
  compression: brotli
  stream_enabled: maybe
restore:
  time_window_start: yesterday
  vhost_mapping: [a, b]
metrics: {port: "x"}
""")
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    msg = str(ei.value)
    for expected in [
        "colour: unknown key",
        "source.stream_port: must be an integer 1-65535, got 99999",
        "source.queues.types[1]: must be one of classic, quorum, stream; got 'lake'",
        "backup.compression_level: must be an integer 1-22, got 'high'",
        "backup.compression: must be one of zstd, lz4, none; got 'brotli'",
        "backup.stream_enabled: must be true or false, got 'maybe'",
        "restore.time_window_start: must be epoch milliseconds or an RFC 3339 time",
        "restore.vhost_mapping: must be a mapping",
        "metrics.port: must be an integer",
        "storage.path: required when storage.backend is filesystem",
        "source.amqp_url: must be a amqp:///amqps:// URL",
    ]:
        assert expected in msg, (expected, msg)
    assert str(p) in msg


def test_missing_required_fields():
    with pytest.raises(ConfigError) as ei:
        Config.from_dict({"source": {}}, env={})
    msg = str(ei.value)
    assert "mode: required" in msg and "storage: required" in msg and "source.amqp_url: required" in msg
    with pytest.raises(ConfigError, match="backup_id: required when mode is restore"):
        Config.from_dict({"mode": "restore", "target": {"amqp_url": "amqp://h"}, "storage": {"backend": "memory"}})
    with pytest.raises(ConfigError, match="top level"):
        Config.from_dict(["not", "a", "mapping"])


def test_unset_env_without_default_is_an_error():
    with pytest.raises(ConfigError, match=r"source.management_password: environment variable RBAK_NOPE_X is not set"):
        Config.from_dict({"mode": "backup", "storage": {"backend": "memory"},
                          "source": {"amqp_url": "amqp://h", "management_password": "${RBAK_NOPE_X}"}}, env={})
    cfg = Config.from_dict({"mode": "backup", "storage": {"backend": "memory", "path": "$${literal}"},
                            "source": {"amqp_url": "amqp://h"}}, env={})
    assert cfg.storage.path == "${literal}"


def test_bad_backup_id_and_time_windows():
    with pytest.raises(ConfigError, match="backup_id: '../x' is not a valid backup id"):
        Config.from_dict({"mode": "backup", "backup_id": "../x", "storage": {"backend": "memory"},
                          "source": {"amqp_url": "amqp://h"}})
    cfg = Config.from_dict({"mode": "restore", "backup_id": "b", "storage": {"backend": "memory"},
                            "target": {"amqp_url": "amqp://h"},
                            "restore": {"time_window_start": "2025-04-10T00:00:00Z", "time_window_end": 1744300000000}})
    assert cfg.restore.window_ms() == (1744243200000, 1744300000000)
    with pytest.raises(ConfigError, match="is after time_window_end"):
        Config.from_dict({"mode": "restore", "backup_id": "b", "storage": {"backend": "memory"},
                          "target": {"amqp_url": "amqp://h"},
                          "restore": {"time_window_start": 2, "time_window_end": 1}})


def test_default_backup_config():
    cfg = Config.default_backup()
    assert cfg.backup_id.startswith("backup-")
    assert cfg.source.amqp_url_for_vhost("/") == "amqp://guest:guest@localhost:5672/%2F"
    assert cfg.storage.storage_url().endswith("/rbak-backups")
    assert "guest:guest" not in repr(cfg)


def test_queue_selection_globs():
    sel = QueueSelection(include=["orders-*", "prod/pay*"], exclude=["orders-tmp"], types=["classic"])
    assert sel.matches("/", "orders-1", "classic")
    assert not sel.matches("/", "orders-tmp", "classic")
    assert not sel.matches("/", "orders-1", "quorum")
    assert sel.matches("prod", "payments", "classic")
    assert not sel.matches("dev", "payments", "classic")
    assert not sel.matches("/", "other", "classic")
    assert QueueSelection(include=["a[1]"]).matches("/", "a1")  # glob character class
    assert QueueSelection(include=["exact"]).matches("/", "exact")


def test_mask_url():
    assert mask_url("amqps://u:p%40ss@h:5671/v") == "amqps://u:***@h:5671/v"
    assert mask_url("amqp://h/") == "amqp://h/"
    # a malformed URL (the colon of the scheme forgotten) still has its password masked in the error
    assert mask_url("amqp//guest:S3cretPW@localhost:5674/v") == "amqp//guest:***@localhost:5674/v"
    assert mask_url("amqp//guest@localhost/v") == "amqp//guest@localhost/v"


def test_a_malformed_url_is_refused_without_its_password(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("source:\n  amqp_url: amqp//guest:S3cretPW@localhost:5674/v\n")
    with pytest.raises(Exception) as e:
        load_config(str(p))
    assert "source.amqp_url" in str(e.value) and "S3cretPW" not in str(e.value), str(e.value)


def test_reference_and_schema_are_generated():
    md = config_reference_markdown()
    assert "`backup.compression_level`" in md and "`restore.queue_mapping`" in md
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml_load(GOOD), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"mode": "backup", "storage": {"backend": "filesystem"}, "nope": 1}, schema)
    out = subprocess.run([sys.executable, "-m", "rbak.config"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("## Configuration reference")


def yaml_load(text):
    import yaml

    return yaml.safe_load(text)


def test_cli_config_reference_and_default_backup_parser(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rbak", "config-reference"], capture_output=True, text=True,
                         check=True).stdout
    assert "`source.tls.ca_cert`" in out and "`offset_storage.path`" in out
    schema = json.loads(subprocess.run([sys.executable, "-m", "rbak", "config-reference", "--json-schema"],
                                       capture_output=True, text=True, check=True).stdout)
    assert schema["properties"]["backup"]["properties"]["compression_level"]["maximum"] == 22

    # no --config: the embedded default, with --path / --backup-id overrides
    from rbak.commands.backup import build_config
    import argparse

    cfg = build_config(argparse.Namespace(config=None, backup_id="b-1", path=str(tmp_path / "x"), vhost=["v1"]))
    assert cfg.backup_id == "b-1" and cfg.storage.backend == "filesystem" and cfg.storage.path == str(tmp_path / "x")
    assert cfg.source.amqp_url == "amqp://guest:guest@localhost:5672/%2f" and cfg.source.queues.vhosts == ["v1"]
    cfg = build_config(argparse.Namespace(config=None, backup_id=None,
                                          path="s3://bkt/pre?endpoint=http://127.0.0.1:9&path_style=true"))
    assert cfg.storage.backend == "s3" and cfg.storage.bucket == "bkt" and cfg.storage.prefix == "pre"
    assert cfg.storage.path_style and cfg.backup_id.startswith("backup-")
    p = tmp_path / "restore.yaml"
    p.write_text("mode: restore\nbackup_id: r\ntarget: {amqp_url: 'amqp://h'}\nstorage: {backend: memory}\n")
    with pytest.raises(ConfigError, match="rbak backup needs mode: backup"):
        build_config(argparse.Namespace(config=str(p), backup_id=None, path=None))


def test_generated_configuration_doc_is_current():
    """docs/configuration.md is `python -m rbak.config` output: regenerate it when a field changes."""
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert doc.read_text() == config_reference_markdown() + "\n", "run: python -m rbak.config > docs/configuration.md"


HOSTILE_PASSWORD = "p@ss:w/rd%41?#&"


def test_credentials_outside_the_url_may_hold_any_character(broker, vhost, monkeypatch):
    """The operator puts no secret into amqp_url: it comes from management_* via ${ENV}."""
    import uuid

    from rbak.broker.connect import connect

    user = f"rbak-{uuid.uuid4().hex[:8]}"
    broker.api("PUT", f"/api/users/{user}", {"password": HOSTILE_PASSWORD, "tags": "management"})
    try:
        broker.api("PUT", f"/api/permissions/{vhost}/{user}", {"configure": ".*", "write": ".*", "read": ".*"})
        monkeypatch.setenv("T_USER", user)
        monkeypatch.setenv("T_PASS", HOSTILE_PASSWORD)
        cfg = Config.from_dict({
            "mode": "backup",
            "source": {"amqp_url": f"amqp://127.0.0.1:{broker.amqp_port}/%2f",
                       "management_url": broker.management_url,
                       "management_username": "${T_USER}", "management_password": "${T_PASS}"},
            "storage": {"backend": "memory"},
        })
        assert (cfg.source.username, cfg.source.password) == (user, HOSTILE_PASSWORD)
        conn = connect(cfg.source, vhost)
        assert conn.is_open
        conn.close()
        # A URL with its own credentials still wins over management_*.
        url_cfg = Config.from_dict({**cfg_dict_with_url(broker), "storage": {"backend": "memory"}})
        assert (url_cfg.source.username, url_cfg.source.password) == ("guest", "guest")
    finally:
        broker.api("DELETE", f"/api/users/{user}")


def cfg_dict_with_url(broker) -> dict:
    return {"mode": "backup", "source": {"amqp_url": f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/%2f",
                                         "management_username": "someone-else", "management_password": "x"}}


def test_max_connections_still_loads_but_says_it_is_not_used(tmp_path, caplog):
    """A field rbak documented but never used: configurations that set it load, and the backup says so."""
    from rbak.backup import BackupEngine

    def cfg(**backup):
        return Config.from_dict({"mode": "backup", "backup_id": "b", "source": {"amqp_url": "amqp://localhost/"},
                                 "storage": {"backend": "filesystem", "path": str(tmp_path)}, "backup": backup}, env={})

    BackupEngine(cfg())
    assert "max_connections" not in caplog.text
    BackupEngine(cfg(max_connections=2, max_concurrent_queues=3))
    assert "backup.max_connections: not used" in caplog.text and "(3) per vhost" in caplog.text
    with pytest.raises(ConfigError, match="backup.max_connections"):
        cfg(max_connections=0)


def test_a_queue_selection_under_target_is_refused_not_ignored():
    """target.queues and drill.target.queues select nothing: a restore that silently ignored them would
    publish every queue of the backup. Unset (or all defaults) they load."""
    base = {"mode": "restore", "backup_id": "b", "target": {"amqp_url": "amqp://h/"},
            "storage": {"backend": "filesystem", "path": "/tmp/x"}}
    Config.from_dict(base, env={})
    Config.from_dict({**base, "target": {"amqp_url": "amqp://h/", "queues": {"min_messages": 0}}}, env={})
    with pytest.raises(ConfigError, match=r"target\.queues: not used.*restore\.queues"):
        Config.from_dict({**base, "target": {"amqp_url": "amqp://h/", "queues": {"include": ["orders"]}}}, env={})
    with pytest.raises(ConfigError, match=r"drill\.target\.queues: not used"):
        Config.from_dict({**base, "mode": "drill", "drill": {"target": {"amqp_url": "amqp://h/",
                                                                      "queues": {"vhosts": ["v"]}}}}, env={})
    ok = Config.from_dict({**base, "restore": {"queues": {"include": ["orders"], "min_messages": 3}}}, env={})
    assert ok.restore.queues.matches("/", "orders", "classic", 3) and not ok.restore.queues.matches("/", "orders", "classic", 2)
    assert ok.restore.queues.matches("/", "orders", "stream", 0)  # streams are never skipped by it
