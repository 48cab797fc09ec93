"""The operator's end-to-end scenarios with every Job run in the real image: the local kubelet's
container mode (``opcluster.PodRunner(container_mode=True)``, ``support.container``) runs each
Job's pod spec in ``rbak:ci`` with podman, as a kubelet would (the image and command the operator
wrote, its env with the Secrets resolved, the ConfigMap and emptyDir volumes, runAsUser 1000 and
a read-only root filesystem with no /tmp), against the real API server, RabbitMQ 3.10 and moto
S3. The body the operator writes is executed by the image, not by the test's Python.

Without the image (``bash .ci/image``) or podman: skipped on a developer's machine, a failure
with ``CI=true``."""

from __future__ import annotations

import pytest

from support import container
from support.op_e2e import Cluster
from support.require import require_that

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

# The scenarios of test_operator_e2e.py, here with the Jobs in the image.
from test_operator_e2e import (  # noqa: E402,F401 (collected by pytest)
    e2e_restore_from_latest_backup_puts_messages_back,
    e2e_failing_backup_reports_the_cause as test_failing_backup_reports_the_cause,
    e2e_scheduled_backup_status_shows_manifest_counts as test_scheduled_backup_status_shows_manifest_counts,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_s3, e2e_kube):
    """tests/operator/conftest.py's cluster, its Jobs run in ``rbak:ci`` (the operator names it)."""
    require_that(container.image_problem(container.IMAGE))
    c = Cluster(tmp_path_factory.mktemp("cluster"), kube=e2e_kube, job_image=container.IMAGE)
    try:
        yield c
    finally:
        c.close()


def test_backup_then_restore_jobs_run_in_the_image(cluster, env):
    """The backup -> restore scenario, and the kubelet really ran both Jobs in the image."""
    e2e_restore_from_latest_backup_puts_messages_back(cluster, env)
    jobs = {j["metadata"]["name"]: j for j in cluster.http.items("batch/v1", "jobs")
            if j["metadata"]["name"].startswith(env.tag)}
    assert len(jobs) == 2, sorted(jobs)
    for name, job in jobs.items():
        [c] = job["spec"]["template"]["spec"]["containers"]
        assert c["image"] == container.IMAGE, (name, c["image"])
        assert (name, c["name"], container.IMAGE) in cluster.runner.container_runs, cluster.runner.container_runs
