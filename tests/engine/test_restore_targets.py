"""Issue 43, as a new user meets it: a restore goes where the user points it, a backup of nothing is
not a backup, a dry run proves it can read, restores work from read-only storage, and nothing is
silently plaintext. Every test runs `rbak` as a user does (a subprocess) against the real brokers."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from support.backups import fast_publish
from support.restores import consume_all, declare
from support.require import require_tool

BODIES = [b"probe-%d" % i for i in range(10)]


def rbak(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, "COLUMNS": "250"})  # `list`'s table on one line


def write_yaml(path: Path, doc: dict) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def backup_cfg(broker, vhost: str, store: Path, backup_id: str, tmp: Path, include: list[str] | None = None,
               **backup) -> dict:
    queues: dict = {"vhosts": [vhost]}
    if include is not None:
        queues["include"] = include
    return {"mode": "backup", "backup_id": backup_id,
            "source": {"amqp_url": broker.amqp_url(vhost), "management_url": broker.management_url,
                       "stream_port": broker.stream_port, "queues": queues},
            "storage": {"backend": "filesystem", "path": str(store)},
            "backup": {"include_definitions": True, **backup},
            "offset_storage": {"path": str(tmp / f"state-{backup_id}.db"), "sync_interval_secs": 0}}


def restore_cfg(broker, store: Path, backup_id: str, url: str | None = None, **restore) -> dict:
    return {"mode": "restore", "backup_id": backup_id,
            "target": {"amqp_url": url or broker.server_url(), "management_url": broker.management_url},
            "storage": {"backend": "filesystem", "path": str(store)},
            "restore": {"publish_mode": "queue", **restore}}


def backed_up(broker, vhost: str, tmp: Path, backup_id: str = "good", **kw) -> Path:
    """A real backup (`rbak backup`) of ``vhost`` holding queue q with BODIES; returns the store."""
    store = tmp / "store"
    declare(broker, vhost, "q")
    if broker.message_count(vhost, "q") == 0:
        fast_publish(broker, vhost, "q", BODIES)
    r = rbak("backup", "--config", write_yaml(tmp / f"b-{backup_id}.yaml",
                                              backup_cfg(broker, vhost, store, backup_id, tmp, **kw)))
    assert r.returncode == 0, r.stderr
    return store


def one_line_error(r: subprocess.CompletedProcess) -> str:
    lines = [x for x in r.stderr.splitlines() if x.startswith("rbak: ")]
    assert len(lines) == 1, r.stderr
    return lines[0]


# --------------------------------------------------------------------------
# 1. The vhost of the target URL is the target.
# --------------------------------------------------------------------------


def test_the_vhost_in_the_target_url_is_where_the_messages_go(broker, vhost_factory, tmp_path):
    src, dst = vhost_factory(broker), vhost_factory(broker)
    store = backed_up(broker, src, tmp_path)
    declare(broker, dst, "q")
    path = f"file://{store}"
    common = ["restore", "--path", path, "--backup-id", "good", "--management-url", broker.management_url]
    dry = rbak(*common, "--target-url", broker.amqp_url(dst), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"target: vhost {src!r} -> {dst!r} (the vhost of the target URL)" in dry.stdout
    assert f"{src}/q -> {dst}/q: dry-run, would publish 10" in dry.stdout
    assert f"restore plan: {src}/q -> {dst}/q" in dry.stderr  # said before anything would be published
    r = rbak(*common, "--target-url", broker.amqp_url(dst))
    assert r.returncode == 0, r.stderr
    assert f"{src}/q -> {dst}/q: restored, confirmed 10" in r.stdout, r.stdout
    assert [d.body for d in consume_all(broker, dst, "q", 10)] == BODIES
    # the original is untouched: still exactly what it held (a backup never takes a message away)
    assert broker.message_count(src, "q") == 10
    assert [b for b in broker.read_bodies(src, "q")] == BODIES


def test_with_definitions_the_url_vhost_is_created_and_the_original_is_not(broker, vhost_factory, tmp_path):
    src = vhost_factory(broker)
    store = backed_up(broker, src, tmp_path)
    dst = f"test-dst-{uuid.uuid4().hex[:10]}"
    try:
        r = rbak("restore", "--path", f"file://{store}", "--backup-id", "good", "--definitions",
                 "--target-url", broker.amqp_url(dst), "--management-url", broker.management_url, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert broker.vhost_exists(dst) and [d.body for d in consume_all(broker, dst, "q", 10)] == BODIES
        assert broker.message_count(src, "q") == 10  # the original vhost: not written to
        assert f"target: vhost {src!r} -> {dst!r}" in r.stdout
    finally:
        broker.delete_vhost(dst)


def test_a_url_vhost_and_a_mapping_that_disagree_are_refused_naming_both(broker, vhost_factory, tmp_path):
    src, dst, other = vhost_factory(broker), vhost_factory(broker), vhost_factory(broker)
    store = backed_up(broker, src, tmp_path)
    declare(broker, dst, "q")
    declare(broker, other, "q")
    cfg = write_yaml(tmp_path / "r.yaml", restore_cfg(broker, store, "good", broker.amqp_url(dst),
                                                      vhost_mapping={src: other}))
    r = rbak("restore", "--config", cfg)
    assert r.returncode == 2, r.stderr
    line = one_line_error(r)
    assert f"names vhost {dst!r} but restore.vhost_mapping maps {src!r} to {other!r}" in line
    assert "guest:guest" not in line
    assert broker.message_count(dst, "q") == 0 and broker.message_count(other, "q") == 0


def test_a_url_vhost_for_a_multi_vhost_backup_is_refused(broker, vhost_factory, tmp_path):
    a, b = vhost_factory(broker), vhost_factory(broker)
    for v in (a, b):
        declare(broker, v, "q")
        fast_publish(broker, v, "q", BODIES)
    store = tmp_path / "store"
    cfg = backup_cfg(broker, a, store, "two", tmp_path)
    cfg["source"]["queues"]["vhosts"] = [a, b]
    assert rbak("backup", "--config", write_yaml(tmp_path / "b.yaml", cfg)).returncode == 0
    r = rbak("restore", "--path", f"file://{store}", "--backup-id", "two", "--target-url", broker.amqp_url(a),
             "--management-url", broker.management_url, "--allow-non-empty")
    assert r.returncode == 2
    line = one_line_error(r)
    assert f"names vhost {a!r}" in line and "restores 2 vhosts" in line and "vhost_mapping" in line
    assert broker.message_count(a, "q") == 10 and broker.message_count(b, "q") == 10


def test_a_missing_target_vhost_is_named_in_one_line(broker, vhost_factory, tmp_path):
    src = vhost_factory(broker)
    store = backed_up(broker, src, tmp_path)
    missing = f"test-missing-{uuid.uuid4().hex[:8]}"
    r = rbak("restore", "--path", f"file://{store}", "--backup-id", "good", "--target-url",
             broker.amqp_url(missing), "--management-url", broker.management_url)
    assert r.returncode == 1
    assert f"target vhost {missing!r} does not exist" in one_line_error(r)
    assert "access to the vhost" not in r.stderr and not broker.vhost_exists(missing)


# --------------------------------------------------------------------------
# 2. Mappings and selections that name nothing are refused.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("restore,expect", [
    ({"vhost_mapping": {"SRC-typo": "elsewhere"}}, "restore.vhost_mapping: key 'SRC-typo' names no vhost"),
    ({"queue_mapping": {"qq": "elsewhere"}}, "restore.queue_mapping: key 'qq' names no queue"),
    ({"queues": {"include": ["nope*"]}}, "restore.queues.include: 'nope*' matches no queue"),
])
def test_a_mapping_or_include_that_names_nothing_exits_2(broker, vhost_factory, tmp_path, restore, expect):
    src = vhost_factory(broker)
    store = backed_up(broker, src, tmp_path)
    dst = vhost_factory(broker)
    declare(broker, dst, "q")
    restore = json.loads(json.dumps(restore).replace("SRC", src))
    for dry in (True, False):
        cfg = write_yaml(tmp_path / "r.yaml", restore_cfg(broker, store, "good", dry_run=dry, **restore))
        r = rbak("restore", "--config", cfg)
        assert r.returncode == 2, (r.stdout, r.stderr)
        line = one_line_error(r)
        assert expect.replace("SRC", src) in line, line
        if "mapping" in expect:
            assert "(closest: " in line  # the names that do exist
    assert broker.message_count(src, "q") == 10 and broker.message_count(dst, "q") == 0


# --------------------------------------------------------------------------
# 3. A backup of nothing is not a backup, and never displaces one.
# --------------------------------------------------------------------------


def test_the_probe_sequence_empty_backups_never_win(broker, vhost_factory, tmp_path):
    src = vhost_factory(broker)
    store = backed_up(broker, src, tmp_path)  # "good": 10 messages
    path = f"file://{store}"
    # a broken pattern: refused, nothing written
    r = rbak("backup", "--config", write_yaml(tmp_path / "nope.yaml",
                                              backup_cfg(broker, src, store, "nope", tmp_path, include=["nope*"])))
    assert r.returncode == 2 and "source.queues.include: 'nope*' matches no queue" in r.stderr, r.stderr
    assert not (store / "nope").exists()
    # a selection that finds an empty queue: a complete backup, listed as empty
    declare(broker, src, "idle")
    r = rbak("backup", "--config", write_yaml(tmp_path / "empty.yaml",
                                              backup_cfg(broker, src, store, "empty", tmp_path, include=["idle"])))
    assert r.returncode == 0, r.stderr
    assert "holds no message" in r.stderr
    listed = {e["backup_id"]: e for e in json.loads(rbak("list", "--path", path, "--format", "json").stdout)}
    assert listed["empty"]["content"] == "empty" and listed["good"]["content"] == ""
    assert listed["empty"]["encrypted"] is False
    assert "empty: no message" in rbak("list", "--path", path).stdout
    # restore without an id: the newest backup holding data, saying which and why
    dst = vhost_factory(broker)
    declare(broker, dst, "q")
    r = rbak("restore", "--path", path, "--target-url", broker.amqp_url(dst), "--management-url",
             broker.management_url)
    assert r.returncode == 0, r.stderr
    assert "restoring the newest complete backup 'good'" in r.stderr and "'empty'" in r.stderr
    assert [d.body for d in consume_all(broker, dst, "q", 10)] == BODIES
    # prune keeps the last backup with data, whatever the empty ones
    p = rbak("prune", "--path", path, "--keep-last", "1", "--dry-run")
    assert p.returncode == 0, p.stderr
    assert "keep   good: one of the last 1" in p.stdout, p.stdout
    assert "delete empty: empty (holds no message)" in p.stdout, p.stdout
    # an intentional definitions-only backup: said by the config, listed as such, counted
    r = rbak("backup", "--config", write_yaml(tmp_path / "defs.yaml", {
        **backup_cfg(broker, src, store, "defs", tmp_path), "source": {
            "amqp_url": broker.amqp_url(src), "management_url": broker.management_url},
        "backup": {"include_definitions": True, "definitions_only": True}}))
    assert r.returncode == 0, r.stderr
    listed = {e["backup_id"]: e for e in json.loads(rbak("list", "--path", path, "--format", "json").stdout)}
    assert listed["defs"]["content"] == "definitions-only"
    p = rbak("prune", "--path", path, "--keep-last", "1", "--dry-run")
    assert "keep   defs: one of the last 1" in p.stdout and "keep   good" not in p.stdout, p.stdout


# --------------------------------------------------------------------------
# 4. A dry run proves it can read.
# --------------------------------------------------------------------------


def test_a_dry_run_with_the_wrong_key_bytes_fails_as_the_restore_would(broker, vhost_factory, tmp_path):
    src = vhost_factory(broker)
    good_ring = tmp_path / "good.yaml"
    good_ring.write_text(yaml.safe_dump({"k1": base64.b64encode(os.urandom(32)).decode()}))
    wrong_ring = tmp_path / "wrong.yaml"
    wrong_ring.write_text(yaml.safe_dump({"k1": base64.b64encode(os.urandom(32)).decode()}))
    store = tmp_path / "store"
    declare(broker, src, "q")
    fast_publish(broker, src, "q", BODIES)
    cfg = backup_cfg(broker, src, store, "enc", tmp_path)
    cfg["encryption"] = {"enabled": True, "key_id": "k1", "keys_file": str(good_ring)}
    assert rbak("backup", "--config", write_yaml(tmp_path / "b.yaml", cfg)).returncode == 0
    dst = vhost_factory(broker)
    declare(broker, dst, "q")
    common = ["restore", "--path", f"file://{store}", "--backup-id", "enc", "--target-url", broker.amqp_url(dst),
              "--management-url", broker.management_url, "--keys-file", str(wrong_ring)]
    dry, real = rbak(*common, "--dry-run"), rbak(*common)
    assert dry.returncode == real.returncode == 1, (dry.stdout, dry.stderr)
    assert "would publish" not in dry.stdout
    error = one_line_error(dry)[len("rbak: "):]
    assert "cannot decrypt with key id 'k1': wrong key" in error
    assert error in real.stderr and "q: failed" in real.stdout  # the real restore's own error
    assert broker.message_count(dst, "q") == 0
    ok = rbak(*common[:-1], str(good_ring), "--dry-run")
    assert ok.returncode == 0 and "would publish 10" in ok.stdout, ok.stderr
    described = json.loads(rbak("describe", "--path", f"file://{store}", "--backup-id", "enc", "--format",
                                "json").stdout)
    assert described["encrypted"] is True
    assert "yes (key k1)" in rbak("list", "--path", f"file://{store}").stdout


# --------------------------------------------------------------------------
# 5. Restores from read-only storage.
# --------------------------------------------------------------------------


@pytest.fixture
def read_only(tmp_path):
    """``make(dir)`` -> the same directory, bind-mounted read-only (unmounted afterwards)."""
    require_tool("mount")
    mounts: list[Path] = []

    def make(src: Path) -> Path:
        ro = tmp_path / f"ro-{len(mounts)}"
        ro.mkdir()
        subprocess.run(["mount", "--bind", str(src), str(ro)], check=True)
        mounts.append(ro)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        return ro

    yield make
    for m in mounts:
        subprocess.run(["umount", str(m)], check=False)


def test_definitions_and_data_restore_from_a_read_only_directory(broker, vhost_factory, tmp_path, read_only):
    src = vhost_factory(broker)
    store = backed_up(broker, src, tmp_path)
    ro = read_only(store)
    assert subprocess.run(["touch", str(ro / "x")], capture_output=True).returncode != 0  # really read-only
    dst = f"test-ro-{uuid.uuid4().hex[:10]}"
    work = tmp_path / "work"
    work.mkdir()
    try:
        r = rbak("restore", "--path", f"file://{ro}", "--backup-id", "good", "--definitions", "--target-url",
                 broker.amqp_url(dst), "--management-url", broker.management_url, cwd=work)
        assert r.returncode == 0, r.stderr
        assert [d.body for d in consume_all(broker, dst, "q", 10)] == BODIES
        written = [line.split("wrote: ", 1)[1] for line in r.stdout.splitlines() if line.startswith("wrote: ")]
        assert len(written) == 2 and all(w.startswith(str(work / "rbak-restore")) for w in written), r.stdout
        assert all(Path(w).is_file() for w in written)
        assert "stored" in r.stderr and "locally instead" in r.stderr
    finally:
        broker.delete_vhost(dst)


@pytest.fixture
def iam_moto(tmp_path):
    """A moto server of its own that enforces IAM (the shared one allows everything): returns
    (endpoint, writer keys, read-only keys); the reader may only get and list, as a DR role."""
    import socket
    import time

    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "6"}  # the IAM setup below, then every call is checked
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup")

        def user(name: str, actions: list[str]) -> tuple[str, str]:
            iam.create_user(UserName=name)
            iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
            k = iam.create_access_key(UserName=name)["AccessKey"]
            return k["AccessKeyId"], k["SecretAccessKey"]

        yield endpoint, user("writer", ["s3:*"]), user("reader", ["s3:GetObject", "s3:ListBucket"])
    finally:
        proc.terminate()
        proc.wait(30)


def test_definitions_and_data_restore_with_read_only_s3_credentials(broker, vhost_factory, tmp_path, iam_moto):
    import boto3
    from botocore.config import Config as BotoConfig

    endpoint, writer, reader = iam_moto
    bucket = f"ro-{uuid.uuid4().hex[:10]}"
    s3w = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=writer[0],
                       aws_secret_access_key=writer[1], config=BotoConfig(s3={"addressing_style": "path"}))
    s3w.create_bucket(Bucket=bucket)

    def storage(keys: tuple[str, str]) -> dict:
        return {"backend": "s3", "bucket": bucket, "endpoint": endpoint, "path_style": True, "region": "us-east-1",
                "access_key_id": keys[0], "secret_access_key": keys[1]}

    src = vhost_factory(broker)
    declare(broker, src, "q")
    fast_publish(broker, src, "q", BODIES)
    cfg = backup_cfg(broker, src, tmp_path, "good", tmp_path)
    cfg["storage"] = storage(writer)
    r = rbak("backup", "--config", write_yaml(tmp_path / "b.yaml", cfg))
    assert r.returncode == 0, r.stderr
    before = sorted(o["Key"] for o in s3w.list_objects_v2(Bucket=bucket)["Contents"])
    dst = f"test-ros3-{uuid.uuid4().hex[:10]}"
    work = tmp_path / "work"
    work.mkdir()
    rcfg = restore_cfg(broker, tmp_path, "good", broker.amqp_url(dst), restore_definitions=True)
    rcfg["storage"] = storage(reader)
    try:
        r = rbak("restore", "--config", write_yaml(tmp_path / "r.yaml", rcfg), cwd=work)
        assert r.returncode == 0, r.stderr
        assert [d.body for d in consume_all(broker, dst, "q", 10)] == BODIES
        assert broker.message_count(src, "q") == 10
        written = [line.split("wrote: ", 1)[1] for line in r.stdout.splitlines() if line.startswith("wrote: ")]
        assert len(written) == 2 and all(Path(w).is_file() and w.startswith(str(work)) for w in written), r.stdout
        assert "AccessDenied" in r.stderr or "Access Denied" in r.stderr  # the refusal is said, not hidden
        assert sorted(o["Key"] for o in s3w.list_objects_v2(Bucket=bucket)["Contents"]) == before
    finally:
        broker.delete_vhost(dst)


# --------------------------------------------------------------------------
# 6. No silent plaintext.
# --------------------------------------------------------------------------


def test_a_backup_config_naming_a_key_without_enabled_is_refused(broker, vhost_factory, tmp_path):
    src = vhost_factory(broker)
    ring = tmp_path / "ring.yaml"
    ring.write_text(yaml.safe_dump({"k1": base64.b64encode(os.urandom(32)).decode()}))
    store = tmp_path / "store"
    cfg = backup_cfg(broker, src, store, "plain", tmp_path)
    cfg["encryption"] = {"key_id": "k1", "keys_file": str(ring)}
    r = rbak("backup", "--config", write_yaml(tmp_path / "b.yaml", cfg))
    assert r.returncode == 2
    assert "encryption.enabled: is false but encryption.key_id, encryption.keys_file is set" in r.stderr
    assert not (store / "plain").exists()
