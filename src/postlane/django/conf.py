"""``settings.POSTLANE``: the Django integration's settings, read when used (tests override
them), and the Postlane store URL derived from Django's own ``DATABASES``.

    POSTLANE = {
        "DATABASE": "default",      # the alias whose connection (and transaction) enqueues
        "LANE": "interactive",      # the lane of an email that names none
        "LANES": ["interactive", "bulk"],  # the lane names the workers run (validation)
        "MAX_CONTENT_BYTES": 1_000_000,
        "MAX_ATTACHMENT_BYTES": 10_485_760,   # per attachment (docs/content.md)
        "MAX_ATTACHMENTS_BYTES": 10_485_760,  # all of one message's attachments
        "REQUIRE_KEY": False,       # True: an email without an idempotency key is an error
        "STORE_URL": None,          # default: derived from DATABASES[DATABASE]
        "PROVIDER": None,           # postlane_worker's provider URL (or POSTLANE_PROVIDER)
    }
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from postlane.core.attachments import (
    DEFAULT_MAX_ATTACHMENT_BYTES,
    DEFAULT_MAX_ATTACHMENTS_BYTES,
    AttachmentLimits,
)
from postlane.core.message import DEFAULT_LANE
from postlane.core.validation import DEFAULT_MAX_CONTENT_BYTES, Limits
from postlane.errors import ConfigurationError

_KNOWN = {"DATABASE", "LANE", "LANES", "MAX_CONTENT_BYTES", "MAX_ATTACHMENT_BYTES",
          "MAX_ATTACHMENTS_BYTES", "REQUIRE_KEY", "STORE_URL", "PROVIDER"}

_LIBPQ = {"sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "connect_timeout",
          "application_name", "options", "target_session_attrs", "service", "passfile",
          "gssencmode", "channel_binding"}


@dataclass(frozen=True, slots=True)
class PostlaneSettings:
    database: str = "default"
    lane: str = DEFAULT_LANE
    limits: Limits = Limits()
    require_key: bool = False
    store_url: str | None = None
    provider: str | None = None


def postlane_settings() -> PostlaneSettings:
    """``settings.POSTLANE`` checked: an unknown name is a ``ConfigurationError`` (a typo
    would otherwise be silently ignored)."""
    from django.conf import settings

    raw: dict[str, Any] = dict(getattr(settings, "POSTLANE", None) or {})
    unknown = set(raw) - _KNOWN
    if unknown:
        raise ConfigurationError(
            f"unknown POSTLANE settings {sorted(unknown)} (known: {sorted(_KNOWN)})")
    return PostlaneSettings(
        database=raw.get("DATABASE", "default"),
        lane=raw.get("LANE", DEFAULT_LANE),
        limits=Limits(lanes=tuple(raw.get("LANES", Limits().lanes)),
                      max_content_bytes=raw.get("MAX_CONTENT_BYTES", DEFAULT_MAX_CONTENT_BYTES),
                      attachments=AttachmentLimits(
                          raw.get("MAX_ATTACHMENT_BYTES", DEFAULT_MAX_ATTACHMENT_BYTES),
                          raw.get("MAX_ATTACHMENTS_BYTES", DEFAULT_MAX_ATTACHMENTS_BYTES))),
        require_key=bool(raw.get("REQUIRE_KEY", False)),
        store_url=raw.get("STORE_URL"),
        provider=raw.get("PROVIDER"),
    )


def store_url(conf: PostlaneSettings | None = None) -> str:
    """Postlane's store URL: ``POSTLANE["STORE_URL"]``, else the database Django writes
    the outbox into (so the worker reads what ``send_mail`` wrote)."""
    from django.conf import settings

    conf = conf or postlane_settings()
    if conf.store_url:
        return conf.store_url
    db = settings.DATABASES[conf.database]
    engine = db["ENGINE"].rsplit(".", 1)[-1]
    if engine == "sqlite3":
        return f"sqlite:///{db['NAME']}"
    if engine != "postgresql":
        raise ConfigurationError(
            f"DATABASES[{conf.database!r}] is {db['ENGINE']}: Postlane runs on PostgreSQL "
            "or SQLite")
    auth = quote(db.get("USER") or "", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    host = db.get("HOST") or "localhost"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    # libpq's keywords among OPTIONS travel as query parameters; Django's own (pool,
    # isolation_level, server_side_binding...) mean nothing to another connection.
    options = {k: v for k, v in (db.get("OPTIONS") or {}).items() if k in _LIBPQ}
    query = f"?{urlencode(options)}" if options else ""
    return f"postgresql://{auth}{'@' if auth else ''}{host}{port}/{quote(db['NAME'])}{query}"
