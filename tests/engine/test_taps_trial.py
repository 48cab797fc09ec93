"""A new user's trial of queue taps (docs/archive.md, "Queue taps") on RabbitMQ 4.3.6, from the docs alone: the
mistakes a user makes, each with what rbak says and its exit status. Findings F1-F7 of the trial (fixed), and the
ones left open as strict xfails that pass once they are fixed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pika
import pytest
import yaml
from support.brokers import wait_until
from support.archives import Archiver, archive_config, declare_stream, fs_storage, generations, rbak

ROOT = Path(__file__).resolve().parents[2]
HEAD = "rbak: Configuration error: "


def bind(broker, vhost: str, exchange: str, queue: str, key: str) -> None:
    broker.api("POST", f"/api/bindings/{vhost}/e/{exchange}/q/{queue}", json={"routing_key": key, "arguments": {}})


def bind_keys(broker, vhost: str, queue: str) -> list[tuple[str, str]]:
    return sorted((b["source"], b["routing_key"]) for b in broker.api("GET", f"/api/queues/{vhost}/{queue}/bindings")
                  if b["source"])


def shop(broker, vhost: str) -> None:
    """Two quorum queues with similar names (orders, orders-eu) bound to a topic exchange, and a stream."""
    broker.api("PUT", f"/api/exchanges/{vhost}/ex", json={"type": "topic", "durable": True})
    for q in ("orders", "orders-eu"):
        broker.declare_queue(vhost, q, arguments={"x-queue-type": "quorum"})
        bind(broker, vhost, "ex", q, f"{q}.#")
    declare_stream(broker, vhost, "events.s")


def archive(cfg: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rbak", "archive", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=120)


def refused(cfg: Path) -> str:
    r = archive(cfg)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    return r.stderr.splitlines()[-1]


def taps_of(broker, vhost: str) -> list[str]:
    return sorted(q["name"] for q in broker.list_queues(vhost) if q["name"].startswith("rbak.tap."))


def test_a_user_s_mistakes_in_archive_taps_are_refused_naming_what_is_wrong(rmq43, vhost_factory, tmp_path):
    broker, vhost = rmq43, vhost_factory(rmq43)
    shop(broker, vhost)
    store = fs_storage(tmp_path)

    def cfg(queues: dict | None = None, **taps) -> Path:
        c = archive_config(tmp_path, broker, vhost, store, name="orders", taps=taps or None)
        d = json.loads(c.read_text())
        d["source"]["queues"].update(queues or {})
        if not taps:
            del d["archive"]["taps"]
        c.write_text(json.dumps(d))
        return c

    # F1: a queue both include and exclude name was "a name that names no queue"
    assert refused(cfg(include=["orders"], exclude=["orders"])) == (
        f"{HEAD}archive.taps.include: 'orders': queue 'orders' in vhost {vhost!r} excluded by archive.taps.exclude "
        "['orders']; nothing was archived")
    assert refused(cfg(include=["orders*"], exclude=["orders*"])) == (
        f"{HEAD}archive.taps.include: 'orders*': queue 'orders' in vhost {vhost!r}, queue 'orders-eu' in vhost "
        f"{vhost!r} excluded by archive.taps.exclude ['orders*']; nothing was archived")
    # F2: with taps, a typo in source.queues.include was accepted (the taps made the selection non-empty)
    assert refused(cfg({"include": ["evnts.*"]}, include=["orders"])) == (
        f"{HEAD}source.queues.include: 'evnts.*' matches no stream on {broker.management_url} in vhost(s) "
        f"{vhost!r} (closest: 'events.s'); nothing was archived")
    # F3: a quorum queue selected as if it were a stream: the message points at archive.taps
    assert refused(cfg({"include": ["orders"]})) == (
        f"{HEAD}source.queues.include: 'orders' matches no stream on {broker.management_url} in vhost(s) {vhost!r} "
        "('orders' is a quorum queue: archive it through archive.taps); nothing was archived")
    # F14: an exact name that names nothing beside a pattern that matches was ignored (rbak backup refuses it)
    assert refused(cfg({"include": ["events.*", "evnts.x"]})) == (
        f"{HEAD}source.queues.include: 'evnts.x' matches no stream on {broker.management_url} in vhost(s) {vhost!r} "
        "(closest: 'events.s'); nothing was archived")
    # the taps alone, selected as documented, are not refused: nothing is declared by a refusal above
    assert taps_of(broker, vhost) == []
    # a typo and a tap on a stream, as documented
    assert refused(cfg(include=["ordrs"])) == (
        f"{HEAD}archive.taps.include: 'ordrs' names no queue in vhost(s) {vhost!r} (closest: 'orders', 'orders-eu'); "
        "nothing was archived")
    assert refused(cfg(include=["events.s"])) == (
        f"{HEAD}archive.taps.include: 'events.s': queue 'events.s' in vhost {vhost!r} is a stream: streams are "
        "archived as they are (select it in source.queues); nothing was archived")
    # F4: a queue under rbak.tap. was tapped as rbak.tap.rbak.tap.x
    broker.declare_queue(vhost, "rbak.tap.mine")
    assert refused(cfg(include=["rbak.tap.mine"])) == (
        f"{HEAD}archive.taps.include: 'rbak.tap.mine': queue 'rbak.tap.mine' in vhost {vhost!r} is named under "
        "'rbak.tap.' (rbak's names: a tap's name, not a queue to tap); nothing was archived")
    # F13: a tap listed twice was accepted silently
    r = archive(cfg(include=["orders", "orders-eu", "orders"]))
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == "  - archive.taps.include: 'orders' listed twice", r.stderr
    # F5: the minimum of max_length_bytes was printed as 1e+06
    r = archive(cfg(include=["orders"], max_length_bytes=10))
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        "  - archive.taps.max_length_bytes: must be an integer >= 1000000, got 10"), r.stderr
    assert taps_of(broker, vhost) == ["rbak.tap.mine"]  # the user's own queue; no refusal declared a tap
    assert not (tmp_path / "store").exists()


def test_a_glob_skips_an_exclusive_reply_queue_and_taps_the_rest(rmq43, vhost_factory, tmp_path):
    """F6: include ['orders*'] was refused as long as an application held an exclusive queue the glob matched."""
    broker, vhost = rmq43, vhost_factory(rmq43)
    shop(broker, vhost)
    broker.declare_queue(vhost, "orders-us", arguments={"x-queue-type": "quorum"})  # published to straight only
    log = tmp_path / "archiver.log"
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url(vhost))) as conn:
        conn.channel().queue_declare("orders.reply", exclusive=True)
        arc = Archiver(archive_config(tmp_path, broker, vhost, fs_storage(tmp_path), name="orders",
                                      taps={"include": ["orders*"]}), log).running()
        # F11: a tapped queue deleted under the archiver: its bindings read as an empty list (not a 404), so the
        # tap was unbound "as the queue no longer is bound so" and the documented warning never came
        broker.api("DELETE", f"/api/queues/{vhost}/orders-eu")
        wait_until(lambda: "the queue is gone" in log.read_text(), timeout=30, what="the deleted queue said")
        summary = arc.stop()
    text = log.read_text()
    assert (f"tap 'rbak.tap.orders-eu' of queue 'orders-eu' in vhost {vhost!r}: the queue is gone; its tap stream "
            "stays, with the bindings it had") in text and "unbound" not in text, text[-3000:]
    assert bind_keys(broker, vhost, "rbak.tap.orders-eu") == [("ex", "orders-eu.#")]
    # F12: a tap of a queue bound to no exchange records nothing, ever; only the generic warning said so
    assert (f"tap 'rbak.tap.orders-us' of queue 'orders-us' in vhost {vhost!r}: the queue is bound to no exchange "
            "but the default one, so the tap records nothing until it is (what is published straight to the queue "
            "is not recorded)") in text
    assert text.count("the queue is bound to no exchange") == 1  # said once, not at every listing
    assert (f"archive.taps.include: 'orders*': queue 'orders.reply' in vhost {vhost!r} is exclusive: it belongs "
            "to one connection and goes with it; not tapped") in log.read_text()
    assert taps_of(broker, vhost) == ["rbak.tap.orders", "rbak.tap.orders-eu", "rbak.tap.orders-us"]
    assert [s["name"] for s in summary["streams"]] == ["events.s", "rbak.tap.orders", "rbak.tap.orders-eu",
                                                       "rbak.tap.orders-us"]


@pytest.fixture
def tapped(rmq43, vhost_factory, tmp_path):
    """An archive of the tap of ``orders`` holding o-0..o-2 (and orders-eu's messages not tapped)."""
    broker, vhost = rmq43, vhost_factory(rmq43)
    tmp = tmp_path
    shop(broker, vhost)
    store = fs_storage(tmp)
    arc = Archiver(archive_config(tmp, broker, vhost, store, name="orders", taps={"include": ["orders"]}),
                   tmp / "archiver.log").running()
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url(vhost))) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("ex", "orders.new", f"o-{i}".encode())
            ch.basic_publish("ex", "orders-eu.new", f"eu-{i}".encode())
    wait_until(lambda: sum(g["total_messages"] for g in generations(str(tmp / "store"), "orders")) >= 3,
               timeout=60, what="the tap archived")
    arc.stop()
    return broker, vhost, store, tmp


def restore(tmp: Path, broker, store: str, dst: str, restore_section: dict, *extra: str) -> subprocess.CompletedProcess:
    cfg = tmp / f"restore-{dst}.yaml"
    cfg.write_text(yaml.safe_dump({
        "mode": "restore", "storage": json.loads(store),
        "target": {"amqp_url": broker.amqp_url(dst), "management_url": broker.management_url},
        "restore": restore_section}))
    return rbak("restore", "--config", str(cfg), "--archive", "orders", "--pitr-end", "recoverable", "--no-progress",
                *extra, check=False)


def test_restoring_a_tap_by_the_wrong_name_or_by_both_names_is_refused(tapped, vhost_factory):
    broker, vhost, store, tmp = tapped
    fresh = vhost_factory(broker)
    broker.declare_queue(fresh, "orders-copy", arguments={"x-queue-type": "quorum"})
    # F10: the documented `rbak restore --config restore.yaml --pitr-end recoverable` needs a backup_id in the
    # file, and --archive was refused with --config: it now finds the newest generation in the config's storage
    # (restore() passes --archive orders); a backup_id in the file as well is refused
    cfg = tmp / "named.yaml"
    cfg.write_text(yaml.safe_dump({"mode": "restore", "backup_id": "orders.x", "storage": json.loads(store),
                                   "target": {"amqp_url": broker.amqp_url(fresh)}}))
    r = rbak("restore", "--config", str(cfg), "--archive", "orders", check=False)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        f"{HEAD}--archive orders: {cfg} names a backup_id; give one of the two"), r.stderr
    # F7: mapped by both names to two queues, one mapping was ignored silently
    r = restore(tmp, broker, store, fresh, {"queue_mapping": {f"{vhost}/orders": "orders-copy",
                                                              f"{vhost}/rbak.tap.orders": "orders"}})
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        f"{HEAD}restore.queue_mapping: keys '{vhost}/rbak.tap.orders' and '{vhost}/orders' both map the tap "
        f"'{vhost}/rbak.tap.orders' of queue 'orders', to 'orders' and 'orders-copy': keep one"), r.stderr
    # F8: restore.queues named the tapped queue: refused with "closest: 'orders'", the very name typed
    r = restore(tmp, broker, store, fresh, {"queues": {"include": ["orders"]}})
    gen = generations(str(tmp / "store"), "orders")[-1]["backup_id"]
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        f"{HEAD}restore.queues.include: 'orders' matches no queue of backup {gen!r}; it names the queue a tap "
        f"recorded: select the tap by its archived name ('{vhost}/rbak.tap.orders'); its queues: "
        f"'{vhost}/events.s', '{vhost}/rbak.tap.orders'"), r.stderr
    # the documented way: select by the archived name, map by the queue's name
    r = restore(tmp, broker, store, fresh, {"queues": {"include": ["rbak.tap.orders"]},
                                            "queue_mapping": {f"{vhost}/orders": "orders-copy"}})
    assert r.returncode == 0, r.stderr
    assert [m.body for m in broker.drain_queue(fresh, "orders-copy")] == [b"o-0", b"o-1", b"o-2"]
    # an --archive name typo names the archives the storage holds (exit 1: a storage error, not exit 2)
    r = rbak("restore", "--path", str(tmp / "store"), "--archive", "ordres", "--target-url", broker.amqp_url(fresh),
             "--management-url", broker.management_url, check=False)
    assert r.returncode == 1 and r.stderr.splitlines()[-1] == (
        f"rbak: Storage error: --archive ordres: no generation of archive 'ordres' at "
        f"file://{tmp / 'store'}; archives there: 'orders'"), r.stderr


def test_the_crd_refuses_a_blank_tap_pattern(kube_api):
    """F9: spec.taps.include: [""] passed kubectl apply; the archiver's pod then refused it at start."""
    kube_api.kubectl("apply", "-f", str(ROOT / "crds"))
    kube_api.wait_established("rabbitmqbackups.rbak.io", "rabbitmqrestores.rbak.io", "rabbitmqarchives.rbak.io")
    obj = {"apiVersion": "rbak.io/v1alpha1", "kind": "RabbitMQArchive", "metadata": {"name": "blank-tap"},
           "spec": {"broker": {"rabbitmqClusterReference": {"name": "rabbitmq"}},
                    "queues": {"vhosts": ["prod"], "include": ["events.*"]},
                    "storage": {"s3": {"bucket": "rabbitmq-archive", "region": "eu-west-1",
                                       "credentialsSecretRef": {"name": "rbak-s3"}}},
                    "taps": {"include": [""]}}}
    r = kube_api.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)
    assert r.returncode == 1 and 'spec.taps.include[0]: Invalid value: "": spec.taps.include[0] in body should be ' \
        "at least 1 chars long" in r.stderr, r.stderr
    # F13: a tap listed twice was accepted (and deduplicated) by the CRD and by rbak archive alike
    obj["spec"]["taps"] = {"include": ["orders", "orders"]}
    r = kube_api.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)
    assert r.returncode == 1 and 'spec.taps.include[1]: Duplicate value: "orders"' in r.stderr, r.stderr
