"""Fixtures of the operator's end-to-end tests (helpers: tests/support/op_e2e.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.brokers import unique_name
from support.op_e2e import API, Cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_s3, e2e_kube):
    """The operator, the local kubelet and a real API server: the suite's own (``kube_api``), or the
    cluster ``RBAK_E2E_KUBECONFIG`` names (``e2e_kube``). kmock's emulator only where a module needs
    a fault the server will not produce (test_operator_emulator_faults.py)."""
    # REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE stay in the operator's environment as this machine sets
    # them: the kubernetes client keeps the kubeconfig's CA regardless (issue #28, defect 3).
    c = Cluster(tmp_path_factory.mktemp("cluster"), kube=e2e_kube)
    try:
        yield c
    finally:
        calls = c.emu.api_calls()
        dump = os.environ.get("RBAK_OPERATOR_API_CALLS_DUMP")
        if dump and not c.external:
            Path(dump).write_text(json.dumps(sorted(calls), indent=1))
        c.close()


@pytest.fixture
def env(cluster, rmq310, moto_s3, s3_bucket):
    """A fresh vhost with a queue, a bucket, and the Secrets a backup needs."""
    vhost = unique_name("test-op")
    rmq310.create_vhost(vhost)
    tag = unique_name("e2e")
    http = cluster.http
    http.secret(f"{tag}-s3", {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    http.secret(f"{tag}-rmq", {"username": rmq310.user, "password": rmq310.password})
    http.secret(f"{tag}-bad", {"username": rmq310.user, "password": "definitely-wrong"})
    http.secret(f"{tag}-cluster-default-user", {"username": rmq310.user, "password": rmq310.password,
                                                "host": rmq310.host, "port": str(rmq310.amqp_port)})
    e = type("Env", (), {})()
    e.vhost, e.tag, e.broker, e.bucket = vhost, tag, rmq310, s3_bucket
    e.storage = {"s3": {"bucket": s3_bucket.bucket, "prefix": s3_bucket.prefix, "endpoint": s3_bucket.endpoint,
                        "pathStyle": True, "region": "us-east-1", "credentialsSecretRef": {"name": f"{tag}-s3"}}}
    e.url_broker = {"amqpUrl": f"amqp://{rmq310.host}:{rmq310.amqp_port}/%2f", "managementUrl": rmq310.management_url,
                    "credentialsSecretRef": {"name": f"{tag}-rmq"}}
    e.cluster_broker = {"rabbitmqClusterReference": {"name": f"{tag}-cluster"}}
    try:
        yield e
    finally:
        # Delete this test's objects so their reconcile loops end and the server stays small.
        for api, plural in ((API, "rabbitmqrestores"), (API, "rabbitmqbackups"), (API, "rabbitmqarchives"),
                            ("batch/v1", "jobs"),
                            ("sparkoperator.k8s.io/v1beta2", "sparkapplications")):
            for o in http.items(api, plural):
                if o["metadata"]["name"].startswith(tag):
                    http.patch(api, plural, o["metadata"]["name"], {"metadata": {"finalizers": None}})
                    http.delete(api, plural, o["metadata"]["name"])
        rmq310.delete_vhost(vhost)
