"""Shared fixtures: a PostgreSQL test database, a SQLite file, and a migrated ``store`` on both.

PostgreSQL is not optional: if it cannot be reached the tests that need it *fail* (never
skip), with the URL tried and how to start it. Point ``POSTLANE_TEST_PG_ADMIN_URL`` at a
maintenance database to use a server other than ``postgresql://postgres@127.0.0.1:5432``.

The stores have no clock seam (the database's clock is the truth; the worker's own timing
runs on an injectable ``worker.clock.Clock``). Tests move stored time forward by writing
the time columns directly through a side connection (``side`` fixture / ``SideDB``): a
lease is made to have expired by setting ``lease_expires_at`` into the past, a delayed row
is made due by setting ``run_at`` into the past, and so on.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from postlane import Message
from postlane.store import Store, open_store

# -- the timing and failure rules run on every supported Python ---------------------------
EVERY_PYTHON = (
    "unit/test_attempt.py",
    "unit/test_worker_timing.py",
    "unit/test_held_slots.py",
    "integration/test_worker_phases.py",
    "integration/test_worker_shutdown.py",
    "integration/test_worker_failures.py",
    "integration/test_worker_caretaker.py",
    "integration/test_provider_smtp.py",
    "integration/test_provider_http.py",
)
"""Where asyncio's cancellation (which differs between 3.11, 3.12 and 3.13) decides the
outcome: deadlines, stops, misbehaving servers. ``scripts/check`` runs them again on each
other Python it finds (``-m every_python``)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.as_posix()
        if any(path.endswith("tests/" + name) for name in EVERY_PYTHON):
            item.add_marker(pytest.mark.every_python)

PG_ADMIN_URL = os.environ.get(
    "POSTLANE_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TIME_COLUMNS = frozenset({
    "run_at", "expires_at", "lease_expires_at", "attempt_started_at", "created_at",
    "updated_at", "sent_at", "finished_at",
})


# -- PostgreSQL --------------------------------------------------------------------------
def pg_admin() -> psycopg.Connection[Any]:
    """An autocommit connection to the maintenance database; fails the test if unreachable."""
    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is required by these tests and is not reachable at {PG_ADMIN_URL} "
            f"({exc}). Start it (the dev machines run it on 127.0.0.1:5432, `.ci/run` starts "
            "it) or set POSTLANE_TEST_PG_ADMIN_URL.",
            pytrace=False,
        )


def pg_database_url(name: str) -> str:
    parts = urlsplit(PG_ADMIN_URL)
    return urlunsplit(parts._replace(path=f"/{name}"))


def create_pg_database(name: str) -> str:
    """Create (or re-create) an empty database and return its URL."""
    with pg_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return pg_database_url(name)


def drop_pg_database(name: str) -> None:
    with pg_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh database ``postlane_test_<pid>`` for this session, dropped at the end."""
    name = f"postlane_test_{os.getpid()}"
    url = create_pg_database(name)
    try:
        yield url
    finally:
        drop_pg_database(name)


_fresh_counter = itertools.count(1)


@pytest.fixture
def fresh_pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """An empty database of its own, for tests that need a schema-less start."""
    pg_url = request.getfixturevalue("pg_url")  # fails early and clearly if PG is down
    name = f"{urlsplit(pg_url).path.lstrip('/')}_{next(_fresh_counter)}"
    url = create_pg_database(name)
    try:
        yield url
    finally:
        drop_pg_database(name)


def truncate_pg(url: str) -> None:
    """Empty every Postlane table but the migration record (new tables join automatically)
    and restart their identities.

    The effect of ``TRUNCATE ... RESTART IDENTITY CASCADE`` over all of them, at a fraction
    of the cost: TRUNCATE takes ~150 ms per call here, DELETE of a test's few rows ~2 ms.
    Foreign keys are not checked while emptying (``session_replication_role``), so the
    order does not matter.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename LIKE 'postlane\\_%' AND tablename <> 'postlane_migrations'"
        )]
        identities = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name LIKE 'postlane\\_%' "
            "AND is_identity = 'YES'"
        ).fetchall()
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            for table in tables:
                conn.execute(f'DELETE FROM "{table}"')
            for table, column in identities:
                conn.execute("SELECT setval(pg_get_serial_sequence(%s, %s), 1, false)",
                             (table, column))


# -- SQLite ------------------------------------------------------------------------------
@pytest.fixture
def sqlite_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'postlane.db'}"


def sqlite_path(url: str) -> str:
    return url[len("sqlite:///"):]


# -- the store on both engines -----------------------------------------------------------
def store_url(store: Store) -> str:
    if store.engine == "postgres":
        return store.url  # type: ignore[attr-defined,no-any-return]
    return f"sqlite:///{store.path}"  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """An opened, migrated store; on PostgreSQL every test starts from empty tables."""
    if request.param == "sqlite":
        url = request.getfixturevalue("sqlite_url")
    else:
        url = request.getfixturevalue("pg_url")
    async with open_store(url) as s:
        await s.migrate()
        if s.engine == "postgres":
            truncate_pg(url)
        yield s


class SideDB:
    """A connection of the test's own, next to the store's: reads and time travel."""

    def __init__(self, url: str) -> None:
        self.engine = "sqlite" if url.startswith("sqlite:") else "postgres"
        self.url = url
        if self.engine == "sqlite":
            self._sq = sqlite3.connect(sqlite_path(url), isolation_level=None, timeout=60)
            self._sq.execute("PRAGMA busy_timeout=60000")
        else:
            self._pg = psycopg.connect(url, autocommit=True)

    def close(self) -> None:
        if self.engine == "sqlite":
            self._sq.close()
        else:
            self._pg.close()

    def __enter__(self) -> SideDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql`` with ``?`` placeholders on either engine."""
        if self.engine == "sqlite":
            return self._sq.execute(sql, params).fetchall()
        cur = self._pg.execute(sql.replace("?", "%s"), params)
        return cur.fetchall() if cur.description else []

    def scalar(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        rows = self.query(sql, params)
        return rows[0][0] if rows else None

    def shift(self, delivery_id: int, column: str, seconds: float) -> None:
        """Set ``column`` of one delivery to database-now plus ``seconds`` (negative: past)."""
        assert column in TIME_COLUMNS
        if self.engine == "sqlite":
            self.query(
                f"UPDATE postlane_deliveries SET {column} = "
                f"(julianday('now') - 2440587.5) * 86400.0 + ? WHERE id = ?",
                (seconds, delivery_id),
            )
        else:
            self.query(
                f"UPDATE postlane_deliveries SET {column} = "
                f"now() + make_interval(secs => ?::float8) WHERE id = ?",
                (seconds, delivery_id),
            )

    def expire_lease(self, delivery_id: int, by: float = 60.0) -> None:
        self.shift(delivery_id, "lease_expires_at", -by)

    def make_due(self, delivery_id: int) -> None:
        self.shift(delivery_id, "run_at", -1.0)

    def count(self, table: str, where: str = "TRUE", params: tuple[Any, ...] = ()) -> int:
        where = where if self.engine == "postgres" else where.replace("TRUE", "1")
        return int(self.scalar(f"SELECT count(*) FROM {table} WHERE {where}", params))

    def now(self) -> datetime:
        if self.engine == "sqlite":
            value = self.scalar("SELECT (julianday('now') - 2440587.5) * 86400.0")
            return datetime.fromtimestamp(value, UTC)
        return self.scalar("SELECT now()")  # type: ignore[no-any-return]


@pytest.fixture
def side(store: Store) -> Iterator[SideDB]:
    with SideDB(store_url(store)) as db:
        yield db


# -- messages ----------------------------------------------------------------------------
def msg(key: str, **overrides: Any) -> Message:
    """A valid email message; override any field."""
    fields: dict[str, Any] = {
        "key": key, "to": "alice@example.com", "subject": "Reset your password",
        "text": "Follow the link.",
    }
    fields.update(overrides)
    return Message(**fields)
