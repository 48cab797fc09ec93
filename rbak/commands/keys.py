"""``rbak keys rewrap``: wrap envelope backups' data keys for another key-encryption key.

Only new ``keys/*.wrap.json`` objects are written: no segment and no manifest is touched, so it
runs under S3 Object Lock, and a rerun finds the wraps in place and changes nothing.
"""

from __future__ import annotations

import argparse

from ..errors import ConfigError, EncryptionError
from ..repo.catalog import list_backups, load_manifest
from ..sealing.crypto import load_keyring
from ..sealing.envelope import Kek, KeySources, KmsSettings, RewrapResult, rewrap
from ..storage import open_storage
from . import output


def register(sub: argparse._SubParsersAction, _imp: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="key-encryption keys of envelope-encrypted backups")
    ks = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    r = ks.add_parser("rewrap", help="wrap backups' data keys for another key (adds objects; rewrites nothing)")
    r.add_argument("--path", required=True, help="storage URL (file:///dir, s3://bucket/prefix?..., memory://)")
    r.add_argument("--prefix", default="", help="storage prefix the backups live under")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--backup-id", help="the backup to rewrap")
    which.add_argument("--all", action="store_true", help="every envelope-encrypted backup under the prefix")
    r.add_argument("--to", required=True, metavar="KEY",
                   help="the new key-encryption key: a keyring key id, or kms:KEY (a KMS key id, ARN or alias)")
    r.add_argument("--from", dest="from_", metavar="KEY",
                   help="unwrap with this key only (same forms as --to); default: any key available")
    r.add_argument("--keys-file", default=None, metavar="PATH",
                   help="keyring: a file or a mounted Secret directory (RBAK_ENCRYPTION_KEYS is also read)")
    r.add_argument("--kms-region", default=None, help="KMS region (default the key ARN's, else AWS_REGION)")
    r.add_argument("--kms-endpoint-url", default=None,
                   help="KMS endpoint URL (default AWS_ENDPOINT_URL_KMS, else AWS)")
    r.add_argument("--format", choices=("text", "json"), default="text")
    r.set_defaults(handler=cmd_rewrap)


def cmd_rewrap(args: argparse.Namespace) -> int:
    to = Kek.parse(args.to, "--to")
    from_ = Kek.parse(args.from_, "--from") if args.from_ else None
    if from_ == to:
        raise ConfigError("--from: names the same key as --to")
    sources = KeySources(load_keyring(args.keys_file), KmsSettings(args.kms_region, args.kms_endpoint_url))
    if to.source == "keyring" and to.key_id not in sources.keyring:
        raise ConfigError(f"--to: key {to.key_id!r} is not in the keyring (--keys-file or RBAK_ENCRYPTION_KEYS); "
                          "nothing was written")
    storage = open_storage(args.path)
    if args.backup_id:
        m = load_manifest(storage, args.backup_id, args.prefix)
        if m.encryption is None or not m.encryption.envelope:
            how = "not encrypted" if m.encryption is None else (
                f"encrypted directly with keyring key {m.encryption.key_id!r} (written before envelope encryption), "
                "so it has no data key to wrap")
            raise EncryptionError(f"backup {args.backup_id!r}: {how}")
        results = [rewrap(storage, args.prefix, m.backup_id, m.encryption, to, sources, from_)]
    else:
        results = []
        for e in list_backups(storage, args.prefix):
            if e.manifest is None:
                results.append(RewrapResult(e.backup_id, "skipped", e.error or "no manifest"))
                continue
            results.append(rewrap(storage, args.prefix, e.backup_id, e.manifest.encryption, to, sources, from_))
    failed = [r for r in results if r.outcome == "failed"]
    if args.format == "json":
        output.emit(args, {"to": str(to), "results": [r.to_json_obj() for r in results], "ok": not failed})
    else:
        for r in results:
            print(f"{r.backup_id}: {r.outcome}: {r.detail}" + (f" ({r.key})" if r.key and r.outcome == "added" else ""))
        added = sum(r.outcome == "added" for r in results)
        already = sum(r.outcome == "already" for r in results)
        print(f"{added} wrap(s) added, {already} already in place (nothing changed for those), "
              f"{sum(r.outcome == 'skipped' for r in results)} skipped, {len(failed)} failed")
    if failed:
        raise EncryptionError(f"{len(failed)} backup(s) not rewrapped, first {failed[0].backup_id}: "
                              f"{failed[0].detail}")
    return 0
