"""What the target broker accepts, and 3.x definitions adapted to it (pure functions).

A 3.x cluster's definitions hold things RabbitMQ 4.x refuses, and one refusal
fails the whole ``POST /api/definitions``:

- ``ha-*`` policy keys: classic queue mirroring was removed in 4.0 (deprecated
  feature ``classic_queue_mirroring``, phase ``removed``);
- ``x-queue-version: 1``: classic queue storage v1 is gone in 4.3 (no feature
  flag or deprecated feature names it; the ``rabbitmq_4.3.0`` feature flag
  and the version tell);
- transient (``durable: false``) non-exclusive queues: deprecated feature
  ``transient_nonexcl_queues``, which a 4.x node may deny;
- global QoS: deprecated feature ``global_qos`` (denied by default on 4.3).
  It is not part of definitions and rbak never uses it; it is reported as a
  capability only.

The capabilities come from the management API (overview, feature flags,
deprecated features), never from trying an import and parsing its error.
``adapt_definitions`` rewrites what the target would refuse and lists every
change; ``restore.definitions_strict`` turns that list into a refusal.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

DENIED_PHASES = ("denied_by_default", "disconnected", "removed")
TRANSIENT_MODES = ("durable", "skip")


@dataclass(frozen=True)
class TargetCapabilities:
    version: str = ""
    classic_mirroring: bool = True
    cqv1: bool = True
    transient_nonexcl_queues: bool = True
    global_qos: bool = True

    def to_json_obj(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DefinitionChange:
    """One rewrite of the backed-up definitions, as reported (and refused in strict mode)."""

    kind: str  # policies | queues | bindings
    name: str  # vhost/name as on the target
    change: str  # what was done
    reason: str  # why the target needs it

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r}: {self.change} ({self.reason})"

    def to_json_obj(self) -> dict[str, str]:
        return asdict(self)


def version_tuple(version: str | None) -> tuple[int, ...]:
    out = []
    for part in (version or "").split("-")[0].split(".")[:3]:
        try:
            out.append(int(part))
        except ValueError:
            break
    return tuple(out)


def _denied(deprecated: list[dict[str, Any]] | None, name: str, default: bool) -> bool:
    """Whether the node refuses a deprecated feature; ``state`` (4.1+) wins over the phase."""
    if deprecated is None:
        return default
    for f in deprecated:
        if f.get("name") == name:
            if f.get("state") in ("denied", "permitted"):
                return f["state"] == "denied"
            return f.get("deprecation_phase") in DENIED_PHASES
    return default


def detect_capabilities(overview: dict[str, Any], feature_flags: list[dict[str, Any]] | None,
                        deprecated: list[dict[str, Any]] | None) -> TargetCapabilities:
    """From ``/api/overview``, ``/api/feature-flags`` and ``/api/deprecated-features`` (None: no endpoint)."""
    version = str(overview.get("rabbitmq_version") or "")
    v = version_tuple(version)
    flags = {f.get("name") for f in feature_flags or []}
    v4 = bool(v) and v >= (4,)
    return TargetCapabilities(
        version=version,
        classic_mirroring=not _denied(deprecated, "classic_queue_mirroring", default=v4),
        cqv1=not ("rabbitmq_4.3.0" in flags or (bool(v) and v >= (4, 3))),
        transient_nonexcl_queues=not _denied(deprecated, "transient_nonexcl_queues", default=False),
        global_qos=not _denied(deprecated, "global_qos", default=False),
    )


def capabilities_of(client: Any) -> TargetCapabilities:
    """Ask the target's management API (``rbak.broker.management.ManagementClient``)."""
    return detect_capabilities(client.overview(), client.feature_flags(), client.deprecated_features())


def _label(o: dict[str, Any]) -> str:
    return f"{o.get('vhost', '/')}/{o.get('name', '')}"


def adapt_definitions(doc: dict[str, Any], caps: TargetCapabilities, transient_queues: str = "durable",
                      ) -> tuple[dict[str, Any], list[DefinitionChange], set[tuple[str, str]]]:
    """(adapted copy, every change made, (vhost, queue) of transient queues left out).

    Only what the target refuses is touched; a document the target accepts
    comes back equal, with no changes.
    """
    out = copy.deepcopy(doc)
    changes: list[DefinitionChange] = []
    skipped: set[tuple[str, str]] = set()
    target = f"the target runs RabbitMQ {caps.version or '?'}"
    if not caps.classic_mirroring:
        kept = []
        for p in out.get("policies", []) or []:
            d = p.get("definition") or {}
            ha = sorted(k for k in d if k.startswith("ha-"))
            if ha:
                p["definition"] = {k: v for k, v in d.items() if not k.startswith("ha-")}
                why = f"classic queue mirroring was removed in RabbitMQ 4.0; {target}"
                if not p["definition"]:
                    changes.append(DefinitionChange("policies", _label(p), f"dropped: it held only {', '.join(ha)}", why))
                    continue
                changes.append(DefinitionChange("policies", _label(p), f"removed {', '.join(ha)}", why))
            kept.append(p)
        if "policies" in out:
            out["policies"] = kept
    queues = []
    for qd in out.get("queues", []) or []:
        args = qd.get("arguments") or {}
        if not caps.cqv1 and args.get("x-queue-version") == 1:
            args["x-queue-version"] = 2
            changes.append(DefinitionChange("queues", _label(qd), "x-queue-version 1 declared as 2",
                                            f"classic queue storage v1 was removed in RabbitMQ 4.3; {target}"))
        qtype = args.get("x-queue-type", "classic")
        if not caps.transient_nonexcl_queues and qd.get("durable") is False and qtype == "classic":
            why = f"transient non-exclusive queues are denied (deprecated feature transient_nonexcl_queues); {target}"
            if transient_queues == "skip":
                skipped.add((qd.get("vhost", "/"), qd.get("name", "")))
                changes.append(DefinitionChange("queues", _label(qd), "skipped (restore.transient_queues: skip)", why))
                continue
            qd["durable"] = True
            changes.append(DefinitionChange("queues", _label(qd), "declared durable", why))
        queues.append(qd)
    if "queues" in out:
        out["queues"] = queues
    if skipped:
        bindings = []
        for b in out.get("bindings", []) or []:
            if b.get("destination_type") == "queue" and (b.get("vhost", "/"), b.get("destination")) in skipped:
                changes.append(DefinitionChange("bindings", f"{b.get('vhost', '/')}/{b.get('source')}->{b.get('destination')}",
                                                "skipped with its transient queue", "restore.transient_queues: skip"))
                continue
            bindings.append(b)
        out["bindings"] = bindings
    return out, changes, skipped
