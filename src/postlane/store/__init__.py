"""Storage engines behind one interface; ``open_store(url)`` picks one by URL scheme.

``Store`` is what an engine implements; consumers name the roles they use
(``WorkerStore``, ``OperatorStore``... see ``postlane.store.roles``)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from postlane.core.records import Claim, RescueResult, Stats, Transition
from postlane.core.redaction import redact_url
from postlane.core.validation import Limits
from postlane.errors import ConfigurationError
from postlane.store.base import Store
from postlane.store.roles import (
    ApiKeyStore,
    CallbackStore,
    FleetStore,
    ImportStore,
    OperatorStore,
    ProducerStore,
    ProviderEventStore,
    StoreLifecycle,
    TemplateStore,
    WorkerStore,
)

DEFAULT_DATABASE_URL = "sqlite:///postlane.db"
DATABASE_URL_ENV = "POSTLANE_DATABASE_URL"

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_DATABASE_URL",
    "ApiKeyStore",
    "CallbackStore",
    "Claim",
    "FleetStore",
    "ImportStore",
    "OperatorStore",
    "ProducerStore",
    "ProviderEventStore",
    "RescueResult",
    "Stats",
    "Store",
    "StoreLifecycle",
    "TemplateStore",
    "Transition",
    "WorkerStore",
    "database_url",
    "open_store",
    "plain_url",
    "redact_url",
]


def database_url(explicit: str | None = None) -> str:
    """``explicit``, else ``$POSTLANE_DATABASE_URL``, else a SQLite file in the working dir;
    SQLAlchemy's spellings made plain (see :func:`plain_url`)."""
    return plain_url(explicit or os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL)


def open_store(url: str, *, limits: Limits | None = None, pool_size: int = 4) -> Store:
    """A store for ``sqlite:///path`` (``sqlite:////abs/path``) or ``postgresql://...``.

    URLs written for SQLAlchemy work as they are (``postgresql+psycopg://``,
    ``postgres://``, ``sqlite+pysqlite:///``): the driver part is dropped, since each engine
    has one driver. The store is not connected yet: use ``async with open_store(url)``.
    """
    url = plain_url(url)
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from postlane.store.sqlite import SQLiteStore

        path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
        if not path:
            raise ConfigurationError(
                f"SQLite URL needs a path: sqlite:///relative.db or sqlite:////abs/path.db "
                f"(got {redact_url(url)!r})"
            )
        return SQLiteStore(path, limits=limits)
    if scheme == "postgresql":
        from postlane.store.postgres import PostgresStore

        return PostgresStore(url, limits=limits, max_size=pool_size)
    raise ConfigurationError(
        f"unsupported database URL scheme {scheme!r} in {redact_url(url)!r} "
        "(use sqlite:///path or postgresql://...)"
    )


def plain_url(url: str) -> str:
    """``url`` with a SQLAlchemy driver suffix dropped (``postgresql+psycopg2://`` to
    ``postgresql://``) and ``postgres://`` (Heroku's spelling) as ``postgresql://``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    engine = scheme.split("+", 1)[0].lower()
    engine = {"postgres": "postgresql"}.get(engine, engine)
    return f"{engine}://{rest}" if engine in ("postgresql", "sqlite") else url
