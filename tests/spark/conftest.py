"""One local SparkSession for every Spark test of an xdist worker (JVM start-up is the cost).

It is created after the moto S3 fixture has exported its fake credentials,
because Spark's Python workers inherit the environment of the JVM, which is
fixed when the session starts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.brokers import unique_name

REPO = Path(__file__).resolve().parents[2]
SPARK_DIR = REPO / "spark"
# Local-mode Python workers and the scripts' subprocesses import rbak from this
# checkout even where it is not pip-installed.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)

import pyspark  # noqa: E402,F401  (a hard requirement of these tests)


@pytest.fixture(scope="session")
def spark(moto_s3):
    from rbak_spark.session import get_session

    session = get_session("rbak-tests", "local[2]", {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
    })
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def target(rmq310):
    """(broker, a fresh vhost) deleted afterwards."""
    name = unique_name("test-spark")
    rmq310.create_vhost(name)
    try:
        yield rmq310, name
    finally:
        rmq310.delete_vhost(name)
