"""Issue 15: the log filter of the CLI (credentials and control characters, ``rbak.base.logsafe``) is
installed by every entry point: the operator's startup, the Spark jobs' drivers and their
executors' workers. Each is run in its own process (logging is per process) with a real
botocore DEBUG record (a signed S3 request to moto: ``Authorization: AWS4-HMAC-SHA256
Credential=..., Signature=...``) and a queue name holding ESC, NUL and a newline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

EMIT = """
import logging, boto3
def emit():
    logging.getLogger("botocore").setLevel(logging.DEBUG)
    s3 = boto3.client("s3", endpoint_url=ENDPOINT, region_name="us-east-1")
    s3.create_bucket(Bucket="logsafe-probe")
    s3.put_object(Bucket="logsafe-probe", Key="k", Body=b"x")
    logging.getLogger("rbak.backup.engine").warning("queue %r in vhost %s failed", "evil\\x1b[2J\\x00q", "v\\nFAKE LINE")
"""

ENTRY = {
    "operator": """
import os, kopf
async def operator(**kw):  # what the operator's startup runs once the log filter is in place
    emit()
kopf.operator = operator
os.environ["RBAK_OPERATOR_STANDALONE"] = "1"  # no leader election: no cluster here
from rbak_operator.__main__ import main
main()
""",
    **{job: f"""
import rbak_spark.session as session
from rbak.errors import RbakError
def fake_session(*a, **k):
    emit()
    raise RbakError("stop here")
session.get_session = fake_session
import rbak.repo.catalog, rbak.storage.url  # validate_job checks --path and --backup-id before Spark starts
rbak.storage.url.open_existing_storage = lambda *a, **k: None
import types  # restore_job reads the manifest before Spark starts too: one of no archive
rbak.repo.catalog.load_manifest = lambda *a, **k: types.SimpleNamespace(archive=None)
from rbak_spark.{job} import main
assert main(ARGV) != 0
""" for job in ("restore_job", "validate_job", "export_job")},
    "spark-executor": """
import logging, sys
from rbak_spark.executor import storage_for
storage_for("memory://")
h = logging.StreamHandler(sys.stderr)  # a handler set up after the worker started (as Spark's are)
logging.getLogger().addHandler(h)
logging.getLogger().setLevel(logging.DEBUG)
emit()
""",
}

ARGV = {
    "restore_job": ["--path", "file:///nonexistent", "--backup-id", "b", "--target-amqp-url", "amqp://u:p@h/"],
    "validate_job": ["--path", "file:///nonexistent", "--backup-id", "b"],
    "export_job": ["--path", "file:///nonexistent", "--backup-id", "b", "--output", "/nonexistent/out"],
}


@pytest.mark.parametrize("entry", sorted(ENTRY))
def test_entry_point_filters_secrets_and_control_characters(entry, moto_s3, tmp_path):
    script = f"ENDPOINT = {moto_s3!r}\nARGV = {ARGV.get(entry)!r}\n" + EMIT + textwrap.dedent(ENTRY[entry])
    env = dict(os.environ, RBAK_OPERATOR_LOG_LEVEL="DEBUG", RBAK_LOG_LEVEL="DEBUG",
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "operator"), str(REPO / "spark")]))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stderr
    assert "botocore" in log and "Authorization" in log  # the signed request was logged...
    assert not re.search(r"Signature=[0-9a-f]{16}", log)  # ...without its signature
    assert "AWS4-HMAC-SHA256 Credential=" not in log
    assert "\x1b" not in log and "\x00" not in log and "\nFAKE LINE" not in log
    assert "evil\\x1b[2J" in log and "FAKE LINE" in log  # escaped, still readable, on its own line
