"""Test infrastructure shared by every test module: brokers, S3, TLS (see README.md here).

Import as ``from support.brokers import Broker`` (tests/conftest.py puts tests/ on sys.path).
"""
