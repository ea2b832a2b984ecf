"""The transactional outbox: write a send intent inside the caller's own transaction.

The application's business write and its send intent commit together or not at all::

    with psycopg.connect(url) as conn:           # one transaction
        conn.execute("INSERT INTO users ...")
        postlane.enqueue(conn, Message(key=f"welcome:{user_id}", to=email, ...))

Nothing here commits: the caller's commit (or rollback) decides. Only the caller's driver
is imported: enqueueing through ``sqlite3`` loads neither psycopg nor anything else optional.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from postlane import tracing
from postlane.core.message import EnqueueResult, Message
from postlane.core.validation import Limits, validate
from postlane.store.connections import async_writer, sync_writer

DEFAULT_LIMITS = Limits()


def enqueue(conn: Any, message: Message, *, limits: Limits = DEFAULT_LIMITS) -> EnqueueResult:
    """Write ``message`` through ``conn`` in its current transaction; do not commit.

    ``conn`` is a ``sqlite3``, psycopg 3 or psycopg2 connection, a SQLAlchemy
    ``Connection``, ``Session`` or ``scoped_session`` (Flask-SQLAlchemy's ``db.session``)
    over one of them, or Django's ``django.db.connection``. For async connections use
    ``enqueue_async``. Enqueueing an existing key with the same content (a retry) returns
    the existing delivery's id with ``created=False`` and writes nothing; a key another
    producer (an API client, an import) wrote, or written for other content, raises
    ``KeyConflict`` (see ``postlane.core.producers``).
    """
    validate(message, limits)
    result = sync_writer(conn).insert_one(message)
    tracing.enqueued([message], [result])
    return result


def enqueue_many(
    conn: Any, messages: Sequence[Message], *, limits: Limits = DEFAULT_LIMITS
) -> list[EnqueueResult]:
    """The bulk form of ``enqueue``; every message is validated first."""
    for message in messages:
        validate(message, limits)
    results = sync_writer(conn).insert_many(messages)
    tracing.enqueued(messages, results)
    return results


async def enqueue_async(
    conn: Any, message: Message, *, limits: Limits = DEFAULT_LIMITS
) -> EnqueueResult:
    """``enqueue`` through an async connection, in its transaction: a psycopg 3
    ``AsyncConnection``, an asyncpg connection, or SQLAlchemy's ``AsyncConnection`` /
    ``AsyncSession`` over either."""
    validate(message, limits)
    result = await (await async_writer(conn)).insert_one(message)
    tracing.enqueued([message], [result])
    return result


async def enqueue_many_async(
    conn: Any, messages: Sequence[Message], *, limits: Limits = DEFAULT_LIMITS
) -> list[EnqueueResult]:
    for message in messages:
        validate(message, limits)
    results = await (await async_writer(conn)).insert_many(messages)
    tracing.enqueued(messages, results)
    return results
