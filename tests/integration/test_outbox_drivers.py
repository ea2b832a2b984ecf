"""The outbox's guarantees on every other driver and wrapper users hold: psycopg2, asyncpg,
SQLAlchemy's async forms (over asyncpg, over psycopg 3 and over aiosqlite), and Flask-SQLAlchemy's
``scoped_session``. Each runs the same conformance set as the psycopg 3 tests of
test_outbox.py: a rollback leaves nothing, a commit leaves the delivery and its event, the
same key returns the existing delivery with ``created=False``, nothing commits on its own
(the enqueue may be the transaction's first statement), a batch reports its repeats and the
keys that existed, and a second transaction enqueueing the same key waits for the first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiosqlite
import asyncpg
import psycopg
import psycopg2
import pytest
from conftest import msg, store_url
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import scoped_session, sessionmaker
from test_outbox import (
    _wait_until_blocked,
    accounts,
    assert_committed,
    assert_nothing,
    pg_store,
    sqlite_store,
)

import postlane
from postlane import EnqueueResult, KeyConflict, Message, UnsupportedConnection
from postlane.store import Store
from postlane.templates import (
    enqueue_template_in_transaction,
    enqueue_template_in_transaction_async,
)

assert pg_store and sqlite_store  # the fixtures, imported for this module's tests

INSERT_ACCOUNT = "INSERT INTO accounts VALUES (1, 'alice@example.com')"


class Tx:
    """One transaction through one driver, driven the same way whatever the driver."""

    database = "postgres"  # which store the driver writes to

    def __init__(self, url: str) -> None:
        self.url = url

    async def open(self) -> None:
        raise NotImplementedError

    async def execute(self, sql: str) -> None:
        raise NotImplementedError

    async def enqueue(self, message: Message) -> EnqueueResult:
        raise NotImplementedError

    async def enqueue_many(self, messages: list[Message]) -> list[EnqueueResult]:
        raise NotImplementedError

    async def end(self, commit: bool) -> None:
        raise NotImplementedError

    def backend_pid(self) -> int:
        raise NotImplementedError


class Psycopg2Tx(Tx):
    async def open(self) -> None:
        self.conn = psycopg2.connect(self.url)

    async def execute(self, sql: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql)

    async def enqueue(self, message: Message) -> EnqueueResult:
        return await asyncio.to_thread(postlane.enqueue, self.conn, message)

    async def enqueue_many(self, messages: list[Message]) -> list[EnqueueResult]:
        return await asyncio.to_thread(postlane.enqueue_many, self.conn, messages)

    async def end(self, commit: bool) -> None:
        (self.conn.commit if commit else self.conn.rollback)()
        self.conn.close()

    def backend_pid(self) -> int:
        return int(self.conn.get_backend_pid())


class AsyncpgTx(Tx):
    async def open(self) -> None:
        self.conn = await asyncpg.connect(self.url)
        self.tx = self.conn.transaction()
        await self.tx.start()

    async def execute(self, sql: str) -> None:
        await self.conn.execute(sql)

    async def enqueue(self, message: Message) -> EnqueueResult:
        return await postlane.enqueue_async(self.conn, message)

    async def enqueue_many(self, messages: list[Message]) -> list[EnqueueResult]:
        return await postlane.enqueue_many_async(self.conn, messages)

    async def end(self, commit: bool) -> None:
        await (self.tx.commit() if commit else self.tx.rollback())
        await self.conn.close()

    def backend_pid(self) -> int:
        return int(self.conn.get_server_pid())


class AsyncSessionTx(Tx):
    """SQLAlchemy's AsyncSession (what a FastAPI dependency yields), over ``driver``."""

    driver = "asyncpg"

    async def open(self) -> None:
        self.engine = create_async_engine(
            self.url.replace("postgresql://", f"postgresql+{self.driver}://", 1)
            .replace("sqlite://", f"sqlite+{self.driver}://", 1))
        self.session = AsyncSession(self.engine)

    async def execute(self, sql: str) -> None:
        await self.session.execute(text(sql))

    async def enqueue(self, message: Message) -> EnqueueResult:
        return await postlane.enqueue_async(self.session, message)

    async def enqueue_many(self, messages: list[Message]) -> list[EnqueueResult]:
        return await postlane.enqueue_many_async(self.session, messages)

    async def end(self, commit: bool) -> None:
        await (self.session.commit() if commit else self.session.rollback())
        await self.session.close()
        await self.engine.dispose()

    def backend_pid(self) -> int:
        raise NotImplementedError


class AsyncSessionPsycopgTx(AsyncSessionTx):
    driver = "psycopg"


class AsyncConnectionTx(AsyncSessionTx):
    """SQLAlchemy's AsyncConnection over asyncpg, as ``engine.connect()`` gives it."""

    async def open(self) -> None:
        await super().open()
        self.connection = await self.engine.connect()

    async def execute(self, sql: str) -> None:
        await self.connection.execute(text(sql))

    async def enqueue(self, message: Message) -> EnqueueResult:
        return await postlane.enqueue_async(self.connection, message)

    async def enqueue_many(self, messages: list[Message]) -> list[EnqueueResult]:
        return await postlane.enqueue_many_async(self.connection, messages)

    async def end(self, commit: bool) -> None:
        await (self.connection.commit() if commit else self.connection.rollback())
        await self.connection.close()
        await self.session.close()
        await self.engine.dispose()


class AsyncSessionAiosqliteTx(AsyncSessionTx):
    database = "sqlite"
    driver = "aiosqlite"


class AsyncConnectionAiosqliteTx(AsyncConnectionTx):
    database = "sqlite"
    driver = "aiosqlite"


class ScopedSessionTx(Tx):
    """A ``scoped_session`` over psycopg2, which Flask-SQLAlchemy's ``db.session`` is."""

    async def open(self) -> None:
        self.engine = create_engine(self.url.replace("postgresql://", "postgresql+psycopg2://"))
        self.session = scoped_session(sessionmaker(self.engine))

    async def execute(self, sql: str) -> None:
        self.session.execute(text(sql))

    async def enqueue(self, message: Message) -> EnqueueResult:
        return postlane.enqueue(self.session, message)

    async def enqueue_many(self, messages: list[Message]) -> list[EnqueueResult]:
        return postlane.enqueue_many(self.session, messages)

    async def end(self, commit: bool) -> None:
        (self.session.commit if commit else self.session.rollback)()
        self.session.remove()
        self.engine.dispose()

    def backend_pid(self) -> int:
        raise NotImplementedError


DRIVERS: dict[str, type[Tx]] = {
    "psycopg2": Psycopg2Tx,
    "asyncpg": AsyncpgTx,
    "sqlalchemy-async-asyncpg": AsyncSessionTx,
    "sqlalchemy-async-psycopg": AsyncSessionPsycopgTx,
    "sqlalchemy-asyncconnection-asyncpg": AsyncConnectionTx,
    "scoped-session-psycopg2": ScopedSessionTx,
    "sqlalchemy-async-aiosqlite": AsyncSessionAiosqliteTx,
    "sqlalchemy-asyncconnection-aiosqlite": AsyncConnectionAiosqliteTx,
}


@pytest.fixture(params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db(request: pytest.FixtureRequest, driver: str) -> Store:
    """The migrated store on the engine the driver under test writes to."""
    name = "sqlite_store" if DRIVERS[driver].database == "sqlite" else "pg_store"
    store: Store = request.getfixturevalue(name)
    return store


@pytest.fixture
def tx(driver: str, db: Store) -> Callable[[], Any]:
    """Opens a new transaction through the driver under test."""
    kind = DRIVERS[driver]

    async def open_tx() -> Tx:
        t = kind(store_url(db))
        await t.open()
        return t
    return open_tx


async def test_rollback_leaves_nothing_commit_leaves_one(db: Store,
                                                         tx: Callable[[], Any]) -> None:
    t = await tx()
    await t.execute(INSERT_ACCOUNT)
    r = await t.enqueue(msg("welcome:1"))
    assert r.created
    await t.end(commit=False)
    await assert_nothing(db, "welcome:1")

    t = await tx()
    # The enqueue first: it must join the transaction, not commit on its own.
    r = await t.enqueue(msg("welcome:1"))
    again = await t.enqueue(msg("welcome:1", metadata={"retry": 1}))  # content the same
    assert (again.id, again.created) == (r.id, False)
    await t.execute(INSERT_ACCOUNT)
    assert await db.get("welcome:1") is None  # invisible before the commit
    await t.end(commit=True)
    await assert_committed(db, r, [1])
    d = await db.get("welcome:1")
    assert d is not None and d.subject == "Reset your password"


async def test_enqueue_first_then_rollback_leaves_nothing(db: Store,
                                                          tx: Callable[[], Any]) -> None:
    t = await tx()
    await t.enqueue(msg("first:1"))
    await t.enqueue_many([msg("first:2")])
    await t.execute(INSERT_ACCOUNT)
    await t.end(commit=False)
    await assert_nothing(db, "first:1")
    assert await db.get("first:2") is None


async def test_enqueue_many(db: Store, tx: Callable[[], Any]) -> None:
    existing = await db.enqueue(msg("x:0"))
    x2 = msg("x:2", lane="bulk", headers={"X-Campaign": "7"}, metadata={"user": 2})
    batch = [msg("x:1"), x2, msg("x:1"), msg("x:0"), msg("x:3")]
    t = await tx()
    await t.execute(INSERT_ACCOUNT)
    await t.enqueue_many(batch)
    await t.end(commit=False)
    assert await db.get("x:1") is None
    assert await accounts(db) == []

    t = await tx()
    await t.execute(INSERT_ACCOUNT)
    results = await t.enqueue_many(batch)
    more = await t.enqueue_many([msg("x:4"), x2])
    assert await t.enqueue_many([]) == []
    await t.end(commit=True)
    assert [(r.key, r.created) for r in results] == [
        ("x:1", True), ("x:2", True), ("x:1", False), ("x:0", False), ("x:3", True)]
    assert results[2].id == results[0].id and results[3].id == existing.id
    assert results[0].id < results[1].id < results[4].id  # ids in input order
    assert [(r.key, r.created) for r in more] == [("x:4", True), ("x:2", False)]
    assert more[1].id == results[1].id
    assert (await db.stats()).states["pending"] == 5
    d = await db.get("x:2")
    assert d is not None
    assert (d.lane, d.headers, d.metadata) == ("bulk", {"X-Campaign": "7"}, {"user": 2})
    for r in (*results, *more):
        assert [e.kind for e in await db.timeline(r.id)] == ["enqueued"]
    assert await accounts(db) == [1]


@pytest.mark.parametrize("driver", ["psycopg2", "asyncpg"])
@pytest.mark.parametrize("first_outcome", ["commit", "rollback"])
async def test_same_key_in_two_transactions(pg_store: Store, driver: str,
                                            first_outcome: str) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    first, second = DRIVERS[driver](url), DRIVERS[driver](url)
    await first.open()
    await second.open()
    r1 = await first.enqueue(msg("reset:race", metadata={"by": "first"}))
    waiting = asyncio.create_task(second.enqueue(msg("reset:race", metadata={"by": "second"})))
    await asyncio.to_thread(_wait_until_blocked, url, second.backend_pid())
    assert not waiting.done()  # held up by the first transaction's uncommitted key
    await first.end(commit=first_outcome == "commit")
    r2 = await asyncio.wait_for(waiting, 10)
    await second.end(commit=True)
    d = await pg_store.get("reset:race")
    assert d is not None
    if first_outcome == "commit":
        assert (r2.id, r2.created, d.metadata) == (r1.id, False, {"by": "first"})
    else:
        assert r2.created and (d.id, d.metadata) == (r2.id, {"by": "second"})
    assert (await pg_store.stats()).states["pending"] == 1


async def test_a_key_an_api_client_wrote_is_a_conflict_on_every_driver(
        db: Store, tx: Callable[[], Any]) -> None:
    """A key belongs to its producer: no driver answers the application with a delivery an
    HTTP API client wrote, nor with one of its own for other content."""
    await db.enqueue_request(msg("reset:4242", to="mallory@example.net"), "hash",
                                   "apikey:1")
    mine = await db.enqueue(msg("welcome:1"))
    for attempt in (lambda t: t.enqueue(msg("reset:4242")),
                    lambda t: t.enqueue_many([msg("other:1"), msg("reset:4242")]),
                    lambda t: t.enqueue(msg("welcome:1", subject="other")),
                    lambda t: t.enqueue_many([msg("welcome:1", to="eve@example.com")])):
        t = await tx()
        with pytest.raises(KeyConflict):
            await attempt(t)
        await t.end(commit=False)
    t = await tx()
    assert (await t.enqueue(msg("welcome:1"))).id == mine.id  # a retry of its own
    await t.end(commit=True)
    assert await db.get("other:1") is None
    planted = await db.get("reset:4242")
    assert planted is not None and planted.recipient == "mallory@example.net"


async def test_templates_through_psycopg2_and_asyncpg(pg_store: Store) -> None:
    await pg_store.add_template_version("welcome", "Hi {{ name }}", "Hello {{ name }}", None)
    url = pg_store.url  # type: ignore[attr-defined]
    with psycopg2.connect(url) as conn:
        r = enqueue_template_in_transaction(conn, "welcome", {"name": "Ada"}, key="t:1",
                                            to="ada@example.com")
    a = await asyncpg.connect(url)
    try:
        async with a.transaction():
            r2 = await enqueue_template_in_transaction_async(
                a, "welcome", {"name": "Bo"}, key="t:2", to="bo@example.com")
    finally:
        await a.close()
    for result, name in ((r, "Ada"), (r2, "Bo")):
        d = await pg_store.get(result.key)
        assert d is not None
        assert (d.subject, d.text, d.template_id, d.template_version) == (
            f"Hi {name}", f"Hello {name}", "welcome", 1)


async def test_templates_and_a_bare_connection_on_aiosqlite(sqlite_store: Store) -> None:
    """The template form reads the version through the caller's AsyncSession; a bare
    aiosqlite connection (no SQLAlchemy) is refused by name, nothing written."""
    await sqlite_store.add_template_version("welcome", "Hi {{ name }}", "Hello {{ name }}",
                                            None)
    url = store_url(sqlite_store).replace("sqlite://", "sqlite+aiosqlite://", 1)
    engine = create_async_engine(url)
    async with AsyncSession(engine) as session:
        r = await enqueue_template_in_transaction_async(
            session, "welcome", {"name": "Bo"}, key="t:1", to="bo@example.com")
        await session.commit()
    await engine.dispose()
    d = await sqlite_store.get(r.key)
    assert d is not None and r.created
    assert (d.subject, d.text, d.template_id, d.template_version) == (
        "Hi Bo", "Hello Bo", "welcome", 1)
    async with aiosqlite.connect(sqlite_store.path) as bare:  # type: ignore[attr-defined]
        with pytest.raises(UnsupportedConnection, match=r"bare aiosqlite.*AsyncSession"):
            await postlane.enqueue_async(bare, msg("k"))
        with pytest.raises(UnsupportedConnection, match="bare aiosqlite"):
            await postlane.enqueue_many_async(bare, [msg("k")])
    assert await sqlite_store.get("k") is None


# -- the wrong pairing ---------------------------------------------------------------------
@pytest.fixture
async def async_things(pg_store: Store) -> AsyncIterator[list[Any]]:
    url = pg_store.url  # type: ignore[attr-defined]
    engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://", 1))
    apg = await asyncpg.connect(url)
    pga = await psycopg.AsyncConnection.connect(url)
    session = async_sessionmaker(engine)()
    yield [apg, pga, session]
    await session.close()
    await engine.dispose()
    await apg.close()
    await pga.close()


async def test_async_connections_refused_by_sync_enqueue(pg_store: Store,
                                                         async_things: list[Any]) -> None:
    for conn in async_things:
        with pytest.raises(UnsupportedConnection, match="is async: use `await postlane"):
            postlane.enqueue(conn, msg("k"))
        with pytest.raises(UnsupportedConnection, match="is async"):
            postlane.enqueue_many(conn, [msg("k")])
    assert await pg_store.get("k") is None


async def test_sync_connections_refused_by_enqueue_async(pg_store: Store) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    session = scoped_session(sessionmaker(engine))
    with psycopg2.connect(url) as p2:
        for conn in (p2, session):
            with pytest.raises(UnsupportedConnection, match=r"is sync: use `postlane\.enqueue"):
                await postlane.enqueue_async(conn, msg("k"))
            with pytest.raises(UnsupportedConnection, match="is sync"):
                await postlane.enqueue_many_async(conn, [msg("k")])
    session.remove()
    engine.dispose()
    assert await pg_store.get("k") is None
    with pytest.raises(UnsupportedConnection, match="cannot enqueue_async through"):
        await postlane.enqueue_async(object(), msg("k"))


async def test_times_are_the_databases_and_fields_round_trip(db: Store,
                                                              tx: Callable[[], Any]) -> None:
    """Delay and validity windows count from the transaction's ``now()`` (as on psycopg 3),
    an absolute expiry is kept as given, on the single and the bulk form."""
    until = datetime(2099, 1, 2, 3, 4, 5, tzinfo=UTC)
    windowed = {"delay": timedelta(seconds=60), "expires_in": timedelta(hours=1),
                "sender": "shop@example.com", "html": "<p>Hi</p>", "metadata": {"a": [1]}}
    t = await tx()
    await t.enqueue(msg("one:window", **windowed))
    await t.enqueue(msg("one:until", expires_at=until))
    await t.enqueue_many([msg("many:window", **windowed), msg("many:until", expires_at=until)])
    await t.end(commit=True)
    for form in ("one", "many"):
        d = await db.get(f"{form}:window")
        assert d is not None
        assert d.run_at - d.created_at == timedelta(seconds=60)
        assert d.expires_at is not None
        assert d.expires_at - d.created_at == timedelta(hours=1)
        assert (d.sender, d.html, d.metadata) == ("shop@example.com", "<p>Hi</p>", {"a": [1]})
        d = await db.get(f"{form}:until")
        assert d is not None and d.expires_at == until and d.run_at == d.created_at


@pytest.mark.parametrize("driver", ["psycopg2", "asyncpg"])
async def test_bulk_enqueues_sharing_keys_in_opposite_orders_never_deadlock(
    pg_store: Store, driver: str
) -> None:
    """As on psycopg 3 (test_outbox.py): the batch writes its rows in key order, so two
    transactions enqueueing the same keys in opposite orders wait, never deadlock."""
    url = pg_store.url  # type: ignore[attr-defined]
    keys = [f"overlap:{i:03d}" for i in range(300)]
    for round_ in range(3):
        batches = [[msg(f"{k}:{round_}") for k in keys],
                   [msg(f"{k}:{round_}") for k in reversed(keys)]]
        txs = [DRIVERS[driver](url) for _ in batches]
        for t in txs:
            await t.open()
            await t.execute("SELECT 1")

        async def run(t: Tx, batch: list[Message]) -> list[EnqueueResult]:
            results = await t.enqueue_many(batch)
            await t.end(commit=True)
            return results

        results = await asyncio.gather(*(run(t, b) for t, b in zip(txs, batches, strict=True)))
        first, second = ({r.key: r for r in rs} for rs in results)
        assert {k: r.id for k, r in first.items()} == {k: r.id for k, r in second.items()}
        assert all(first[k].created != second[k].created for k in first)
    assert (await pg_store.stats()).states["pending"] == 900
