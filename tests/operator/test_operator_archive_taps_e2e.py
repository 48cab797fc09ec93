"""RabbitMQArchive ``spec.taps`` as a user drives it: the real API server, ``kubectl apply`` of the shipped
example (docs/examples/rabbitmqarchive-taps.yaml) pointed at a real broker (3.10.8) and moto S3, the local
kubelet running the archiver's Deployment as a process.

A quorum queue and a classic queue bound to a topic exchange are tapped; what is published through the
exchange (and once straight to a queue through the default exchange, which a tap does not record) is
archived, and a RabbitMQRestore of the archive into a fresh vhost puts exactly the exchange-routed messages,
in order, into each queue, and no tap stream. The typos a user makes are refused with a message naming the
field: a ``spec.taps.include`` that names no queue and one that names a stream by the archiver (its exit
surfaced in the status and an event), an unknown key by the API server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from support.brokers import unique_name
from support.op_e2e import API, ARCHIVE_FAST, Cluster
from support.opcluster import wait_for
from test_operator_archive_e2e import _cond, _status, _where

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "rabbitmqarchive-taps.yaml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_s3, e2e_kube):
    c = Cluster(tmp_path_factory.mktemp("cluster-archive-taps"), kube=e2e_kube, operator_env=ARCHIVE_FAST)
    try:
        yield c
    finally:
        c.close()


def _example(env, broker, name: str, vhost: str, taps: dict | None = None) -> dict:
    """The shipped example as a user adapts it: their name, broker, vhost and bucket; ``taps`` replaces its
    spec.taps (a user's typo)."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["metadata"]["name"] = name
    spec = obj["spec"]
    spec["broker"] = {"amqpUrl": f"amqp://{broker.host}:{broker.amqp_port}/{quote(vhost, safe='')}", "managementUrl": broker.management_url,
                      "credentialsSecretRef": {"name": f"{env.tag}-rmq"}}
    spec["queues"]["vhosts"] = [vhost]
    spec["storage"] = env.storage
    spec["rpoSeconds"], spec["maxDelaySeconds"] = 5, 1
    if taps is not None:
        spec["taps"] = taps
    return obj


def _kubectl(cluster: Cluster, *args: str, input: str | None = None):  # noqa: A002 - subprocess.run's name
    return cluster.emu.kube.kubectl("-n", cluster.http.ns, *args, input=input, check=False)


def _apply(cluster: Cluster, obj: dict):
    return _kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(obj))


def _bind(broker, vhost: str, exchange: str, queue: str, key: str) -> None:
    broker.api("POST", f"/api/bindings/{vhost}/e/{exchange}/q/{queue}", json={"routing_key": key, "arguments": {}})


def _events(cluster: Cluster, name: str) -> list[tuple[str, str, str]]:
    return [(e["type"], e["reason"], e.get("message") or "") for e in cluster.events(name)]


def _stop(cluster: Cluster, name: str) -> None:
    deployment = f"rbak-archive-{name}"
    cluster.http.delete(API, "rabbitmqarchives", name)
    cluster.http.delete("apps/v1", "deployments", deployment)  # no garbage collector on this server
    wait_for(lambda: deployment not in cluster.runner.deployment_pods, timeout=60, what="the pod stopped")


def test_taps_archived_restored_into_their_queues_and_typos_refused(cluster, env, rmq310):
    broker, vhost = rmq310, env.vhost
    broker.api("PUT", f"/api/exchanges/{vhost}/shop", json={"type": "topic", "durable": True})
    broker.declare_queue(vhost, "orders", arguments={"x-queue-type": "quorum"})
    broker.declare_queue(vhost, "payments")
    _bind(broker, vhost, "shop", "orders", "order.*")
    _bind(broker, vhost, "shop", "payments", "pay.*")
    _bind(broker, vhost, "shop", "orders", "all")
    _bind(broker, vhost, "shop", "payments", "all")

    def pub(key: str, bodies: list[bytes]) -> None:
        broker.publish(vhost, "", bodies, exchange="shop", routing_key=key)

    name = f"{env.tag}-taps"
    deployment = f"rbak-archive-{name}"

    def diag() -> str:
        return f"{_status(cluster, name)}\n{cluster.runner.deployment_output(deployment)[-3000:]}\n{cluster.logs()}"

    fresh = unique_name("test-op-tapr")
    bad_vhost = unique_name("test-op-tapx")
    try:
        # 1. the example applied as a user adapts it
        r = _apply(cluster, _example(env, broker, name, vhost))
        assert r.returncode == 0 and r.stdout.strip() == f"rabbitmqarchive.rbak.io/{name} created", (r.stdout, r.stderr)
        # 4. alongside, in a vhost of their own, the typos a user makes: each refused naming the field
        broker.create_vhost(bad_vhost)
        broker.declare_queue(bad_vhost, "orders", arguments={"x-queue-type": "quorum"})
        broker.declare_queue(bad_vhost, "events", arguments={"x-queue-type": "stream"})
        bad = f"{env.tag}-tapx"

        def refused(msg: str) -> dict:
            """The archiver exited 2 on ``msg``: the status (Failed, Ready False) and a Warning event say so."""
            def said(s: dict) -> bool:
                return any(c["type"] == "Ready" and msg in c["message"] for c in s.get("conditions") or [])
            st = wait_for(_where(cluster, bad, said), timeout=60, what=f"the status to say {msg!r}",
                          diag=lambda: f"{_status(cluster, bad)}\n{cluster.logs()}")
            ready = next(c for c in st["conditions"] if c["type"] == "Ready")
            assert st["phase"] == "Failed" and ready["status"] == "False" and ready["reason"] == "ArchiverFailing", st
            assert re.fullmatch(rf"the archiver \(pod rbak-archive-{bad}-[0-9a-f]{{5}}\) exited with code 2: "
                                rf"rbak: Configuration error: {re.escape(msg)}", ready["message"]), ready
            wait_for(lambda: ("Warning", "ArchiverFailing", ready["message"]) in _events(cluster, bad), timeout=30,
                     what="the event")
            r = _kubectl(cluster, "get", "rabbitmqarchive", bad)
            assert r.stdout.splitlines()[1].split()[:2] == [bad, "Failed"], r.stdout
            return st

        # a pattern that names no queue ("order" for "orders"): the CRD cannot know; the archiver refuses it
        r = _apply(cluster, _example(env, broker, bad, bad_vhost, {"include": ["order"]}))
        assert r.returncode == 0, r.stderr

        cm = wait_for(lambda: cluster.http.get("v1", "configmaps", deployment), timeout=60, what="the config",
                      diag=diag)
        cfg = yaml.safe_load(cm["data"]["config.yaml"])
        assert cfg["archive"]["taps"] == {"include": ["orders", "payments"], "max_age": "7D",
                                          "max_length_bytes": 10737418240}

        # the archiver declared the taps and archives them (empty): what is published from now on is recorded
        st = wait_for(_where(cluster, name, lambda s: s.get("phase") == "Archiving" and sorted(
            x["name"] for x in s.get("streams") or []) == ["rbak.tap.orders", "rbak.tap.payments"]), timeout=60,
            what="the taps archived", diag=diag)

        # 2. published through the exchange, and once straight to the quorum queue (not recorded)
        pub("order.new", [b"o-0", b"o-1"])
        pub("pay.card", [b"p-0"])
        pub("all", [b"all-0"])
        broker.publish(vhost, "orders", [b"straight-0"])
        pub("order.paid", [b"o-2"])
        want = {"orders": [b"o-0", b"o-1", b"all-0", b"o-2"], "payments": [b"p-0", b"all-0"]}

        def caught_up(s: dict) -> bool:
            arch = {x["name"]: x.get("archivedOffset") for x in s.get("streams") or []}
            return _cond(s, "RPOMet") == "True" and arch == {"rbak.tap.orders": 3, "rbak.tap.payments": 1}

        st = wait_for(_where(cluster, name, caught_up), timeout=90, what="both taps archived", diag=diag)
        assert st["phase"] == "Archiving" and st["streamCount"] == 2 and st["gapMessages"] == 0, st
        # the source queues hold what they held: the taps took nothing from them
        assert broker.message_count(vhost, "orders") == 5 and broker.message_count(vhost, "payments") == 2
        r = _kubectl(cluster, "get", "rabbitmqarchive", name)
        header, row = (line.split() for line in r.stdout.splitlines())
        assert header == ["NAME", "PHASE", "RPO", "LAG", "RECOVERABLE", "UNTIL", "STREAMS", "GAPS", "AGE"], r.stdout
        assert row[:3] == [name, "Archiving", "5"] and row[5:7] == ["2", "0"], r.stdout

        # the typo's archiver exited 2 meanwhile; the status and an event say why
        refused(f"spec.taps.include: 'order' names no queue in vhost(s) {bad_vhost!r} (closest: 'orders'); nothing "
                "was archived")
        # a pattern that names a stream (its pod restarts with the new config while the restore runs)
        r = _apply(cluster, _example(env, broker, bad, bad_vhost, {"include": ["events"]}))
        assert r.returncode == 0 and r.stdout.strip() == f"rabbitmqarchive.rbak.io/{bad} configured", r.stderr

        # 3. a RabbitMQRestore of the archive into a fresh vhost, its queues declared first as the docs say
        broker.create_vhost(fresh)
        broker.declare_queue(fresh, "orders", arguments={"x-queue-type": "quorum"})
        broker.declare_queue(fresh, "payments")
        rname = f"{env.tag}-tapr"
        restore = {"apiVersion": API, "kind": "RabbitMQRestore", "metadata": {"name": rname},
                   "spec": {"archiveRef": {"name": name}, "vhostMapping": {vhost: fresh}}}
        r = _kubectl(cluster, "apply", "-f", "-", input=json.dumps(restore))
        assert r.returncode == 0, r.stderr
        rst = wait_for(lambda: (s := (cluster.http.get(API, "rabbitmqrestores", rname) or {}).get("status") or {})
                       .get("phase") in ("Succeeded", "Failed") and s, timeout=90, what="the restore", diag=diag)
        assert rst["phase"] == "Succeeded", rst
        assert {q: [m.body for m in broker.drain_queue(fresh, q)] for q in want} == want
        assert sorted(q["name"] for q in broker.list_queues(fresh)) == ["orders", "payments"]  # no tap stream
        assert rst["backupId"] == st["generation"] and rst["messages"] == rst["confirmedMessages"] == 6, rst
        assert rst["targetQueues"] == [f"{fresh}/orders", f"{fresh}/payments"], rst
        r = _kubectl(cluster, "get", "rabbitmqrestore", rname)
        header, row = (line.split() for line in r.stdout.splitlines())
        assert header[:5] == ["NAME", "PHASE", "BACKUP", "ENGINE", "RESTORED"], r.stdout
        assert row[:5] == [rname, "Succeeded", st["generation"], "job", "6"], r.stdout

        # back to the typos: the stream named in spec.taps.include
        refused(f"spec.taps.include: 'events': queue 'events' in vhost {bad_vhost!r} is a stream: streams are "
                "archived as they are (select it in spec.queues); nothing was archived")
        assert broker.queue_info(bad_vhost, "rbak.tap.orders") is None  # nothing was declared
        # an unknown key (maxage for maxAge): the API server refuses it (kubectl's strict field validation), on
        # an update as on a create, and nothing changes
        before = cluster.http.get(API, "rabbitmqarchives", bad)["spec"]
        r = _apply(cluster, _example(env, broker, bad, bad_vhost, {"include": ["orders"], "maxage": "1D"}))
        assert r.returncode == 1 and r.stderr.rstrip().endswith(
            'strict decoding error: unknown field "spec.taps.maxage"'), r.stderr
        assert cluster.http.get(API, "rabbitmqarchives", bad)["spec"] == before
        r = _apply(cluster, _example(env, broker, f"{bad}2", bad_vhost, {"include": ["orders"], "maxage": "1D"}))
        assert r.returncode == 1 and 'unknown field "spec.taps.maxage"' in r.stderr, r.stderr
        assert cluster.http.get(API, "rabbitmqarchives", f"{bad}2") is None
        # what the docs warn of: with --validate=false the server drops the key, and maxAge stays the default
        typo = yaml.safe_dump(_example(env, broker, f"{bad}2", bad_vhost, {"include": ["orders"], "maxage": "1D"}))
        r = _kubectl(cluster, "apply", "--validate=false", "--dry-run=server", "-o", "json", "-f", "-", input=typo)
        assert r.returncode == 0 and json.loads(r.stdout)["spec"]["taps"] == {
            "include": ["orders"], "maxAge": "7D", "maxLengthBytes": 10737418240}, (r.stdout, r.stderr)
    finally:
        _stop(cluster, name)
        _stop(cluster, f"{env.tag}-tapx")
        broker.delete_vhost(fresh)
        broker.delete_vhost(bad_vhost)
