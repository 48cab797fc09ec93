"""Definitions export: GET /api/definitions -> ``definitions/definitions.json<ext>`` (pretty JSON)."""

from __future__ import annotations

import orjson

from ..errors import ManagementApiError
from ..format.compression import Compression, compress
from ..format.manifest import DefinitionsBackup
from ..keys import BackupLayout
from ..crypto import ObjectCodec
from ..storage.base import Storage
from .management import ManagementClient


def export_definitions(client: ManagementClient) -> dict:
    raw = client.definitions_raw()
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ManagementApiError(f"GET /api/definitions: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ManagementApiError("GET /api/definitions: expected a JSON object")
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
