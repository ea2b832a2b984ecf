"""Errors stop at the seam: what a store operation raises when the database fails is a
Postlane error (``StoreUnavailable``, ``StoreConflict``, ``StoreError``) with the driver's
exception as its cause, and the API answers it as before (503 for an outage).

Outages are real: PostgreSQL backends terminated by an administrator, a port nothing
listens on, a SQLite table dropped behind the store's back.
"""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import httpx
import psycopg
import pytest
from conftest import PG_ADMIN_URL, msg, pg_admin, sqlite_path, store_url

from postlane.api import create_app
from postlane.api.keys import create_key
from postlane.errors import StoreConflict, StoreError, StoreUnavailable
from postlane.store import Store, open_store
from postlane.store.base import Store as StoreBase
from postlane.store.postgres import PostgresStore
from postlane.store.postgres._base import postgres_errors
from postlane.store.sqlite import SQLiteStore
from postlane.store.sqlite._base import sqlite_errors


def _break(store: Store) -> type[Exception]:
    """Make the store's next operation fail in its driver; the driver's error class."""
    if store.engine == "postgres":
        # An administrator (or a failover) ends every connection the store's pool holds.
        with pg_admin() as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s", (store_url(store).rsplit("/", 1)[1],))
        return psycopg.OperationalError
    # Another program removes a table under the store's open connection.
    side = sqlite3.connect(sqlite_path(store_url(store)), timeout=60)
    try:
        side.execute("DROP TABLE postlane_events")
    finally:
        side.close()
    return sqlite3.OperationalError


async def test_a_database_that_fails_an_operation_is_store_unavailable(store: Store) -> None:
    delivery = await store.enqueue(msg("k1"))
    driver_error = _break(store)
    with pytest.raises(StoreUnavailable) as raised:
        await store.timeline(delivery.id)
    assert isinstance(raised.value.__cause__, driver_error)
    assert str(raised.value).startswith("PostgreSQL: " if store.engine == "postgres"
                                        else "SQLite: ")


async def test_an_unreachable_postgres_is_store_unavailable_at_open() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = open_store(f"postgresql://postgres@127.0.0.1:{port}/postlane?connect_timeout=2")
    with pytest.raises(StoreUnavailable, match="cannot connect to PostgreSQL") as raised:
        await store.open()
    assert isinstance(raised.value.__cause__, psycopg.Error)
    await store.close()


async def test_an_unreadable_sqlite_file_is_store_unavailable_at_open(tmp_path: Path) -> None:
    path = f"{tmp_path}/not-a-database.db"
    with open(path, "wb") as f:
        f.write(b"this is not a SQLite database, it is a text file " * 100)
    store = open_store(f"sqlite:///{path}")
    with pytest.raises(StoreUnavailable, match="cannot open SQLite database") as raised:
        await store.open()
    assert isinstance(raised.value.__cause__, sqlite3.DatabaseError)
    await store.close()


def test_each_engine_maps_its_driver_errors(pg_url: str) -> None:
    """The two maps on real driver exceptions: unique violation, connection trouble,
    anything else; the driver's exception stays the cause."""
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute("CREATE TEMP TABLE t (k text PRIMARY KEY)")
        pg.execute("INSERT INTO t VALUES ('a')")
        with pytest.raises(StoreConflict) as conflict, postgres_errors():
            pg.execute("INSERT INTO t VALUES ('a')")
        assert isinstance(conflict.value.__cause__, psycopg.errors.UniqueViolation)
        assert "Key (k)" not in str(conflict.value), "DETAIL (the row's values) is left out"
        with pytest.raises(StoreError) as other, postgres_errors():
            pg.execute("SELECT 1/0")
        assert type(other.value) is StoreError
        assert isinstance(other.value.__cause__, psycopg.errors.DivisionByZero)
    with pytest.raises(StoreUnavailable), postgres_errors():
        psycopg.connect(PG_ADMIN_URL.rsplit("/", 1)[0] + "/no_such_database_here")

    lite = sqlite3.connect(":memory:")
    lite.execute("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER CHECK (n > 0))")
    lite.execute("INSERT INTO t VALUES ('a', 1)")
    with pytest.raises(StoreConflict) as conflict, sqlite_errors():
        lite.execute("INSERT INTO t VALUES ('a', 1)")
    assert isinstance(conflict.value.__cause__, sqlite3.IntegrityError)
    with pytest.raises(StoreError) as other, sqlite_errors():
        lite.execute("INSERT INTO t VALUES ('b', 0)")  # a CHECK, not a unique key
    assert type(other.value) is StoreError
    with pytest.raises(StoreUnavailable), sqlite_errors():
        lite.execute("SELECT * FROM no_such_table")
    lite.close()


@pytest.mark.parametrize("engine", [PostgresStore, SQLiteStore])
def test_every_operation_of_each_engine_is_translated(engine: type[StoreBase]) -> None:
    for name in StoreBase.__abstractmethods__:
        assert hasattr(getattr(engine, name), "__wrapped__"), f"{engine.__name__}.{name}"


async def test_the_api_answers_an_outage_with_503(sqlite_url: str) -> None:
    """On SQLite, where the outage (a table gone) lasts: on PostgreSQL the pool replaces a
    terminated connection, so the route answers from a fresh one, and a database that
    refuses connections answers only after the pool's timeout (the engine-level test above
    covers PostgreSQL's translation)."""
    async with open_store(sqlite_url) as store:
        await store.migrate()
        _, token = await create_key(store, "read", name="reader")
        delivery = await store.enqueue(msg("k2"))
        app = create_app(sqlite_url, sample_interval_s=0)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                headers = {"Authorization": f"Bearer {token}"}
                ok = await client.get(f"/v1/messages/{delivery.id}", headers=headers)
                assert ok.status_code == 200, ok.text
                _break(store)
                down = await client.get(f"/v1/messages/{delivery.id}", headers=headers)
    assert down.status_code == 503, down.text
    assert down.headers["content-type"] == "application/problem+json"
    problem = down.json()
    assert problem["type"].endswith(":store-unavailable")
    assert problem["title"] == "Database unavailable"
    assert problem["detail"] == "the database did not answer: OperationalError"




async def test_the_api_answers_an_unexpected_database_error_with_500(fresh_pg_url: str) -> None:
    """A refusal no operation expects (a table gone on PostgreSQL: ``UndefinedTable``) is a
    ``StoreError`` now, but the API answers it as before: 500, not "try again later"."""
    async with open_store(fresh_pg_url) as store:
        await store.migrate()
        _, token = await create_key(store, "read", name="reader")
        delivery = await store.enqueue(msg("k3"))
        with pytest.raises(StoreError) as raised:
            with psycopg.connect(fresh_pg_url, autocommit=True) as side:
                side.execute("DROP TABLE postlane_events CASCADE")
            await store.timeline(delivery.id)
        assert type(raised.value) is StoreError
        assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedTable)
    app = create_app(fresh_pg_url, sample_interval_s=0)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            answer = await client.get(f"/v1/messages/{delivery.id}",
                                      headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 500, answer.text
    assert answer.json()["type"].endswith(":internal")
    assert answer.json()["detail"] == "an unexpected UndefinedTable; see the server log"
