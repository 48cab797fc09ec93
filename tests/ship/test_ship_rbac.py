"""The chart grants the operator exactly the API calls its code makes, no more, no less.

The operator lists them in ``rbak_operator.kube.api_calls.USED_API_CALLS`` (its
end-to-end test checks the real process stays inside that set, from the API
emulator's request log); here the chart's rendered Roles are compared with it
for every RBAC shape the chart produces.
"""

from __future__ import annotations

import pytest

from support.ship import find, granted, manifests, render_chart

RELEASE_NS = "rbak-system"  # render_chart's release namespace
LEASES = {("coordination.k8s.io", "leases")}


def used() -> set[tuple[str, str, str]]:
    from rbak_operator.kube.api_calls import used_api_calls

    return used_api_calls()


def without(calls: set, resources: set[tuple[str, str]]) -> set:
    return {c for c in calls if (c[0], c[1]) not in resources}


def lease_calls() -> set[tuple[str, str, str]]:
    """Leader election's calls: its Lease is created, read and renewed, never listed, watched or patched."""
    calls = used() - without(used(), LEASES)
    assert calls == {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    return calls


@pytest.mark.parametrize("replicas", [1, 2])
def test_all_namespaces_cluster_role_is_exactly_what_the_operator_uses(replicas):
    cluster, per_ns = granted(manifests(render_chart({"operator": {"replicas": replicas}})))
    # the Lease is never granted cluster-wide: a Role in the release namespace, only with election
    expected = without(used(), LEASES)
    assert cluster - expected == set(), f"granted but never used: {sorted(cluster - expected)}"
    assert expected - cluster == set(), f"used but not granted: {sorted(expected - cluster)}"
    assert per_ns == ({RELEASE_NS: lease_calls()} if replicas > 1 else {})


@pytest.mark.parametrize("watch", [["a", "b"], [RELEASE_NS, "b"]], ids=["elsewhere", "release-ns-watched"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_watched_namespaces_roles_are_exactly_what_the_operator_uses(replicas, watch):
    objs = manifests(render_chart({"operator": {"replicas": replicas}, "watchNamespaces": watch}))
    cluster, per_ns = granted(objs)
    cluster_scoped = {("", "namespaces"), ("apiextensions.k8s.io", "customresourcedefinitions")}
    calls = without(used(), LEASES)
    want_cluster = {c for c in calls if (c[0], c[1]) in cluster_scoped}
    want_ns = calls - want_cluster
    want = {ns: set(want_ns) for ns in watch}
    if replicas > 1:  # the Lease lives in the release namespace, watched or not
        want.setdefault(RELEASE_NS, set()).update(lease_calls())
    assert cluster == want_cluster, (sorted(cluster ^ want_cluster))
    assert set(per_ns) == set(want)
    for ns, grants in per_ns.items():
        assert grants == want[ns], (ns, sorted(grants ^ want[ns]))


@pytest.mark.parametrize("values", [{"operator": {"leaderElection": {"enabled": True}}},
                                    {"operator": {"replicas": 3, "leaderElection": {"enabled": False}}}],
                         ids=["forced-on", "replicas-win"])
def test_leader_election_grants_the_lease_whenever_it_is_on(values):
    cluster, per_ns = granted(manifests(render_chart(values)))
    assert cluster == without(used(), LEASES)
    assert per_ns == {RELEASE_NS: lease_calls()}


def test_backup_jobs_get_no_api_access_and_spark_drivers_only_their_pods():
    objs = manifests(render_chart({"spark": {"enabled": True}, "watchNamespaces": ["a"]}))
    cluster, per_ns = granted(objs, sa="rbak-job")
    assert cluster == set() and per_ns == {}
    cluster, per_ns = granted(objs, sa="rbak-spark")
    assert cluster == set()
    assert {r for _, r, _ in per_ns["a"]} == {"pods", "services", "configmaps", "persistentvolumeclaims"}
    assert {g for g, _, _ in per_ns["a"]} == {""}


def test_the_comparison_would_catch_a_missing_or_extra_rule():
    """The helpers above really see rules: a role missing 'create jobs' or granting secrets/list differs."""
    objs = manifests(render_chart({}))
    role = find(objs, "ClusterRole")[0]
    cluster, _ = granted(objs)
    assert ("batch", "jobs", "create") in cluster
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["jobs"]] + [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]
    tampered, _ = granted(objs)
    assert ("batch", "jobs", "create") not in tampered and ("", "secrets", "list") in tampered
