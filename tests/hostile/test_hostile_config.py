"""Hostile configs and command lines: errors never echo secrets; logs never carry them.

YAML syntax errors, duplicate keys, billion-laughs, credentials on the
command line, and botocore's request headers at ``-vvv``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rbak.config import load_config
from rbak.errors import ConfigError
from support.rss import BOUND_MIB, rbak_measured

SECRET = "Sup3r-S3cret-Value"


def rbak(*args, env=None):
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("text", [
    f'mode: backup\nsource:\n  management_password: "{SECRET}\n  amqp_url: amqp://localhost\n',
    f"mode: backup\nsource:\n  management_password: {SECRET}\n   bad: [indent\n",
    f"mode: backup\nsource: {{management_password: {SECRET}, \n",
    f"mode: backup\nsource:\n  management_password: '{SECRET}'\n\t- tab\n",
])
def test_a_yaml_syntax_error_never_echoes_the_text(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert str(p) in msg and "line" in msg and SECRET not in msg
    r = rbak("restore", "--config", str(p))
    assert r.returncode != 0 and SECRET not in r.stderr + r.stdout and "not valid YAML" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("text,key", [
    ("mode: backup\nmode: restore\n", "mode"),
    ("mode: backup\nsource:\n  amqp_url: amqp://a\n  amqp_url: amqp://b\n", "amqp_url"),
])
def test_duplicate_keys_are_an_error_naming_the_key(tmp_path, text, key):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=rf"duplicate key '{key}'"):
        load_config(p)


def test_billion_laughs_is_refused_with_bounded_memory(tmp_path):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    p = tmp_path / "c.yaml"
    p.write_text("mode: backup\n" + "\n".join(lines) + "\n")
    r, peak = rbak_measured("restore", "--config", str(p))
    assert r.returncode != 0 and "Traceback" not in r.stderr and "Configuration error" in r.stderr
    assert peak < BOUND_MIB


def test_a_password_on_the_command_line_is_warned_about_and_env_or_file_accepted(tmp_path, rmq310, vhost_factory):
    vh = vhost_factory(rmq310)
    store = tmp_path / "s"
    store.mkdir()
    url = rmq310.amqp_url("/")
    base = ["restore", "--path", f"file://{store}", "--backup-id", "none", "--dry-run",
            "--management-url", rmq310.management_url]
    r = rbak(*base, "--target-url", url)
    assert "password on the command line" in r.stderr and "RBAK_TARGET_URL" in r.stderr
    assert "guest:guest" not in r.stderr
    r = rbak(*base, env={"RBAK_TARGET_URL": url})
    assert "password on the command line" not in r.stderr
    f = tmp_path / "url"
    f.write_text(url + "\n")
    r = rbak(*base, "--target-url-file", str(f))
    assert "password on the command line" not in r.stderr
    r = rbak(*base, "--target-url-file", str(tmp_path / "missing"))
    assert r.returncode != 0 and "--target-url-file" in r.stderr
    assert vh


def test_vvv_logs_no_authorization_header(s3_bucket, tmp_path):
    r = rbak("-vvv", "list", "--path", str(s3_bucket))
    assert r.returncode == 0, r.stderr[-2000:]
    log = r.stderr
    assert "botocore" in log  # the debug logs are there...
    assert "AWS4-HMAC-SHA256 Credential" not in log and "Signature=" not in log.replace("Signature=***", "")
    key = os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key:
        assert key not in log
    r = rbak("-vv", "list", "--path", str(s3_bucket))  # rbak's own debug log only
    assert r.returncode == 0, r.stderr[-2000:]
    assert "DEBUG botocore" not in r.stderr and "DEBUG urllib3" not in r.stderr


def test_log_lines_escape_control_characters():
    import logging

    from rbak.base.logsafe import SafeLogFilter

    rec = logging.LogRecord("x", logging.WARNING, __file__, 1, "queue %r %s", ("a\x00b", "c\x1b[2J\nFAKE"), None)
    SafeLogFilter().filter(rec)
    msg = rec.getMessage()
    assert "\x00" not in msg and "\x1b" not in msg and "\n" not in msg
    assert "\\x1b" in msg and "\\x0a" in msg
