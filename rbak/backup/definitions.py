"""Definitions export: GET /api/definitions, scoped to what the backup covers, stored as
``definitions/definitions.json<ext>`` (pretty JSON).

A backup of some vhosts (``source.queues.vhosts``) holds only those vhosts,
their exchanges, policies, operator policies and parameters, the queues its
selection covers (include/exclude/types) with the bindings between kept
objects, and only the users with permissions there (with their permissions):
never another tenant's vhosts or users. A backup of every vhost keeps the
cluster's users and global parameters.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import ManagementApiError
from ..format.compression import Compression, compress
from ..format.manifest import DefinitionsBackup
from ..base.definitions_doc import filter_queues, scope_to_vhosts
from ..format.layout import BackupLayout
from ..sealing.crypto import ObjectCodec
from ..storage.base import Storage
from ..broker.management import ManagementClient


def export_definitions(client: ManagementClient, selection: Any = None) -> dict:
    """The source's definitions, scoped to ``selection`` (``rbak.config.QueueSelection``; None: all)."""
    raw = client.definitions_raw()
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ManagementApiError(f"GET /api/definitions: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ManagementApiError("GET /api/definitions: expected a JSON object")
    return scope_definitions(doc, selection) if selection is not None else doc


def scope_definitions(doc: dict, selection: Any) -> dict:
    """Pure: ``doc`` reduced to the vhosts and queues ``selection`` covers."""
    if selection.vhosts:
        doc = scope_to_vhosts(doc, selection.vhosts)
    filter_queues(doc, lambda vhost, name, qtype: selection.matches(vhost, name, qtype))
    return doc


def store_definitions(doc: dict, storage: Storage, layout: BackupLayout, compression: Compression,
                      level: int | None = None, codec: ObjectCodec | None = None) -> DefinitionsBackup:
    """Pretty-printed (2-space) like the Rust tool; counts for the manifest. Sealed when ``codec`` encrypts."""
    pretty = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    key = layout.definitions(compression)
    (codec or ObjectCodec(layout.backup_id)).put(storage, key, compress(pretty, compression, level))

    def n(name: str) -> int:
        v = doc.get(name)
        return len(v) if isinstance(v, list) else 0

    return DefinitionsBackup(key=key, vhost_count=n("vhosts"), queue_count=n("queues"),
                             exchange_count=n("exchanges"), user_count=n("users"), size_bytes=len(pretty))
