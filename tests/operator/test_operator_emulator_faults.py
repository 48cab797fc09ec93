"""Watch faults a real API server will not produce on demand, on kmock's emulator (issue 30).

A ``410 Gone`` needs a resourceVersion older than the server's watch cache: the real server of
test_operator_watch_faults.py compacts on its own schedule, so the emulator answers with one
instead (``support.opcluster.WatchFaults``). The safety resync is a day here: no periodic pass can
hide a missed event.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rbak_operator.decide.naming import manual_run_name
from support.op_e2e import Cluster, create_backup, trigger, wait_run
from support.opcluster import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

# The emulator ignores timeoutSeconds: the operator's own client timeout (this + 30 s) ends its watches.
OPERATOR_ENV = {"RBAK_OPERATOR_RESYNC_SECONDS": "86400", "RBAK_OPERATOR_WATCH_TIMEOUT_SECONDS": "1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_s3):
    c = Cluster(tmp_path_factory.mktemp("cluster-faults-emu"), operator_env=OPERATOR_ENV)
    try:
        yield c
    finally:
        c.close()


def test_a_job_finishing_while_its_watch_is_gone_is_recorded(cluster, env, tmp_path):
    """The run's Job finishes while every watch of Jobs is answered ``410 Gone``: the operator
    learns of it only by kopf's listing again after each 410, and the status still records the run.
    Runs on the emulator: a real server sends a 410 only for a resourceVersion it has compacted away,
    which it will not do on demand."""
    env.broker.publish_n(env.vhost, "q", 3, declare={})
    name = f"{env.tag}-gone"
    job = manual_run_name(name, "1")
    gate = tmp_path / "gate"  # the pod waits after its first queue until this file exists
    cluster.runner.extra_env = {"PYTHONPATH": str(GATE_DIR), "RBAK_TEST_PROGRESS_GATE": str(gate)}
    faults = cluster.emu.faults
    try:
        create_backup(cluster, env, name)
        trigger(cluster, name, "1")
        wait_for(lambda: cluster.status(name).get("active") == [job], 60, what="run active", diag=cluster.logs)
        wait_for(Path(f"{gate}.backup.reached").exists, 60, what="the run held", diag=cluster.logs)
        faults.expire("jobs", times=1_000_000)  # every Jobs watch from now on, until disarmed
        # the watch open now ends by the operator's client timeout; its successor gets the 410
        wait_for(lambda: faults.served.get("jobs", 0) >= 1, 90, what="a 410 on the Jobs watch", diag=cluster.logs)
        gate.touch()  # the Job finishes while no watch of Jobs is open
        run = wait_run(cluster, name, job=job, phase="Succeeded", timeout=120)
        assert run["messages"] == 3
        assert cluster.status(name)["active"] == []
        assert faults.served["jobs"] >= 2  # kopf listed again and re-watched after the first 410
    finally:
        faults.expire("jobs", times=0)
        gate.touch()
        cluster.runner.extra_env = {}


from test_operator_progress_e2e import GATE_DIR  # noqa: E402
