"""What a new user's trial of `rbak archive` tripped on (TRIAL.md, worktree hD): each a refusal with its message."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rbak.config import Config
from rbak.errors import ConfigError


def archive_dict(**extra) -> dict:
    return {"mode": "archive",
            "source": {"amqp_url": "amqp://guest:guest@localhost:5672/%2f", "queues": {"vhosts": ["v"]}},
            "storage": {"backend": "filesystem", "path": "/tmp/x"}, "archive": {"name": "orders"}, **extra}


@pytest.mark.parametrize("enc,named", [
    ({"key_id": "k1", "keys_file": "keys.yaml"}, "encryption.key_id, encryption.keys_file"),
    ({"envelope": True, "keys_env": "KEYS"}, "encryption.keys_env, encryption.envelope"),
])
def test_an_archive_config_naming_a_key_without_enabled_is_refused(enc, named):
    """An archive with a key in its config but `enabled` unset used to be written in plaintext."""
    with pytest.raises(ConfigError) as e:
        Config.from_dict(archive_dict(encryption=enc), env={})
    assert (f"encryption.enabled: is false but {named} is set: this archive would be stored in plaintext; "
            "set encryption.enabled: true to encrypt it, or remove the encryption section") in str(e.value)


def run_archive(tmp_path, d: dict) -> subprocess.CompletedProcess:
    """``rbak archive --config`` on ``d`` written to a file, as a user runs it."""
    cfg = tmp_path / "a.yaml"
    cfg.write_text(json.dumps(d))
    return subprocess.run([sys.executable, "-m", "rbak", "archive", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=120)


def test_the_archive_cli_refuses_a_key_without_enabled_before_writing(tmp_path):
    store = tmp_path / "store"
    d = archive_dict(encryption={"key_id": "k1"})
    d["storage"]["path"] = str(store)
    r = run_archive(tmp_path, d)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == ("  - encryption.enabled: is false but encryption.key_id is set: this archive "
                                         "would be stored in plaintext; set encryption.enabled: true to encrypt it, "
                                         "or remove the encryption section")
    assert not store.exists()


def test_an_amqp_url_at_the_management_port_is_refused_before_any_connection(tmp_path):
    """The archiver retried it for ever (ERROR every 10 s); it is one port given for two protocols."""
    d = archive_dict()
    d["source"].update(amqp_url="amqp://guest:guest@127.0.0.1:15674/orders", management_url="http://127.0.0.1:15674")
    r = run_archive(tmp_path, d)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == ("  - source.amqp_url: 127.0.0.1:15674 is source.management_url's address (the "
                                         "management API speaks HTTP): point amqp_url at the broker's AMQP port (5672 "
                                         "by default, 5671 with TLS)")


@pytest.mark.parametrize("port,which", [(5672, "amqp_url"), (15672, "management_url")])
def test_a_stream_port_that_is_another_protocols_port_is_refused(port, which):
    d = archive_dict()
    d["source"].update(management_url="http://localhost:15672", stream_port=port)
    with pytest.raises(ConfigError) as e:
        Config.from_dict(d, env={})
    assert (f"source.stream_port: {port} is the port of source.{which}: set the broker's stream protocol port "
            "(5552 by default)") in str(e.value)
