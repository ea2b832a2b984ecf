"""The transactional outbox: write a send intent inside the caller's own transaction.

The application's business write and its send intent commit together or not at all::

    with psycopg.connect(url) as conn:           # one transaction
        conn.execute("INSERT INTO users ...")
        postlane.enqueue(conn, Message(key=f"welcome:{user_id}", to=email, ...))

Nothing here commits: the caller's commit (or rollback) decides.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from postlane.core.message import EnqueueResult, Message
from postlane.core.validation import Limits, validate
from postlane.errors import UnsupportedConnection
from postlane.store import postgres as pg
from postlane.store import sqlite as sq

DEFAULT_LIMITS = Limits()


def enqueue(conn: Any, message: Message, *, limits: Limits = DEFAULT_LIMITS) -> EnqueueResult:
    """Write ``message`` through ``conn`` in its current transaction; do not commit.

    ``conn`` is a ``sqlite3.Connection``, a ``psycopg.Connection``, or a SQLAlchemy
    ``Connection`` or ``Session`` over either. For ``psycopg.AsyncConnection`` use
    ``enqueue_async``. Enqueueing an existing key with the same content (a retry) returns
    the existing delivery's id with ``created=False`` and writes nothing; a key another
    producer (an API client, an import) wrote, or written for other content, raises
    ``KeyConflict`` (see ``postlane.core.producers``).
    """
    validate(message, limits)
    raw = _driver_connection(conn)
    if isinstance(raw, sqlite3.Connection):
        return sq.insert_one(raw, message)
    import psycopg

    if isinstance(raw, psycopg.Connection):
        return pg.enqueue_on_sync_connection(raw, message)
    if isinstance(raw, psycopg.AsyncConnection):
        raise UnsupportedConnection("an async psycopg connection needs `await enqueue_async(...)`")
    raise UnsupportedConnection(
        f"cannot enqueue through {type(conn).__module__}.{type(conn).__name__}; pass a "
        "sqlite3, psycopg 3 or SQLAlchemy connection"
    )


def enqueue_many(
    conn: Any, messages: Sequence[Message], *, limits: Limits = DEFAULT_LIMITS
) -> list[EnqueueResult]:
    """The bulk form of ``enqueue`` (COPY on PostgreSQL); every message is validated first."""
    for message in messages:
        validate(message, limits)
    raw = _driver_connection(conn)
    if isinstance(raw, sqlite3.Connection):
        return sq.insert_many(raw, messages)
    import psycopg

    if isinstance(raw, psycopg.Connection):
        return pg.enqueue_many_on_sync_connection(raw, messages)
    raise UnsupportedConnection(
        f"cannot enqueue through {type(conn).__module__}.{type(conn).__name__}"
    )


async def enqueue_async(
    conn: Any, message: Message, *, limits: Limits = DEFAULT_LIMITS
) -> EnqueueResult:
    """``enqueue`` for a ``psycopg.AsyncConnection`` in the caller's transaction."""
    validate(message, limits)
    import psycopg

    if not isinstance(conn, psycopg.AsyncConnection):
        raise UnsupportedConnection("enqueue_async takes a psycopg.AsyncConnection")
    return await pg.enqueue_on_connection(conn, message)


async def enqueue_many_async(
    conn: Any, messages: Sequence[Message], *, limits: Limits = DEFAULT_LIMITS
) -> list[EnqueueResult]:
    for message in messages:
        validate(message, limits)
    import psycopg

    if not isinstance(conn, psycopg.AsyncConnection):
        raise UnsupportedConnection("enqueue_many_async takes a psycopg.AsyncConnection")
    return await pg.enqueue_many_on_connection(conn, messages)


def _driver_connection(conn: Any) -> Any:
    """Unwrap SQLAlchemy to the DB-API connection it drives, inside its transaction."""
    module = type(conn).__module__
    if module.startswith("sqlalchemy"):
        connection = conn.connection() if hasattr(conn, "get_bind") else conn  # Session
        return connection.connection.driver_connection
    return conn
