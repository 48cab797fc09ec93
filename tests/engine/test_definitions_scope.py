"""Definitions import against real brokers: scoping, existing users, adapting to the target's capabilities,
strict refusal, and the automatic rollback of a failed import."""

from __future__ import annotations


import pika
import pytest
from support.restores import options_for

from rbak.backup.definitions import scope_definitions
from rbak.config import QueueSelection
from rbak.errors import IncompatibleDefinitionsError, ManagementApiError
from rbak.broker.management import ManagementClient
from rbak.restore.compat import TargetCapabilities, adapt_definitions, capabilities_of, detect_capabilities
from rbak.restore.definitions import apply_definitions
from support.brokers import unique_name

FULL = {"queue": ".*", "configure": ".*", "write": ".*", "read": ".*"}


def _client(b):
    return ManagementClient(b.management_url, b.user, b.password, role="target")


def _perm(user, vhost):
    return {"user": user, "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}


def _hash_of(b, password):
    """A real password hash of this broker's algorithm (from a throwaway user)."""
    name = unique_name("hash")
    b.api("PUT", f"/api/users/{name}", json={"password": password, "tags": ""})
    try:
        u = b.api("GET", f"/api/users/{name}")
        return u["password_hash"], u["hashing_algorithm"]
    finally:
        b.api("DELETE", f"/api/users/{name}", ok=(404,))


def _login(b, vhost, user, password):
    try:
        pika.BlockingConnection(pika.ConnectionParameters(
            b.host, b.amqp_port, vhost, pika.PlainCredentials(user, password), connection_attempts=1)).close()
        return True
    except pika.exceptions.AMQPError:
        return False


def test_capabilities_come_from_the_management_api(broker):
    with _client(broker) as c:
        caps = capabilities_of(c)
    assert caps.version == broker.api("GET", "/api/overview")["rabbitmq_version"]
    major_minor = tuple(int(x) for x in caps.version.split(".")[:2])
    assert caps.classic_mirroring == (major_minor < (4, 0))
    assert caps.cqv1 == (major_minor < (4, 3))
    if major_minor >= (4, 3):
        assert not caps.global_qos  # denied by default on 4.3


def test_adapt_only_what_the_target_refuses():
    doc = {"policies": [
        {"vhost": "v", "name": "ha", "pattern": ".*", "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"}},
        {"vhost": "v", "name": "mixed", "pattern": "^x", "definition": {"ha-mode": "exactly", "ha-params": 2, "max-length": 5}},
        {"vhost": "v", "name": "plain", "pattern": "^y", "definition": {"message-ttl": 1000}}],
        "queues": [{"vhost": "v", "name": "v1", "durable": True, "arguments": {"x-queue-version": 1}},
                   {"vhost": "v", "name": "tmp", "durable": False, "auto_delete": False, "arguments": {}},
                   {"vhost": "v", "name": "qq", "durable": True, "arguments": {"x-queue-type": "quorum"}}],
        "bindings": [{"vhost": "v", "source": "amq.fanout", "destination": "tmp", "destination_type": "queue"}]}
    same, changes, skipped = adapt_definitions(doc, TargetCapabilities(version="3.10.8"))
    assert same == doc and not changes and not skipped
    old = detect_capabilities({"rabbitmq_version": "4.3.6"}, [{"name": "rabbitmq_4.3.0"}],
                              [{"name": "classic_queue_mirroring", "state": "denied", "deprecation_phase": "removed"},
                               {"name": "transient_nonexcl_queues", "state": "denied",
                                "deprecation_phase": "permitted_by_default"}])
    out, changes, skipped = adapt_definitions(doc, old)
    assert [p["name"] for p in out["policies"]] == ["mixed", "plain"]
    assert out["policies"][0]["definition"] == {"max-length": 5}
    assert {q["name"]: (q["durable"], q["arguments"]) for q in out["queues"]} == {
        "v1": (True, {"x-queue-version": 2}), "tmp": (True, {}), "qq": (True, {"x-queue-type": "quorum"})}
    assert [(c.kind, c.name) for c in changes] == [("policies", "v/ha"), ("policies", "v/mixed"),
                                                   ("queues", "v/v1"), ("queues", "v/tmp")]
    out, changes, skipped = adapt_definitions(doc, old, "skip")
    assert skipped == {("v", "tmp")} and [q["name"] for q in out["queues"]] == ["v1", "qq"] and not out["bindings"]
    assert doc["queues"][1]["durable"] is False  # the input is untouched


def test_backup_scope_keeps_one_tenant():
    doc = {"rabbit_version": "3.10.8",
           "users": [{"name": "a"}, {"name": "b"}, {"name": "admin"}],
           "vhosts": [{"name": "A"}, {"name": "B"}],
           "permissions": [_perm("a", "A"), _perm("b", "B")], "topic_permissions": [],
           "parameters": [{"vhost": "A", "component": "operator_policy", "name": "op", "value": {}},
                          {"vhost": "B", "component": "vhost-limits", "name": "limits", "value": {}}],
           "global_parameters": [{"name": "cluster_name", "value": "x"}],
           "policies": [{"vhost": "A", "name": "p"}, {"vhost": "B", "name": "p"}],
           "queues": [{"vhost": "A", "name": "keep", "arguments": {}}, {"vhost": "A", "name": "tmp.1", "arguments": {}},
                      {"vhost": "B", "name": "keep", "arguments": {}}],
           "exchanges": [{"vhost": "A", "name": "x"}, {"vhost": "B", "name": "x"}],
           "bindings": [{"vhost": "A", "source": "x", "destination": "keep", "destination_type": "queue"},
                        {"vhost": "A", "source": "x", "destination": "tmp.1", "destination_type": "queue"}]}
    out = scope_definitions(doc, QueueSelection(vhosts=["A"], exclude=["tmp.*"]))
    assert [u["name"] for u in out["users"]] == ["a"] and [v["name"] for v in out["vhosts"]] == ["A"]
    assert {k: [o.get("name", o.get("user")) for o in out[k]] for k in
            ("permissions", "parameters", "global_parameters", "policies", "queues", "exchanges")} == {
        "permissions": ["a"], "parameters": ["op"], "global_parameters": [], "policies": ["p"], "queues": ["keep"],
        "exchanges": ["x"]}
    assert [b["destination"] for b in out["bindings"]] == ["keep"] and out["rabbit_version"] == "3.10.8"


def test_existing_users_are_kept_unless_overwrite_users(broker, vhost):
    user = unique_name("existing")
    broker.api("PUT", f"/api/users/{user}", json={"password": "target-pw", "tags": "monitoring"})
    try:
        h, alg = _hash_of(broker, "backup-pw")
        doc = {"users": [{"name": user, "password_hash": h, "hashing_algorithm": alg, "tags": "administrator"}],
               "vhosts": [{"name": "src"}], "permissions": [_perm(user, "src"), _perm("guest", "src")]}
        broker.api("PUT", f"/api/permissions/{vhost}/{user}", json={"configure": "^own", "write": "^own", "read": "^own"})
        snaps = []
        with _client(broker) as c:
            res = apply_definitions(doc, "doc", options_for(broker, "x", vhost_mapping=(("src", vhost),)), c,
                                    lambda data: snaps.append(data) or "snap")
        assert res.imported and any(user in k for k in res.kept_users)
        assert broker.api("GET", f"/api/users/{user}")["tags"] in ("monitoring", ["monitoring"])
        assert _login(broker, vhost, user, "target-pw") and not _login(broker, vhost, user, "backup-pw")
        assert broker.api("GET", f"/api/permissions/{vhost}/{user}")["configure"] == "^own"
        with _client(broker) as c:
            apply_definitions(doc, "doc", options_for(broker, "x", vhost_mapping=(("src", vhost),),
                                                      overwrite_users=True), c, lambda data: "snap")
        assert _login(broker, vhost, user, "backup-pw")
        assert broker.api("GET", f"/api/permissions/{vhost}/{user}")["configure"] == ".*"
    finally:
        broker.api("DELETE", f"/api/users/{user}", ok=(404,))


def test_strict_refuses_before_touching_the_target(rmq43):
    new_vhost = unique_name("strict")
    doc = {"vhosts": [{"name": new_vhost}],
           "policies": [{"vhost": new_vhost, "name": "ha", "pattern": ".*", "apply-to": "queues", "priority": 0,
                         "definition": {"ha-mode": "all"}}],
           "queues": [{"vhost": new_vhost, "name": "v1", "durable": True, "auto_delete": False,
                       "arguments": {"x-queue-version": 1}}]}
    snaps = []
    with _client(rmq43) as c, pytest.raises(IncompatibleDefinitionsError) as e:
        apply_definitions(doc, "defs.json", options_for(rmq43, "x", definitions_strict=True), c,
                          lambda data: snaps.append(data) or "snap")
    msg = str(e.value)
    assert f"policies '{new_vhost}/ha'" in msg and "ha-mode" in msg and f"queues '{new_vhost}/v1'" in msg
    assert "2 definition(s)" in msg and not snaps and not rmq43.vhost_exists(new_vhost)


def test_failed_import_is_rolled_back_from_the_snapshot(broker, vhost):
    new_vhost, new_user, existing = unique_name("rb"), unique_name("rbuser"), unique_name("rbexisting")
    broker.api("PUT", f"/api/users/{existing}", json={"password": "keep-pw", "tags": ""})
    try:
        h, alg = _hash_of(broker, "other-pw")
        doc = {"users": [{"name": new_user, "password_hash": h, "hashing_algorithm": alg, "tags": ""},
                         {"name": existing, "password_hash": h, "hashing_algorithm": alg, "tags": "administrator"}],
               "vhosts": [{"name": new_vhost}],
               "permissions": [_perm(new_user, new_vhost), _perm(existing, vhost)],
               "policies": [{"vhost": vhost, "name": "created-then-undone", "pattern": "^p", "apply-to": "queues",
                             "priority": 0, "definition": {"max-length": 10}}],
               "queues": [{"vhost": vhost, "name": "bad", "durable": True, "auto_delete": False,
                           "arguments": {"x-queue-type": "no-such-type"}}]}
        snaps = []
        with _client(broker) as c, pytest.raises(ManagementApiError) as e:
            apply_definitions(doc, "defs.json", options_for(broker, "x", overwrite_users=True), c,
                              lambda data: snaps.append(data) or "the-snapshot-key")
        msg = str(e.value)
        assert "rolled back" in msg and "'the-snapshot-key'" in msg and "no message was restored" in msg
        assert "removed 4 object(s) the import had created" in msg and "restored 1 replaced object(s)" in msg
        assert "could NOT undo" not in msg and len(snaps) == 1
        assert not broker.vhost_exists(new_vhost)
        assert broker.api("GET", f"/api/users/{new_user}", ok=(404,)).get("error")
        assert broker.api("GET", f"/api/policies/{vhost}/created-then-undone", ok=(404,)).get("error")
        assert broker.api("GET", f"/api/permissions/{vhost}/{existing}", ok=(404,)).get("error")
        assert broker.api("GET", f"/api/users/{existing}")["tags"] in ("", [])
        assert _login(broker, vhost, "guest", "guest") and not _login(broker, "/", existing, "other-pw")
        broker.api("PUT", f"/api/permissions/{vhost}/{existing}", json=FULL)
        assert _login(broker, vhost, existing, "keep-pw")
    finally:
        for u in (new_user, existing):
            broker.api("DELETE", f"/api/users/{u}", ok=(404,))
        broker.delete_vhost(new_vhost)


def test_transient_queues_declared_durable_or_skipped_with_their_messages(broker, vhost, tmp_path, monkeypatch):
    """A target denying transient non-exclusive queues (deprecated feature transient_nonexcl_queues, denied
    by configuration on a 4.x node; the CI nodes permit it, so the detected capability is overridden)."""
    import dataclasses
    import json

    from support.restores import build_backup, make_records, storage_for

    from rbak.format.compression import Compression, compress
    from rbak.format.manifest import DefinitionsBackup
    from rbak.format.layout import BackupLayout
    from rbak.restore import definitions, run_restore

    storage = storage_for(tmp_path)
    bodies = [b"t-%d" % i for i in range(5)]
    manifest = build_backup(storage, "tr", [(vhost, "tmp-q", "classic", make_records(vhost, "tmp-q", bodies, every_type=False)),
                                            (vhost, "keep-q", "classic", make_records(vhost, "keep-q", bodies[:3], every_type=False))])
    doc = {"vhosts": [{"name": vhost}], "permissions": [], "users": [],
           "queues": [{"name": "tmp-q", "vhost": vhost, "durable": False, "auto_delete": False, "arguments": {}},
                      {"name": "keep-q", "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}}],
           "bindings": [{"source": "amq.fanout", "vhost": vhost, "destination": "tmp-q", "destination_type": "queue",
                         "routing_key": "", "arguments": {}}]}
    key = BackupLayout("tr").definitions(Compression.ZSTD)
    storage.put(key, compress(json.dumps(doc).encode(), Compression.ZSTD))
    manifest.definitions = DefinitionsBackup(key=key, vhost_count=1, queue_count=2, exchange_count=0, size_bytes=1)
    storage.put(BackupLayout("tr").manifest, manifest.to_json())
    real = definitions.capabilities_of
    monkeypatch.setattr(definitions, "capabilities_of",
                        lambda c: dataclasses.replace(real(c), transient_nonexcl_queues=False))

    summary = run_restore(storage, options_for(broker, "tr", restore_definitions=True, transient_queues="skip"))
    by = {q.source_queue: q for q in summary.queues}
    assert by["tmp-q"].status == "skipped" and "restore.transient_queues: skip" in by["tmp-q"].error
    assert broker.queue_info(vhost, "tmp-q") is None
    assert by["keep-q"].status == "restored" and broker.message_count(vhost, "keep-q") == 3
    changes = [(c.kind, c.change) for c in summary.definitions.adapted]
    assert ("queues", "skipped (restore.transient_queues: skip)") in changes and ("bindings", "skipped with its transient queue") in changes

    broker.drain_queue(vhost, "keep-q")
    summary = run_restore(storage, options_for(broker, "tr", restore_definitions=True))
    by = {q.source_queue: q for q in summary.queues}
    assert by["tmp-q"].status == "restored" and by["tmp-q"].confirmed == 5
    assert broker.queue_info(vhost, "tmp-q")["durable"] is True
    assert [m.body for m in broker.drain_queue(vhost, "tmp-q")] == bodies
    assert ("queues", f"{vhost}/tmp-q", "declared durable") in {(c.kind, c.name, c.change) for c in summary.definitions.adapted}
