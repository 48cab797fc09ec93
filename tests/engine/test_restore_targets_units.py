"""Issue 43's decisions as pure functions: where a restore goes, what names nothing, which backups
count for retention, which encryption configs are refused (no broker)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from rbak.config import Config, ConnectionConfig, QueueSelection
from rbak.errors import ConfigError
from rbak.format.manifest import BackupManifest, QueueBackup
from rbak.restore.options import RestoreOptions
from rbak.restore.plan import check_selection, plan_restore, resolve_target_vhosts
from rbak.repo.retention import RetentionPolicy, StoredBackup, plan_retention


def manifest(*queues: tuple[str, str, int], bid: str = "b") -> BackupManifest:
    m = BackupManifest(backup_id=bid, created_at=1, completed_at=2)
    m.queues = [QueueBackup(name=n, vhost=v, queue_type="classic", message_count=c) for v, n, c in queues]
    m.recompute_totals()
    return m


def opts(url: str = "amqp://h:5672", **kw) -> RestoreOptions:
    return RestoreOptions("b", target=ConnectionConfig(amqp_url=url), **kw)


def targets(m: BackupManifest, o: RestoreOptions) -> list[tuple[str, str, str, str]]:
    o2, _ = resolve_target_vhosts(m, o)
    return [(p.source_vhost, p.source_queue, p.target_vhost, p.target_queue) for p in plan_restore(m, o2)]


def test_the_url_vhost_is_the_target_of_a_single_vhost_backup():
    m = manifest(("prod", "q", 3))
    assert targets(m, opts()) == [("prod", "q", "prod", "q")]  # a URL without a vhost: the backup's own
    assert targets(m, opts("amqp://h:5672/")) == [("prod", "q", "prod", "q")]
    assert targets(m, opts("amqp://h:5672/staging")) == [("prod", "q", "staging", "q")]
    assert targets(m, opts("amqp://h:5672/%2f")) == [("prod", "q", "/", "q")]
    _, where = resolve_target_vhosts(m, opts("amqp://u:secret@h:5672/staging"))
    assert where.lines() == ["vhost 'prod' -> 'staging' (the vhost of the target URL)"]
    # a mapping that agrees is fine; one that disagrees is refused naming both
    assert targets(m, opts("amqp://h/staging", vhost_mapping=(("prod", "staging"),)))[0][2] == "staging"
    with pytest.raises(ConfigError, match=r"names vhost 'staging' but restore.vhost_mapping maps 'prod' to 'qa'") as e:
        resolve_target_vhosts(m, opts("amqp://u:secret@h/staging", vhost_mapping=(("prod", "qa"),)))
    assert "secret" not in str(e.value)


def test_a_url_vhost_for_several_source_vhosts_is_refused_unless_one_is_selected():
    m = manifest(("a", "q", 1), ("b", "q", 1))
    with pytest.raises(ConfigError, match=r"names vhost 'x', but backup 'b' restores 2 vhosts \('a', 'b'\)"):
        resolve_target_vhosts(m, opts("amqp://h/x"))
    assert targets(m, opts(vhost_mapping=(("a", "x"), ("b", "y")))) == [("a", "q", "x", "q"), ("b", "q", "y", "q")]
    one = opts("amqp://h/x", queues=QueueSelection(vhosts=["b"]))
    assert targets(m, one) == [("b", "q", "x", "q")]


def test_mapping_keys_and_includes_that_name_nothing_are_refused_with_the_closest_names():
    m = manifest(("nu-src", "orders", 1), ("nu-src", "payments", 1))
    with pytest.raises(ConfigError, match=r"restore.vhost_mapping: key 'nu-scr' names no vhost of backup 'b' "
                                          r"\(closest: 'nu-src'\)"):
        check_selection(m, opts(vhost_mapping=(("nu-scr", "nu-mapt"),)))
    with pytest.raises(ConfigError, match=r"restore.queue_mapping: key 'nu-src/order' names no queue.*closest: "
                                          r"'nu-src/orders'"):
        check_selection(m, opts(queue_mapping=(("nu-src/order", "x"),)))
    with pytest.raises(ConfigError, match=r"restore.queues.include: 'nope\*' matches no queue of backup 'b'"):
        check_selection(m, opts(queues=QueueSelection(include=["nope*"])))
    with pytest.raises(ConfigError, match=r"restore.queues.vhosts: 'other' names no vhost"):
        check_selection(m, opts(queues=QueueSelection(vhosts=["other"])))
    with pytest.raises(ConfigError, match=r"restore.queues: selects none of the 2 queue\(s\)"):
        check_selection(m, opts(queues=QueueSelection(include=["orders"], exclude=["ord*"])))
    # names that exist pass, bare or qualified; a definitions vhost counts for the vhost mapping
    check_selection(m, opts(vhost_mapping=(("nu-src", "x"),), queue_mapping=(("orders", "o2"), ("nu-src/payments", "p2")),
                            queues=QueueSelection(include=["pay*"])))
    check_selection(m, opts(vhost_mapping=(("defs-only", "x"),)), definition_vhosts={"defs-only"})


def test_retention_counts_only_backups_holding_data():
    day = 86_400_000
    backups = [StoredBackup("good", 1 * day, True)] + [
        StoredBackup(f"empty-{i}", (2 + i) * day, True, holds_data=False) for i in range(3)]
    now = datetime.fromtimestamp(10 * 86400, tz=timezone.utc)
    plan = plan_retention(backups, RetentionPolicy(keep_last=1), now)
    assert plan.keep == ["good"] and plan.delete == ["empty-0", "empty-1", "empty-2"]
    assert "one of the last 1" in plan.lines()[0]
    assert plan.lines()[1] == "delete empty-0: empty (holds no message): keep rules count only backups holding data"
    # max_age alone: the newest backup holding data survives whatever its age
    aged = plan_retention(backups, RetentionPolicy(max_age=timedelta(days=1)), now)
    assert "good" in aged.keep and aged.delete == ["empty-0", "empty-1", "empty-2"]


def test_a_manifest_says_empty_or_definitions_only_and_keeps_rust_bytes_otherwise():
    assert manifest(("v", "q", 0)).content == "empty" and manifest().content == "empty"
    assert manifest(("v", "q", 1)).content == ""
    d = manifest()
    d.definitions_only = True
    back = BackupManifest.from_json(d.to_json())
    assert back.definitions_only and back.content == "definitions-only" and back.holds_data
    assert b"definitions_only" not in manifest(("v", "q", 1)).to_json()


BASE = {"mode": "backup", "source": {"amqp_url": "amqp://h"}, "storage": {"backend": "memory"}}


@pytest.mark.parametrize("enc,named", [
    ({"key_id": "k1"}, "encryption.key_id"),
    ({"keys_env": "KEYS"}, "encryption.keys_env"),
    ({"envelope": True, "kms_key_id": "alias/x"}, "encryption.kms_key_id, encryption.envelope"),
])
def test_a_backup_config_naming_a_key_without_enabled_is_refused(enc, named):
    with pytest.raises(ConfigError, match=f"encryption.enabled: is false but {named} is set: this backup would be "
                                          "stored in plaintext"):
        Config.from_dict({**BASE, "encryption": enc}, env={})
    Config.from_dict({**BASE, "mode": "restore", "backup_id": "b", "target": {"amqp_url": "amqp://h"},
                      "encryption": enc}, env={})  # reading encrypted backups needs the keys, not `enabled`


def test_definitions_only_is_explicit_and_excludes_a_queue_selection():
    Config.from_dict({**BASE, "backup": {"definitions_only": True}}, env={})
    with pytest.raises(ConfigError, match="source.queues: not used with backup.definitions_only"):
        Config.from_dict({**BASE, "source": {"amqp_url": "amqp://h", "queues": {"include": ["a"]}},
                          "backup": {"definitions_only": True}}, env={})
    with pytest.raises(ConfigError, match="backup.definitions_only: needs backup.include_definitions"):
        Config.from_dict({**BASE, "backup": {"definitions_only": True, "include_definitions": False}}, env={})


def test_a_restore_exclude_that_names_nothing_is_refused():
    """A new user's trial: 'exclude: [ordres]' restored exactly the queue meant to stay out."""
    m = manifest(("v", "orders", 1), ("v", "payments", 1))
    with pytest.raises(ConfigError, match=r"restore.queues.exclude: 'ordres' matches no queue of backup 'b' "
                                          r"\(closest: 'orders'"):
        check_selection(m, opts(queues=QueueSelection(exclude=["ordres"])))
    check_selection(m, opts(queues=QueueSelection(exclude=["ord*"])))
