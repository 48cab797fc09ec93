"""The machinery of config sections: documented, constrained fields and a repr that never shows a
secret or a URL's password."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"


def doc_field(default: Any = dataclasses.MISSING, doc: str = "", *, factory: Any = None,
              required: bool = False, min: float | None = None, max: float | None = None,  # noqa: A002 - min and max: the names the reference and callers use
              secret: bool = False) -> Any:
    """A dataclass field with its reference documentation and constraints."""
    meta = {"doc": doc, "required": required, "min": min, "max": max, "secret": secret}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    if default is dataclasses.MISSING:
        default = None
    return field(default=default, metadata=meta)


class _Section:
    """Mixin: masked repr and a plain-dict view of a config section."""

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.metadata.get("secret") and v is not None:
                v = MASK
            elif isinstance(v, str) and "url" in f.name:
                v = mask_url(v)
            parts.append(f"{f.name}={v!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def to_dict(self, mask: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if isinstance(v, _Section):
                v = v.to_dict(mask)
            elif mask and f.metadata.get("secret") and v is not None:
                v = MASK
            elif mask and isinstance(v, str) and "url" in f.name:
                v = mask_url(v)
            elif isinstance(v, (list, dict)):
                v = type(v)(v)
            out[f.name] = v
        return out


def mask_url(url: str | None) -> str | None:
    """``amqp://user:secret@host/`` -> ``amqp://user:***@host/`` (for logs and errors)."""
    if not url or "@" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return re.sub(r"//([^:/@]*):[^@]*@", r"//\1:" + MASK + "@", url)
    if parts.password is None:
        # no userinfo as urlsplit reads it; a malformed URL (``amqp//user:secret@host``) still carries one
        head, at, tail = url.rpartition("@")
        return f"{head.rsplit(':', 1)[0]}:{MASK}{at}{tail}" if ":" in head.split("//")[-1] else url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:{MASK}@{host}", parts.path, parts.query, parts.fragment))
