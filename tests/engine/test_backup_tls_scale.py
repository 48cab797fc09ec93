"""TLS (amqps + https management) against the 3.10 TLS listeners, and 1,000 queues over a few connections."""

from __future__ import annotations

import pytest

from rbak.backup import BackupEngine
from rbak.broker.connect import connect
from rbak.config import Config
from rbak.errors import AmqpError, ManagementApiError

from support.backups import backup_config, load, records


def _tls_config(b, vhost, tmp_path, ca, client=None, backup_id="tls1"):
    tls = {"enabled": True, "ca_cert": str(ca)}
    if client:
        tls.update(client_cert=str(client[0]), client_key=str(client[1]))
    return Config.from_dict({
        "mode": "backup", "backup_id": backup_id,
        "source": {"amqp_url": b.amqps_url(vhost), "management_url": b.management_tls_url,
                   "tls": tls, "queues": {"vhosts": [vhost]}},
        "storage": {"backend": "filesystem", "path": str(tmp_path / "store")},
        "backup": {"include_definitions": True},
        "offset_storage": {"path": str(tmp_path / "st.db")},
    }, env={})


def test_tls_backup_and_wrong_ca(rmq310, vhost_factory, tls, tmp_path):
    b = rmq310
    vhost = vhost_factory(b)
    b.publish(vhost, "secure", [b"t-%d" % i for i in range(20)], declare={})
    assert b.amqps_url(vhost).startswith("amqps://")

    s = BackupEngine(_tls_config(b, vhost, tmp_path, tls.ca_cert, (tls.client_cert, tls.client_key))).run()
    assert s.completed and s.total_messages == 20
    m = load(tmp_path / "store", "tls1")
    assert [r.body for r in records(tmp_path / "store", m, vhost, "secure")] == [b"t-%d" % i for i in range(20)]

    # an unrelated CA: both the management API and AMQP refuse, naming TLS; never a plaintext retry
    bad = _tls_config(b, vhost, tmp_path, tls.wrong_ca_cert, backup_id="tls2")
    with pytest.raises(ManagementApiError, match="TLS handshake with https://localhost:15671 failed.*CERTIFICATE_VERIFY_FAILED"):
        BackupEngine(bad).run()
    with pytest.raises(AmqpError, match=r"amqps://localhost:5671 vhost .*TLS certificate verification failed") as ei:
        connect(bad.source, vhost).close()
    assert "guest:guest" not in str(ei.value)
    # tls.enabled with a plain http management URL is refused, not silently downgraded
    plain = _tls_config(b, vhost, tmp_path, tls.ca_cert, backup_id="tls3")
    plain.source.management_url = b.management_url
    with pytest.raises(ManagementApiError, match="plain http but tls.enabled"):
        BackupEngine(plain).run()
    assert b.message_count(vhost, "secure") == 20


@pytest.mark.slow
def test_1000_queues_few_connections(rmq310, vhost_factory, tmp_path):
    b = rmq310
    vhost = vhost_factory(b)
    with b.connect(vhost) as conn:
        ch = conn.channel()
        for i in range(1000):
            ch.queue_declare(f"q-{i:04d}", durable=True)
            ch.basic_publish("", f"q-{i:04d}", b"m-%d" % i)
    store = tmp_path / "store"
    eng = BackupEngine(backup_config(b, vhost, store, "many", tmp_path / "st.db", max_concurrent_queues=4))
    s = eng.run()
    assert s.completed and len(s.queues) == 1000 and s.total_messages == 1000
    assert eng.connections_opened <= 4
    m = load(store, "many")
    assert len(m.queues) == 1000 and all(q.message_count == 1 for q in m.queues)
    assert records(store, m, vhost, "q-0777")[0].body == b"m-777"
