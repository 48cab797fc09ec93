"""docs/migrate.md, run as a user runs it: its config files and commands (host names, ports, vhost names and
paths replaced) back up one tenant's vhost on a 3.10.8 or 4.0.5 cluster, restore it into 4.3.6 with its
definitions; every message is there in the source's order, the other tenant's vhost and users never reach
the target, existing target users are kept, and clients can switch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from rbak.format.compression import Compression, decompress
from support.brokers import Broker, unique_name

CLASSIC = {"classic-lazy": {"x-queue-mode": "lazy"}, "classic-v1": {"x-queue-version": 1},
           "mirrored-q": {}}
QUORUM = {"quorum-limited": {"x-queue-type": "quorum", "x-delivery-limit": 5},
          "quorum-prio": {"x-queue-type": "quorum"}}
STREAM = {"stream-q": {"x-queue-type": "stream"}}
N = 30


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "migrate.md"


def rbak(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, f"rbak {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def guide_blocks() -> tuple[dict[str, str], list[list[str]]]:
    """The guide's config files (``# name`` on a block's first line) and its ``rbak`` commands, in order."""
    text = GUIDE.read_text()
    files, commands = {}, []
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", text, re.S):
        if lang == "yaml":
            first, rest = body.split("\n", 1)
            files[first.lstrip("# ").strip()] = rest
        elif lang == "sh":
            for line in body.splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("rbak "):
                    commands.append(line.split()[1:])
    return files, commands


def fill(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in text, f"docs/migrate.md no longer contains {old!r}: update the guide and this test together"
        text = text.replace(old, new)
    return text


def _props(name: str, i: int) -> pika.BasicProperties:
    prio = (i * 7) % 10 if name == "quorum-prio" else None
    return pika.BasicProperties(delivery_mode=2, priority=prio, message_id=f"{name}-{i}")


def _publish(b: Broker, vhost: str, queues: dict[str, dict], sent: dict[str, list[bytes]] | None = None) -> None:
    with b.connect(vhost) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for name, args in queues.items():
            ch.queue_declare(name, durable=True, arguments=args)
            bodies = sent[name] if sent else [f"{name}-{i}".encode() for i in range(N)]
            for i, body in enumerate(bodies):
                ch.basic_publish("", name, body, _props(name, int(body.rsplit(b"-", 1)[1])), mandatory=True)


def _drain(b: Broker, vhost: str, name: str) -> list[bytes]:
    if name in STREAM:
        return [m.body for m in b.read_stream(vhost, name)]
    return [m.body for m in b.drain_queue(vhost, name)]


def _user(b: Broker, name: str, password: str, vhost: str | None) -> None:
    b.api("PUT", f"/api/users/{name}", json={"password": password, "tags": ""})
    if vhost:
        b.api("PUT", f"/api/permissions/{vhost}/{name}", json={"configure": ".*", "write": ".*", "read": ".*"})


def _can_login(b: Broker, vhost: str, user: str, password: str) -> bool:
    params = pika.ConnectionParameters(b.host, b.amqp_port, vhost, pika.PlainCredentials(user, password),
                                       connection_attempts=1, socket_timeout=10)
    try:
        pika.BlockingConnection(params).close()
        return True
    except pika.exceptions.AMQPError:
        return False


@pytest.mark.parametrize("source_name", ["rmq310", "rmq40"])
def test_migrate_one_tenant_into_4_3(source_name, request, rmq43, vhost_factory, tmp_path):
    src: Broker = request.getfixturevalue(source_name)
    tenant, other = vhost_factory(src, "mig"), vhost_factory(src, "other")
    target_vhost = unique_name("migrated")  # created by the restore
    app, foreign, shared = unique_name("app"), unique_name("foreign"), unique_name("shared")
    try:
        _user(src, app, "app-pw", tenant)
        _user(src, foreign, "foreign-pw", other)
        _user(src, shared, "source-pw", tenant)
        _user(rmq43, shared, "target-pw", None)  # already on the target: must stay as it is
        queues = {**CLASSIC, **QUORUM, **STREAM}
        if source_name == "rmq310":  # classic mirroring (gone in 4.0) by policy, as 3.x clusters ran it
            src.api("PUT", f"/api/policies/{tenant}/mirror-all", json={
                "pattern": "^mirrored", "apply-to": "queues", "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"}})
            src.api("PUT", f"/api/policies/{tenant}/lazy-limit", json={
                "pattern": "^classic-lazy$", "apply-to": "queues", "priority": 1,
                "definition": {"ha-mode": "all", "max-length": 100000}})
        _publish(src, tenant, queues)
        _publish(src, other, {"other-q": {}})

        files, commands = guide_blocks()
        assert set(files) == {"backup.yaml", "restore.yaml"}
        assert commands == [["backup", "--config", "backup.yaml"],
                            ["validate", "--path", "./migration-backups", "--backup-id", "migration-1", "--deep"],
                            ["restore", "--config", "restore.yaml", "--dry-run"], ["restore", "--config", "restore.yaml"]]
        (tmp_path / "backup.yaml").write_text(fill(files["backup.yaml"], {
            "old-rabbit.internal:5672": f"{src.host}:{src.amqp_port}",
            "old-rabbit.internal:15672": f"{src.host}:{src.mgmt_port}",
            "stream_port: 5552": f"stream_port: {src.stream_port}", "vhosts: [orders]": f'vhosts: ["{tenant}"]'}))
        (tmp_path / "restore.yaml").write_text(fill(files["restore.yaml"], {
            "new-rabbit.internal:5672": f"{rmq43.host}:{rmq43.amqp_port}",
            "new-rabbit.internal:15672": f"{rmq43.host}:{rmq43.mgmt_port}",
            "{orders: orders}": f'{{"{tenant}": "{target_vhost}"}}'}))
        env = {"OLD_RABBIT_USER": src.user, "OLD_RABBIT_PASSWORD": src.password,
               "NEW_RABBIT_USER": rmq43.user, "NEW_RABBIT_PASSWORD": rmq43.password}
        out = [rbak(*cmd, cwd=tmp_path, env=env).stdout for cmd in commands[:3]]
        store = tmp_path / "migration-backups"
        manifest = json.loads((store / "migration-1" / "manifest.json").read_text())
        assert {q["name"]: q["message_count"] for q in manifest["queues"]} == {n: N for n in queues}
        assert "is valid" in out[1]
        assert "would publish 180" in out[2] and f"{target_vhost}/classic-v1" in out[2]
        assert not rmq43.vhost_exists(target_vhost)  # the dry run changed nothing
        report = rbak(*commands[3], cwd=tmp_path, env=env).stdout
        # the backup holds this tenant only: no other vhost, no foreign user, no password hash of theirs
        stored_defs = decompress((store / "migration-1" / "definitions" / "definitions.json.zst").read_bytes(),
                                 Compression.ZSTD).decode()
        assert other not in stored_defs and foreign not in stored_defs and app in stored_defs
        defs = rbak("definitions-export", "--config", "backup.yaml", cwd=tmp_path, env=env).stdout
        assert other not in defs and foreign not in defs and tenant in defs
        assert rmq43.vhost_exists(target_vhost)
        # every adaptation printed, and stored next to the backup
        assert f"{target_vhost}/classic-v1" in report and "x-queue-version 1 declared as 2" in report
        reports = list((store / "migration-1" / "restore").glob("report-*.json"))  # the dry run stores none
        assert len(reports) == 1
        stored = json.loads(reports[0].read_text())["definitions"]
        assert stored["imported"] and stored["target_version"].startswith("4.3")
        adapted = {(c["name"], c["change"]) for c in stored["adapted"]}
        if source_name == "rmq310":
            assert (f"{target_vhost}/mirror-all", "dropped: it held only ha-mode, ha-sync-mode") in adapted
            assert (f"{target_vhost}/lazy-limit", "removed ha-mode") in adapted
            pol = rmq43.api("GET", f"/api/policies/{target_vhost}/lazy-limit")
            assert pol["definition"] == {"max-length": 100000}
            assert rmq43.api("GET", f"/api/policies/{target_vhost}/mirror-all", ok=(404,)).get("error")
        assert (f"{target_vhost}/classic-v1", "x-queue-version 1 declared as 2") in adapted

        # the other tenant is not on the target, nor its user; the shared user kept its target password
        assert not rmq43.vhost_exists(other)
        assert rmq43.api("GET", f"/api/users/{foreign}", ok=(404,)).get("error")
        assert _can_login(rmq43, target_vhost, shared, "target-pw")
        assert not _can_login(rmq43, target_vhost, shared, "source-pw")
        # switch clients: the application's own user and password work on the target
        assert _can_login(rmq43, target_vhost, app, "app-pw")

        types = {q["name"]: q["type"] for q in rmq43.list_queues(target_vhost)}
        assert types == {**{n: "classic" for n in CLASSIC}, **{n: "quorum" for n in QUORUM}, "stream-q": "stream"}
        # every message there, in the source's order: the source drained after the backup (rbak left it
        # as it was) gives that order; on 4.3 a quorum queue with priorities delivers by priority, so
        # the restored queue must read exactly like a control queue fed the source's order on 4.3
        control = vhost_factory(rmq43, "control")
        for name in queues:
            source_order = _drain(src, tenant, name)
            assert sorted(source_order) == sorted(f"{name}-{i}".encode() for i in range(N))
            restored = _drain(rmq43, target_vhost, name)
            if name in QUORUM:
                _publish(rmq43, control, {name: queues[name]}, {name: source_order})
                assert restored == _drain(rmq43, control, name), name
            else:
                assert restored == source_order, name
    finally:
        for b, u in ((src, app), (src, foreign), (src, shared), (rmq43, shared), (rmq43, app)):
            b.api("DELETE", f"/api/users/{u}", ok=(404,))
        rmq43.delete_vhost(target_vhost)
