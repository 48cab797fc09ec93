"""The one passive declare (``rbak.broker.declare``): counts, and each refusal of the broker as an error
naming vhost and queue, on every broker; the kept channel survives each refusal."""

from __future__ import annotations

import time
import uuid

import pytest

from rbak.broker.channels import CONTROL, kept_channel
from rbak.broker.declare import passive_declare, queue_counts
from rbak.errors import AmqpError, QueueAccessRefused, QueueLocked, QueueNotFound


def test_counts_and_refusals_name_vhost_and_queue(broker, vhost):
    broker.publish(vhost, "full", [b"1", b"2"], declare={})
    with broker.connect(vhost) as owner, broker.wire(vhost) as conn:
        owner.channel().queue_declare("mine", exclusive=True)
        ch = owner.channel()
        ch.basic_consume("full", lambda *a: None)
        assert passive_declare(conn, vhost, "full") == (0, 1)  # both held unacked by the consumer
        ch.close()
        # the broker requeues a closed channel's unacked messages asynchronously (4.3.6 under load
        # answered (0, 0) right after the close): the counts must settle to exactly (2, 0)
        deadline = time.monotonic() + 30
        while passive_declare(conn, vhost, "full") != (2, 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert passive_declare(conn, vhost, "full") == (2, 0)
        with pytest.raises(QueueNotFound, match=f"queue 'gone' in vhost '{vhost}': no such queue .*404"):
            passive_declare(conn, vhost, "gone")
        assert queue_counts(conn, vhost, "gone") is None
        with pytest.raises(QueueLocked, match=f"queue 'mine' in vhost '{vhost}': exclusive queue.*405"):
            queue_counts(conn, vhost, "mine")
        assert queue_counts(conn, vhost, "full") == (2, 0)
        assert kept_channel(conn, CONTROL).is_open and conn.is_open
    assert broker.message_count(vhost, "full") == 2


def test_access_refused_names_vhost_and_queue(broker, vhost):
    broker.declare_queue(vhost, "secret")
    user, pw = f"rbak-none-{uuid.uuid4().hex[:8]}", "pw-3"
    broker.api("PUT", f"/api/users/{user}", json={"password": pw, "tags": ""})
    try:
        broker.api("PUT", f"/api/permissions/{vhost}/{user}", json={"configure": "", "write": "", "read": ""})
        with broker.wire(vhost, user, pw) as conn:
            if broker.version.startswith(("3.", "4.0")):  # measured: 3.10.8 and 4.0.5 check no permission here
                assert passive_declare(conn, vhost, "secret") == (0, 0)
            else:  # 4.3.6 wants configure permission for it
                with pytest.raises(QueueAccessRefused,
                                   match=f"queue 'secret' in vhost '{vhost}': access refused.*403"):
                    passive_declare(conn, vhost, "secret")
                with pytest.raises(QueueAccessRefused, match="'other'"):  # before it says there is no such queue
                    queue_counts(conn, vhost, "other")  # (on a fresh kept channel: the refusal closed the first)
    finally:
        broker.api("DELETE", f"/api/users/{user}", ok=(404,))
    assert issubclass(QueueAccessRefused, AmqpError)
