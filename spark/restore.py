"""Spark job: see rbak_spark/restore_job.py (spark-submit spark/restore.py --help)."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
if os.path.isfile(os.path.join(_here, "..", "rbak", "__init__.py")):  # a source checkout without pip install
    sys.path.append(os.path.join(_here, ".."))

from rbak_spark.restore_job import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
