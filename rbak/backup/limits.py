"""What the broker applies to a quorum queue, resolved before a backup reads it (pure functions).

RabbitMQ resolves a quorum queue's ``delivery-limit`` and ``delayed-retry-*``
settings from the queue argument, the policy and the operator policy
(``rabbit_queue_type_util:args_policy_lookup`` + ``rabbit_policy:get``), with
per-key merge rules that changed in 4.0. The management API's per-queue
``policy`` / ``effective_policy_definition`` fields only appear after the
queue's first stats tick (measured: right after a declare, and on quorum
queues for seconds afterwards, the listing holds neither), so the policy
lists are matched here as the broker matches them, and anything the
management API reports on top can only make the result stricter.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Iterable

log = logging.getLogger(__name__)

DEFAULT_LIMIT_4X = 20  # rabbit_quorum_queue ?DEFAULT_DELIVERY_LIMIT, 4.0 and later
RETRY_KEYS = ("delayed-retry-type", "delayed-retry-min", "delayed-retry-max")

_APPLY_TO = {
    "all": {"classic", "quorum", "stream"},
    "queues": {"classic", "quorum", "stream"},
    "classic_queues": {"classic"},
    "quorum_queues": {"quorum"},
    "streams": {"stream"},
}


def version_tuple(version: str | None) -> tuple[int, int]:
    """``"4.3.6"`` -> (4, 3); unknown -> (0, 0)."""
    parts = re.findall(r"\d+", version or "")
    if len(parts) < 2:
        return (int(parts[0]), 0) if parts else (0, 0)
    return int(parts[0]), int(parts[1])


@dataclass(frozen=True, slots=True)
class Setting:
    """One resolved value and where it came from (for error messages)."""

    value: Any
    source: str  # e.g. "queue argument x-delivery-limit", "policy 'lim'", "broker default (4.x)"


@dataclass(frozen=True, slots=True)
class QueueSettings:
    delivery_limit: Setting | None  # value None: unlimited
    delayed_retry: Setting | None  # value: "all" | "failed" | "returned"; None: disabled
    single_active: bool = False  # x-single-active-consumer: a read may use one consumer only


def matching_policies(policies: Iterable[dict[str, Any]], name: str, queue_type: str) -> list[dict[str, Any]]:
    """The policies of the highest priority whose pattern and apply-to match (all of them on a tie).

    RabbitMQ picks one policy per queue (highest priority); on equal priorities its
    choice is not something a client can predict, so every tied one is returned and
    the caller takes the stricter value.
    """
    hits: list[dict[str, Any]] = []
    for p in policies:
        if queue_type not in _APPLY_TO.get(p.get("apply-to") or "all", set()):
            continue
        pattern = p.get("pattern") or ""
        try:
            matched = re.search(pattern, name) is not None
        except re.error:
            matched = True  # an Erlang pattern Python cannot read: assume it applies (stricter)
        if matched:
            hits.append(p)
    if not hits:
        return []
    top = max(int(p.get("priority") or 0) for p in hits)
    return [p for p in hits if int(p.get("priority") or 0) == top]


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _merge_limit(a: int, b: int, major: int) -> int:
    """Two delivery limits as the broker merges them (policy/op-policy, and policy/argument)."""
    if major >= 4 and (a < 0 or b < 0):
        return max(a, b)  # 4.x: negative = unlimited, and the other (limited) value is kept
    return min(a, b)


def resolve_delivery_limit(arguments: dict[str, Any], policies: list[dict[str, Any]],
                           op_policies: list[dict[str, Any]], version: str | None) -> Setting:
    """The delivery limit the broker applies (value None: unlimited). Candidates from tied policies
    count as several policies: the stricter wins."""
    major = version_tuple(version)[0]
    pol = [(v, f"policy {p.get('name')!r}") for p in policies
           if (v := _int((p.get("definition") or {}).get("delivery-limit"))) is not None]
    op = [(v, f"operator policy {p.get('name')!r}") for p in op_policies
          if (v := _int((p.get("definition") or {}).get("delivery-limit"))) is not None]
    policy_val: tuple[int, str] | None = None
    for v, src in pol + op:  # policy merged with operator policy, as rabbit_policy:get
        if policy_val is None:
            policy_val = (v, src)
        else:
            merged = _merge_limit(policy_val[0], v, major)
            policy_val = (merged, policy_val[1] if merged == policy_val[0] else src)
    arg = _int(arguments.get("x-delivery-limit"))
    if arg is not None and policy_val is not None:
        merged = _merge_limit(policy_val[0], arg, major)
        found: tuple[int, str] | None = (merged, policy_val[1] if merged == policy_val[0] else "queue argument x-delivery-limit")
    elif arg is not None:
        found = (arg, "queue argument x-delivery-limit")
    else:
        found = policy_val
    if found is None:
        return Setting(DEFAULT_LIMIT_4X, f"the broker's default for {version}") if major >= 4 else \
            Setting(None, f"none set ({version} has no default)")
    value, src = found
    if value < 0 and major >= 4:
        return Setting(None, src)  # 4.x: negative disables the limit
    return Setting(value, src)


def resolve_delayed_retry(arguments: dict[str, Any], policies: list[dict[str, Any]],
                          op_policies: list[dict[str, Any]]) -> Setting | None:
    """RabbitMQ 4.3 ``delayed-retry-type`` (policy has precedence, the operator policy over it)
    when it is active (a positive ``delayed-retry-min``); None when disabled."""
    types = []
    for p in op_policies:
        if (t := (p.get("definition") or {}).get("delayed-retry-type")) is not None:
            types.append((t, f"operator policy {p.get('name')!r}"))
    if not types:
        for p in policies:
            if (t := (p.get("definition") or {}).get("delayed-retry-type")) is not None:
                types.append((t, f"policy {p.get('name')!r}"))
    if not types and arguments.get("x-delayed-retry-type") is not None:
        types.append((arguments["x-delayed-retry-type"], "queue argument x-delayed-retry-type"))
    mins = [_int((p.get("definition") or {}).get("delayed-retry-min")) for p in policies + op_policies]
    mins.append(_int(arguments.get("x-delayed-retry-min")))
    active = [(t, src) for t, src in types if t in ("all", "failed", "returned")]
    if not active or not any(m is not None and m > 0 for m in mins):
        return None
    # tied policies: "all" > "returned"/"failed" (the one delaying more returns is the stricter)
    active.sort(key=lambda x: x[0] != "all")
    return Setting(active[0][0], active[0][1])


def resolve_settings(arguments: dict[str, Any], name: str, queue_type: str, policies: list[dict[str, Any]],
                     op_policies: list[dict[str, Any]], version: str | None,
                     reported_policy: str | None = None, reported_op_policy: str | None = None) -> QueueSettings:
    """Every setting of a quorum queue that decides how a backup may read and return it."""
    pol = matching_policies(policies, name, queue_type)
    op = matching_policies(op_policies, name, queue_type)
    # what the management API reports (once it does) is the broker's own choice: add it
    pol += [p for p in policies if reported_policy and p.get("name") == reported_policy and p not in pol]
    op += [p for p in op_policies if reported_op_policy and p.get("name") == reported_op_policy and p not in op]
    limit = resolve_delivery_limit(arguments, pol, op, version) if queue_type == "quorum" else None
    retry = None
    if queue_type == "quorum" and version_tuple(version) >= (4, 3):  # delayed retries are new in 4.3
        retry = resolve_delayed_retry(arguments, pol, op)
    return QueueSettings(limit, retry, arguments.get("x-single-active-consumer") is True)


def refuse_delayed_retry(retry: Setting | None, nack_return: bool) -> str | None:
    """Why a quorum queue with delayed retries cannot be read without delaying its messages, or None.

    4.3 (``rabbit_fifo:should_delay0``): ``all`` delays every return; ``returned`` delays
    returns that are not failures (a ``basic.nack`` with requeue, a consumer timeout);
    ``failed`` delays failed ones (a channel close, a reject). rbak returns by nack where the
    broker counts it as no failure, else by closing the channel.
    """
    if retry is None:
        return None
    kind = retry.value
    if kind == "all" or (kind == "returned" and nack_return) or (kind == "failed" and not nack_return):
        how = "basic.nack (a plain return)" if nack_return else "closing the channel (a failed delivery)"
        return (f"delayed retries are on (delayed-retry-type {kind!r}, from {retry.source}): every message a "
                f"backup returns by {how} would be held back from your consumers for the retry delay")
    return None


def budget_ceiling(limit: int | None, margin: int) -> int | None:
    """The ``x-delivery-count`` no message may reach because of a backup: ``limit - margin``.

    A backup that returns by channel close (every quorum return before 4.3, measured: 0-9-1
    close, cancel, nack and reject, AMQP 1.0 ``released`` and ``modified`` on 4.0.5) adds one
    delivery to each message it takes, so a message at count ``c`` may be taken only while
    ``c + 1 < ceiling``: the application keeps ``margin`` deliveries below its limit (and the
    one at the limit) for its own retries. None: no limit applies.
    """
    return None if limit is None else limit - margin


def may_take(count: int, ceiling: int | None) -> bool:
    """Whether a message at ``count`` may be taken (and given back with one more delivery)."""
    return ceiling is None or count + 1 < ceiling
