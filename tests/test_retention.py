"""rbak.repo.retention.plan_retention over random backup histories (hypothesis) and a few fixed cases."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbak.errors import ConfigError
from rbak.repo.retention import RetentionPolicy, StoredBackup, parse_duration, plan_retention

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
HOUR = 3600 * 1000


@st.composite
def histories(draw):
    """Backups over ~100 days, each incremental on zero or more earlier ones; some incomplete or foreign."""
    n = draw(st.integers(0, 40))
    ages = sorted(draw(st.lists(st.integers(0, 100 * 24), min_size=n, max_size=n)), reverse=True)
    out: list[StoredBackup] = []
    for i, age_h in enumerate(ages):
        ts = int(NOW.timestamp() * 1000) - age_h * HOUR + i  # distinct, in order
        deps = frozenset(draw(st.sets(st.sampled_from([b.backup_id for b in out]), max_size=2))) if out else frozenset()
        out.append(StoredBackup(f"b{i:03d}", ts, draw(st.booleans().map(lambda x: x or i % 7 != 3)), deps,
                                owned=draw(st.sampled_from([True] * 5 + [False]))))
    return out


policies = st.builds(
    RetentionPolicy,
    st.one_of(st.none(), st.integers(1, 6)),
    st.one_of(st.none(), st.integers(0, 8)),
    st.one_of(st.none(), st.integers(0, 5)),
    st.one_of(st.none(), st.integers(0, 4)),
    st.one_of(st.none(), st.integers(1, 120).map(lambda d: timedelta(days=d))),
)


def closure(ids: set[str], by_id: dict[str, StoredBackup]) -> set[str]:
    out, stack = set(), list(ids)
    while stack:
        b = by_id.get(stack.pop())
        for d in b.depends_on if b else ():
            if d in by_id and d not in out:
                out.add(d)
                stack.append(d)
    return out


@settings(max_examples=150, deadline=None)
@given(histories(), policies)
def test_no_kept_chain_is_ever_broken(backups, policy):
    plan = plan_retention(backups, policy, NOW)
    by_id = {b.backup_id: b for b in backups}
    keep = set(plan.keep)
    assert keep | set(plan.delete) == set(by_id) and not keep & set(plan.delete)
    assert closure(keep, by_id) <= keep  # every backup a kept one continues is kept
    for bid in plan.delete:
        b = by_id[bid]
        assert b.complete and b.owned  # never an incomplete (maybe running) one, never another policy's
    done = [b for b in backups if b.complete and b.owned]
    if done:
        assert max(done, key=lambda b: (b.created_at_ms, b.backup_id)).backup_id in keep
    for v in plan.verdicts:
        assert v.reasons  # every decision says why


def _newest_per_period(done: list[StoredBackup], key, n: int) -> set[str]:
    best: dict[str, StoredBackup] = {}
    for b in done:
        k = key(datetime.fromtimestamp(b.created_at_ms / 1000, tz=timezone.utc))
        if k not in best or b.created_at_ms > best[k].created_at_ms:
            best[k] = b
    return {best[k].backup_id for k in sorted(best, reverse=True)[:n]}


@settings(max_examples=150, deadline=None)
@given(histories(), st.integers(0, 8), st.integers(0, 5), st.integers(0, 4))
def test_gfs_keeps_the_newest_backup_of_each_day_week_month(backups, d, w, m):
    plan = plan_retention(backups, RetentionPolicy(keep_daily=d, keep_weekly=w, keep_monthly=m), NOW)
    done = [b for b in backups if b.complete and b.owned]
    want = (_newest_per_period(done, lambda t: t.date().isoformat(), d)
            | _newest_per_period(done, lambda t: tuple(t.isocalendar()[:2]), w)
            | _newest_per_period(done, lambda t: (t.year, t.month), m))
    keep = set(plan.keep)
    assert want <= keep
    by_id = {b.backup_id: b for b in backups}
    if done:
        want.add(max(done, key=lambda b: b.created_at_ms).backup_id)
    # nothing else of ours survives, unless the chain of a kept one (ours, running, or another policy's) needs it
    kept_anyway = want | {b.backup_id for b in backups if not (b.complete and b.owned)}
    extra = {b for b in keep if by_id[b].complete and by_id[b].owned} - want
    assert extra <= closure(kept_anyway, by_id)


def test_keep_last_with_a_chain():
    t = int(NOW.timestamp() * 1000)
    bs = [StoredBackup("full", t - 3 * HOUR, True), StoredBackup("inc1", t - 2 * HOUR, True, frozenset({"full"})),
          StoredBackup("inc2", t - HOUR, True, frozenset({"inc1"})), StoredBackup("running", t, False)]
    plan = plan_retention(bs, RetentionPolicy(keep_last=1), NOW)
    assert plan.delete == []
    lines = "\n".join(plan.lines())
    assert "keep   full: base of inc1" in lines and "keep   inc2: one of the last 1" in lines
    assert "keep   running: incomplete (may still be running)" in lines
    # a new full backup ends the chain: the old chain may go
    bs.append(StoredBackup("full2", t + 1, True))
    assert plan_retention(bs, RetentionPolicy(keep_last=1), NOW).delete == ["full", "inc1", "inc2"]


def test_max_age_never_empties_the_storage():
    t = int((NOW - timedelta(days=400)).timestamp() * 1000)
    bs = [StoredBackup(f"b{i}", t + i, True) for i in range(3)]
    plan = plan_retention(bs, RetentionPolicy(max_age=parse_duration("30d")), NOW)
    assert plan.delete == ["b0", "b1"] and plan.keep == ["b2"]


def test_bad_policy_values():
    with pytest.raises(ConfigError, match="keep_last"):
        RetentionPolicy(keep_last=0)
    with pytest.raises(ConfigError, match="--max-age.*'1y'"):
        parse_duration("1y")
