"""Spark drivers for rbak: validate, restore and a ``rbak`` DataFrame source.

Thin layers over the ``rbak`` library: executors open storage with
``rbak.storage.open_storage`` (no S3A), check segments with
``rbak.repo.validate.check_segment`` and publish with ``rbak.restore``; nothing
here re-implements the format or the restore rules.
"""

from __future__ import annotations
