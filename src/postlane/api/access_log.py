"""Access logs without recipient addresses.

A request line such as ``GET /v1/messages?recipient=ada%40example.com`` would put the
address into the server's access log, where the worker's own logs only ever write
``a***@example.com`` (``core.validation.redact_address``). ``RedactAddresses`` rewrites each
address-like part of a logged request target (a query value or a path segment holding an
``@``, plain or percent-encoded) the same way. The app adds it to uvicorn's access logger
while it runs (``create_app``'s lifespan), so ``postlane serve`` and any uvicorn that runs
the app log redacted targets.

Credentials in a target are cut the same way: the token of a one-click unsubscribe link
(``/unsubscribe/TOKEN``, which also names the recipient) and a webhook's ``token=``
parameter are logged as ``***``.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import quote, unquote_plus

from postlane.core.redaction import redact_address

ACCESS_LOGGERS = ("uvicorn.access",)

# A part of a request target between its delimiters that holds an @ (or %40).
_ADDRESS_PART = re.compile(r"[^/?&=#\s\"]*(?:@|%40)[^/?&=#\s\"]*", re.IGNORECASE)


_CREDENTIAL = re.compile(r"(/unsubscribe/|[?&]token=)[^/?&#\s\"]+", re.IGNORECASE)


def redact_target(text: str) -> str:
    """Every address-like part of ``text`` (a request target, a request line) redacted, and
    every credential it carries."""
    text = _CREDENTIAL.sub(lambda m: f"{m[1]}***", text)
    if "@" not in text and "%40" not in text.lower():
        return text
    return _ADDRESS_PART.sub(
        lambda m: quote(redact_address(unquote_plus(m[0])), safe="@*"), text)


class RedactAddresses(logging.Filter):
    """Redacts addresses in a record's string arguments (uvicorn passes the request target
    as one) and, for a record without arguments, in its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(redact_target(a) if isinstance(a, str) else a
                                for a in record.args)
        elif not record.args and isinstance(record.msg, str):
            record.msg = redact_target(record.msg)
        return True


def install(logger_names: tuple[str, ...] = ACCESS_LOGGERS) -> RedactAddresses:
    """Add one filter to the access loggers; returns it, for ``uninstall``."""
    redactor = RedactAddresses()
    for name in logger_names:
        logging.getLogger(name).addFilter(redactor)
    return redactor


def uninstall(redactor: RedactAddresses,
              logger_names: tuple[str, ...] = ACCESS_LOGGERS) -> None:
    for name in logger_names:
        logging.getLogger(name).removeFilter(redactor)
