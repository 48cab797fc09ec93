"""URLs that carry credentials, taken from the command line, the environment or a file.

A password in ``argv`` is visible to every user through ``ps`` and lands in
shell history, so the CLI also reads each such URL from an environment
variable (``RBAK_TARGET_URL``) or a file (``--target-url-file``, e.g. a
mounted Kubernetes secret), and warns when a password came on the command line.
"""

from __future__ import annotations

import logging
import os
from urllib.parse import urlsplit

from ..config import EncryptionConfig
from ..errors import ConfigError
from ..sealing.envelope import KmsSettings, writer_codec

log = logging.getLogger("rbak")


def has_password(url: str | None) -> bool:
    try:
        return bool(url) and urlsplit(url).password is not None
    except ValueError:
        return False


def url_from(flag: str, value: str | None, file_path: str | None, env_var: str) -> str | None:
    """The URL from ``--flag``, ``--flag-file`` or ``$ENV_VAR`` (in that order); None when none is given."""
    if value:
        if has_password(value):
            log.warning("%s carries a password on the command line, where `ps` shows it to every user; "
                        "put the URL in $%s or a file given with %s-file instead", flag, env_var, flag)
        return value
    if file_path:
        try:
            with open(file_path, encoding="utf-8") as f:
                url = f.read().strip()
        except OSError as e:
            raise ConfigError(f"{flag}-file: cannot read {file_path!r}: {e.strerror or e}") from None
        if not url:
            raise ConfigError(f"{flag}-file: {file_path!r} is empty")
        return url
    return os.environ.get(env_var) or None


def add_encryption_args(p) -> None:
    """Encryption flags for commands that write a new backup without a config file: the same settings as
    a backup's ``encryption`` section (``key_id``, ``keys_file``, ``envelope``, ``kms_*``)."""
    p.add_argument("--encrypt-key-id", default=None, metavar="ID",
                   help="encrypt the new backup's segments with this key id from the keyring (rbak's extension "
                        "of the format; the manifest stays readable and names the key id); with --envelope: the "
                        "keyring key that wraps the backup's data key")
    p.add_argument("--keys-file", default=None, metavar="PATH",
                   help="keyring: a file or a mounted Secret directory (RBAK_ENCRYPTION_KEYS is also read)")
    p.add_argument("--envelope", action="store_true",
                   help="envelope encryption: the backup gets its own data key, stored only wrapped by "
                        "--encrypt-key-id and/or --kms-key-id, so keys rotate with `rbak keys rewrap`")
    p.add_argument("--kms-key-id", default=None, metavar="KEY",
                   help="an AWS KMS key (id, ARN or alias/...) that also wraps the data key (needs --envelope)")
    p.add_argument("--kms-region", default=None, help="KMS region (default the key ARN's, else AWS_REGION)")
    p.add_argument("--kms-endpoint-url", default=None, metavar="URL",
                   help="KMS endpoint URL (default AWS_ENDPOINT_URL_KMS, else AWS)")


def import_codec_from(args, backup_id: str):
    """The codec the encryption flags ask for; before anything is read, so a missing key or an
    unreachable KMS costs nothing (an envelope's data key is wrapped here, by every key-encryption key)."""
    if args.kms_key_id and not args.envelope:
        raise ConfigError("--kms-key-id: a KMS key only wraps data keys: add --envelope")
    if args.envelope and not (args.encrypt_key_id or args.kms_key_id):
        raise ConfigError("--envelope: needs --encrypt-key-id and/or --kms-key-id (the keys that wrap the "
                          "backup's data key)")
    for flag, value in (("--kms-region", args.kms_region), ("--kms-endpoint-url", args.kms_endpoint_url)):
        if value is not None and not args.kms_key_id:
            raise ConfigError(f"{flag}: only used with --kms-key-id")
        if value is not None and not value.strip():
            raise ConfigError(f"{flag}: must not be empty")
    if args.kms_endpoint_url and not args.kms_endpoint_url.startswith(("http://", "https://")):
        raise ConfigError(f"--kms-endpoint-url: {args.kms_endpoint_url!r} is not an http(s) URL")
    return import_codec(backup_id, args.encrypt_key_id, args.keys_file, envelope=args.envelope,
                        kms_key_id=args.kms_key_id, kms=KmsSettings(args.kms_region, args.kms_endpoint_url))


def import_codec(backup_id: str, key_id: str | None, keys_file: str | None, envelope: bool = False,
                 kms_key_id: str | None = None, kms: KmsSettings | None = None):
    """The codec of a backup written by an import (``--encrypt-key-id``, ``--envelope``, ``--kms-key-id``):
    built from the ``encryption`` section a backup with these settings has, through ``writer_codec``, so
    an import is sealed and its data key wrapped exactly as a backup's; no key id, no encryption."""
    kms = kms or KmsSettings()
    enc = EncryptionConfig(enabled=bool(key_id or kms_key_id), key_id=key_id, keys_file=keys_file,
                           envelope=envelope, kms_key_id=kms_key_id, kms_region=kms.region,
                           kms_endpoint_url=kms.endpoint_url)
    return writer_codec(backup_id, enc)
