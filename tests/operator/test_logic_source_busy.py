"""Issue 27: which RabbitMQBackups read the same source (a pure decision)."""

from __future__ import annotations

from rbak_operator.decide import policy


def spec(url=None, ref=None, vhosts=None):
    broker = {"rabbitmqClusterReference": ref} if ref else {"amqpUrl": url}
    return {"broker": broker, **({"queues": {"vhosts": vhosts}} if vhosts is not None else {})}


def test_source_of():
    # issue 44: the URL's vhost scopes the backup when queues.vhosts is absent; a URL naming none: every vhost
    assert policy.source_of(spec("amqp://Rabbit:5672/%2f"), "ns") == ("amqp:rabbit:5672", frozenset({"/"}))
    assert policy.source_of(spec("amqp://Rabbit:5672"), "ns") == ("amqp:rabbit:5672", frozenset())
    assert policy.source_of(spec("amqps://r/%2f", vhosts=["a"]), "ns") == ("amqp:r:5671", frozenset({"a"}))
    assert policy.source_of(spec("amqp://r/x"), "ns") == ("amqp:r:5672", frozenset({"x"}))
    assert not policy.same_source(policy.source_of(spec("amqp://r/x"), "ns"), policy.source_of(spec("amqp://r:5672/y"), "ns"))


def test_the_url_vhost_scopes_the_backup_config():
    from rbak_operator.decide import rbakconfig

    def vhosts(**kw):
        base = {"broker": {"amqpUrl": kw.pop("url"), "managementUrl": "http://r:15672",
                           "credentialsSecretRef": {"name": "c"}}, "storage": {"pvc": {"claimName": "d"}}, **kw}
        return rbakconfig.backup_config(base, "ns", "b-1")[0]["source"].get("queues", {}).get("vhosts")
    assert vhosts(url="amqp://r:5672/tenant-a") == ["tenant-a"]
    assert vhosts(url="amqp://r:5672/%2f") == ["/"]
    assert vhosts(url="amqp://r:5672") is None  # every vhost
    assert vhosts(url="amqp://r:5672/tenant-a", queues={"vhosts": ["b", "c"]}) == ["b", "c"]  # the field wins
    assert policy.source_of(spec(ref={"name": "c"}), "ns") == ("cluster:ns/c", frozenset())
    assert policy.source_of(spec(ref={"name": "c", "namespace": "mq"}), "ns")[0] == "cluster:mq/c"


def test_same_source():
    a = ("amqp:r:5672", frozenset({"a", "b"}))
    assert policy.same_source(a, ("amqp:r:5672", frozenset({"b"})))
    assert policy.same_source(a, ("amqp:r:5672", frozenset()))  # every vhost
    assert not policy.same_source(a, ("amqp:r:5672", frozenset({"c"})))
    assert not policy.same_source(a, ("amqp:s:5672", frozenset({"a"})))


def test_busy_source():
    mine = ("amqp:r:5672", frozenset({"a"}))
    others = [("x", ("amqp:r:5672", frozenset()), ["x-1"]), ("y", ("amqp:r:5672", frozenset({"b"})), ["y-1"]),
              ("z", ("amqp:r:5672", frozenset({"a"})), ["z-2", "z-1"]), ("w", ("amqp:q:5672", frozenset()), ["w-1"])]
    assert policy.busy_source(mine, others) == ["x/x-1", "z/z-1", "z/z-2"]
    assert policy.busy_source(mine, []) == []
