"""Issue 27: which RabbitMQBackups read the same source (a pure decision)."""

from __future__ import annotations

from rbak_operator import policy


def spec(url=None, ref=None, vhosts=None):
    broker = {"rabbitmqClusterReference": ref} if ref else {"amqpUrl": url}
    return {"broker": broker, **({"queues": {"vhosts": vhosts}} if vhosts is not None else {})}


def test_source_of():
    assert policy.source_of(spec("amqp://Rabbit:5672/%2f"), "ns") == ("amqp:rabbit:5672", frozenset())
    assert policy.source_of(spec("amqps://r/%2f", vhosts=["a"]), "ns") == ("amqp:r:5671", frozenset({"a"}))
    assert policy.source_of(spec("amqp://r/x"), "ns") == policy.source_of(spec("amqp://r:5672/y"), "ns")
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
