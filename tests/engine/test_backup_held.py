"""Messages held unacknowledged by a consumer are not in a backup, and the summary says so (issue 44)."""

from __future__ import annotations

import os
import subprocess
import sys

import pika
import yaml

from support.backups import load
from support.brokers import wait_until


def test_held_messages_are_reported_per_queue_and_in_total(broker, vhost, tmp_path):
    b = broker
    b.publish(vhost, "busy", [f"m-{i}".encode() for i in range(12)], declare={"x-queue-type": "quorum"})
    b.publish(vhost, "calm", [b"c"] * 2, declare={})
    conn = pika.BlockingConnection(pika.URLParameters(b.amqp_url(vhost)))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=5)
        got = []
        ch.basic_consume("busy", lambda c, m, p, body: got.append(m.delivery_tag), auto_ack=False)
        while len(got) < 5:
            conn.process_data_events(time_limit=0.5)
        wait_until(lambda: (b.queue_info(vhost, "busy") or {}).get("messages_unacknowledged") == 5, 60)
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({
            "mode": "backup", "backup_id": "held-1",
            "source": {"amqp_url": b.amqp_url(vhost), "management_url": b.management_url,
                       "stream_port": b.stream_port, "queues": {"vhosts": [vhost]}},
            "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
            "backup": {"include_definitions": False}, "offset_storage": {"path": str(tmp_path / "s.db")}}))
        r = subprocess.run([sys.executable, "-m", "rbak", "backup", "--config", str(cfg)], capture_output=True,
                           text=True, env=dict(os.environ), timeout=300)
    finally:
        conn.close()
    assert r.returncode == 0, r.stderr
    assert f"  {vhost}/busy (quorum): 7 messages, 5 held by consumers (not backed up) [done]" in r.stdout, r.stdout
    assert f"  {vhost}/calm (classic): 2 messages [done]" in r.stdout, r.stdout
    assert "WARNING: 5 message(s) held unacknowledged by consumers are not in the backup" in r.stdout
    assert f"  vhosts read: {vhost}\n" in r.stdout
    m = load(tmp_path / "store", "held-1")
    assert {q.name: (q.message_count, q.held_by_consumers) for q in m.queues} == {"busy": (7, 5), "calm": (2, None)}
    assert m.held_by_consumers == 5
