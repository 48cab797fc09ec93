"""Fixtures for real brokers, a real S3 endpoint and TLS files (helpers: tests/support/).

- ``broker``: each test runs once per CI broker (ids ``rmq310``, ``rmq40``, ``rmq43``).
  ``rmq310`` / ``rmq40`` / ``rmq43``: one specific broker.
- ``vhost``: a fresh ``test-<hex>`` vhost on ``broker`` (guest has full rights),
  deleted after the test. Stay inside it: other test runs share the brokers.
  ``vhost_factory``: ``make(broker)`` for more vhosts or vhosts on a chosen broker.
- ``moto_s3``: endpoint URL of a moto S3 server (one per xdist worker); fake AWS
  credentials are exported in ``os.environ`` for the whole session.
- ``lock_bucket``: a fresh bucket with S3 Object Lock enabled (no prefix).
- ``s3_bucket``: a fresh bucket; the fixture value is its storage URL (``str``) with
  ``.bucket``, ``.endpoint``, ``.prefix``, ``.keys()``, ``.get(key)``.
- ``tls``: ``support.tls.TlsFiles`` with the CI certificate paths.
- ``kube_api``: a real Kubernetes API server (etcd + rbak-kube-apiserver, one per xdist
  worker): ``support.kubeapi.KubeApi`` with ``.kubeconfig``, ``.server``, ``.ca_file``,
  ``.token`` and ``.kubectl(*args, input=None, check=True)``.

An unreachable broker, missing TLS material or a missing package FAILS the test
when CI=true and skips it otherwise (``support.require``), so CI can never pass
by skipping.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.brokers import BROKERS, Broker, unique_name
from support.kubeapi import ExternalKube, KubeApi, binaries_problem
from support.require import require_that, unavailable
from support.s3 import MotoS3Server, S3Bucket, apply_fake_env, create_bucket
from support.tls import TlsFiles, tls_files

# A test that runs `pip install --prefix X .` would otherwise UNINSTALL the editable rbak
# from site-packages (pip replaces an installed distribution of the same name), breaking
# every later `python -m rbak` in this and concurrent runs. Inherited by subprocesses.
os.environ["PIP_IGNORE_INSTALLED"] = "1"
#: A test using any of these (directly or through another fixture) reaches a RabbitMQ: a CI broker or
#: a private node it starts (``shared_root`` holds the private-node scenarios). It is marked ``broker``.
BROKER_FIXTURES = {"broker", "vhost", "vhost_factory", "rmq310", "rmq40", "rmq43", "shared_root", "node_dir",
                   "denying_node"}
#: Heavy module-scoped fixtures: their module's tests share one xdist worker.
MODULE_FIXTURES = {"node_dir", "denying_node", "cluster", "real_db"}
#: These start a JVM (Spark) or another heavy process: a test using one is marked ``slow``.
SLOW_FIXTURES = {"spark"}
_reachability: dict[str, str | None] = {}


def _usable(b: Broker) -> Broker:
    if b.name not in _reachability:
        _reachability[b.name] = b.unreachable_reason()
    reason = _reachability[b.name]
    if reason:
        unavailable(reason)
    return b


def pytest_configure(config):
    """With -n and no --dist of its own, distribute with ``loadgroup``: tests marked xdist_group below
    share a worker (not an addopts: without -n it would switch pytest-benchmark off with a warning)."""
    dist = getattr(config.option, "dist", "no")
    if dist == "load" and not any(str(a).startswith("--dist") for a in config.invocation_params.args):
        config.option.dist = "loadgroup"


def pytest_collection_modifyitems(items):
    """Mark by what a test uses, so the quick lane (``-m "not broker and not slow"``) needs no broker
    and starts no JVM without anyone remembering a marker."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if BROKER_FIXTURES & used:
            item.add_marker(pytest.mark.broker)
        # With -n, --dist loadgroup (pytest_configure) keeps an xdist_group on one worker.
        if "shared_root" in used:
            # Private-node scenarios are built once per run (a file lock): all tests of one scenario
            # on one worker, so no worker sits idle waiting for the one another is building.
            name = getattr(item, "callspec", None) and item.callspec.params.get("name")
            group = f"node-{name}" if isinstance(name, str) else f"node-{item.module.__name__}"
            item.add_marker(pytest.mark.xdist_group(group))
        elif MODULE_FIXTURES & used:
            # A heavy module-scoped fixture (a private node, the operator's cluster, a mosquitto
            # file): built once, not once per worker that happens to run a test of the module.
            item.add_marker(pytest.mark.xdist_group(f"module-{item.module.__name__}"))
        if SLOW_FIXTURES & used:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=sorted(BROKERS), ids=str)
def broker(request) -> Broker:
    return _usable(BROKERS[request.param])


@pytest.fixture
def rmq310() -> Broker:
    return _usable(BROKERS["rmq310"])


@pytest.fixture
def rmq40() -> Broker:
    return _usable(BROKERS["rmq40"])


@pytest.fixture
def rmq43() -> Broker:
    return _usable(BROKERS["rmq43"])


@pytest.fixture
def vhost(broker: Broker):
    name = unique_name("test")
    broker.create_vhost(name)
    try:
        yield name
    finally:
        broker.delete_vhost(name)


@pytest.fixture
def vhost_factory():
    """``make(broker) -> name``: fresh vhosts on any broker, all deleted after the test."""
    made: list[tuple[Broker, str]] = []

    def make(b: Broker, prefix: str = "test") -> str:
        _usable(b)
        name = unique_name(prefix)
        b.create_vhost(name)
        made.append((b, name))
        return name

    yield make
    for b, name in made:
        b.delete_vhost(name)


@pytest.fixture(scope="session")
def moto_s3():
    with pytest.MonkeyPatch.context() as mp:
        apply_fake_env(mp.setenv, mp.delenv)
        server = MotoS3Server().start()
        try:
            yield server.endpoint
        finally:
            server.stop()


@pytest.fixture
def s3_bucket(moto_s3: str) -> S3Bucket:
    return create_bucket(moto_s3, unique_name("bucket"), prefix="backups")


@pytest.fixture
def lock_bucket(moto_s3: str) -> S3Bucket:
    """A fresh bucket created with S3 Object Lock enabled (no prefix)."""
    return create_bucket(moto_s3, unique_name("lock"), object_lock=True)


@pytest.fixture(scope="session")
def tls() -> TlsFiles:
    files = tls_files()
    missing = files.missing()
    if missing:
        unavailable(f"TLS material missing: {', '.join(map(str, missing))}; run .ci/setup")
    return files


@pytest.fixture(scope="session")
def e2e_kube(request):
    """The cluster of the operator's end-to-end tests: an existing one when ``RBAK_E2E_KUBECONFIG``
    names its kubeconfig (kind, any cluster; see docs/operator.md), else the suite's own API
    server (``kube_api``)."""
    path = os.environ.get("RBAK_E2E_KUBECONFIG")
    if not path:
        return request.getfixturevalue("kube_api")
    kube = ExternalKube(Path(path).expanduser())
    r = kube.kubectl("get", "--raw", "/readyz", check=False)
    if r.returncode != 0:
        pytest.fail(f"RBAK_E2E_KUBECONFIG={path}: the cluster does not answer: {r.stderr.strip()}")
    return kube


@pytest.fixture(scope="session")
def kube_api(tmp_path_factory) -> KubeApi:
    require_that(binaries_problem())
    api = KubeApi.start(tmp_path_factory.mktemp("kube-api"))
    try:
        yield api
    finally:
        api.stop()
