"""One way to get a SparkSession, under ``spark-submit`` or plain ``python``.

Under ``spark-submit`` (or a SparkApplication) the master comes from the
submitter; from ``python spark/x.py`` a local session is made (``--master``,
else ``$RBAK_SPARK_MASTER``, else ``local[*]``). Either way this package is
zipped and shipped with ``addPyFile`` so executors can unpickle functions
and data-source classes that live in it, whatever the working directory.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile

from rbak.base.logsafe import configure

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# SQL settings every rbak job wants: the data source prunes segments only
# when Python filter pushdown is on (Spark refuses a reader that implements
# pushFilters otherwise).
SQL_CONF = {
    "spark.sql.python.filterPushdown.enabled": "true",
}


def setup_logging() -> None:
    """The CLI's logging on a job's driver: level from ``$RBAK_LOG_LEVEL`` (default WARNING),
    records filtered of credentials and control characters (``rbak.base.logsafe``)."""
    configure(os.environ.get("RBAK_LOG_LEVEL", "WARNING").upper(), stream=sys.stderr)


def _zip_package() -> str:
    tmp = tempfile.mkdtemp(prefix="rbak_spark-")
    path = os.path.join(tmp, "rbak_spark.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(os.listdir(PACKAGE_DIR)):
            if name.endswith(".py"):
                z.write(os.path.join(PACKAGE_DIR, name), f"rbak_spark/{name}")
    return path


def ship_package(spark) -> None:
    """Make ``rbak_spark`` importable on every executor (once per context)."""
    sc = spark.sparkContext
    if getattr(sc, "_rbak_spark_shipped", False):
        return
    path = _zip_package()
    sc.addPyFile(path)
    sc._rbak_spark_shipped = True  # noqa: SLF001 - the zip stays: Spark serves it from this path to new executors


def get_session(app_name: str, master: str | None = None, conf: dict[str, str] | None = None):
    """The active session (spark-submit) or a new local one, ready for rbak jobs."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    submitted = SparkSession.getActiveSession() is not None or "PYSPARK_GATEWAY_PORT" in os.environ
    if master:
        builder = builder.master(master)
    if not submitted:
        # Python workers run ``$PYSPARK_PYTHON`` (default: whatever ``python3`` is on PATH); run
        # them with this interpreter, which has rbak installed, unless told otherwise.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if not master:
            builder = builder.master(os.environ.get("RBAK_SPARK_MASTER", "local[*]"))
    for k, v in {**SQL_CONF, **(conf or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    for k, v in SQL_CONF.items():  # a session that already existed keeps its own settings otherwise
        spark.conf.set(k, v)
    ship_package(spark)
    return spark
