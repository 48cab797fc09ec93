"""Definitions import (restore side) and the import half of the CLI's definitions commands.

Order of a restore with ``restore_definitions``:

1. load the backup's ``definitions/definitions.json<ext>`` (the manifest's key,
   else the first of ``.zst``/``.lz4``/none that exists) and check it is a
   definitions document;
2. scope it: only the vhosts of ``definitions_selection.vhosts`` (else
   ``restore.queues.vhosts``, else every vhost of the document), their
   objects and the users with rights there; apply the selection's queue and
   exchange patterns and the vhost/queue remapping (the same maps the
   messages use, so a restore into a staging vhost gets its topology);
3. ask the TARGET what it supports (``compat.capabilities_of``: version,
   feature flags, deprecated features) and adapt what it would refuse
   (``ha-*`` policy keys, CQv1, transient queues), recording every change;
   ``definitions_strict`` refuses instead, naming every incompatibility,
   before anything is written anywhere;
4. keep the target's existing users and permissions (their password hash,
   tags and permissions are never replaced unless ``overwrite_users``);
5. GET the target's current ``/api/definitions`` and store it FIRST as
   ``definitions/rollback-before-import-<UTC timestamp><ext>`` in the backup
   (skipped in a dry run, which changes nothing);
6. POST ``/api/definitions`` (RabbitMQ merges: it never deletes). A failed
   import is rolled back from that snapshot (``rollback.rollback_import``)
   and raises ``ManagementApiError`` saying so; the engine then publishes no
   message.

The result (changes, kept users, rollback) is printed by the CLI and stored
next to the backup as ``restore/report-<ts>.json``.
"""

from __future__ import annotations

import copy
import datetime as _dt
import fnmatch
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


from ..sealing.crypto import codec_for
from ..base.definitions_doc import KINDS, VHOST_KINDS, counts, identity, prune_bindings, scope_to_vhosts
from ..errors import IncompatibleDefinitionsError, ManagementApiError, NotFoundError, RbakError, SerializationError
from ..format.compression import Compression, compress, decompress
from ..format.manifest import BackupManifest
from ..format.layout import BackupLayout
from ..broker.management import ManagementClient
from .compat import DefinitionChange, adapt_definitions, capabilities_of
from ..config import DefinitionsSelection
from .options import RestoreOptions
from .plan import map_queue, map_vhost
from .rollback import rollback_import
from .source import BackupSource

log = logging.getLogger(__name__)

__all__ = ["ManagementClient", "KINDS", "import_definitions", "apply_definitions", "transform_definitions"]


# --------------------------------------------------------------------------
# Loading and transforming.
# --------------------------------------------------------------------------


def _compression_of_key(key: str) -> Compression:
    for c in (Compression.ZSTD, Compression.LZ4):
        if key.endswith(c.extension):
            return c
    return Compression.NONE


def load_backup_definitions(source: BackupSource, manifest: BackupManifest, layout: BackupLayout,
                            keyring: Mapping[str, bytes] | None = None) -> tuple[dict[str, Any], str]:
    """(definitions document, its key)."""
    keys = [manifest.definitions.key] if manifest.definitions else []
    keys += [layout.definitions(c) for c in (Compression.ZSTD, Compression.LZ4, Compression.NONE)]
    codec = codec_for(manifest.backup_id, manifest.encryption, keyring)
    for key in keys:
        try:
            raw = source.get(codec, key)
        except NotFoundError:
            continue
        return parse_definitions(decompress(raw, _compression_of_key(key)), key), key
    raise NotFoundError(f"backup {layout.backup_id!r} has no definitions (looked for {', '.join(dict.fromkeys(keys))})")


def parse_definitions(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise SerializationError(f"{where}: definitions are not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise SerializationError(f"{where}: definitions must be a JSON object")
    for kind in KINDS:
        if kind in doc and not isinstance(doc[kind], list):
            raise SerializationError(f"{where}: '{kind}' must be a list")
    return doc


def _glob(patterns: Sequence[str], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) if any(c in p for c in "*?[") else name == p for p in patterns)


def transform_definitions(doc: dict[str, Any], selection: DefinitionsSelection, vhost_map: dict[str, str],
                          queue_map: dict[str, str]) -> dict[str, Any]:
    """Select and remap a definitions document (a new document; the input is untouched).

    Selection: ``vhosts`` keeps only objects of those (source) vhosts, the
    users with permissions there, and no global parameters;
    ``queues``/``exchanges`` keep only matching queues/exchanges and the
    bindings between kept objects. Remapping rewrites every ``vhost`` field and
    the names of remapped queues (also as binding destinations).
    """
    out = scope_to_vhosts(doc, selection.vhosts) if selection.vhosts else copy.deepcopy(doc)
    out = copy.deepcopy(out)
    if selection.queues:
        out["queues"] = [q for q in out.get("queues", []) if _glob(selection.queues, q.get("name", ""))]
    if selection.exchanges:
        out["exchanges"] = [e for e in out.get("exchanges", []) if _glob(selection.exchanges, e.get("name", ""))]
    if selection.queues or selection.exchanges:
        prune_bindings(out)
    # remapping (queue names first: the queue map is keyed by the SOURCE vhost)
    for q in out.get("queues", []):
        q["name"] = map_queue(q.get("vhost", "/"), q["name"], queue_map)
    for b in out.get("bindings", []):
        if b.get("destination_type") == "queue":
            b["destination"] = map_queue(b.get("vhost", "/"), b["destination"], queue_map)
    for v in out.get("vhosts", []):
        v["name"] = map_vhost(v["name"], vhost_map)
    for kind in VHOST_KINDS:
        for o in out.get(kind, []):
            if "vhost" in o:
                o["vhost"] = map_vhost(o["vhost"], vhost_map)
    return out


def import_selection(options: RestoreOptions) -> DefinitionsSelection:
    """``definitions_selection``, its vhosts defaulting to ``restore.queues.vhosts``: a restore of
    some vhosts never touches the others."""
    sel = options.definitions_selection
    if not sel.vhosts and options.queues.vhosts:
        return DefinitionsSelection(vhosts=list(options.queues.vhosts), queues=list(sel.queues),
                                    exchanges=list(sel.exchanges))
    return sel


def definition_vhosts(source: BackupSource, manifest: BackupManifest, options: RestoreOptions) -> set[str]:
    """The vhosts of the definitions a restore imports (after ``import_selection``): they are mapped as
    the queues are, so the target-vhost rules and mapping checks see them. Empty when none are imported."""
    if not (options.restore_definitions or options.definitions_dry_run):
        return set()
    keyring = options.keyring() if manifest.encryption is not None else None
    doc, _ = load_backup_definitions(source, manifest, BackupLayout(options.backup_id, options.prefix), keyring)
    sel = import_selection(options)
    names = {v.get("name") for v in doc.get("vhosts", []) if isinstance(v, dict)}
    names |= {o.get("vhost") for kind in VHOST_KINDS for o in doc.get(kind, []) if isinstance(o, dict)}
    return {n for n in names if isinstance(n, str) and (not sel.vhosts or n in sel.vhosts)}


def keep_existing_users(doc: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Drop (in place) the users, permissions and topic permissions the target already has,
    so an import never replaces a password hash, tags or rights; returns what was kept."""
    kept: list[str] = []
    have_users = {u.get("name") for u in current.get("users", []) or []}
    users = []
    for u in doc.get("users", []) or []:
        if u.get("name") in have_users:
            kept.append(f"user {u.get('name')!r} (password hash and tags unchanged)")
        else:
            users.append(u)
    if "users" in doc:
        doc["users"] = users
    for kind in ("permissions", "topic_permissions"):
        have = {identity(kind, o) for o in current.get(kind, []) or []}
        keep = []
        for o in doc.get(kind, []) or []:
            if identity(kind, o) in have:
                kept.append(f"{kind[:-1].replace('_', ' ')} of {o.get('user')!r} in vhost {o.get('vhost')!r} unchanged")
            else:
                keep.append(o)
        if kind in doc:
            doc[kind] = keep
    return kept


# --------------------------------------------------------------------------
# Diff (dry run).
# --------------------------------------------------------------------------


_VOLATILE = {"tracing", "metadata", "description", "tags", "default_queue_type", "limits"}


def diff_definitions(new: dict[str, Any], current: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """Per kind: names that would be created, and existing ones whose settings differ (RabbitMQ keeps
    the existing queue's arguments and fails the import when they conflict)."""
    out: dict[str, dict[str, list[str]]] = {}
    for kind in KINDS:
        have = {identity(kind, o): o for o in current.get(kind, []) or []}
        create, change = [], []
        for o in new.get(kind, []) or []:
            ident = identity(kind, o)
            label = "/".join("" if x is None else str(x) for x in ident)
            old = have.get(ident)
            if old is None:
                create.append(label)
            elif kind != "vhosts" and {k: v for k, v in o.items() if k not in _VOLATILE} != {
                k: v for k, v in old.items() if k not in _VOLATILE
            }:
                change.append(label)
        if create or change:
            out[kind] = {"create": create, "change": change}
    return out


@dataclass
class DefinitionsResult:
    source_key: str
    dry_run: bool
    rollback_key: str | None = None
    imported: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    changes: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    target_version: str = ""
    capabilities: dict[str, Any] = field(default_factory=dict)
    adapted: list[DefinitionChange] = field(default_factory=list)  # what was rewritten for the target
    kept_users: list[str] = field(default_factory=list)
    skipped_queues: list[tuple[str, str]] = field(default_factory=list)  # (target vhost, queue) not declared
    error: str | None = None
    rollback: str | None = None  # what the automatic rollback did
    report_key: str | None = None

    def to_json_obj(self) -> dict[str, Any]:
        return {"source_key": self.source_key, "dry_run": self.dry_run, "rollback_key": self.rollback_key,
                "imported": self.imported, "counts": self.counts, "changes": self.changes,
                "target_version": self.target_version, "capabilities": self.capabilities,
                "adapted": [c.to_json_obj() for c in self.adapted], "kept_users": self.kept_users,
                "skipped_queues": [list(x) for x in self.skipped_queues], "error": self.error,
                "rollback": self.rollback, "report_key": self.report_key}

    def report_lines(self) -> list[str]:
        """The human-readable report: every change made for the target, every user kept."""
        lines = [f"  adapted for RabbitMQ {self.target_version}: {c}" for c in self.adapted]
        lines += [f"  kept the target's {k}" for k in self.kept_users]
        return lines


def rollback_timestamp(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"


def _refuse_incompatible(changes: list[DefinitionChange], version: str, source_label: str) -> None:
    lines = "\n  - ".join(str(c) for c in changes)
    raise IncompatibleDefinitionsError(
        f"{source_label}: {len(changes)} definition(s) are incompatible with the target (RabbitMQ {version}) and "
        f"restore.definitions_strict is true; nothing was changed on the target:\n  - {lines}")


def apply_definitions(doc: dict[str, Any], source_label: str, options: RestoreOptions, client: ManagementClient,
                      write_rollback: Callable[[bytes], str],
                      write_report: Callable[[DefinitionsResult], str] | None = None) -> DefinitionsResult:
    """Steps 2-6 of the module docstring on ``doc``; ``write_rollback(json_bytes) -> where`` stores the
    snapshot BEFORE the import, ``write_report(result) -> where`` the restore report (also on failure)."""
    new = transform_definitions(doc, import_selection(options), options.vhost_map, options.queue_map)
    caps = capabilities_of(client)
    new, adapted, skipped = adapt_definitions(new, caps, options.transient_queues)
    if adapted and options.definitions_strict:
        _refuse_incompatible(adapted, caps.version, source_label)
    current = client.get_definitions()
    kept = [] if options.overwrite_users else keep_existing_users(new, current)
    dry = options.definitions_dry_run or options.dry_run
    res = DefinitionsResult(source_key=source_label, dry_run=dry, counts=counts(new),
                            changes=diff_definitions(new, current), target_version=caps.version,
                            capabilities=caps.to_json_obj(), adapted=adapted, kept_users=kept,
                            skipped_queues=sorted(skipped))
    if dry:
        return res
    res.rollback_key = write_rollback(json.dumps(current, indent=2).encode("utf-8"))
    try:
        client.post_definitions(new)
    except ManagementApiError as e:
        res.error = e.args[0]
        try:
            res.rollback = "rolled back: " + rollback_import(client, current, new).describe()
        except ManagementApiError as e2:
            res.rollback = f"the automatic rollback failed too ({e2.args[0]})"
        _store_report(res, write_report)
        raise ManagementApiError(
            f"definitions import from {source_label!r} failed: {res.error}; {res.rollback} from the snapshot "
            f"{res.rollback_key!r} (the target's definitions before the import); no message was restored") from None
    res.imported = True
    _store_report(res, write_report)
    return res


def _store_report(res: DefinitionsResult, write_report: Callable[[DefinitionsResult], str] | None) -> None:
    if write_report is None:
        return
    try:
        res.report_key = write_report(res)
    except RbakError as e:  # the import's outcome matters more than its report
        log.warning("could not store the restore report: %s", e)


def import_definitions(source: BackupSource, manifest: BackupManifest, options: RestoreOptions,
                       client: ManagementClient | None = None) -> DefinitionsResult:
    """Steps 1-6 of the module docstring; raises (and imports nothing) on any failure before the POST."""
    layout = BackupLayout(options.backup_id, options.prefix)
    keyring = options.keyring() if manifest.encryption is not None else None
    doc, key = load_backup_definitions(source, manifest, layout, keyring)
    comp = _compression_of_key(key)
    codec = codec_for(manifest.backup_id, manifest.encryption, keyring)

    def write_rollback(data: bytes) -> str:
        rollback_key = layout.rollback_definitions(rollback_timestamp(), comp)
        return source.put(codec, rollback_key, compress(data, comp))  # sealed like the backup it sits in

    def write_report(res: DefinitionsResult) -> str:
        return store_restore_report(source, layout, {"backup_id": options.backup_id, "definitions": res.to_json_obj()})

    own = client is None
    client = client or ManagementClient.for_connection(options.target, "target")
    try:
        return apply_definitions(doc, key, options, client, write_rollback, write_report)
    finally:
        if own:
            client.close()


def store_restore_report(source: BackupSource, layout: BackupLayout, report: dict[str, Any], key: str | None = None) -> str:
    """``restore/report-<ts>.json`` next to the backup (``key``: rewrite an earlier one)."""
    key = key or layout.restore_report(rollback_timestamp())
    return source.put_report(key, json.dumps(report, indent=2).encode("utf-8"))
