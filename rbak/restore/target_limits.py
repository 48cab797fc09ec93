"""What a target queue may do to restored messages, judged before publishing and checked after.

A queue's arguments and the policies applied to it can drop, expire or
dead-letter what a restore publishes, and the broker still confirms every
message: a confirm says "enqueued", not "kept". RabbitMQ combines them per
setting (``rabbit_amqqueue_process``, ``rabbit_fifo``): a numeric limit is
the smallest of the queue argument, the policy and the operator policy; the
overflow behaviour and the dead-letter exchange come from the argument when
it is set, else from the policies. The management API gives the merged
policy definition (``effective_policy_definition``, on 3.10-4.3), but only
once the queue's first statistics were emitted (seconds after a declare on
4.x); until then the policies are matched here as the broker does (pattern,
``apply-to``, highest priority), taking the strictest value on a priority tie.

What is lossy for a restore (``lossy_reasons``):

- ``max-length`` / ``max-length-bytes`` with room for fewer than the messages
  to restore (current depth + restored): ``drop-head`` drops the oldest,
  ``reject-publish`` / ``reject-publish-dlx`` refuse the rest (the publisher's
  nack would stop the restore half-way; refused before publishing instead);
- ``message-ttl``: whatever is not consumed in time expires;
- ``expires``: the queue and its messages are deleted once unused that long.

A ``dead-letter-exchange`` is named where it applies (those messages go
there instead of being dropped). ``delivery-limit`` and a dead-letter
exchange alone are not lossy: a restore only publishes, so nothing is
delivered, rejected or returned by it. Streams are not judged (their
retention is by segment age and size, not per message).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ManagementApiError

NUMERIC = ("max-length", "max-length-bytes", "message-ttl", "expires", "delivery-limit")
BY_ARGUMENT = ("overflow", "dead-letter-exchange", "dead-letter-routing-key")
KEYS = NUMERIC + BY_ARGUMENT


@dataclass(frozen=True)
class Setting:
    key: str  # the policy key: max-length, overflow, ...
    value: Any
    source: str  # "queue argument x-max-length", "policy 'p'", "operator policy 'op'"

    def __str__(self) -> str:
        return f"{self.key} {self.value!r} ({self.source})" if isinstance(self.value, str) else \
            f"{self.key} {self.value} ({self.source})"


@dataclass(frozen=True)
class TargetLimits:
    """The effective settings of one target queue (only the ones that are set)."""

    queue_type: str
    settings: dict[str, Setting] = field(default_factory=dict)

    def get(self, key: str) -> Setting | None:
        return self.settings.get(key)


def _number(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return int(v)
    try:
        return int(str(v))
    except ValueError:
        return None


def policy_applies(policy: dict[str, Any], queue: str, queue_type: str) -> bool:
    """Whether a policy (as ``/api/policies`` lists it) matches this queue, as the broker decides.

    An unreadable pattern counts as matching: the check errs on the side of refusing."""
    apply_to = policy.get("apply-to") or "all"
    if apply_to not in ("all", "queues", f"{queue_type}_queues") and not (apply_to == "streams" and queue_type == "stream"):
        return False
    try:
        return re.search(str(policy.get("pattern") or ""), queue) is not None
    except re.error:
        return True


def matching_definition(policies: list[dict[str, Any]], queue: str, queue_type: str) -> tuple[dict[str, Any], str]:
    """(definition, name) of the policy the broker applies: the highest priority match; on a tie the
    strictest value of each key (the broker's pick among equals is not defined)."""
    matches = [p for p in policies if policy_applies(p, queue, queue_type)]
    if not matches:
        return {}, ""
    top = max(_number(p.get("priority")) or 0 for p in matches)
    best = [p for p in matches if (_number(p.get("priority")) or 0) == top]
    merged: dict[str, Any] = {}
    for p in best:
        for k, v in (p.get("definition") or {}).items():
            if k in NUMERIC and k in merged and (nv := _number(v)) is not None \
                    and (nm := _number(merged[k])) is not None:
                merged[k] = min(nv, nm)
            else:
                merged.setdefault(k, v)
    return merged, " / ".join(sorted(str(p.get("name")) for p in best))


def effective_limits(queue_type: str, arguments: dict[str, Any], policy: dict[str, Any], policy_name: str,
                     operator: dict[str, Any], operator_name: str) -> TargetLimits:
    """Combine the queue's arguments with its policy and operator policy definitions, per key."""
    out: dict[str, Setting] = {}
    for key in KEYS:
        cands: list[Setting] = []
        arg = arguments.get("x-" + key)
        if arg is not None:
            cands.append(Setting(key, arg, f"queue argument x-{key}"))
        if key in policy and policy[key] is not None:
            cands.append(Setting(key, policy[key], f"policy {policy_name!r}"))
        if key in operator and operator[key] is not None:
            cands.append(Setting(key, operator[key], f"operator policy {operator_name!r}"))
        if not cands:
            continue
        if key in NUMERIC:
            nums = [(n, c) for c in cands if (n := _number(c.value)) is not None]
            if nums:
                n, best = min(nums, key=lambda t: t[0])
                out[key] = Setting(key, n, best.source)
        else:
            out[key] = cands[0]
    return TargetLimits(queue_type, out)


def read_limits(client: Any, vhost: str, queue: str, queue_type: str | None = None) -> tuple[TargetLimits, dict[str, Any]] | None:
    """The effective limits of a target queue and its management record; None when it does not exist."""
    info = _queue_record(client, vhost, queue)
    if info is None:
        return None
    qtype = info.get("type") or queue_type or "classic"
    args = info.get("arguments") or {}
    if "effective_policy_definition" in info:  # the broker's own merge of policy and operator policy
        merged = info.get("effective_policy_definition") or {}
        op_name = info.get("operator_policy") or ""
        op_def: dict[str, Any] = {}
        if op_name:
            op_def = next((p.get("definition") or {} for p in client.operator_policies(vhost)
                           if p.get("name") == op_name), {})
        pol = {k: v for k, v in merged.items() if not (k in op_def and op_def[k] == v)}
        return effective_limits(qtype, args, pol, info.get("policy") or "", op_def, op_name), info
    policies = client.policies(vhost)
    operator = client.operator_policies(vhost)
    pol, pol_name = matching_definition(policies, queue, qtype)
    op, op_name = matching_definition(operator, queue, qtype)
    return effective_limits(qtype, args, pol, pol_name, op, op_name), info


def _queue_record(client: Any, vhost: str, queue: str) -> dict[str, Any] | None:
    """``GET /api/queues/{vhost}/{name}``; a name the URL cannot carry (``.``, ``..``: HTTP clients resolve
    dot segments) is found in the vhost's listing instead."""
    from ..broker.management import q

    if queue not in (".", ".."):
        try:
            info = client.request("GET", f"queues/{q(vhost)}/{q(queue)}")
        except ManagementApiError as e:
            if e.status == 404:
                return None
            raise
        if isinstance(info, dict) and info.get("name") == queue:
            return info
    try:
        listing = client.request("GET", f"queues/{q(vhost)}") or []
    except ManagementApiError as e:
        if e.status == 404:
            return None
        raise
    return next((d for d in listing if isinstance(d, dict) and d.get("name") == queue), None)


def _dlx(limits: TargetLimits) -> str:
    d = limits.get("dead-letter-exchange")
    return f", dead-lettered to exchange {d.value!r} ({d.source})" if d is not None else ""


def lossy_reasons(limits: TargetLimits, depth: int, incoming: int, depth_bytes: int | None,
                  incoming_bytes: Callable[[], int] | None = None,
                  exact_incoming: Callable[[], int] | None = None) -> list[str]:
    """Why this target may drop, expire or dead-letter restored messages (empty: it keeps them all).

    ``depth`` and ``depth_bytes`` (None: unknown) are what the queue holds now, ``incoming`` an upper
    bound of the messages to publish; ``exact_incoming`` and ``incoming_bytes`` (body bytes) are asked
    only when a limit would be exceeded by the bound."""
    if limits.queue_type == "stream":
        return []
    out: list[str] = []
    overflow = limits.get("overflow")
    mode = str(overflow.value) if overflow is not None else "drop-head"
    how = f"overflow {mode}" + (f" ({overflow.source})" if overflow is not None else " (the default)")
    verb = ("drops the oldest messages" if mode == "drop-head"
            else "rejects (nacks) the messages past the limit" if mode == "reject-publish"
            else "rejects the messages past the limit")
    dead = _dlx(limits) if mode in ("drop-head", "reject-publish-dlx") else ""
    ml = limits.get("max-length")
    if ml is not None and depth + incoming > ml.value:
        n = exact_incoming() if exact_incoming is not None else incoming
        if depth + n > ml.value:
            out.append(f"{ml} leaves room for {max(0, ml.value - depth)} of the {n} message(s) to restore "
                       f"(it holds {depth}); with {how} the queue {verb}{dead}")
    mb = limits.get("max-length-bytes")
    if mb is not None:
        if depth_bytes is None:
            out.append(f"{mb}: it holds {depth} message(s) of unknown total size, so whether the restored "
                       f"bodies fit cannot be told; with {how} the queue {verb}{dead}")
        else:
            need = incoming_bytes() if incoming_bytes is not None else 0
            if depth_bytes + need > mb.value:
                out.append(f"{mb} leaves room for {max(0, mb.value - depth_bytes)} of the {need} body bytes to "
                           f"restore (it holds {depth_bytes}); with {how} the queue {verb}{dead}")
    ttl = limits.get("message-ttl")
    if ttl is not None:
        out.append(f"{ttl}: restored messages not consumed within {ttl.value} ms expire{_dlx(limits)}")
    exp = limits.get("expires")
    if exp is not None:
        out.append(f"{exp}: the queue is deleted with every message in it after {exp.value} ms without "
                   f"consumers or declarations")
    return out


def refusal(target_label: str, reasons: list[str]) -> str:
    """The message of a refused target (before anything is published)."""
    return (f"{target_label} may drop, expire or dead-letter restored messages: {'; '.join(reasons)}. "
            f"Nothing was published. Change the queue's arguments or policy, restore into another queue "
            f"(restore.queue_mapping), or set restore.allow_lossy_target: true to publish anyway (the restore "
            f"then fails if the queue holds fewer messages than were confirmed)")
