"""How Postlane's processes (``postlane worker``, ``postlane serve``) write their log lines.

Two formats: ``text`` for a terminal and ``json`` (one object per line: time, level, logger,
message, and ``delivery_id`` / ``provider_message_id`` when a line is about a send) for a log
pipeline. Both redact recipient addresses: a log line is read by more people than the
database is. The HTTP client libraries' per-request INFO lines (httpx, botocore...) are
kept below the chosen level unless it is DEBUG: at INFO they were 1,090 of a worker's 1,097
lines, burying the lines about sends.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

from postlane.core.redaction import redact_addresses, redact_url
from postlane.errors import ConfigurationError

LOG_FORMATS = ("text", "json")

QUIET_LOGGERS = ("httpx", "httpcore", "botocore", "boto3", "aiobotocore", "urllib3",
                 "psycopg.pool")
"""Libraries that log each request (or each pool event) at INFO or DEBUG."""

SEND_FIELDS = ("delivery_id", "provider_message_id", "lane", "attempt")
"""``extra=`` keys a log call may pass; the JSON format writes them as fields."""

_DELIVERY_ID = re.compile(r"\bdelivery %d")
_PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]")
_SECRET_NAME = re.compile(r"pass|secret|token|key|auth|credential", re.IGNORECASE)


def redact_setting(name: str, value: Any) -> Any:
    """A configuration value as it may be logged: secrets named as such become ``***``;
    URLs lose their password and any query option named like a secret (``api_key=``)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, Mapping):
        return {k: redact_setting(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_setting(name, v) for v in value]
    text = str(value)
    if _SECRET_NAME.search(name):
        return "***"
    if "://" in text:
        redacted = redact_url(text)
        try:
            query = urlsplit(redacted).query
        except ValueError:
            return "<unparseable URL>"
        if query:  # rebuilt by hand: geturl() would turn sqlite:///x.db into sqlite:/x.db
            hidden = "&".join(f"{pair.partition('=')[0]}=***"
                              if _SECRET_NAME.search(unquote(pair.partition("=")[0])) else pair
                              for pair in query.split("&"))
            redacted = redacted.replace("?" + query, "?" + hidden, 1)
        return redacted
    return text


def delivery_arg(record: logging.LogRecord) -> object | None:
    """The id of a ``"... delivery %d ..."`` line, for the lines that pass no ``extra=``."""
    msg = str(record.msg)
    match = _DELIVERY_ID.search(msg)
    if match is None or not isinstance(record.args, tuple):
        return None
    index = len(_PLACEHOLDER.findall(msg[:match.start()].replace("%%", "")))
    return record.args[index] if index < len(record.args) else None


class TextFormatter(logging.Formatter):
    """The classic ``time LEVEL logger: message`` line, with addresses redacted."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact_addresses(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``delivery_id`` and ``provider_message_id`` as fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact_addresses(record.getMessage()),
        }
        for name in (*SEND_FIELDS, "configuration"):
            value = getattr(record, name, None)
            if value is not None:
                data[name] = value
        if "delivery_id" not in data:
            found = delivery_arg(record)
            if found is not None:
                data["delivery_id"] = found
        if record.exc_info:
            data["exception"] = redact_addresses(self.formatException(record.exc_info))
        return json.dumps(data, default=str)


class _PostlaneHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The stderr handler ``configure_logging`` installs, told apart to be replaced."""


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    """Install one stderr handler on the root logger in ``log_format``, at ``level``."""
    if log_format not in LOG_FORMATS:
        raise ConfigurationError(
            f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    if not isinstance(logging.getLevelName(level.upper()), int):
        raise ConfigurationError(f"log level {level!r} is not one of DEBUG, INFO, WARNING, "
                                 "ERROR, CRITICAL")
    handler = _PostlaneHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _PostlaneHandler)]:
        root.removeHandler(old)  # ours from an earlier call; others' (pytest's) stay
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet_level = logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(quiet_level)


def log_effective_configuration(logger: logging.Logger, what: str,
                                settings: Mapping[str, Any]) -> None:
    """One line at start naming every setting the process runs with, secrets redacted."""
    shown = {name: redact_setting(name, value) for name, value in settings.items()}
    logger.info("%s configuration: %s", what, json.dumps(shown, default=str, sort_keys=True),
                extra={"configuration": shown})


__all__ = ["LOG_FORMATS", "QUIET_LOGGERS", "JsonFormatter", "TextFormatter",
           "configure_logging", "log_effective_configuration", "redact_setting"]
