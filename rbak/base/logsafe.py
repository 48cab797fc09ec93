"""What may reach a log line: no credentials, no raw control characters.

Installed by every entry point through ``configure`` (the CLI, the operator's
startup, the Spark jobs' drivers; ``install`` alone in Spark executors' workers):
the filter on the root handlers, and the same rendering in the log-record factory,
so handlers added later (kopf's event poster) and Python's last-resort handler
never see a raw record either. At ``-vv`` botocore
and urllib3 log request headers (``Authorization: AWS4-HMAC-SHA256
Credential=..., Signature=...``, ``X-Amz-Security-Token``) and URLs may carry
``user:password@``; queue and vhost names may hold NUL, ESC or newlines that
would forge or garble lines. Every record is rendered once, redacted and
escaped, then handed on.
"""

from __future__ import annotations

import logging
import re
from typing import Callable

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


def sanitize(record: logging.LogRecord) -> logging.LogRecord:
    """Render ``record`` once, redacted and escaped (idempotent: a clean line stays as it is)."""
    try:
        msg = record.getMessage()
    except Exception:  # noqa: BLE001 - a broken format string: log it as it is
        return record
    record.msg = escape_controls(redact(msg))
    record.args = None
    return record


class SafeLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        sanitize(record)
        return True


def _safe_factory(previous: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args, **kwargs) -> logging.LogRecord:
        return sanitize(previous(*args, **kwargs))

    factory.rbak_safe = True  # type: ignore[attr-defined]  # the mark install() looks for
    return factory


def install(logger: logging.Logger | None = None) -> None:
    """Add the filter to every handler of ``logger`` (the root by default), and make every
    log record of this process sanitized where it is created (once per process)."""
    lg = logger or logging.getLogger()
    for h in lg.handlers:
        if not any(isinstance(f, SafeLogFilter) for f in h.filters):
            h.addFilter(SafeLogFilter())
    current = logging.getLogRecordFactory()
    if not getattr(current, "rbak_safe", False):
        logging.setLogRecordFactory(_safe_factory(current))


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: int | str = logging.INFO, stream=None) -> None:
    """The one logging set-up of rbak's entry points: root handler and format, then ``install``."""
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=stream)
    install()
