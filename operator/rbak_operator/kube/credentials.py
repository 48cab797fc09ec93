"""Where a run's broker credentials come from, looked up the way the RabbitMQ operators publish them.

- ``rabbitmqClusterReference.name``: the RabbitmqCluster's
  ``status.defaultUser.secretReference`` names the default user's Secret (and
  its key names); ``<name>-default-user`` only when the status has none (or
  the RabbitmqCluster cannot be found: no cluster operator CRD installed).
- ``rabbitmqClusterReference.connectionSecret`` (messaging-topology-operator):
  a Secret with ``uri`` (the management API URL), ``username`` and
  ``password``; the operator reads ``uri`` to build the endpoints, the
  credentials reach the pod only as ``secretKeyRef`` env vars.

The operator only looks things up here; ``rbakconfig.broker_connection``
decides from what it found (pure).
"""

from __future__ import annotations

from typing import Any

from rbak.errors import RbakError
from rbak_operator.decide.rbakconfig import ResolvedBroker

CONNECTION_SECRET_KEYS = ("uri", "username", "password")


class MissingSecret(RbakError):
    prefix = "Missing secret"


def resolve_broker(kube: Any, broker: dict[str, Any] | None, namespace: str, field: str) -> ResolvedBroker:
    """Look up what a ``rabbitmqClusterReference`` points at (nothing for ``amqpUrl`` brokers)."""
    ref = (broker or {}).get("rabbitmqClusterReference") if isinstance(broker, dict) else None
    if not ref:
        return ResolvedBroker()
    ns = ref.get("namespace") or namespace
    secret = (ref.get("connectionSecret") or {}).get("name")
    if secret:
        data = kube.secret_values(ns, secret)
        where = f"{field}.rabbitmqClusterReference.connectionSecret"
        if data is None:
            raise MissingSecret(f"{where}: Secret {ns}/{secret} not found")
        missing = [k for k in CONNECTION_SECRET_KEYS if not data.get(k)]
        if missing:
            raise MissingSecret(f"{where}: Secret {ns}/{secret} lacks key(s) {', '.join(missing)} "
                                f"(it needs {', '.join(CONNECTION_SECRET_KEYS)})")
        return ResolvedBroker(connection_uri=data["uri"])
    if ref.get("name") and ns == namespace:
        cluster = kube.get_rabbitmq_cluster(ns, ref["name"])
        return ResolvedBroker(cluster_status=(cluster or {}).get("status") or None)
    return ResolvedBroker()
