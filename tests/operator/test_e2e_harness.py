"""What the end-to-end harness installs on an existing cluster (``RBAK_E2E_KUBECONFIG``), checked
offline: the suite's own API server serves no admission policies, and no kind cluster runs here
(docs/operator.md, "The end-to-end suite on your own cluster")."""

from __future__ import annotations

import celpy
import kubernetes_validate
import pytest

from support.opcluster import LOCAL_KUBELET_LABEL, LOCAL_KUBELET_POLICY


@pytest.mark.parametrize("obj", LOCAL_KUBELET_POLICY, ids=lambda o: o["kind"])
def test_the_local_kubelet_policy_is_a_valid_object(obj):
    kubernetes_validate.validate(obj, "1.33", strict=True)


def test_the_local_kubelet_policy_refuses_only_pods_a_job_owns():
    """The Job controller's pods are refused; the harness's own Pod objects (no owner) and pods of
    anything else are not; only in namespaces the harness labels."""
    policy, binding = LOCAL_KUBELET_POLICY
    [rule] = policy["spec"]["validations"]
    env = celpy.Environment()
    allowed = env.program(env.compile(rule["expression"]))

    def admits(meta: dict) -> bool:
        return bool(allowed.evaluate({"object": celpy.json_to_cel({"metadata": meta})}))

    assert admits({"name": "run-pod", "labels": {"job-name": "run"}})
    assert admits({"name": "web-1", "ownerReferences": [{"kind": "ReplicaSet", "name": "web"}]})
    assert not admits({"name": "run-x1", "ownerReferences": [{"kind": "Job", "name": "run"}]})
    assert not admits({"name": "run-x2", "ownerReferences": [{"kind": "ReplicaSet", "name": "a"},
                                                              {"kind": "Job", "name": "run"}]})
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": {LOCAL_KUBELET_LABEL: "true"}}
    assert binding["spec"]["validationActions"] == ["Deny"]
