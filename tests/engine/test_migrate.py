"""docs/migrate.md, run as a user runs it: back up one tenant's vhost on a 3.10.8 or 4.0.5 cluster with
the CLI, restore it into 4.3.6 with its definitions, check every message is there in the source's order,
that the other tenant's vhost and users never reach the target, and that clients can switch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


def rbak(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "rbak", *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"rbak {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


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

        store = tmp_path / "store"
        (tmp_path / "backup.yaml").write_text(f"""
mode: backup
backup_id: migration-1
source:
  amqp_url: {src.amqp_url('/')}
  management_url: {src.management_url}
  stream_port: {src.stream_port}
  queues: {{vhosts: ["{tenant}"]}}
storage: {{backend: filesystem, path: "{store}"}}
offset_storage: {{path: "{tmp_path / 'state.db'}"}}
""")
        out = json.loads(rbak("backup", "--config", str(tmp_path / "backup.yaml"), "--json").stdout)
        assert out["completed"] and {q["name"]: q["messages"] for q in out["queues"]} == {n: N for n in queues}
        # the backup holds this tenant only: no other vhost, no foreign user, no password hash of theirs
        stored_defs = decompress((store / "migration-1" / "definitions" / "definitions.json.zst").read_bytes(),
                                 Compression.ZSTD).decode()
        assert other not in stored_defs and foreign not in stored_defs and app in stored_defs
        defs = rbak("definitions-export", "--config", str(tmp_path / "backup.yaml")).stdout
        assert other not in defs and foreign not in defs and tenant in defs

        (tmp_path / "restore.yaml").write_text(f"""
mode: restore
backup_id: migration-1
target:
  amqp_url: {rmq43.amqp_url('/')}
  management_url: {rmq43.management_url}
storage: {{backend: filesystem, path: "{store}"}}
restore:
  restore_definitions: true
  vhost_mapping: {{"{tenant}": "{target_vhost}"}}
  checkpoint_state: "{tmp_path / 'restore.db'}"
""")
        report = rbak("restore", "--config", str(tmp_path / "restore.yaml")).stdout
        assert rmq43.vhost_exists(target_vhost)
        # every adaptation printed, and stored next to the backup
        assert f"{target_vhost}/classic-v1" in report and "x-queue-version 1 declared as 2" in report
        reports = list((store / "migration-1" / "restore").glob("report-*.json"))
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
