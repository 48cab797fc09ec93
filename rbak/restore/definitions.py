"""Definitions import (restore side) and export/import for the CLI commands.

Order of a restore with ``restore_definitions``:

1. load the backup's ``definitions/definitions.json<ext>`` (the manifest's key,
   else the first of ``.zst``/``.lz4``/none that exists) and check it is a
   definitions document;
2. apply ``definitions_selection`` and the vhost/queue remapping (the same
   maps the messages use, so a restore into a staging vhost gets its topology);
3. GET the TARGET's current ``/api/definitions`` and store it FIRST as
   ``definitions/rollback-before-import-<UTC timestamp><ext>`` in the backup
   (skipped in ``definitions_dry_run``, which changes nothing);
4. POST ``/api/definitions`` (RabbitMQ merges: it never deletes). Any failure
   raises ``ManagementApiError`` and the engine publishes no message.

``definitions_dry_run`` diffs the document against the target and reports
what would be created or changed, per kind.
"""

from __future__ import annotations

import copy
import datetime as _dt
import fnmatch
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import requests

from ..crypto import codec_for
from ..errors import ManagementApiError, NotFoundError, SerializationError
from ..format.compression import Compression, compress, decompress
from ..format.manifest import BackupManifest
from ..keys import BackupLayout
from ..storage.base import Storage
from .options import DefinitionsFilter, RestoreOptions, TargetConnection
from .plan import map_queue, map_vhost

KINDS = ("users", "vhosts", "permissions", "topic_permissions", "parameters", "global_parameters",
         "policies", "queues", "exchanges", "bindings")


class ManagementClient:
    """The few management API calls definitions need; errors name the URL path, never the password."""

    def __init__(self, target: TargetConnection):
        self.base = target.management_url.rstrip("/")
        from urllib.parse import unquote, urlsplit

        url = urlsplit(target.amqp_url)
        user = target.management_username or (unquote(url.username) if url.username else "guest")
        password = target.management_password or (unquote(url.password) if url.password else "guest")
        self.auth = (user, password)
        self.timeout = target.connection_timeout_secs
        self.verify: Any = True
        if target.ca_cert:
            self.verify = target.ca_cert
        if not target.verify:
            self.verify = False
        self.cert = (target.client_cert, target.client_key) if target.client_cert else None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        url = self.base + path
        try:
            r = requests.request(method, url, auth=self.auth, json=body, timeout=max(self.timeout, 60.0),
                                 verify=self.verify, cert=self.cert)
        except requests.exceptions.SSLError as e:
            raise ManagementApiError(f"{method} {url}: TLS error: {e}") from None
        except requests.RequestException as e:
            raise ManagementApiError(f"{method} {url}: {type(e).__name__}: {e}") from None
        if r.status_code == 401:
            raise ManagementApiError(f"{method} {url}: authentication failed for user {self.auth[0]!r}")
        if r.status_code >= 400:
            raise ManagementApiError(f"{method} {url}: HTTP {r.status_code}: {r.text[:1000]}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise ManagementApiError(f"{method} {url}: the response is not JSON") from None

    def get_definitions(self) -> dict[str, Any]:
        return self.request("GET", "/api/definitions")

    def post_definitions(self, doc: dict[str, Any]) -> None:
        self.request("POST", "/api/definitions", doc)


# --------------------------------------------------------------------------
# Loading and transforming.
# --------------------------------------------------------------------------


def _compression_of_key(key: str) -> Compression:
    for c in (Compression.ZSTD, Compression.LZ4):
        if key.endswith(c.extension):
            return c
    return Compression.NONE


def load_backup_definitions(storage: Storage, manifest: BackupManifest, layout: BackupLayout,
                            keyring: Mapping[str, bytes] | None = None) -> tuple[dict[str, Any], str]:
    """(definitions document, its key)."""
    keys = [manifest.definitions.key] if manifest.definitions else []
    keys += [layout.definitions(c) for c in (Compression.ZSTD, Compression.LZ4, Compression.NONE)]
    codec = codec_for(manifest.backup_id, manifest.encryption, keyring)
    for key in keys:
        try:
            raw = codec.get(storage, key)
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


def _glob(patterns: tuple[str, ...], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) if any(c in p for c in "*?[") else name == p for p in patterns)


def transform_definitions(doc: dict[str, Any], selection: DefinitionsFilter, vhost_map: dict[str, str],
                          queue_map: dict[str, str]) -> dict[str, Any]:
    """Select and remap a definitions document (a new document; the input is untouched).

    Selection: ``vhosts`` keeps only objects of those (source) vhosts, the
    users with permissions there, and no global parameters;
    ``queues``/``exchanges`` keep only matching queues/exchanges and the
    bindings between kept objects. Remapping rewrites every ``vhost`` field and
    the names of remapped queues (also as binding destinations).
    """
    out = copy.deepcopy(doc)
    vs = selection.vhosts

    def keep_vhost(v: str | None) -> bool:
        return not vs or v in vs

    if vs:
        out["vhosts"] = [v for v in out.get("vhosts", []) if v.get("name") in vs]
    for kind in ("permissions", "topic_permissions", "parameters", "policies", "queues", "exchanges", "bindings"):
        if kind in out:
            out[kind] = [o for o in out[kind] if keep_vhost(o.get("vhost"))]
    if vs:
        # a vhost-scoped import brings only the users that have rights in those vhosts,
        # and no cluster-wide parameters
        users = {p.get("user") for p in out.get("permissions", []) + out.get("topic_permissions", [])}
        out["users"] = [u for u in out.get("users", []) if u.get("name") in users]
        out.pop("global_parameters", None)
    if selection.queues:
        out["queues"] = [q for q in out.get("queues", []) if _glob(selection.queues, q.get("name", ""))]
    if selection.exchanges:
        out["exchanges"] = [e for e in out.get("exchanges", []) if _glob(selection.exchanges, e.get("name", ""))]
    if selection.queues or selection.exchanges:
        queues = {(q["vhost"], q["name"]) for q in out.get("queues", [])}
        exchanges = {(e["vhost"], e["name"]) for e in out.get("exchanges", [])} | {(None, "")}

        def present(b: dict[str, Any], name: str, kind: str) -> bool:
            if kind == "queue":
                return (b.get("vhost"), name) in queues
            return name == "" or name.startswith("amq.") or (b.get("vhost"), name) in exchanges

        out["bindings"] = [
            b for b in out.get("bindings", [])
            if present(b, b.get("source", ""), "exchange") and present(b, b.get("destination", ""), b.get("destination_type", "queue"))
        ]
    # remapping (queue names first: the queue map is keyed by the SOURCE vhost)
    for q in out.get("queues", []):
        q["name"] = map_queue(q.get("vhost", "/"), q["name"], queue_map)
    for b in out.get("bindings", []):
        if b.get("destination_type") == "queue":
            b["destination"] = map_queue(b.get("vhost", "/"), b["destination"], queue_map)
    for v in out.get("vhosts", []):
        v["name"] = map_vhost(v["name"], vhost_map)
    for kind in ("permissions", "topic_permissions", "parameters", "policies", "queues", "exchanges", "bindings"):
        for o in out.get(kind, []):
            if "vhost" in o:
                o["vhost"] = map_vhost(o["vhost"], vhost_map)
    return out


# --------------------------------------------------------------------------
# Diff (dry run).
# --------------------------------------------------------------------------


def _identity(kind: str, o: dict[str, Any]) -> tuple:
    if kind in ("users", "vhosts", "global_parameters"):
        return (o.get("name"),)
    if kind in ("permissions", "topic_permissions"):
        return (o.get("user"), o.get("vhost"), o.get("exchange"))
    if kind == "parameters":
        return (o.get("vhost"), o.get("component"), o.get("name"))
    if kind == "bindings":
        return (o.get("vhost"), o.get("source"), o.get("destination"), o.get("destination_type"),
                o.get("routing_key"), json.dumps(o.get("arguments") or {}, sort_keys=True))
    return (o.get("vhost"), o.get("name"))


_VOLATILE = {"tracing", "metadata", "description", "tags", "default_queue_type", "limits"}


def diff_definitions(new: dict[str, Any], current: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """Per kind: names that would be created, and existing ones whose settings differ (RabbitMQ keeps
    the existing queue's arguments and fails the import when they conflict)."""
    out: dict[str, dict[str, list[str]]] = {}
    for kind in KINDS:
        have = {_identity(kind, o): o for o in current.get(kind, []) or []}
        create, change = [], []
        for o in new.get(kind, []) or []:
            ident = _identity(kind, o)
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

    def to_json_obj(self) -> dict[str, Any]:
        return {"source_key": self.source_key, "dry_run": self.dry_run, "rollback_key": self.rollback_key,
                "imported": self.imported, "counts": self.counts, "changes": self.changes}


def rollback_timestamp(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"


def apply_definitions(doc: dict[str, Any], source_label: str, options: RestoreOptions, client: ManagementClient,
                      write_rollback: Callable[[bytes], str]) -> DefinitionsResult:
    """Select/remap ``doc``, diff it against the target, and (unless a dry run) store the
    rollback snapshot with ``write_rollback(json_bytes) -> where`` BEFORE posting it."""
    new = transform_definitions(doc, options.definitions_selection, options.vhost_map, options.queue_map)
    current = client.get_definitions()
    dry = options.definitions_dry_run or options.dry_run
    res = DefinitionsResult(source_key=source_label, dry_run=dry,
                            counts={k: len(new.get(k, []) or []) for k in KINDS if new.get(k)},
                            changes=diff_definitions(new, current))
    if dry:
        return res
    res.rollback_key = write_rollback(json.dumps(current, indent=2).encode("utf-8"))
    try:
        client.post_definitions(new)
    except ManagementApiError as e:
        raise ManagementApiError(f"definitions import from {source_label!r} failed (the target's previous definitions "
                                 f"are saved at {res.rollback_key!r}); no message was restored: {e.args[0]}") from None
    res.imported = True
    return res


def import_definitions(storage: Storage, manifest: BackupManifest, options: RestoreOptions,
                       client: ManagementClient | None = None) -> DefinitionsResult:
    """Steps 1-4 of the module docstring; raises (and imports nothing) on any failure before the POST."""
    layout = BackupLayout(options.backup_id, options.prefix)
    keyring = options.keyring() if manifest.encryption is not None else None
    doc, key = load_backup_definitions(storage, manifest, layout, keyring)
    comp = _compression_of_key(key)
    codec = codec_for(manifest.backup_id, manifest.encryption, keyring)

    def write_rollback(data: bytes) -> str:
        rollback_key = layout.rollback_definitions(rollback_timestamp(), comp)
        codec.put(storage, rollback_key, compress(data, comp))  # sealed like the backup it sits in
        return rollback_key

    return apply_definitions(doc, key, options, client or ManagementClient(options.target), write_rollback)
