"""Smoke tests of the CI infrastructure itself: both brokers, moto S3, TLS, the scripts."""

from __future__ import annotations

import socket
import ssl
import subprocess
from pathlib import Path

import pika
import pytest
import requests

from rbak.storage import open_storage
from support.brokers import BROKERS, Broker, unique_name, wait_until

REPO = Path(__file__).resolve().parents[1]


def test_management_reports_expected_version(broker: Broker):
    overview = broker.api("GET", "/api/overview")
    assert overview["rabbitmq_version"] == broker.version
    protocols = {(lst["protocol"], lst["port"]) for lst in overview["listeners"]}
    assert ("amqp", broker.amqp_port) in protocols
    assert ("stream", broker.stream_port) in protocols


def test_stream_port_accepts_connections(broker: Broker):
    socket.create_connection((broker.host, broker.stream_port), timeout=5).close()


def test_vhost_fixture_gives_guest_full_rights(broker: Broker, vhost: str):
    assert vhost.startswith("test-")
    assert broker.vhost_exists(vhost)
    perms = broker.api("GET", f"/api/vhosts/{vhost}/permissions")
    assert [(p["user"], p["configure"], p["write"], p["read"]) for p in perms] == [("guest", ".*", ".*", ".*")]


def test_vhost_create_delete_roundtrip(broker: Broker):
    name = unique_name("infra")
    broker.create_vhost(name)
    try:
        assert broker.vhost_exists(name)
    finally:
        broker.delete_vhost(name)
    assert not broker.vhost_exists(name)


def test_amqp_publish_and_get(broker: Broker, vhost: str):
    props = pika.BasicProperties(delivery_mode=2, headers={"k": "v", "n": 7}, message_id="m1")
    broker.publish(vhost, "q1", [b"hello"], properties=props, declare={})
    with broker.connect(vhost) as conn:
        method, got_props, body = conn.channel().basic_get("q1", auto_ack=True)
    assert body == b"hello"
    assert got_props.headers == {"k": "v", "n": 7}  # pika decodes UTF-8 long strings
    assert got_props.message_id == "m1"
    assert broker.message_count(vhost, "q1") == 0


def test_read_queue_is_non_destructive_and_keeps_classic_order(broker: Broker, vhost: str):
    bodies = broker.publish_n(vhost, "q", 200, declare={})
    assert broker.message_count(vhost, "q") == 200
    first = broker.read_queue(vhost, "q")
    second = broker.read_queue(vhost, "q")
    assert [m.body for m in first] == bodies
    assert [m.body for m in second] == bodies
    assert not any(m.redelivered for m in first)
    assert all(m.redelivered for m in second)
    assert broker.message_count(vhost, "q") == 200
    assert [m.body for m in broker.read_queue(vhost, "q", limit=3)] == bodies[:3]
    assert broker.drain_queue(vhost, "q")[-1].body == bodies[-1]
    assert broker.message_count(vhost, "q") == 0


def test_read_queue_on_quorum_queue(broker: Broker, vhost: str):
    """Documents what requeueing does to quorum queues (see Broker.read_queue)."""
    bodies = broker.publish_n(vhost, "q", 100, declare={"x-queue-type": "quorum"})
    first = broker.read_queue(vhost, "q")
    assert [m.body for m in first] == bodies
    second = broker.read_queue(vhost, "q")
    assert sorted(m.body for m in second) == sorted(bodies)
    assert broker.message_count(vhost, "q") == 100
    if broker.version.startswith("4."):
        assert {m.headers.get("x-delivery-count") for m in second} == {1}
        assert {m.headers.get("x-delivery-count") for m in broker.read_queue(vhost, "q")} == {2}


def test_quorum_reads_hit_the_default_delivery_limit_on_4_0(rmq40: Broker, vhost_factory):
    vhost = vhost_factory(rmq40)
    rmq40.publish_n(vhost, "q", 3, declare={"x-queue-type": "quorum"})
    counts = [len(rmq40.read_queue(vhost, "q")) for _ in range(22)]
    assert counts[:21] == [3] * 21  # the read after the 20th return still sees them...
    assert counts[21] == 0  # ...then 4.0 drops them (delivery-limit 20)


def test_vhost_factory_cleans_up_on_every_broker(vhost_factory):
    made = [(b, vhost_factory(b)) for b in BROKERS.values()]
    assert all(b.vhost_exists(v) for b, v in made)
    assert made[0][1] != made[1][1]


def test_management_stats_catch_up_within_seconds(broker: Broker, vhost: str):
    broker.publish_n(vhost, "stats", 7, declare={})
    info = wait_until(lambda: (i := broker.queue_info(vhost, "stats")) and i.get("messages") == 7 and i,
                      timeout=10, what="management stats showing 7 messages")
    assert info["messages_ready"] == 7


def test_read_stream(broker: Broker, vhost: str):
    bodies = broker.publish_n(vhost, "s", 20, declare={"x-queue-type": "stream"})
    assert [m.body for m in broker.read_stream(vhost, "s")] == bodies
    assert [m.body for m in broker.read_stream(vhost, "s")] == bodies  # still there


def test_queue_info_via_management_api(broker: Broker, vhost: str):
    broker.declare_queue(vhost, "mq", arguments={"x-queue-type": "quorum"})
    broker.publish_n(vhost, "mq", 5)
    info = broker.queue_info(vhost, "mq")
    assert info["type"] == "quorum" and info["durable"] is True
    assert [q["name"] for q in broker.list_queues(vhost)] == ["mq"]
    assert broker.queue_info(vhost, "absent") is None


def test_rabbitmqctl_reaches_the_node(broker: Broker, vhost: str):
    out = broker.rabbitmqctl("-q", "list_vhosts", "name").stdout.split()
    assert vhost in out
    assert broker.data_dir.is_dir()


def test_moto_s3_through_open_storage(s3_bucket):
    storage = open_storage(s3_bucket)
    storage.put("a/b.bin", b"payload")
    assert storage.get("a/b.bin") == b"payload"
    assert s3_bucket.keys() == ["backups/a/b.bin"]
    assert s3_bucket.get("backups/a/b.bin") == b"payload"


def test_s3_buckets_are_fresh(s3_bucket, moto_s3):
    assert s3_bucket.endpoint == moto_s3
    assert s3_bucket.keys() == []


def _amqps(broker: Broker, vhost: str, ca: Path, cert: Path | None = None, key: Path | None = None):
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert:
        ctx.load_cert_chain(str(cert), str(key))
    params = pika.ConnectionParameters(
        host="localhost", port=broker.amqps_port, virtual_host=vhost,
        credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(ctx, "localhost"), socket_timeout=10,
    )
    return pika.BlockingConnection(params)


def test_tls_listener_accepts_trusted_ca_and_client_cert(rmq310: Broker, tls):
    vhost = "/"
    with _amqps(rmq310, vhost, tls.ca_cert) as conn:
        assert conn.is_open
    with _amqps(rmq310, vhost, tls.ca_cert, tls.client_cert, tls.client_key) as conn:
        assert conn.is_open
    r = requests.get(rmq310.management_tls_url + "/api/overview", auth=("guest", "guest"),
                     verify=str(tls.ca_cert), timeout=10)
    assert r.json()["rabbitmq_version"] == "3.10.8"


def test_tls_listener_rejects_wrong_ca_and_foreign_client_cert(rmq310: Broker, tls):
    with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
        _amqps(rmq310, "/", tls.wrong_ca_cert)
    with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
        _amqps(rmq310, "/", tls.ca_cert, tls.wrong_client_cert, tls.wrong_client_key)
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(rmq310.management_tls_url + "/api/overview", verify=str(tls.wrong_ca_cert), timeout=10)


def test_ci_scripts_pass_shellcheck():
    scripts = [REPO / ".ci" / n for n in ("setup", "run", "brokers", "lib.sh", "lock", "latest", "image")]
    scripts += [REPO / "docker" / n for n in ("rbak-entrypoint", "slim-venv")]
    r = subprocess.run(["shellcheck", "-x", *map(str, scripts)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
