"""What a RabbitMQ definitions document holds, and scoping it to some vhosts (pure functions).

Used by the backup (a backup's definitions hold only what it covers) and by
the restore (an import never touches vhosts it was not asked to). Operator
policies and vhost limits are ``parameters`` (components ``operator_policy``
and ``vhost-limits``), so scoping parameters by vhost scopes them too.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

KINDS = ("users", "vhosts", "permissions", "topic_permissions", "parameters", "global_parameters",
         "policies", "queues", "exchanges", "bindings")
VHOST_KINDS = ("permissions", "topic_permissions", "parameters", "policies", "queues", "exchanges", "bindings")


def identity(kind: str, o: dict[str, Any]) -> tuple:
    """The key RabbitMQ knows an object by (what an import creates or replaces)."""
    if kind in ("users", "vhosts", "global_parameters"):
        return (o.get("name"),)
    if kind == "permissions":
        return (o.get("user"), o.get("vhost"))
    if kind == "topic_permissions":
        return (o.get("user"), o.get("vhost"), o.get("exchange"))
    if kind == "parameters":
        return (o.get("vhost"), o.get("component"), o.get("name"))
    if kind == "bindings":
        return (o.get("vhost"), o.get("source"), o.get("destination"), o.get("destination_type"),
                o.get("routing_key"), json.dumps(o.get("arguments") or {}, sort_keys=True))
    return (o.get("vhost"), o.get("name"))


def queue_type(q: dict[str, Any]) -> str:
    return (q.get("arguments") or {}).get("x-queue-type") or q.get("type") or "classic"


def scope_to_vhosts(doc: dict[str, Any], vhosts: Iterable[str]) -> dict[str, Any]:
    """A new document holding only ``vhosts``, their objects, the users with rights there, and
    no cluster-wide (global) parameters. Other top-level keys (versions) are kept."""
    keep = set(vhosts)
    out = {k: v for k, v in doc.items() if k not in KINDS}
    out["vhosts"] = [dict(v) for v in doc.get("vhosts", []) or [] if v.get("name") in keep]
    for kind in VHOST_KINDS:
        out[kind] = [dict(o) for o in doc.get(kind, []) or [] if o.get("vhost") in keep]
    users = {p.get("user") for p in out["permissions"] + out["topic_permissions"]}
    out["users"] = [dict(u) for u in doc.get("users", []) or [] if u.get("name") in users]
    out["global_parameters"] = []
    return out


def prune_bindings(doc: dict[str, Any]) -> None:
    """Drop bindings whose source exchange or destination is not in the document (in place).

    The default exchange and ``amq.*`` exchanges always exist, so bindings from them stay.
    """
    queues = {(q.get("vhost"), q.get("name")) for q in doc.get("queues", []) or []}
    exchanges = {(e.get("vhost"), e.get("name")) for e in doc.get("exchanges", []) or []}

    def exchange_ok(vhost: Any, name: str) -> bool:
        return name == "" or name.startswith("amq.") or (vhost, name) in exchanges

    def ok(b: dict[str, Any]) -> bool:
        v, dest = b.get("vhost"), b.get("destination", "")
        if not exchange_ok(v, b.get("source", "")):
            return False
        return (v, dest) in queues if b.get("destination_type", "queue") == "queue" else exchange_ok(v, dest)

    if "bindings" in doc:
        doc["bindings"] = [b for b in doc["bindings"] or [] if ok(b)]


def filter_queues(doc: dict[str, Any], keep: Callable[[str, str, str], bool]) -> None:
    """Keep the queues ``keep(vhost, name, type)`` accepts, and the bindings that still have both ends."""
    if "queues" in doc:
        doc["queues"] = [q for q in doc["queues"] or [] if keep(q.get("vhost", "/"), q.get("name", ""), queue_type(q))]
    prune_bindings(doc)


def counts(doc: dict[str, Any]) -> dict[str, int]:
    return {k: len(doc.get(k) or []) for k in KINDS if doc.get(k)}
