"""A restore whose management URL answers for another broker than its AMQP URL is refused before
anything is imported or published (a new user's trial of issue 45: ``management_url`` defaults to
:15672 whatever the AMQP port, so a restore into the 4.3 broker on :5674 read the 3.10 broker's
policies, passed the lossy-target check, and a max-length target dropped 148 of 150 messages)."""

from __future__ import annotations

import dataclasses

import pytest
from support.restores import build_backup, declare, make_records, options_for, storage_for

from rbak.errors import ConfigError
from rbak.restore.engine import run_restore


def test_a_management_url_of_another_broker_is_refused_naming_both(rmq43, rmq310, vhost_factory, tmp_path):
    vhost = vhost_factory(rmq43)
    twin = vhost_factory(rmq310)  # the same name where the wrong management API looks would hide it
    rmq310.delete_vhost(twin)
    rmq310.create_vhost(vhost)
    try:
        declare(rmq43, vhost, "q", arguments={"x-max-length": 2})
        storage = storage_for(tmp_path)
        build_backup(storage, "split", [(vhost, "q", "classic", make_records(vhost, "q", [b"m%d" % i for i in range(5)],
                                                                             every_type=False))])
        opts = options_for(rmq43, "split")
        opts = dataclasses.replace(opts, target=dataclasses.replace(opts.target, management_url=rmq310.management_url))
        with pytest.raises(ConfigError) as e:
            run_restore(storage, opts)
        msg = str(e.value)
        assert f"target.management_url {rmq310.management_url} answers for cluster" in msg, msg
        assert f"target.amqp_url 127.0.0.1:{rmq43.amqp_port}" in msg or f":{rmq43.amqp_port} is cluster" in msg, msg
        assert "nothing was restored" in msg and "\n" not in msg
        assert rmq43.message_count(vhost, "q") == 0
        assert "q" not in {q["name"] for q in rmq310.list_queues(vhost)}  # no definitions went to the other one
    finally:
        rmq310.delete_vhost(vhost)
