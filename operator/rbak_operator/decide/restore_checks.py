"""A RabbitMQRestore's target vhost, mappings and selection, checked against the backup's manifest
before any run starts: the same rules as ``rbak restore`` (``rbak.restore.plan``), so a typo is a
refusal in the object's status, not a Job that publishes into the wrong place (or fails later)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rbak.config import ConnectionConfig, QueueSelection
from rbak.errors import ConfigError
from rbak.restore.options import RestoreOptions
from rbak.restore.plan import check_selection, resolve_target_vhosts
from rbak_operator.decide.rbakconfig import queue_selection

# rbak's config key paths, as the spec names them
SPEC_FIELDS = (("restore.vhost_mapping", "spec.vhostMapping"), ("restore.queue_mapping", "spec.queueMapping"),
               ("restore.queues", "spec.queues"), ("--vhost-map", "spec.vhostMapping"))


def backup_broker_as_target(broker: dict[str, Any] | None) -> dict[str, Any] | None:
    """The backed-up broker as a restore target (no ``spec.target``): its ``amqpUrl`` without its vhost.
    That vhost is where the backup connected, not a choice of where to restore: each vhost goes back
    to its own name (or where ``spec.vhostMapping`` says)."""
    if not broker or not broker.get("amqpUrl"):
        return broker
    p = urlsplit(broker["amqpUrl"])
    return {**broker, "amqpUrl": urlunsplit((p.scheme, p.netloc, "", p.query, ""))}


def check_restore_spec(spec: dict[str, Any], target: dict[str, Any] | None, manifest: Any) -> str | None:
    """The refusal (one line, naming spec fields) of a restore whose mappings or selection name nothing
    in ``manifest`` or whose target URL's vhost conflicts, else None. Definitions restores are left to
    the run (their vhosts are in the definitions, which the operator does not read)."""
    if spec.get("restoreDefinitions"):
        return None
    url = (target or {}).get("amqpUrl") or "amqp://cluster"  # a cluster reference names no vhost
    try:
        opts = RestoreOptions(
            manifest.backup_id, target=ConnectionConfig(amqp_url=url),
            vhost_mapping=tuple(sorted((spec.get("vhostMapping") or {}).items())),
            queue_mapping=tuple(sorted((spec.get("queueMapping") or {}).items())),
            queues=QueueSelection(**queue_selection(spec.get("queues"))))
        check_selection(manifest, opts)
        resolve_target_vhosts(manifest, opts)
    except ConfigError as e:
        msg = str(e).removeprefix("Configuration error: ")
        for ours, theirs in SPEC_FIELDS:
            msg = msg.replace(ours, theirs)
        return msg
    return None
