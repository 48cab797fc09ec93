"""An instant evaluation of the alert expressions the chart ships, over one scrape of live metrics.

Prometheus is not on this machine, so a test that shows an alert fires evaluates its ``expr`` here: a
vector selector (matchers by equality), a number, and a comparison between two vectors (``on(...)`` /
``ignoring(...)`` one-to-one matching) or a vector and a number, as PromQL defines them (the left side's
samples whose comparison holds, with its labels). Anything else raises, so an unsupported expression
cannot pass silently. ``for:`` is not evaluated: the test says how long the condition held.
"""

from __future__ import annotations

import operator
import urllib.request
from typing import Any

from support.require import require

Sample = tuple[dict[str, str], float]
OPS = {">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le, "==": operator.eq,
       "!=": operator.ne}


def scrape(url: str) -> dict[str, list[Sample]]:
    """metric name -> [(labels, value)] of one /metrics scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out: dict[str, list[Sample]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def evaluate(expr: str, metrics: dict[str, list[Sample]]) -> list[Sample]:
    """The samples ``expr`` returns at this instant (an alert fires for each)."""
    node = require("promql_parser").parse(expr)
    res = _eval(node, metrics)
    if isinstance(res, float):
        raise ValueError(f"{expr!r} is a scalar, not a vector")
    return res


def _eval(node: Any, metrics: dict[str, list[Sample]]) -> list[Sample] | float:
    kind = type(node).__name__
    if kind == "VectorSelector":
        want = {m.name: m.value for m in node.matchers.matchers} if node.matchers else {}
        if any(str(m.op) != "=" for m in (node.matchers.matchers if node.matchers else [])):
            raise ValueError(f"only = matchers are evaluated here: {node}")
        return [(lab, v) for lab, v in metrics.get(node.name, []) if all(lab.get(k) == x for k, x in want.items())]
    if kind == "NumberLiteral":
        return float(node.val)
    if kind == "ParenExpr":
        return _eval(node.expr, metrics)
    if kind == "BinaryExpr":
        op = OPS.get(str(node.op))
        mod = node.modifier
        if op is None or (mod is not None and (mod.return_bool or mod.group_labels)):
            raise ValueError(f"not evaluated here: {node}")
        lhs, rhs = _eval(node.lhs, metrics), _eval(node.rhs, metrics)
        if isinstance(lhs, float) and isinstance(rhs, float):
            raise ValueError(f"scalar comparison without bool: {node}")
        if isinstance(rhs, float):
            return [(lab, v) for lab, v in lhs if op(v, rhs)]  # type: ignore[union-attr]
        if isinstance(lhs, float):
            return [(lab, v) for lab, v in rhs if op(lhs, v)]
        matching = mod.matching if mod is not None else None

        def key(lab: dict[str, str]) -> tuple:
            if matching is None:
                return tuple(sorted(lab.items()))
            names = set(matching.labels)
            on = "on" in str(matching).split("(")[0]
            return tuple(sorted((k, v) for k, v in lab.items() if (k in names) == on))

        right: dict[tuple, float] = {}
        for lab, v in rhs:
            if key(lab) in right:
                raise ValueError(f"many-to-one matching on the right of {node}")
            right[key(lab)] = v
        return [(lab, v) for lab, v in lhs if key(lab) in right and op(v, right[key(lab)])]
    raise ValueError(f"{kind} is not evaluated here")
