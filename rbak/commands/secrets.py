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

from ..errors import ConfigError

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
    """``--encrypt-key-id`` / ``--keys-file`` for commands that write a new backup without a config file."""
    p.add_argument("--encrypt-key-id", default=None, metavar="ID",
                   help="encrypt the new backup's segments with this key id from the keyring (rbak's extension "
                        "of the format; the manifest stays readable and names the key id)")
    p.add_argument("--keys-file", default=None, metavar="PATH",
                   help="keyring: a file or a mounted Secret directory (RBAK_ENCRYPTION_KEYS is also read)")


def import_codec_from(args, backup_id: str):
    """The codec the encryption flags ask for; before anything is read, so a missing key costs nothing."""
    from ..crypto import import_codec

    return import_codec(backup_id, args.encrypt_key_id, args.keys_file)
