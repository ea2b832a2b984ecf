"""An application that enqueues before anyone ran ``postlane migrate`` is told to run it
(not handed a driver's "no such table"), on both engines and through every entry; and the
database URLs applications already have for SQLAlchemy open a store as they are."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from conftest import msg
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import postlane
from postlane import MigrationRequired, open_store
from postlane.store import database_url, plain_url

NOT_MIGRATED = r"no Postlane tables; run `postlane --db URL migrate`"


def test_sqlite3_enqueue_on_an_unmigrated_database(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "app.db")
    with pytest.raises(MigrationRequired, match=NOT_MIGRATED):
        postlane.enqueue(conn, msg("k1"))
    with pytest.raises(MigrationRequired, match=NOT_MIGRATED):
        postlane.enqueue_many(conn, [msg("k1"), msg("k2")])
    conn.close()


def test_psycopg_enqueue_on_an_unmigrated_database(fresh_pg_url: str) -> None:
    with psycopg.connect(fresh_pg_url) as conn:
        with pytest.raises(MigrationRequired, match=NOT_MIGRATED):
            postlane.enqueue(conn, msg("k1"))
        conn.rollback()
        with pytest.raises(MigrationRequired, match=NOT_MIGRATED):
            postlane.enqueue_many(conn, [msg("k1"), msg("k2")])


async def test_psycopg_async_enqueue_on_an_unmigrated_database(fresh_pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_pg_url) as conn:
        with pytest.raises(MigrationRequired, match=NOT_MIGRATED):
            await postlane.enqueue_async(conn, msg("k1"))
        await conn.rollback()
        with pytest.raises(MigrationRequired, match=NOT_MIGRATED):
            await postlane.enqueue_many_async(conn, [msg("k1"), msg("k2")])


async def test_aiosqlite_enqueue_on_an_unmigrated_database(tmp_path: Path) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'app.db'}")
    async with AsyncSession(engine) as session:
        with pytest.raises(MigrationRequired, match=NOT_MIGRATED):
            await postlane.enqueue_async(session, msg("k1"))
        with pytest.raises(MigrationRequired, match=NOT_MIGRATED):
            await postlane.enqueue_many_async(session, [msg("k1"), msg("k2")])
    await engine.dispose()


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_store_enqueue_on_an_unmigrated_database(
        engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = (f"sqlite:///{tmp_path / 'app.db'}" if engine == "sqlite"
           else request.getfixturevalue("fresh_pg_url"))
    async with open_store(url) as store:
        with pytest.raises(MigrationRequired, match=NOT_MIGRATED):
            await store.enqueue(msg("k1"))
        with pytest.raises(MigrationRequired, match=NOT_MIGRATED):
            await store.enqueue_many([msg("k1"), msg("k2")])


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "postgresql+psycopg2", "postgres"])
async def test_sqlalchemy_style_postgres_urls_open_the_store(driver: str,
                                                             fresh_pg_url: str) -> None:
    url = fresh_pg_url.replace("postgresql://", f"{driver}://", 1)
    async with open_store(url) as store:
        await store.migrate()
        assert (await store.enqueue(msg("k1"))).created


async def test_sqlalchemy_style_sqlite_url_opens_the_store(tmp_path: Path) -> None:
    async with open_store(f"sqlite+pysqlite:///{tmp_path / 'app.db'}") as store:
        await store.migrate()
        assert (await store.enqueue(msg("k1"))).created
    assert (tmp_path / "app.db").exists()


@pytest.mark.parametrize(("given", "plain"), [
    ("postgresql+psycopg://u:p@h:5432/db", "postgresql://u:p@h:5432/db"),
    ("postgresql+psycopg2://h/db", "postgresql://h/db"),
    ("postgresql+asyncpg://h/db", "postgresql://h/db"),
    ("postgres://h/db", "postgresql://h/db"),
    ("POSTGRESQL://h/db", "postgresql://h/db"),
    ("sqlite+pysqlite:///app.db", "sqlite:///app.db"),
    ("sqlite:////abs/app.db", "sqlite:////abs/app.db"),
    ("mysql+pymysql://h/db", "mysql+pymysql://h/db"),  # refused later, by open_store
    ("not a url", "not a url"),
])
def test_plain_url(given: str, plain: str) -> None:
    assert plain_url(given) == plain
    assert database_url(given) == plain  # what --db and POSTLANE_DATABASE_URL go through
