"""The passive declares of a backup share one channel per connection (issue 20: per-queue overhead);
a queue the broker refuses (404 deleted, 405 exclusive) closes that channel and the next queue opens
a fresh one, on every broker."""

from __future__ import annotations

import pytest

from rbak.backup.queue_backup import passive_info
from rbak.broker.channels import CONTROL, kept_channel
from rbak.errors import QueueSkipped


def test_passive_declares_share_a_channel_and_survive_refusals(broker, vhost):
    broker.publish(vhost, "a", [b"1", b"2", b"3"], declare={})
    broker.declare_queue(vhost, "b")
    with broker.connect(vhost) as owner, broker.wire(vhost) as conn:
        owner.channel().queue_declare("mine", exclusive=True)
        assert passive_info(conn, vhost, "a") == (3, 0)
        first = kept_channel(conn, CONTROL)
        assert passive_info(conn, vhost, "b") == (0, 0)
        assert kept_channel(conn, CONTROL) is first  # no channel opened or closed per queue
        with pytest.raises(QueueSkipped, match="'gone' in vhost .*deleted before the backup read it"):
            passive_info(conn, vhost, "gone")
        assert passive_info(conn, vhost, "a") == (3, 0)  # a fresh channel after the 404
        assert kept_channel(conn, CONTROL) is not first
        with pytest.raises(QueueSkipped, match="'mine'.*exclusive queue"):
            passive_info(conn, vhost, "mine")
        assert passive_info(conn, vhost, "b") == (0, 0)
        assert conn.is_open
    assert broker.message_count(vhost, "a") == 3  # nothing taken
