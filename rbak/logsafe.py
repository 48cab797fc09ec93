"""What may reach a log line: no credentials, no raw control characters.

Installed on the root handlers by the CLI (``install``). At ``-vv`` botocore
and urllib3 log request headers (``Authorization: AWS4-HMAC-SHA256
Credential=..., Signature=...``, ``X-Amz-Security-Token``) and URLs may carry
``user:password@``; queue and vhost names may hold NUL, ESC or newlines that
would forge or garble lines. Every record is rendered once, redacted and
escaped, then handed on.
"""

from __future__ import annotations

import logging
import re

_SECRET_HEADERS = re.compile(
    r"""(?ix)
    (['"]?(?:authorization|proxy-authorization|x-amz-security-token|x-amz-credential|x-amz-signature|cookie)['"]?
     \s*[:=]\s*(?:b(?=['"]))?)
    ('[^']*'|"[^"]*"|[^,}\n]+)
    """
)
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^:/@\s]*):[^@\s/]*@")
_QUERY_SECRET = re.compile(r"(?i)((?:X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|Signature|password)=)[^&\s'\"]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
MASK = "***"


def redact(text: str) -> str:
    text = _SECRET_HEADERS.sub(lambda m: m.group(1) + MASK, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + ":" + MASK + "@", text)
    return _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, text)


def escape_controls(text: str) -> str:
    """NUL, ESC, CR, LF... as ``\\xNN`` (tabs kept): one record is one line, printed as is."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


class SafeLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format string: log it as it is
            return True
        record.msg = escape_controls(redact(msg))
        record.args = None
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Add the filter to every handler of ``logger`` (the root by default)."""
    lg = logger or logging.getLogger()
    for h in lg.handlers:
        if not any(isinstance(f, SafeLogFilter) for f in h.filters):
            h.addFilter(SafeLogFilter())
