"""Issue 17: a 3.10.8 vhost with a transient non-exclusive queue migrated into a 4.3.6 node
that really denies them (``deprecated_features.permit.transient_nonexcl_queues = false``).

That setting is per node, so the shared brokers are never reconfigured: a private 4.3.6
node runs from the sid chroot on free ports with the management plugin
(``tests/offline/rabbitmq_private.py``). The restore detects the denial from the node's
management API (no override) and declares the queue durable, or skips it with
``restore.transient_queues: skip``.
"""

from __future__ import annotations

import uuid

import pika
import pika.exceptions
import pytest

from rbak.backup import BackupEngine
from rbak.broker.management import ManagementClient
from rbak.restore import run_restore
from rbak.restore.compat import capabilities_of
from rbak.config import ConnectionConfig
from rbak.restore.options import RestoreOptions
from rbak.storage import open_storage

from support.backups import backup_config
from support.require import require_that
from support.private_node import PrivateNode, chroot_ready, private_node

DENY = "deprecated_features.permit.transient_nonexcl_queues = false"


@pytest.fixture(scope="module")
def denying_node():
    require_that(chroot_ready("4.3"))
    with private_node("4.3", conf=[DENY], plugins=("rabbitmq_management",)) as node:
        yield node


def target_of(node: PrivateNode) -> ConnectionConfig:
    return ConnectionConfig(amqp_url=f"amqp://guest:guest@127.0.0.1:{node.port}",
                            management_url=f"http://127.0.0.1:{node.management_port}",
                            management_username="guest", management_password="guest")


def _options(node: PrivateNode, backup_id: str, **kw) -> RestoreOptions:
    return RestoreOptions(backup_id=backup_id, target=target_of(node), restore_definitions=True, publish_mode="queue",
                          **kw)


def _source(rmq310, vhost: str) -> None:
    """A transient queue bound to amq.fanout and a durable one, with messages, on 3.10.8."""
    with rmq310.connect(vhost) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("tmp-q", durable=False)
        ch.queue_bind("tmp-q", "amq.fanout")
        ch.queue_declare("keep-q", durable=True)
        for i in range(5):
            ch.basic_publish("", "tmp-q", b"t-%d" % i, pika.BasicProperties(delivery_mode=2))
        for i in range(3):
            ch.basic_publish("", "keep-q", b"k-%d" % i, pika.BasicProperties(delivery_mode=2))


def _bodies(node: PrivateNode, vhost: str, queue: str) -> list[bytes]:
    with node.connect(vhost) as conn:
        ch = conn.channel()
        out = []
        while True:
            m, _p, body = ch.basic_get(queue, auto_ack=True)
            if m is None:
                return out
            out.append(body)


def _exists(node: PrivateNode, vhost: str, queue: str) -> bool:
    with node.connect(vhost) as conn:
        try:
            conn.channel().queue_declare(queue, passive=True)
            return True
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return False


def test_the_node_really_denies_transient_queues(denying_node):
    caps = capabilities_of(ManagementClient(f"http://127.0.0.1:{denying_node.management_port}", "guest", "guest",
                                            role="target"))
    assert caps.version.startswith("4.3") and caps.transient_nonexcl_queues is False
    conn = denying_node.connect("/")
    try:  # 4.3.6 closes the whole connection (541 INTERNAL_ERROR naming the deprecated feature)
        with pytest.raises((pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker)) as e:
            conn.channel().queue_declare(f"t-{uuid.uuid4().hex[:6]}", durable=False)
    finally:
        if conn.is_open:
            conn.close()
    assert "transient_nonexcl_queues" in e.value.reply_text


@pytest.mark.parametrize("mode", ["durable", "skip"])
def test_migrate_transient_queue_into_a_denying_43_node(mode, denying_node, rmq310, vhost_factory, tmp_path):
    vhost = vhost_factory(rmq310, "tr")
    _source(rmq310, vhost)
    store = tmp_path / "store"
    cfg = backup_config(rmq310, vhost, store, "mig", tmp_path / "st.db", include_definitions=True)
    assert BackupEngine(cfg).run().total_messages == 8
    target_vhost = f"migrated-{mode}-{uuid.uuid4().hex[:6]}"
    opts = _options(denying_node, "mig", vhost_mapping=((vhost, target_vhost),), transient_queues=mode)
    summary = run_restore(open_storage(str(store)), opts)
    by = {q.source_queue: q for q in summary.queues}
    changes = {(c.kind, c.name, c.change) for c in summary.definitions.adapted}
    assert by["keep-q"].status == "restored" and _bodies(denying_node, target_vhost, "keep-q") == [b"k-0", b"k-1", b"k-2"]
    if mode == "durable":
        assert ("queues", f"{target_vhost}/tmp-q", "declared durable") in changes
        assert by["tmp-q"].status == "restored" and by["tmp-q"].confirmed == 5
        assert _bodies(denying_node, target_vhost, "tmp-q") == [b"t-%d" % i for i in range(5)]
    else:
        assert ("queues", f"{target_vhost}/tmp-q", "skipped (restore.transient_queues: skip)") in changes
        assert by["tmp-q"].status == "skipped" and by["tmp-q"].confirmed == 0
        assert not _exists(denying_node, target_vhost, "tmp-q")
    # the source is as it was
    assert rmq310.message_count(vhost, "tmp-q") == 5 and rmq310.message_count(vhost, "keep-q") == 3
