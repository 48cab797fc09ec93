"""Only here for the optional C speedup; all metadata lives in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and rbak
uses its pure-Python codec path (same results, slower).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("rbak.format._speedups", ["rbak/format/_speedups.c", "rbak/format/_erlterm.c", "rbak/format/_amqp10.c",
                                  "rbak/format/_crc32.c", "rbak/format/_amqp091.c"], optional=True)])
