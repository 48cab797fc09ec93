"""Spark job: see rbak_spark/validate_job.py (spark-submit spark/validate.py --help)."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
try:
    import rbak  # noqa: F401
except ImportError:  # a source checkout without pip install: use it, here and in local-mode workers
    _root = os.path.dirname(_here)
    if os.path.isfile(os.path.join(_root, "rbak", "__init__.py")):
        sys.path.append(_root)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), _root) if p)

from rbak_spark.validate_job import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
