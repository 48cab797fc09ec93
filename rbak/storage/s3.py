"""S3 (and S3-compatible: MinIO, Ceph) storage through boto3.

Credentials come from boto3's standard chain (env, profile, IRSA, instance
role) unless given explicitly. ``sse``/``sse_kms_key_id`` ask S3 to encrypt
every object put (SSE-S3 or SSE-KMS); rbak's own client-side encryption is
``rbak.sealing.crypto``. Objects above ``multipart_threshold`` go up as
a multipart upload, which S3 makes visible only once complete, so ``put`` is
atomic on S3 too.
"""

from __future__ import annotations

import datetime
import io
from dataclasses import dataclass
from typing import Any, Iterator

import boto3
import botocore.config
import botocore.exceptions
from boto3.s3.transfer import TransferConfig

from ..errors import NotFoundError, StorageError
from .base import Storage, check_key

MULTIPART_THRESHOLD = 64 * 1024 * 1024
MULTIPART_CHUNK = 16 * 1024 * 1024


SSE_MODES = ("AES256", "aws:kms")
LOCK_MODES = ("GOVERNANCE", "COMPLIANCE")


def lock_period(mode: str | None, days: float | None) -> tuple[str, datetime.timedelta] | None:
    """S3 Object Lock for every put: (mode, how long each object stays locked), or None."""
    if not mode:
        return None
    if mode not in LOCK_MODES:
        raise StorageError(f"S3 object_lock_mode {mode!r}: must be one of {', '.join(LOCK_MODES)}")
    if not days or days <= 0:
        raise StorageError("S3 object_lock_retain_days: a positive number of days is required with object_lock_mode")
    return mode, datetime.timedelta(days=days)


def sse_args(sse: str | None, kms_key_id: str | None) -> dict[str, str]:
    """boto3 put arguments for server-side encryption: SSE-S3 (``AES256``) or SSE-KMS (``aws:kms`` + key id)."""
    if not sse:
        if kms_key_id:
            raise StorageError("S3 sse_kms_key_id needs sse=aws:kms")
        return {}
    if sse not in SSE_MODES:
        raise StorageError(f"S3 sse {sse!r}: must be one of {', '.join(SSE_MODES)}")
    if kms_key_id and sse != "aws:kms":
        raise StorageError("S3 sse_kms_key_id needs sse=aws:kms")
    out = {"ServerSideEncryption": sse}
    if kms_key_id:
        out["SSEKMSKeyId"] = kms_key_id
    return out


@dataclass(frozen=True)
class Patience:
    """How long one S3 call may take before it fails: attempts (botocore's standard retry mode, with
    backoff) times the connect and read timeouts."""

    connect_seconds: float
    read_seconds: float
    attempts: int


# A backup or restore job waits out a slow endpoint (botocore's own timeouts).
JOB = Patience(connect_seconds=60, read_seconds=60, attempts=5)
# The operator reads manifests and lists backups between other objects' passes, on a small shared
# pool: an unreachable endpoint must fail in seconds, not hold a worker for minutes (5 x 60 s).
SHORT = Patience(connect_seconds=5, read_seconds=20, attempts=2)


class S3Storage(Storage):
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        region: str | None = None,
        endpoint: str | None = None,
        path_style: bool = False,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        url: str | None = None,
        sse: str | None = None,
        sse_kms_key_id: str | None = None,
        object_lock_mode: str | None = None,
        object_lock_retain_days: float | None = None,
        patience: Patience = JOB,
    ):
        if not bucket:
            raise StorageError("S3 storage needs a bucket name")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = url or f"s3://{bucket}/{self.prefix}".rstrip("/")
        cfg = botocore.config.Config(
            region_name=region,
            s3={"addressing_style": "path" if path_style else "auto"},
            retries={"max_attempts": patience.attempts, "mode": "standard"},
            connect_timeout=patience.connect_seconds,
            read_timeout=patience.read_seconds,
            max_pool_connections=32,
        )
        session = boto3.session.Session()
        self._client = session.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            aws_session_token=session_token,
            config=cfg,
        )
        self._extra = sse_args(sse, sse_kms_key_id)
        self._lock = lock_period(object_lock_mode, object_lock_retain_days)
        self.write_once = self._lock is not None
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold, multipart_chunksize=MULTIPART_CHUNK, use_threads=True
        )

    @property
    def client(self) -> Any:  # boto3's S3 client (no type information installed)
        """The boto3 S3 client (``rbak doctor`` reads the bucket's settings with it)."""
        return self._client

    def full_key(self, key: str) -> str:
        """The object key in the bucket (the storage prefix included)."""
        return self._k(key)

    def _k(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _err(self, op: str, key: str, e: Exception) -> StorageError:
        # Only the error code and message: never request headers (they may carry credentials).
        if isinstance(e, botocore.exceptions.ClientError):
            err = e.response.get("Error", {})
            code = err.get("Code", "?")
            if code in ("NoSuchKey", "404", "NotFound"):
                return NotFoundError(f"{self.url}: no object at key {key!r}")
            if code == "NoSuchBucket":
                return StorageError(f"{self.url}: bucket {self.bucket!r} does not exist ({op} {key!r})")
            return StorageError(f"{self.url}: {op} {key!r} failed: {code}: {err.get('Message', '')}".rstrip(": "))
        if isinstance(e, botocore.exceptions.NoCredentialsError):
            return StorageError(f"{self.url}: no S3 credentials found (env, profile or storage config)")
        return StorageError(f"{self.url}: {op} {key!r} failed: {type(e).__name__}: {e}")

    def _put_args(self) -> dict:
        extra: dict = dict(self._extra)
        if self._lock is not None:
            mode, period = self._lock
            extra["ObjectLockMode"] = mode
            extra["ObjectLockRetainUntilDate"] = datetime.datetime.now(datetime.timezone.utc) + period
        return extra

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        k = self._k(key)
        extra = self._put_args()
        try:
            if len(data) >= self._transfer.multipart_threshold:
                self._client.upload_fileobj(io.BytesIO(data), self.bucket, k, Config=self._transfer,
                                            ExtraArgs=extra or None)
            else:
                # botocore takes bytes/bytearray/file objects, not memoryviews (segment writers pass those)
                body = data if isinstance(data, (bytes, bytearray)) else bytes(data)
                self._client.put_object(Bucket=self.bucket, Key=k, Body=body, **extra)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise self._err("put", key, e) from None
        except Exception as e:  # noqa: BLE001 - boto3's transfer manager wraps errors in its own types
            raise self._err("put", key, e) from None

    def get(self, key: str) -> bytes:
        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._k(key))["Body"].read()
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise self._err("get", key, e) from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            r = self._client.get_object(
                Bucket=self.bucket, Key=self._k(key), Range=f"bytes={start}-{start + length - 1}"
            )
            return r["Body"].read()
        except botocore.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""
            raise self._err("get", key, e) from None
        except botocore.exceptions.BotoCoreError as e:
            raise self._err("get", key, e) from None

    def list(self, prefix: str = "") -> Iterator[str]:
        if ".." in prefix.split("/"):
            raise StorageError(f"invalid storage prefix {prefix!r}")
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    keys.append(obj["Key"][strip:])
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise self._err("list", prefix, e) from None
        keys.sort()
        return iter(keys)

    def delete(self, key: str) -> None:
        """Object Lock mode: every version goes (a plain delete would only hide it behind a delete
        marker); S3 refuses while a lock holds, which is an error naming the key."""
        if self.write_once:
            return self.purge(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._k(key))
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise self._err("delete", key, e) from None

    def purge(self, key: str) -> None:
        k = self._k(key)
        try:
            for page in self._client.get_paginator("list_object_versions").paginate(Bucket=self.bucket, Prefix=k):
                for v in page.get("Versions", []) + page.get("DeleteMarkers", []):
                    if v["Key"] == k:
                        self._client.delete_object(Bucket=self.bucket, Key=k, VersionId=v["VersionId"])
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise self._err("delete", key, e) from None

    def locked_until(self, key: str):
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._k(key))
        except botocore.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._err("head", key, e) from None
        except botocore.exceptions.BotoCoreError as e:
            raise self._err("head", key, e) from None
        return head.get("ObjectLockRetainUntilDate")

    def size(self, key: str) -> int | None:
        try:
            return int(self._client.head_object(Bucket=self.bucket, Key=self._k(key))["ContentLength"])
        except botocore.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if code in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._err("head", key, e) from None
        except botocore.exceptions.BotoCoreError as e:
            raise self._err("head", key, e) from None

    def close(self) -> None:
        self._client.close()
