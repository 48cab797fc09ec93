"""Storage backends behind one small interface (see ``base.Storage``)."""

from .base import Storage, check_key
from .fs import FilesystemStorage
from .memory import MemoryStorage
from .url import open_storage

__all__ = ["Storage", "FilesystemStorage", "MemoryStorage", "open_storage", "check_key", "S3Storage"]


def __getattr__(name: str):  # boto3 is heavy: import the S3 backend on first use
    if name == "S3Storage":
        from .s3 import S3Storage  # noqa: PLC0415 - boto3 takes ~1 s to import; only S3 users pay it

        return S3Storage
    raise AttributeError(name)
