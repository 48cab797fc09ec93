"""Every (API group, resource, verb) the operator uses: the source for its RBAC.

The Helm chart's ClusterRole is checked against ``used_api_calls()`` by the
ship tests, and the end-to-end test checks that the real operator process
made no call outside this set (from the emulator's request log).
"""

from __future__ import annotations

from rbak_operator.crds.schema import (
    ARCHIVE_PLURAL,
    BACKUP_PLURAL,
    GROUP,
    RABBITMQ_CLUSTERS,
    RABBITMQ_GROUP,
    RESTORE_PLURAL,
    SPARK_GROUP,
    SPARK_PLURAL,
)

# (apiGroup, resource, verbs); "" is the core group.
USED_API_CALLS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (GROUP, BACKUP_PLURAL, ("get", "list", "watch", "patch")),
    (GROUP, f"{BACKUP_PLURAL}/status", ("get", "patch")),
    (GROUP, RESTORE_PLURAL, ("get", "list", "watch", "patch")),
    (GROUP, f"{RESTORE_PLURAL}/status", ("get", "patch")),
    (GROUP, ARCHIVE_PLURAL, ("get", "list", "watch", "patch")),
    (GROUP, f"{ARCHIVE_PLURAL}/status", ("get", "patch")),
    # a RabbitMQArchive's archiver: read, created, replaced on spec changes, deleted (deletionPolicy delete)
    ("apps", "deployments", ("get", "create", "update", "delete")),
    # watched: a run's end wakes its owner; patched: a run whose pod cannot start is marked Failed
    ("batch", "jobs", ("get", "list", "watch", "create", "patch", "delete")),
    ("", "pods", ("list",)),
    ("", "configmaps", ("get", "create", "update", "delete")),
    ("", "secrets", ("get",)),
    ("", "events", ("create",)),
    (SPARK_GROUP, SPARK_PLURAL, ("get", "list", "watch", "create", "delete")),
    # a rabbitmqClusterReference by name: the cluster's status names its default-user Secret
    (RABBITMQ_GROUP, RABBITMQ_CLUSTERS, ("get",)),
    # kopf itself: namespaces for cluster-wide watching, CRD discovery.
    ("", "namespaces", ("list", "watch")),
    ("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),
    # leader election (leader.py, not when standalone): its Lease in the operator's namespace,
    # created on first start, read and renewed (PUT); never listed, watched or patched.
    ("coordination.k8s.io", "leases", ("get", "create", "update")),
)


def used_api_calls() -> set[tuple[str, str, str]]:
    """Flat {(group, resource, verb)} set."""
    return {(g, r, v) for g, r, verbs in USED_API_CALLS for v in verbs}
