"""Undo a failed definitions import from the snapshot taken just before it.

``POST /api/definitions`` is not atomic: RabbitMQ imports users, vhosts,
permissions, parameters, policies, queues, exchanges and bindings in that
order and stops at the first refusal, leaving everything before it in place
(measured: a 3.x policy refused by 4.x left every vhost of the document on
the target). The rollback only ever touches objects of the imported document:

1. objects the import created (in the document and on the target now, not in
   the snapshot) are deleted: a created vhost with everything in it, else
   bindings, queues (only if empty), exchanges, policies, parameters,
   permissions, users, global parameters;
2. objects that existed and were replaced (users, permissions, policies,
   parameters) get the snapshot's version back with one more import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..base.definitions_doc import identity
from ..errors import ManagementApiError
from ..broker.management import ManagementClient, q

# deletion order: dependants first
DELETE_ORDER = ("bindings", "queues", "exchanges", "policies", "parameters", "permissions", "topic_permissions",
                "users", "global_parameters")
RESTORABLE = ("users", "permissions", "topic_permissions", "policies", "parameters", "global_parameters")


@dataclass
class RollbackResult:
    removed: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [f"removed {len(self.removed)} object(s) the import had created"
                 + (f" ({', '.join(self.removed[:10])}{', ...' if len(self.removed) > 10 else ''})" if self.removed else ""),
                 f"restored {len(self.restored)} replaced object(s)"]
        if self.errors:
            parts.append(f"could NOT undo {len(self.errors)}: {'; '.join(self.errors[:5])}")
        return ", ".join(parts)


def _by_identity(doc: dict[str, Any], kind: str) -> dict[tuple, dict[str, Any]]:
    return {identity(kind, o): o for o in doc.get(kind, []) or []}


_SINGULAR = {"users": "user", "vhosts": "vhost", "global_parameters": "global parameter", "permissions": "permission",
             "topic_permissions": "topic permission", "bindings": "binding", "policies": "policy",
             "parameters": "parameter", "queues": "queue", "exchanges": "exchange"}


def _label(kind: str, o: dict[str, Any]) -> str:
    what = _SINGULAR.get(kind, kind)
    if kind in ("users", "vhosts", "global_parameters"):
        return f"{what} {o.get('name')!r}"
    if kind in ("permissions", "topic_permissions"):
        return f"{what} of {o.get('user')!r} in {o.get('vhost')!r}"
    if kind == "bindings":
        return f"{what} {o.get('vhost')}/{o.get('source')}->{o.get('destination')}"
    return f"{what} {o.get('vhost')}/{o.get('name')}"


def _delete_binding(client: ManagementClient, b: dict[str, Any]) -> None:
    kind = "q" if b.get("destination_type", "queue") == "queue" else "e"
    base = f"bindings/{q(b['vhost'])}/e/{q(b.get('source', ''))}/{kind}/{q(b['destination'])}"
    want = (b.get("routing_key", ""), json.dumps(b.get("arguments") or {}, sort_keys=True))
    for found in client.request("GET", base) or []:
        if (found.get("routing_key", ""), json.dumps(found.get("arguments") or {}, sort_keys=True)) == want:
            client.delete(f"{base}/{q(found['properties_key'])}")


def _delete(client: ManagementClient, kind: str, o: dict[str, Any]) -> None:
    v = o.get("vhost", "/")
    if kind == "bindings":
        _delete_binding(client, o)
    elif kind == "queues":
        client.delete(f"queues/{q(v)}/{q(o['name'])}?if-empty=true")
    elif kind == "exchanges":
        client.delete(f"exchanges/{q(v)}/{q(o['name'])}")
    elif kind == "policies":
        client.delete(f"policies/{q(v)}/{q(o['name'])}")
    elif kind == "parameters":
        comp = o.get("component", "")
        if comp == "operator_policy":
            client.delete(f"operator-policies/{q(v)}/{q(o['name'])}")
        elif comp == "vhost-limits":
            for limit in (o.get("value") or {}):
                client.delete(f"vhost-limits/{q(v)}/{q(limit)}")
        else:
            client.delete(f"parameters/{q(comp)}/{q(v)}/{q(o['name'])}")
    elif kind == "permissions":
        client.delete(f"permissions/{q(v)}/{q(o['user'])}")
    elif kind == "topic_permissions":
        client.delete(f"topic-permissions/{q(v)}/{q(o['user'])}")
    elif kind == "users":
        client.delete(f"users/{q(o['name'])}")
    elif kind == "global_parameters":
        client.delete(f"global-parameters/{q(o['name'])}")


def rollback_import(client: ManagementClient, snapshot: dict[str, Any], imported: dict[str, Any]) -> RollbackResult:
    """Steps 1-2 of the module docstring; never raises for one object (its error is collected)."""
    res = RollbackResult()
    now = client.get_definitions()
    before_vhosts = {v.get("name") for v in snapshot.get("vhosts", []) or []}
    now_vhosts = {v.get("name") for v in now.get("vhosts", []) or []}
    created_vhosts = [v.get("name") for v in imported.get("vhosts", []) or []
                      if v.get("name") in now_vhosts and v.get("name") not in before_vhosts]
    for name in created_vhosts:
        try:
            client.delete(f"vhosts/{q(name)}")
            res.removed.append(f"vhost {name!r}")
        except ManagementApiError as e:
            res.errors.append(f"vhost {name!r}: {e}")
    gone = set(created_vhosts)
    for kind in DELETE_ORDER:
        before, current = _by_identity(snapshot, kind), _by_identity(now, kind)
        for ident, o in _by_identity(imported, kind).items():
            if ident in before or ident not in current or o.get("vhost") in gone:
                continue
            try:
                _delete(client, kind, current[ident])
                res.removed.append(_label(kind, o))
            except ManagementApiError as e:
                res.errors.append(f"{_label(kind, o)}: {e}")
    back: dict[str, list[dict[str, Any]]] = {}
    for kind in RESTORABLE:
        before, current = _by_identity(snapshot, kind), _by_identity(now, kind)
        for ident in _by_identity(imported, kind):
            if ident in before and current.get(ident) != before[ident]:
                back.setdefault(kind, []).append(before[ident])
    if back:
        try:
            client.post_definitions(back)
            res.restored = [_label(k, o) for k, objs in back.items() for o in objs]
        except ManagementApiError as e:
            res.errors.append(f"re-importing {sum(map(len, back.values()))} replaced object(s): {e}")
    return res
