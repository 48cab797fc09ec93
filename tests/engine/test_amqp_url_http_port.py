"""An AMQP URL naming the management API's HTTP port (a new user's trial of issue 49: ``amqp_url`` on
localhost:15672 failed after 6 s with "the broker closed the connection"): the error says the port may
not be an AMQP listener, naming the URL without its password."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rbak.broker.wire import Connection, Params
from rbak.errors import ConnectionLost

NOT_AMQP = ("the server closed the connection before greeting in AMQP 0-9-1: port 15672 may not be an AMQP listener "
            "(the management API's HTTP port?); point the AMQP URL at the broker's AMQP port (5672 by default, "
            "5671 with TLS)")


def test_the_wire_says_the_port_may_not_be_an_amqp_listener(rmq310):
    assert rmq310.mgmt_port == 15672
    with pytest.raises(ConnectionLost) as e:
        Connection.open(Params(host="localhost", port=15672, vhost="/", password="s3cret", connect_timeout=15))
    assert str(e.value) == f"AMQP error: amqp://localhost:15672 vhost '/': {NOT_AMQP}"


def test_a_backup_whose_amqp_url_names_the_http_port_exits_1_naming_it(rmq310, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
mode: backup
source:
  amqp_url: amqp://guest:s3cret@localhost:15672/%2f
  management_url: {rmq310.management_url}
  management_password: guest
storage: {{backend: filesystem, path: "{tmp_path / 'store'}"}}
offset_storage: {{path: "{tmp_path / 'state' / 'offsets.db'}"}}
""")
    r = subprocess.run([sys.executable, "-m", "rbak", "backup", "--config", str(cfg)], capture_output=True, text=True,
                       env=dict(os.environ), timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1] == f"rbak: AMQP error: amqp://localhost:15672 vhost '/': {NOT_AMQP}", r.stderr
    assert "s3cret" not in r.stderr
    assert not (tmp_path / "store").exists()
