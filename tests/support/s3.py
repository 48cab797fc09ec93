"""A real S3 endpoint for tests: moto's server on 127.0.0.1, reached over HTTP by boto3.

Nothing is patched: rbak's S3 backend talks HTTP to the moto server exactly as it
would to AWS or MinIO. Credentials are fake values exported into ``os.environ`` so
subprocesses (the ``rbak`` CLI, operator jobs) inherit them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Iterator
from importlib.metadata import version
from urllib.parse import quote

import boto3
import requests
from botocore.config import Config
from botocore.exceptions import ClientError

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}
# Must not leak a developer's real profile/session into tests.
UNSET_ENV = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_CONFIG_FILE",
             "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3Server:
    """``moto.server.ThreadedMotoServer`` on a free local port (start/stop)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no per-request access log
        self.port = free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def start(self) -> "MotoS3Server":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()


def s3_client(endpoint: str):
    """A boto3 S3 client for the moto endpoint (path-style, fake creds, us-east-1)."""
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=FAKE_ENV["AWS_ACCESS_KEY_ID"], aws_secret_access_key=FAKE_ENV["AWS_SECRET_ACCESS_KEY"],
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )


class S3Bucket(str):
    """A fresh bucket's storage URL (a ``str``: pass it straight to ``open_storage``).

    Also carries ``endpoint``, ``bucket`` and ``prefix`` and reads the bucket back
    through boto3 for assertions.
    """

    endpoint: str
    bucket: str
    prefix: str

    def __new__(cls, endpoint: str, bucket: str, prefix: str = "") -> "S3Bucket":
        self = super().__new__(cls, storage_url(endpoint, bucket, prefix))
        self.endpoint, self.bucket, self.prefix = endpoint, bucket, prefix.strip("/")
        return self

    @property
    def url(self) -> str:
        return str(self)

    def url_with_prefix(self, prefix: str) -> str:
        """The same bucket under another prefix."""
        return storage_url(self.endpoint, self.bucket, prefix)

    def client(self):
        return s3_client(self.endpoint)

    def keys(self) -> list[str]:
        """Every object key in the bucket (prefix included), sorted."""
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            out.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(out)

    def get(self, key: str) -> bytes:
        """Raw object bytes by full key (prefix included)."""
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()


def storage_url(endpoint: str, bucket: str, prefix: str = "") -> str:
    """``s3://bucket/prefix?endpoint=...&path_style=true&region=us-east-1``."""
    path = f"/{prefix.strip('/')}" if prefix.strip("/") else ""
    return f"s3://{bucket}{path}?endpoint={quote(endpoint, safe='')}&path_style=true&region=us-east-1"


def create_bucket(endpoint: str, bucket: str, prefix: str = "", object_lock: bool = False) -> S3Bucket:
    kw = {"ObjectLockEnabledForBucket": True} if object_lock else {}
    s3_client(endpoint).create_bucket(Bucket=bucket, **kw)
    return S3Bucket(endpoint, bucket, prefix)


def apply_fake_env(setenv, delenv) -> None:
    """Export fake AWS credentials via the given setenv/delenv (a pytest MonkeyPatch)."""
    for k in UNSET_ENV:
        delenv(k, raising=False)
    for k, v in FAKE_ENV.items():
        setenv(k, v)
    no_proxy = ",".join(x for x in (os.environ.get("NO_PROXY"), "127.0.0.1", "localhost") if x)
    setenv("NO_PROXY", no_proxy)
    setenv("no_proxy", no_proxy)


@contextlib.contextmanager
def iam_user(endpoint: str, name: str, actions: list[str], bucket: str) -> Iterator[dict[str, str]]:
    """A moto IAM user allowed exactly ``actions`` on every resource, with moto's IAM checks on.

    Yields the environment (``os.environ`` plus the user's keys) a subprocess runs with. The checks
    are switched on for the whole server (moto has no per-user switch) and off again on exit, so
    keep the block short; each xdist worker has a server of its own.

    First it checks the one thing every such test relies on: that the emulator authorizes a request
    by the IAM action AWS documents for it, not by the API operation's name. AWS authorizes
    ListObjectsV2 as ``s3:ListBucket``; moto 5.2.6 asks for ``s3:ListObjectsV2`` and so denies a
    correct least-privilege policy (pyproject.toml keeps moto below it, and so the lock).
    """
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id=FAKE_ENV["AWS_ACCESS_KEY_ID"],
                       aws_secret_access_key=FAKE_ENV["AWS_SECRET_ACCESS_KEY"])
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="rbak-test", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Resource": "*", "Action": actions}]}))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    user = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"],
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
    requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
    try:
        if "s3:ListBucket" in actions:
            try:
                user.list_objects_v2(Bucket=bucket, MaxKeys=1)
            except ClientError as e:
                raise AssertionError(
                    f"the S3 emulator (moto {version('moto')}) denied ListObjectsV2 to a policy allowing "
                    f"s3:ListBucket ({e}); AWS authorizes ListObjectsV2 as s3:ListBucket, so this emulator "
                    "cannot judge IAM rights: run `bash .ci/setup` to install the moto of requirements/test.lock") from e
        yield {**os.environ, "AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    finally:
        requests.post(f"{endpoint}/moto-api/reset-auth", data=b"inf", timeout=10).raise_for_status()
