"""A caller's connection, whatever holds it, as the driver connection the outbox writes through.

The one place that knows the wrappers and the drivers (the outbox and the templates' outbox
forms ask here, nothing else looks at a caller's connection):

- wrappers, unwrapped to the DB-API connection inside their transaction: SQLAlchemy's
  ``Connection``, ``Session`` and ``scoped_session`` (Flask-SQLAlchemy's ``db.session``),
  ``AsyncConnection``, ``AsyncSession`` and ``async_scoped_session``; Django's
  ``django.db.connection`` (or ``connections[alias]``);
- drivers: ``sqlite3`` and psycopg 3 sync and psycopg2 (for ``enqueue``), psycopg 3 async
  and asyncpg (for ``enqueue_async``), and aiosqlite under SQLAlchemy's async forms.

A sync connection handed to the async form, or the reverse, is an ``UnsupportedConnection``
that names the form to use. No driver is imported unless the caller's object comes from it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, cast

from postlane.core.message import EnqueueResult, Message
from postlane.core.records import TemplateVersion
from postlane.errors import UnsupportedConnection

SUPPORTED = ("sqlite3, psycopg 3, psycopg2, asyncpg, SQLAlchemy (sync or async, the async "
             "forms over asyncpg, psycopg 3 or aiosqlite) or Django connections")


class SyncWriter(Protocol):
    def insert_one(self, message: Message) -> EnqueueResult: ...
    def insert_many(self, messages: Sequence[Message]) -> list[EnqueueResult]: ...
    def template(self, name: str, version: int | None) -> TemplateVersion | None: ...


class AsyncWriter(Protocol):
    async def insert_one(self, message: Message) -> EnqueueResult: ...
    async def insert_many(self, messages: Sequence[Message]) -> list[EnqueueResult]: ...
    async def template(self, name: str, version: int | None) -> TemplateVersion | None: ...


def _module(obj: Any) -> str:
    return type(obj).__module__ or ""


def _name(obj: Any) -> str:
    return f"{_module(obj)}.{type(obj).__name__}"


def _is_async_sqlalchemy(conn: Any) -> bool:
    return _module(conn).startswith("sqlalchemy.ext.asyncio")


def _is_async_driver(raw: Any) -> bool:
    module = _module(raw)
    if module.startswith("asyncpg"):
        return True
    if module.startswith("psycopg") and not module.startswith("psycopg2"):
        import psycopg

        return isinstance(raw, psycopg.AsyncConnection)
    return False


def raw_sync_connection(conn: Any) -> Any:
    """The DB-API connection under a sync wrapper, inside the wrapper's transaction."""
    module = _module(conn)
    if module.startswith("sqlalchemy") and not _is_async_sqlalchemy(conn):
        # A Session or scoped_session (get_bind) gives its Connection, beginning the
        # session's transaction; a Connection begins its own on first use.
        connection = conn.connection() if hasattr(conn, "get_bind") else conn
        return connection.connection.driver_connection
    if module.startswith("django") and hasattr(conn, "ensure_connection"):
        # Outside transaction.atomic() Django's connection is in autocommit: each enqueue
        # then commits on its own, as any Django write there would.
        conn.ensure_connection()
        return conn.connection
    return conn


class _SQLite:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def insert_one(self, message: Message) -> EnqueueResult:
        from postlane.store.sqlite._producing import insert_one

        return insert_one(self.conn, message)

    def insert_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        from postlane.store.sqlite._producing import insert_many

        return insert_many(self.conn, messages)

    def template(self, name: str, version: int | None) -> TemplateVersion | None:
        from postlane.store.sqlite import SQLiteStore

        return SQLiteStore.template_on_connection(self.conn, name, version)


class _Psycopg:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def insert_one(self, message: Message) -> EnqueueResult:
        from postlane.store.postgres._producing import enqueue_on_sync_connection

        return enqueue_on_sync_connection(self.conn, message)

    def insert_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        from postlane.store.postgres._producing import enqueue_many_on_sync_connection

        return enqueue_many_on_sync_connection(self.conn, messages) if messages else []

    def template(self, name: str, version: int | None) -> TemplateVersion | None:
        from postlane.store.postgres import PostgresStore

        return PostgresStore.template_on_sync_connection(self.conn, name, version)


class _Psycopg2:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def insert_one(self, message: Message) -> EnqueueResult:
        from postlane.store.postgres._drivers import psycopg2_insert_one

        return psycopg2_insert_one(self.conn, message)

    def insert_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        from postlane.store.postgres._drivers import psycopg2_insert_many

        return psycopg2_insert_many(self.conn, messages)

    def template(self, name: str, version: int | None) -> TemplateVersion | None:
        from postlane.store.postgres._drivers import psycopg2_template

        return psycopg2_template(self.conn, name, version)


class _AioSQLite:
    """SQLAlchemy's AsyncConnection over aiosqlite. aiosqlite runs a sqlite3 connection in
    its own thread and has no public way to run blocking code there, so the SQLite path's
    own functions run inside ``run_sync``: SQLAlchemy's adapted DB-API connection takes
    sqlite3's calls (``execute``, ``cursor``) and awaits each on aiosqlite's thread. One
    copy of the SQL, the same key-ownership checks, in the caller's transaction."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    @staticmethod
    def _dbapi(sync_connection: Any) -> sqlite3.Connection:
        # Not a sqlite3.Connection but speaks its subset that _producing uses.
        return cast(sqlite3.Connection, sync_connection.connection.dbapi_connection)

    async def insert_one(self, message: Message) -> EnqueueResult:
        from postlane.store.sqlite._producing import insert_one

        result: EnqueueResult = await self.connection.run_sync(
            lambda sync: insert_one(self._dbapi(sync), message))
        return result

    async def insert_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        from postlane.store.sqlite._producing import insert_many

        results: list[EnqueueResult] = await self.connection.run_sync(
            lambda sync: insert_many(self._dbapi(sync), messages))
        return results

    async def template(self, name: str, version: int | None) -> TemplateVersion | None:
        from postlane.store.sqlite import SQLiteStore

        found: TemplateVersion | None = await self.connection.run_sync(
            lambda sync: SQLiteStore.template_on_connection(self._dbapi(sync), name, version))
        return found


class _PsycopgAsync:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def insert_one(self, message: Message) -> EnqueueResult:
        from postlane.store.postgres._producing import enqueue_on_connection

        return await enqueue_on_connection(self.conn, message)

    async def insert_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        from postlane.store.postgres._producing import enqueue_many_on_connection

        return await enqueue_many_on_connection(self.conn, messages) if messages else []

    async def template(self, name: str, version: int | None) -> TemplateVersion | None:
        from postlane.store.postgres import PostgresStore

        return await PostgresStore.template_on_connection(self.conn, name, version)


class _Asyncpg:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def insert_one(self, message: Message) -> EnqueueResult:
        from postlane.store.postgres._drivers import asyncpg_insert_one

        return await asyncpg_insert_one(self.conn, message)

    async def insert_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        from postlane.store.postgres._drivers import asyncpg_insert_many

        return await asyncpg_insert_many(self.conn, messages)

    async def template(self, name: str, version: int | None) -> TemplateVersion | None:
        from postlane.store.postgres._drivers import asyncpg_template

        return await asyncpg_template(self.conn, name, version)


def sync_writer(conn: Any) -> SyncWriter:
    """The writer for a sync connection or wrapper; ``UnsupportedConnection`` otherwise."""
    if _is_async_sqlalchemy(conn):
        raise UnsupportedConnection(
            f"{_name(conn)} is async: use `await postlane.enqueue_async(...)`")
    raw = raw_sync_connection(conn)
    if isinstance(raw, sqlite3.Connection):
        return _SQLite(raw)
    module = _module(raw)
    if module.startswith("psycopg2"):
        import psycopg2.extensions

        if isinstance(raw, psycopg2.extensions.connection):
            return _Psycopg2(raw)
    elif module.startswith("psycopg"):
        import psycopg

        if isinstance(raw, psycopg.Connection):
            return _Psycopg(raw)
    if _is_async_driver(raw):
        raise UnsupportedConnection(
            f"{_name(raw)} is async: use `await postlane.enqueue_async(...)`")
    raise UnsupportedConnection(f"cannot enqueue through {_name(conn)}; pass {SUPPORTED}")


async def async_writer(conn: Any) -> AsyncWriter:
    """The writer for an async connection or wrapper; ``UnsupportedConnection`` otherwise.

    Through SQLAlchemy over asyncpg the driver's transaction begins only at SQLAlchemy's
    first statement: if the enqueue comes first, one ``SELECT 1`` through SQLAlchemy
    begins it, so the enqueue never commits on its own. Over aiosqlite an AsyncConnection
    not yet in a transaction is begun the same way: otherwise sqlite3's implicit BEGIN
    would hold a transaction SQLAlchemy's ``commit()`` does not know of (and the pool's
    reset on return would roll the message back).
    """
    raw = conn
    if _is_async_sqlalchemy(conn):
        # AsyncSession / async_scoped_session give their AsyncConnection (beginning the
        # session's transaction); an AsyncConnection is used as it is.
        connection = await conn.connection() if hasattr(conn, "get_bind") else conn
        raw = (await connection.get_raw_connection()).driver_connection
        if _module(raw).startswith("asyncpg") and not raw.is_in_transaction():
            from sqlalchemy import text

            await connection.execute(text("SELECT 1"))
        if _module(raw).startswith("aiosqlite"):
            if not connection.in_transaction():
                from sqlalchemy import text

                await connection.execute(text("SELECT 1"))
            return _AioSQLite(connection)
    module = _module(raw)
    if module.startswith("asyncpg"):
        import asyncpg
        import asyncpg.pool

        # A pool's connection proxy forwards to the connection it holds.
        if isinstance(raw, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
            return _Asyncpg(raw)
    elif _is_async_driver(raw):
        return _PsycopgAsync(raw)
    if _is_async_sqlalchemy(conn):
        raise UnsupportedConnection(
            f"cannot enqueue_async through {_name(raw)} under SQLAlchemy: its async "
            "forms work over asyncpg, psycopg 3 and aiosqlite")
    if _module(conn).startswith(("sqlite3", "psycopg", "sqlalchemy", "django")):
        raise UnsupportedConnection(
            f"{_name(conn)} is sync: use `postlane.enqueue(...)` (enqueue_async takes "
            "psycopg 3 AsyncConnection, asyncpg, or SQLAlchemy's AsyncConnection / "
            "AsyncSession over asyncpg, psycopg 3 or aiosqlite)")
    if _module(conn).startswith("aiosqlite"):
        raise UnsupportedConnection(
            f"cannot enqueue_async through a bare {_name(conn)}: pass it as SQLAlchemy's "
            "AsyncConnection or AsyncSession (sqlite+aiosqlite://...)")
    raise UnsupportedConnection(f"cannot enqueue_async through {_name(conn)}; pass {SUPPORTED}")


# -- reading back, for tests (postlane.testing) --------------------------------------------
DELIVERY_SUMMARY = ("id", "key", "to", "lane", "template", "subject", "state")


def deliveries_after(conn: Any, after_id: int) -> list[tuple[Any, ...]]:
    """The deliveries with an id above ``after_id`` as ``conn``'s transaction sees them
    (its own uncommitted ones too), oldest first, as ``DELIVERY_SUMMARY`` tuples. ``conn``
    is any connection ``sync_writer`` takes."""
    cur = raw_sync_connection(conn).cursor()
    try:
        cur.execute("SELECT id, idempotency_key, recipient, lane, template_id, subject, state "
                    f"FROM postlane_delivery_rows WHERE id > {int(after_id):d} ORDER BY id")
        return [tuple(row) for row in cur.fetchall()]
    finally:
        cur.close()


def last_delivery_id(conn: Any) -> int:
    cur = raw_sync_connection(conn).cursor()
    try:
        cur.execute("SELECT COALESCE(MAX(id), 0) FROM postlane_deliveries")
        return int(cur.fetchone()[0])
    finally:
        cur.close()


@contextmanager
def own_connection(url: str) -> Iterator[Any]:
    """A sync connection of its own to the database at ``url`` (``sqlite:///path`` or
    ``postgresql://``), autocommitting, for the readers above: it sees committed rows."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            yield conn
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        yield pg
