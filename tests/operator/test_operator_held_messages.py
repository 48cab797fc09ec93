"""Messages a consumer holds unacknowledged are not in a backup, and the backup says so (issue 44): per
queue and in total, in the manifest, the CLI's summary, the run's status, a condition, an event and the
printer column. On the real API server with the local kubelet and RabbitMQ 3.10."""

from __future__ import annotations

import pika
import pytest

from rbak.repo.catalog import load_manifest

from support.brokers import wait_until
from support.op_e2e import create_backup, s3, trigger, wait_run
from support.opcluster import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]


def test_messages_held_by_a_consumer_are_reported(cluster, env):
    b = env.broker
    b.publish(env.vhost, "busy", [f"m-{i}".encode() for i in range(120)], declare={})
    b.publish(env.vhost, "idle", [b"i"] * 3, declare={})
    conn = pika.BlockingConnection(pika.URLParameters(b.amqp_url(env.vhost)))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)
        got = []
        ch.basic_consume("busy", lambda c, m, p, body: got.append(m.delivery_tag), auto_ack=False)
        while len(got) < 50:
            conn.process_data_events(time_limit=0.5)
        wait_until(lambda: (b.queue_info(env.vhost, "busy") or {}).get("messages_unacknowledged") == 50, 60)
        name = f"{env.tag}-held"
        create_backup(cluster, env, name)
        trigger(cluster, name, "1")
        run = wait_run(cluster, name, phase="Succeeded", timeout=120)
    finally:
        conn.close()  # the consumer goes: its 50 messages return to the queue
    assert (run["messages"], run["heldByConsumers"], run["heldQueues"]) == (73, 50, [f"{env.vhost}/busy (50)"]), run
    m = load_manifest(s3(env), run["backupId"])
    assert {q.name: (q.message_count, q.held_by_consumers) for q in m.queues} == {"busy": (70, 50), "idle": (3, None)}
    st = cluster.status(name)
    held = next(c for c in st["conditions"] if c["type"] == "MessagesHeld")
    assert (held["status"], held["reason"]) == ("True", "HeldByConsumers") and "50 message(s)" in held["message"]
    ev = wait_for(lambda: [e for e in cluster.events(name) if e["reason"] == "MessagesNotBackedUp"], 30, what="event")
    assert ev[0]["type"] == "Warning" and f"{env.vhost}/busy (50)" in ev[0]["message"]
    # the summary the run printed (--json, in its log): per queue and the total
    out = cluster.runner.outputs[run["jobName"]]
    assert out.count('"held_by_consumers": 50') == 2, out
    # the column
    table = cluster.emu.kube.kubectl("-n", cluster.http.ns, "get", "rabbitmqbackups", name).stdout
    head, row = table.splitlines()[:2]
    assert row[head.index("HELD"):].split()[0] == "50", table
