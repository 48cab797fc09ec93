"""Queue taps (``archive.taps``) on the three real brokers: a quorum and a classic queue archived through the
streams ``rbak archive`` declares and binds as the queues are bound, restored into the queues' names in a fresh
vhost; a binding added while archiving is followed, one removed is removed; what is published through the default
exchange is not recorded (and said so); taps that cannot work are refused at start."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from types import SimpleNamespace

import pika
from rbak.archive.archiver import Archiver as ArchiverCore
from rbak.archive.status import archive_status
from rbak.archive.taps import SYNC_SECS
from rbak.broker.management import ManagementClient
from rbak.broker.management import q as segment
from rbak.config.loading import load_config
from rbak.storage import open_storage
from support.brokers import wait_until
from support.archives import Archiver, archive_config, declare_stream, fs_storage, generations, rbak, restore_into


def bind(broker, vhost: str, exchange: str, queue: str, key: str) -> None:
    broker.api("POST", f"/api/bindings/{vhost}/e/{exchange}/q/{queue}", json={"routing_key": key, "arguments": {}})


def bindings(broker, vhost: str, queue: str) -> list[tuple[str, str]]:
    return sorted((b["source"], b["routing_key"]) for b in broker.api("GET", f"/api/queues/{vhost}/{queue}/bindings")
                  if b["source"])


def archived(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in generations(path):
        d = json.loads(rbak("describe", "--path", path, "--backup-id", g["backup_id"], "--format", "json").stdout)
        for q in d["queues"]:
            out[q["name"]] = out.get(q["name"], 0) + q["message_count"]
    return out


def test_taps_record_what_exchanges_route_to_the_queues_and_restore_into_them(broker, vhost_factory, tmp_path):
    vhost, fresh = vhost_factory(broker), vhost_factory(broker)
    broker.api("PUT", f"/api/exchanges/{vhost}/orders", json={"type": "topic", "durable": True})
    broker.api("PUT", f"/api/exchanges/{vhost}/late", json={"type": "fanout", "durable": True})
    broker.declare_queue(vhost, "qq", arguments={"x-queue-type": "quorum"})
    broker.declare_queue(vhost, "cq")
    bind(broker, vhost, "orders", "qq", "q.*")
    bind(broker, vhost, "orders", "qq", "all")
    bind(broker, vhost, "orders", "cq", "c")
    bind(broker, vhost, "orders", "cq", "all")
    declare_stream(broker, vhost, "events")
    broker.publish(vhost, "events", [b"e-0", b"e-1"])
    store = fs_storage(tmp_path)
    path = str(tmp_path / "store")
    log = tmp_path / "archiver.log"
    cfg = archive_config(tmp_path, broker, vhost, store, taps={"include": ["qq", "cq"], "max_age": "1D"})
    arc = Archiver(cfg, log).running()
    text = log.read_text()
    for q in ("qq", "cq"):
        assert (f"tap 'rbak.tap.{q}' of queue {q!r} in vhost {vhost!r} records what exchanges route to the queue; "
                f"messages published straight to it through the default exchange (routing key {q!r}) are NOT "
                "recorded") in text, text[-3000:]
    assert bindings(broker, vhost, "rbak.tap.qq") == [("orders", "all"), ("orders", "q.*")]
    assert bindings(broker, vhost, "rbak.tap.cq") == [("orders", "all"), ("orders", "c")]
    assert broker.queue_info(vhost, "rbak.tap.qq")["arguments"]["x-max-age"] == "1D"

    def pub(exchange: str, key: str, bodies: list[bytes]) -> None:
        broker.publish(vhost, "", bodies, exchange=exchange, routing_key=key)

    pub("orders", "q.1", [b"q-0", b"q-1"])
    pub("orders", "c", [b"c-0"])
    pub("orders", "all", [b"all-0"])
    broker.publish(vhost, "qq", [b"straight-0"])  # the default exchange: in qq, not in its tap
    pub("orders", "q.2", [b"q-2"])
    bind(broker, vhost, "late", "cq", "")  # a binding added while archiving is followed ...
    wait_until(lambda: ("late", "") in bindings(broker, vhost, "rbak.tap.cq"), timeout=60, what="the new binding")
    pub("late", "", [b"late-0"])
    broker.api("DELETE", f"/api/bindings/{vhost}/e/orders/q/cq/c")  # ... and one removed is removed
    wait_until(lambda: ("orders", "c") not in bindings(broker, vhost, "rbak.tap.cq"), timeout=60,
               what="the binding removed")
    pub("orders", "all", [b"all-1"])
    want_qq = [b"q-0", b"q-1", b"all-0", b"q-2", b"all-1"]
    want_cq = [b"c-0", b"all-0", b"late-0", b"all-1"]
    wait_until(lambda: archived(path).get("rbak.tap.qq") == 5 and archived(path).get("rbak.tap.cq") == 4,
               timeout=120, what="the taps archived")
    summary = arc.stop()
    assert summary["errors"] == [], summary["errors"]
    taps = {"rbak.tap.qq": {"queue": "qq", "queue_type": "quorum"}, "rbak.tap.cq": {"queue": "cq",
                                                                                   "queue_type": "classic"}}
    assert {s["name"]: s["tap"] for s in summary["streams"]} == {**taps, "events": None}
    status = archive_status(open_storage(path), "arc").to_json_obj()
    assert {s["name"]: s["tap"] for s in status["streams"]} == {**taps, "events": None}
    text = log.read_text()
    assert (f"tap 'rbak.tap.cq' of queue 'cq' in vhost {vhost!r}: bound to exchange 'late' with routing key '', "
            "as the queue is") in text
    assert (f"tap 'rbak.tap.cq' of queue 'cq' in vhost {vhost!r}: unbound from exchange 'orders' with routing key "
            "'c', as the queue no longer is bound so") in text
    # the source queues were not touched; the taps and their bindings stay after the archiver stopped
    assert broker.message_count(vhost, "qq") == 6 and broker.message_count(vhost, "cq") == 4
    assert bindings(broker, vhost, "rbak.tap.cq") == [("late", ""), ("orders", "all")]
    newest = generations(path)[-1]
    assert {t["queue"]: t["queue_type"] for t in newest["taps"]} == {"qq": "quorum", "cq": "classic"}
    assert "2 queue tap(s)" in rbak("list", "--path", path).stdout
    described = rbak("describe", "--path", path, "--backup-id", newest["backup_id"]).stdout
    assert (f"tap {vhost}/rbak.tap.qq: what was published to quorum queue 'qq' through its bindings (not what "
            "remained in it, nor what came through the default exchange); restored into 'qq' by default") in described

    broker.declare_queue(fresh, "qq", arguments={"x-queue-type": "quorum"})
    broker.declare_queue(fresh, "cq")
    declare_stream(broker, fresh, "events")
    out = restore_into(tmp_path, broker, store, newest["backup_id"], vhost, fresh)
    assert out["ok"], out
    assert [m.body for m in broker.drain_queue(fresh, "qq")] == want_qq  # straight-0 is not there
    assert [m.body for m in broker.drain_queue(fresh, "cq")] == want_cq
    assert [m.body for m in broker.read_stream(fresh, "events")] == [b"e-0", b"e-1"]
    assert broker.queue_info(fresh, "rbak.tap.qq") is None  # restored into the queue's name, not the tap's


def refused(cfg) -> str:
    r = subprocess.run([sys.executable, "-m", "rbak", "archive", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    return r.stderr.splitlines()[-1]


def test_taps_that_cannot_work_are_refused_at_start(broker, vhost, tmp_path):
    declare_stream(broker, vhost, "s")
    broker.declare_queue(vhost, "ad", auto_delete=True)
    broker.declare_queue(vhost, "cq")
    broker.declare_queue(vhost, "rbak.tap.cq")  # a classic queue under the tap's name
    store = fs_storage(tmp_path)
    head = "rbak: Configuration error: archive.taps.include: "
    cases = [
        (["nope"], f"'nope' names no queue in vhost(s) {vhost!r}; nothing was archived"),
        (["cqq"], f"'cqq' names no queue in vhost(s) {vhost!r} (closest: 'cq'); nothing was archived"),
        (["s*"], f"'s*' matches no classic or quorum queue to tap in vhost(s) {vhost!r} (it matches the stream(s) "
                 "'s': streams are archived through source.queues); nothing was archived"),
        (["s"], f"'s': queue 's' in vhost {vhost!r} is a stream: streams are archived as they are (select it in "
                "source.queues); nothing was archived"),
        (["ad"], f"'ad': queue 'ad' in vhost {vhost!r} is auto-delete: it goes with its last consumer; nothing was "
                 "archived"),
        (["zz*"], f"'zz*' matches no classic or quorum queue to tap in vhost(s) {vhost!r}; nothing was archived"),
        (["prod/cq"], f"'prod/cq' names no queue in vhost(s) {vhost!r} (it names vhost 'prod', which is not among "
                      "them: add it to archive.taps.vhosts); nothing was archived"),
        (["cq"], f"queue 'cq' in vhost {vhost!r}: its tap stream's name 'rbak.tap.cq' is taken by a classic queue "
                 "(names under 'rbak.tap.' are rbak's); nothing was archived"),
    ]
    for include, msg in cases:
        assert refused(archive_config(tmp_path, broker, vhost, store, taps={"include": include})) == head + msg
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url(vhost))) as conn:
        conn.channel().queue_declare("mine", exclusive=True)
        assert refused(archive_config(tmp_path, broker, vhost, store, taps={"include": ["mine"]})) == head + (
            f"'mine': queue 'mine' in vhost {vhost!r} is exclusive: it belongs to one connection and goes with it; "
            "nothing was archived")
    assert not (tmp_path / "store").exists()
    assert not [q for q in broker.list_queues(vhost) if q["name"].startswith("rbak.tap.") and q["name"] != "rbak.tap.cq"]


def test_an_archive_drill_compares_a_tap_with_the_live_tap_stream(rmq43, vhost_factory, tmp_path):
    """A drill restores a tap as the stream it is archived as (into the scratch vhost, which has no queue ``qq``)
    and compares it with the live tap; the tapped queue is not read."""
    broker, vhost = rmq43, vhost_factory(rmq43)
    broker.api("PUT", f"/api/exchanges/{vhost}/orders", json={"type": "direct", "durable": True})
    broker.declare_queue(vhost, "qq", arguments={"x-queue-type": "quorum"})
    bind(broker, vhost, "orders", "qq", "k")
    store, path = fs_storage(tmp_path), str(tmp_path / "store")
    cfg = archive_config(tmp_path, broker, vhost, store, taps={"include": ["qq"]})
    arc = Archiver(cfg, tmp_path / "archiver.log").running()
    try:
        broker.publish(vhost, "", [b"d-%d" % i for i in range(20)], exchange="orders", routing_key="k")
        wait_until(lambda: archived(path).get("rbak.tap.qq") == 20, timeout=120, what="the tap archived")
        read_by = int(time.time() * 1000)
        wait_until(lambda: (generations(path)[-1]["archive"]["recoverable_until"] or 0) > read_by + 2500,
                   timeout=120, what="recoverable-until past the look-back")
        r = subprocess.run([sys.executable, "-m", "rbak", "drill", "--config", str(cfg), "--archive", "arc",
                            "--lookback", "2", "--json"], capture_output=True, text=True, timeout=300)
    finally:
        arc.stop()
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    rep = json.loads(r.stdout)
    (st,) = rep["archive"]["streams"]
    assert st["stream"] == "rbak.tap.qq" and st["passed"], st
    assert (st["restored_count"], st["read_back_count"], st["live_count"]) == (20, 20, 20), st
    assert broker.message_count(vhost, "qq") == 20


def test_a_queue_declared_while_archiving_that_a_pattern_matches_gets_a_tap(rmq43, vhost_factory, tmp_path):
    broker, vhost = rmq43, vhost_factory(rmq43)
    broker.api("PUT", f"/api/exchanges/{vhost}/orders", json={"type": "direct", "durable": True})
    broker.declare_queue(vhost, "orders.a")
    bind(broker, vhost, "orders", "orders.a", "a")
    store, path = fs_storage(tmp_path), str(tmp_path / "store")
    log = tmp_path / "archiver.log"
    arc = Archiver(archive_config(tmp_path, broker, vhost, store, taps={"include": ["orders.*"]}), log).running()
    broker.declare_queue(vhost, "orders.b", arguments={"x-queue-type": "quorum"})
    bind(broker, vhost, "orders", "orders.b", "b")
    wait_until(lambda: bindings(broker, vhost, "rbak.tap.orders.b") == [("orders", "b")]
               if broker.queue_info(vhost, "rbak.tap.orders.b") else False, timeout=60, what="the new tap")
    broker.publish(vhost, "", [b"b-0", b"b-1"], exchange="orders", routing_key="b")
    broker.publish(vhost, "", [b"a-0"], exchange="orders", routing_key="a")
    wait_until(lambda: archived(path).get("rbak.tap.orders.b") == 2 and archived(path).get("rbak.tap.orders.a") == 1,
               timeout=120, what="both taps archived")
    summary = arc.stop()
    assert summary["errors"] == [], summary["errors"]
    assert f"declared tap 'rbak.tap.orders.b' of queue 'orders.b' in vhost {vhost!r}" in log.read_text()
    assert {t["queue"]: t["queue_type"] for t in generations(path)[-1]["taps"]} == {"orders.a": "classic",
                                                                                    "orders.b": "quorum"}


class CountingClient(ManagementClient):
    """The management API client, every request it makes recorded (method, path)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, str]] = []

    def _send(self, method, path, timeout=None, **kw):
        self.calls.append((method, path))
        return super()._send(method, path, timeout, **kw)


def test_a_relist_with_taps_lists_the_queues_once_and_still_sees_new_taps_and_deleted_streams(rmq43, vhost_factory,
                                                                                              tmp_path):
    """Each re-list's management API calls, counted: one listing of the vhost's queues serves the taps' sync and
    the stream selection (before: two), plus three per tap (its queue, its queue's and its stream's bindings)."""
    broker, vhost = rmq43, vhost_factory(rmq43)
    broker.api("PUT", f"/api/exchanges/{vhost}/orders", json={"type": "direct", "durable": True})
    broker.declare_queue(vhost, "orders.a")
    bind(broker, vhost, "orders", "orders.a", "a")
    declare_stream(broker, vhost, "events")
    cfg = load_config(archive_config(tmp_path, broker, vhost, fs_storage(tmp_path), taps={"include": ["orders.*"]}))
    arc = ArchiverCore(cfg)
    assert arc.taps is not None
    client = CountingClient.for_connection(cfg.source)
    arc.taps.prepare(client, arc.taps.resolve(client, strict=True))
    present = {f"{s.vhost}/{s.name}" for s in arc._select(client)}
    assert present == {f"{vhost}/events", f"{vhost}/rbak.tap.orders.a"}
    g = SimpleNamespace(listed_ms=None)
    v = segment(vhost)
    listing = ("GET", f"queues/{v}")
    time.sleep(SYNC_SECS)  # the taps' bindings are compared at most this often
    client.calls.clear()
    assert arc._listed(g, client, present) and g.listed_ms is not None  # type: ignore[arg-type]
    assert client.calls == [listing, ("GET", f"queues/{v}/orders.a"), ("GET", f"queues/{v}/orders.a/bindings"),
                            ("GET", f"queues/{v}/rbak.tap.orders.a/bindings")], client.calls
    client.calls.clear()  # within SYNC_SECS: the listing alone
    assert arc._listed(g, client, present)  # type: ignore[arg-type]
    assert client.calls == [listing], client.calls

    # a queue declared mid-run that the pattern matches: its tap is declared, bound, and changes the selection
    broker.declare_queue(vhost, "orders.b", arguments={"x-queue-type": "quorum"})
    bind(broker, vhost, "orders", "orders.b", "b")
    time.sleep(SYNC_SECS)
    client.calls.clear()
    assert not arc._listed(g, client, present)  # type: ignore[arg-type]
    assert bindings(broker, vhost, "rbak.tap.orders.b") == [("orders", "b")]
    assert ("PUT", f"queues/{v}/rbak.tap.orders.b") in client.calls
    assert client.calls.count(listing) == 2 and client.calls[-1] == listing, client.calls  # listed again after it
    present = {f"{s.vhost}/{s.name}" for s in arc._select(client)}
    assert present == {f"{vhost}/events", f"{vhost}/rbak.tap.orders.a", f"{vhost}/rbak.tap.orders.b"}

    # a selected stream deleted: the selection changes, from the one listing
    broker.delete_queue(vhost, "events")
    client.calls.clear()
    assert not arc._listed(g, client, present)  # type: ignore[arg-type]
    assert client.calls == [listing], client.calls
    client.close()


def test_a_glob_passes_over_rbaks_own_queues_and_a_left_over_tap_stays_a_tap(rmq43, vhost_factory, tmp_path):
    """``include: ["*"]`` says nothing of the archive's own lease queue nor of streams; a typo'd exclude is warned
    about; ``source.queues.include: [rbak.tap.*]`` archives the taps only; a tap stream of a queue taken out of
    archive.taps keeps restoring into that queue, said at start; a changed max_age names the setting as not
    applied."""
    vhost = vhost_factory(rmq43)
    rmq43.declare_queue(vhost, "qq", arguments={"x-queue-type": "quorum"})
    rmq43.declare_queue(vhost, "cq")
    declare_stream(rmq43, vhost, "events.s")
    declare_stream(rmq43, vhost, "rbak.tap.cq")  # a tap of a run that tapped cq
    declare_stream(rmq43, vhost, "rbak.tap.qq", **{"x-max-age": "7D", "x-max-length-bytes": 10 * 1024 ** 3})
    log = tmp_path / "archiver.log"
    storage = {"backend": "filesystem", "path": str(tmp_path / "store"), "prefix": "prod"}
    cfg = archive_config(tmp_path, rmq43, vhost, json.dumps(storage), relist_secs=1,
                         taps={"include": ["*"], "exclude": ["cq", "cqq"], "max_age": "1D"})
    d = json.loads(cfg.read_text())
    d["source"]["queues"]["include"] = ["rbak.tap.*"]  # the taps only, as docs/archive.md says (not events.s)
    cfg.write_text(json.dumps(d))
    arc = Archiver(cfg, log).running()
    wait_until(lambda: log.read_text().count("tap 'rbak.tap.qq'") >= 2 and time.sleep(3 * SYNC_SECS) is None,
               timeout=60, what="a few syncs with the lease queue present")
    summary = arc.stop()
    text = log.read_text()
    assert "rbak.lease.archive" not in text and "events.s" not in text and "not tapped" not in text, text[-3000:]
    assert f"archive.taps.exclude: 'cqq' matches no queue in vhost(s) {vhost!r}: it excludes nothing (closest: " \
           "'qq', 'cq')" in text
    assert (f"archive arc: stream 'rbak.tap.cq' in vhost {vhost!r} is the tap stream of classic queue 'cq', which "
            "archive.taps does not tap: archived through source.queues as its tap (restored into 'cq'), its bindings "
            "no longer kept in step with the queue's; add 'cq' to archive.taps.include, or exclude 'rbak.tap.cq' in "
            "source.queues.exclude") in text
    assert (f"archive arc: archive.taps.max_age 1D is not applied to the existing tap 'rbak.tap.qq' of queue 'qq' in "
            f"vhost {vhost!r}: it keeps x-max-age 7D (a stream's arguments are fixed at declaration; change it with a "
            "policy whose max-age replaces it, or delete the tap stream to declare it again, which loses what it "
            "holds)") in text
    assert "archive.taps.max_length_bytes" not in text  # as declared
    assert (summary["state"], summary["storage"], summary["prefix"]) == ("archived", f"file://{tmp_path}/store",
                                                                        "prod")
    assert {s["name"]: s["tap"] for s in summary["streams"]} == {
        "rbak.tap.cq": {"queue": "cq", "queue_type": "classic"},
        "rbak.tap.qq": {"queue": "qq", "queue_type": "quorum"}}
    listed = json.loads(rbak("list", "--path", summary["storage"], "--prefix", summary["prefix"], "--format",
                             "json").stdout)
    assert {t["queue"] for t in listed[-1]["taps"]} == {"cq", "qq"}


def test_a_policy_replaces_a_tap_streams_retention_arguments(broker, vhost):
    """What the not-applied max_age warning tells the user to do works: a policy's max-age and max-length-bytes
    replace the stream's x- arguments, larger or smaller (the retention the broker computes for the stream)."""
    declare_stream(broker, vhost, "rbak.tap.q", **{"x-max-age": "7D", "x-max-length-bytes": 10 * 1024 ** 3})
    expr = (f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, <<"rbak.tap.q">>)), '
            'lists:sort(maps:get(retention, rabbit_stream_queue:update_stream_conf(Q, #{}))).')
    for age, size, ms in (("1D", 1000000, 86400000), ("30D", 90000000000, 2592000000)):
        broker.api("PUT", f"/api/policies/{vhost}/tap", json={"pattern": "^rbak\\.tap\\.", "apply-to": "queues",
                                                              "definition": {"max-age": age, "max-length-bytes": size}})
        wait_until(lambda: broker.rabbitmqctl("eval", expr).stdout.strip() == f"[{{max_age,{ms}}},{{max_bytes,{size}}}]",
                   timeout=30, what=f"the policy's max-age {age} applied")
