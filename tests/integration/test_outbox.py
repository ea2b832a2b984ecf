"""The transactional outbox: ``postlane.enqueue`` writes inside the *caller's* transaction.

The business write and the send intent commit together or not at all, whatever the caller
holds: a sync or async psycopg connection, a plain sqlite3 connection, or SQLAlchemy's
Connection / Session over either.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
from conftest import msg, sqlite_path, truncate_pg
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

import postlane
from postlane import EnqueueResult, InvalidAddress, State, UnsupportedConnection, open_store
from postlane.store import Store

BUSINESS_PG = "CREATE TABLE IF NOT EXISTS accounts (id BIGINT PRIMARY KEY, email TEXT NOT NULL)"
BUSINESS_SQLITE = "CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, email TEXT)"


# -- fixtures ----------------------------------------------------------------------------
@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[Store]:
    async with open_store(pg_url) as store:
        await store.migrate()
        truncate_pg(pg_url)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS accounts")
            conn.execute(BUSINESS_PG)
        yield store


@pytest.fixture
async def sqlite_store(sqlite_url: str) -> AsyncIterator[Store]:
    async with open_store(sqlite_url) as store:
        await store.migrate()  # the caller's connection writes into a migrated file
        with sqlite3.connect(sqlite_path(sqlite_url)) as conn:
            conn.execute(BUSINESS_SQLITE)
        yield store


@pytest.fixture(params=["sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest) -> Store:
    return request.getfixturevalue(f"{'pg' if request.param == 'postgres' else 'sqlite'}_store")


def sa_engine(store: Store) -> Engine:
    if store.engine == "postgres":
        return create_engine(store.url.replace("postgresql://", "postgresql+psycopg://", 1))  # type: ignore[attr-defined]
    return create_engine(f"sqlite:///{store.path}")  # type: ignore[attr-defined]


@pytest.fixture
def engine_for(request: pytest.FixtureRequest) -> Iterator[Callable[[Store], Engine]]:
    made: list[Engine] = []

    def make(store: Store) -> Engine:
        engine = sa_engine(store)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.dispose()


async def accounts(store: Store) -> list[int]:
    """The business rows, read through a connection of our own."""
    if store.engine == "postgres":
        async with await psycopg.AsyncConnection.connect(store.url) as conn:  # type: ignore[attr-defined]
            cur = await conn.execute("SELECT id FROM accounts ORDER BY id")
            return [r[0] for r in await cur.fetchall()]
    with sqlite3.connect(store.path) as conn:  # type: ignore[attr-defined]
        return [r[0] for r in conn.execute("SELECT id FROM accounts ORDER BY id")]


async def assert_committed(store: Store, result: EnqueueResult, account_ids: list[int]) -> None:
    d = await store.get(result.key)
    assert d is not None
    assert d.id == result.id
    assert d.state == State.PENDING
    assert [e.kind for e in await store.timeline(d.id)] == ["enqueued"]
    assert await accounts(store) == account_ids


async def assert_nothing(store: Store, key: str) -> None:
    assert await store.get(key) is None
    assert await accounts(store) == []
    assert (await store.stats()).states["pending"] == 0


# -- psycopg (sync) ----------------------------------------------------------------------
async def test_psycopg_sync_rollback_then_commit(pg_store: Store) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        r = postlane.enqueue(conn, msg("welcome:1"))
        assert r.created
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.rollback()
    await assert_nothing(pg_store, "welcome:1")

    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        r = postlane.enqueue(conn, msg("welcome:1"))
        again = postlane.enqueue(conn, msg("welcome:1"))
        assert (again.id, again.created) == (r.id, False)
        # Not visible to anyone else before the caller commits.
        assert await pg_store.get("welcome:1") is None
        conn.commit()
    await assert_committed(pg_store, r, [1])


async def test_psycopg_sync_exception_in_block_rolls_back(pg_store: Store) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="boom"), psycopg.connect(url) as conn:
        conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        postlane.enqueue(conn, msg("welcome:1"))
        raise RuntimeError("boom")
    await assert_nothing(pg_store, "welcome:1")


async def test_psycopg_sync_inside_explicit_transaction_block(pg_store: Store) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    with psycopg.connect(url, autocommit=True) as conn:
        with pytest.raises(ValueError, match="abort"), conn.transaction():
            conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
            postlane.enqueue(conn, msg("welcome:1"))
            raise ValueError("abort")
        await assert_nothing(pg_store, "welcome:1")
        with conn.transaction():
            conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
            r = postlane.enqueue(conn, msg("welcome:1"))
    await assert_committed(pg_store, r, [1])


async def test_invalid_message_raises_before_touching_the_connection(pg_store: Store) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    with psycopg.connect(url) as conn:
        with pytest.raises(InvalidAddress):
            postlane.enqueue(conn, msg("k", to="nobody"))
        # The transaction is still usable: nothing failed on the server.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        r = postlane.enqueue(conn, msg("k"))
        conn.commit()
    assert (await pg_store.get("k")) is not None
    assert r.created


# -- psycopg (async) ---------------------------------------------------------------------
async def test_psycopg_async_rollback_then_commit(pg_store: Store) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        r = await postlane.enqueue_async(conn, msg("welcome:1"))
        assert r.created
        await conn.rollback()
    await assert_nothing(pg_store, "welcome:1")

    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        r = await postlane.enqueue_async(conn, msg("welcome:1"))
        again = await postlane.enqueue_async(conn, msg("welcome:1"))
        assert (again.id, again.created) == (r.id, False)
        await conn.commit()
    await assert_committed(pg_store, r, [1])


async def test_psycopg_async_enqueue_many(pg_store: Store) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    existing = await pg_store.enqueue(msg("x:0"))
    batch = [msg("x:1"), msg("x:2"), msg("x:1"), msg("x:0")]
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        await postlane.enqueue_many_async(conn, batch)
        await conn.rollback()
    assert await pg_store.get("x:1") is None
    assert await accounts(pg_store) == []

    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        results = await postlane.enqueue_many_async(conn, batch)
        # A second batch in the same transaction (the staging table must not collide).
        more = await postlane.enqueue_many_async(conn, [msg("x:3"), msg("x:2")])
        await conn.commit()
    assert [(r.key, r.created) for r in results] == [
        ("x:1", True), ("x:2", True), ("x:1", False), ("x:0", False)]
    assert results[2].id == results[0].id
    assert results[3].id == existing.id
    assert [(r.key, r.created) for r in more] == [("x:3", True), ("x:2", False)]
    assert more[1].id == results[1].id
    assert (await pg_store.stats()).states["pending"] == 4
    assert await accounts(pg_store) == [1]


async def test_psycopg_async_enqueue_many_as_first_statement(pg_store: Store) -> None:
    """The batch may be the first statement of the caller's transaction: it must neither
    commit that transaction nor end it."""
    url = pg_store.url  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await postlane.enqueue_many_async(conn, [msg("first:1"), msg("first:2")])
        await conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        await conn.rollback()
    assert await pg_store.get("first:1") is None
    assert await accounts(pg_store) == []
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await pg_store.enqueue(msg("first:2"))  # an existing key: the fallback path
        results = await postlane.enqueue_many_async(conn, [msg("first:1"), msg("first:2")])
        await conn.rollback()
    assert [r.created for r in results] == [True, False]
    assert await pg_store.get("first:1") is None


async def test_async_enqueue_refuses_other_connections(sqlite_store: Store) -> None:
    with sqlite3.connect(sqlite_store.path) as conn:  # type: ignore[attr-defined]
        with pytest.raises(UnsupportedConnection):
            await postlane.enqueue_async(conn, msg("k"))
        with pytest.raises(UnsupportedConnection):
            await postlane.enqueue_many_async(conn, [msg("k")])
    assert await sqlite_store.get("k") is None


# -- sqlite3 -----------------------------------------------------------------------------
async def test_sqlite3_implicit_transaction(sqlite_store: Store) -> None:
    path = sqlite_store.path  # type: ignore[attr-defined]
    conn = sqlite3.connect(path)  # the default: the module opens transactions implicitly
    try:
        conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        r = postlane.enqueue(conn, msg("welcome:1"))
        assert r.created and conn.in_transaction
        conn.rollback()
        await assert_nothing(sqlite_store, "welcome:1")

        conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        r = postlane.enqueue(conn, msg("welcome:1"))
        again = postlane.enqueue(conn, msg("welcome:1"))
        assert (again.id, again.created) == (r.id, False)
        conn.commit()
    finally:
        conn.close()
    await assert_committed(sqlite_store, r, [1])


async def test_sqlite3_explicit_begin(sqlite_store: Store) -> None:
    path = sqlite_store.path  # type: ignore[attr-defined]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO accounts VALUES (7, 'bob@example.com')")
        postlane.enqueue(conn, msg("welcome:7"))
        conn.execute("ROLLBACK")
        await assert_nothing(sqlite_store, "welcome:7")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO accounts VALUES (7, 'bob@example.com')")
        r = postlane.enqueue(conn, msg("welcome:7"))
        conn.execute("COMMIT")
    finally:
        conn.close()
    await assert_committed(sqlite_store, r, [7])


async def test_sqlite3_enqueue_many(sqlite_store: Store) -> None:
    existing = await sqlite_store.enqueue(msg("x:0"))
    batch = [msg("x:1"), msg("x:2"), msg("x:1"), msg("x:0")]
    path = sqlite_store.path  # type: ignore[attr-defined]
    conn = sqlite3.connect(path)
    try:
        conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        postlane.enqueue_many(conn, batch)
        conn.rollback()
        assert await sqlite_store.get("x:1") is None
        conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        results = postlane.enqueue_many(conn, batch)
        conn.commit()
    finally:
        conn.close()
    assert [(r.key, r.created) for r in results] == [
        ("x:1", True), ("x:2", True), ("x:1", False), ("x:0", False)]
    assert results[2].id == results[0].id and results[3].id == existing.id
    assert (await sqlite_store.stats()).states["pending"] == 3
    assert await accounts(sqlite_store) == [1]


# -- SQLAlchemy --------------------------------------------------------------------------
async def test_sqlalchemy_connection(any_store: Store,
                                     engine_for: Callable[[Store], Engine]) -> None:
    engine = engine_for(any_store)
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO accounts VALUES (1, 'alice@example.com')"))
        r = postlane.enqueue(conn, msg("welcome:1"))
        assert r.created
        conn.rollback()
    await assert_nothing(any_store, "welcome:1")
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO accounts VALUES (1, 'alice@example.com')"))
        r = postlane.enqueue(conn, msg("welcome:1"))
        assert postlane.enqueue(conn, msg("welcome:1")).id == r.id
        conn.commit()
    await assert_committed(any_store, r, [1])


async def test_sqlalchemy_engine_begin_block(any_store: Store,
                                             engine_for: Callable[[Store], Engine]) -> None:
    engine = engine_for(any_store)
    with pytest.raises(LookupError), engine.begin() as conn:
        conn.execute(text("INSERT INTO accounts VALUES (1, 'alice@example.com')"))
        postlane.enqueue(conn, msg("welcome:1"))
        raise LookupError
    await assert_nothing(any_store, "welcome:1")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO accounts VALUES (1, 'alice@example.com')"))
        r = postlane.enqueue(conn, msg("welcome:1"))
    await assert_committed(any_store, r, [1])


async def test_sqlalchemy_session(any_store: Store,
                                  engine_for: Callable[[Store], Engine]) -> None:
    engine = engine_for(any_store)
    with Session(engine) as session:
        session.execute(text("INSERT INTO accounts VALUES (1, 'alice@example.com')"))
        r = postlane.enqueue(session, msg("welcome:1"))
        assert r.created
        session.rollback()
    await assert_nothing(any_store, "welcome:1")
    with Session(engine) as session:
        # enqueue first, business write second: still one transaction.
        r = postlane.enqueue(session, msg("welcome:1"))
        session.execute(text("INSERT INTO accounts VALUES (1, 'alice@example.com')"))
        session.commit()
    await assert_committed(any_store, r, [1])


async def test_sqlalchemy_session_enqueue_many(any_store: Store,
                                               engine_for: Callable[[Store], Engine]) -> None:
    engine = engine_for(any_store)
    batch = [msg("b:1"), msg("b:2"), msg("b:1")]
    with Session(engine) as session:
        session.execute(text("INSERT INTO accounts VALUES (1, 'alice@example.com')"))
        postlane.enqueue_many(session, batch)
        session.rollback()
    await assert_nothing(any_store, "b:1")
    with Session(engine) as session, session.begin():
        session.execute(text("INSERT INTO accounts VALUES (1, 'alice@example.com')"))
        results = postlane.enqueue_many(session, batch)
    assert [(r.key, r.created) for r in results] == [
        ("b:1", True), ("b:2", True), ("b:1", False)]
    assert results[0].id == results[2].id != results[1].id
    assert (await any_store.stats()).states["pending"] == 2
    assert await accounts(any_store) == [1]


# -- psycopg enqueue_many (sync) ---------------------------------------------------------
async def test_psycopg_sync_enqueue_many(pg_store: Store) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    existing = await pg_store.enqueue(msg("x:0"))
    batch = [msg("x:1"), msg("x:2"), msg("x:1"), msg("x:0"), msg("x:3")]
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        postlane.enqueue_many(conn, batch)
        conn.rollback()
        assert await pg_store.get("x:1") is None
        conn.execute("INSERT INTO accounts VALUES (1, 'alice@example.com')")
        results = postlane.enqueue_many(conn, batch)
        conn.commit()
    assert [(r.key, r.created) for r in results] == [
        ("x:1", True), ("x:2", True), ("x:1", False), ("x:0", False), ("x:3", True)]
    assert results[2].id == results[0].id and results[3].id == existing.id
    assert results[0].id < results[1].id < results[4].id
    assert (await pg_store.stats()).states["pending"] == 4
    for r in results:
        assert [e.kind for e in await pg_store.timeline(r.id)] == ["enqueued"]


# -- concurrency: one key, two transactions ----------------------------------------------
def _wait_until_blocked(url: str, pid: int, timeout: float = 10.0) -> None:
    """Poll pg_stat_activity until backend ``pid`` waits on a lock."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as mon:
        while time.monotonic() < deadline:
            row = mon.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            if row and row[0] == "Lock":
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} never blocked on the first transaction's key")


@pytest.mark.parametrize("first_outcome", ["commit", "rollback"])
async def test_concurrent_enqueue_same_key_threads(pg_store: Store, first_outcome: str) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    first = psycopg.connect(url)
    second = psycopg.connect(url)
    try:
        # Same content (a retry of one business event); metadata tells the writers apart.
        r1 = postlane.enqueue(first, msg("reset:race", metadata={"by": "first"}))
        assert r1.created
        out: dict[str, Any] = {}

        def run_second() -> None:
            try:
                out["result"] = postlane.enqueue(second, msg("reset:race",
                                                             metadata={"by": "second"}))
                second.commit()
            except BaseException as exc:  # pragma: no cover - reported below
                out["error"] = exc

        t = threading.Thread(target=run_second)
        t.start()
        await asyncio.to_thread(_wait_until_blocked, url, second.info.backend_pid)
        assert "result" not in out  # held up by the first transaction's uncommitted key
        if first_outcome == "commit":
            first.commit()
        else:
            first.rollback()
        await asyncio.to_thread(t.join, 10)
        assert not t.is_alive()
        assert "error" not in out, out.get("error")
        r2 = out["result"]
    finally:
        first.close()
        second.close()
    d = await pg_store.get("reset:race")
    assert d is not None
    assert (await pg_store.stats()).states["pending"] == 1
    if first_outcome == "commit":
        assert (r2.id, r2.created) == (r1.id, False)
        assert d.metadata == {"by": "first"}
    else:
        assert r2.created and r2.id != r1.id
        assert d.id == r2.id and d.metadata == {"by": "second"}
    assert [e.kind for e in await pg_store.timeline(d.id)] == ["enqueued"]


async def test_concurrent_enqueue_same_key_asyncio(pg_store: Store) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(url) as a, \
            await psycopg.AsyncConnection.connect(url) as b:
        r1 = await postlane.enqueue_async(a, msg("reset:race"))
        second = asyncio.create_task(postlane.enqueue_async(b, msg("reset:race")))
        await asyncio.to_thread(_wait_until_blocked, url, b.info.backend_pid)
        assert not second.done()
        await a.commit()
        r2 = await asyncio.wait_for(second, 10)
        await b.commit()
    assert r1.created and not r2.created and r1.id == r2.id
    assert (await pg_store.stats()).states["pending"] == 1


async def test_concurrent_enqueue_many_overlapping_keys(pg_store: Store) -> None:
    """The bulk path COPYs straight into the table; a key another transaction holds makes
    that COPY wait, then fail on the unique key once the holder commits, and the batch
    falls back to insert-or-find: one row per key, the winner's id for the shared one."""
    url = pg_store.url  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(url) as a, \
            await psycopg.AsyncConnection.connect(url) as b:
        first = await postlane.enqueue_many_async(a, [msg("bulk:1"), msg("bulk:2")])
        second = asyncio.create_task(postlane.enqueue_many_async(
            b, [msg("bulk:2"), msg("bulk:3"), msg("bulk:3")]))
        await asyncio.to_thread(_wait_until_blocked, url, b.info.backend_pid)
        assert not second.done()
        await a.commit()
        results = await asyncio.wait_for(second, 10)
        await b.commit()
    assert [r.created for r in first] == [True, True]
    assert [(r.key, r.created) for r in results] == [
        ("bulk:2", False), ("bulk:3", True), ("bulk:3", False)]
    assert results[0].id == first[1].id and results[1].id == results[2].id
    assert (await pg_store.stats()).states["pending"] == 3
    shared = await pg_store.get("bulk:2")
    assert shared is not None and shared.subject != "second"
    for key in ("bulk:1", "bulk:2", "bulk:3"):
        d = await pg_store.get(key)
        assert d is not None
        assert [e.kind for e in await pg_store.timeline(d.id)] == ["enqueued"]


@pytest.mark.parametrize("driver", ["sync", "async"])
async def test_bulk_enqueues_sharing_keys_in_opposite_orders_never_deadlock(
    pg_store: Store, driver: str
) -> None:
    """Two transactions enqueue the same 300 keys at the same moment, in opposite orders.
    Taken in input order, each would hold keys the other waits for: a deadlock, which
    PostgreSQL breaks by failing one of them. Both ways take the keys in one order."""
    url = pg_store.url  # type: ignore[attr-defined]
    keys = [f"overlap:{i:03d}" for i in range(300)]
    for round_ in range(3):
        batches = [[msg(f"{k}:{round_}") for k in keys],
                   [msg(f"{k}:{round_}") for k in reversed(keys)]]
        if driver == "sync":
            barrier = threading.Barrier(2)

            def run(batch: list[Any], barrier: threading.Barrier = barrier
                    ) -> list[EnqueueResult]:
                with psycopg.connect(url) as conn:
                    conn.execute("SELECT 1")
                    barrier.wait()
                    return postlane.enqueue_many(conn, batch)

            results = await asyncio.gather(*(asyncio.to_thread(run, b) for b in batches))
        else:
            async def run_async(batch: list[Any]) -> list[EnqueueResult]:
                async with await psycopg.AsyncConnection.connect(url) as conn:
                    return await postlane.enqueue_many_async(conn, batch)

            results = await asyncio.gather(*(run_async(b) for b in batches))
        first, second = ({r.key: r for r in rs} for rs in results)
        assert {k: r.id for k, r in first.items()} == {k: r.id for k, r in second.items()}
        assert all(first[k].created != second[k].created for k in first)
    assert (await pg_store.stats()).states["pending"] == 900


# -- the enqueue wakes workers only when it commits --------------------------------------
async def test_outbox_commit_wakes_waiting_worker(pg_store: Store) -> None:
    await pg_store.wait_for_work(10)  # start the listener; it wakes once when in place
    url = pg_store.url  # type: ignore[attr-defined]
    with psycopg.connect(url) as conn:
        postlane.enqueue(conn, msg("rolled-back"))
        conn.rollback()
    t0 = time.monotonic()
    await pg_store.wait_for_work(0.5)
    assert time.monotonic() - t0 >= 0.45  # a rolled-back insert notifies no one
    waiter = asyncio.create_task(pg_store.wait_for_work(5))
    await asyncio.sleep(0.2)  # let it start waiting; nothing to poll for
    with psycopg.connect(url) as conn:
        postlane.enqueue(conn, msg("committed"))
        conn.commit()
    t1 = time.monotonic()
    await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - t1 < 1.5


# -- what is not supported ---------------------------------------------------------------
class NotAConnection:
    def execute(self, *args: Any) -> None:  # pragma: no cover - must never be called
        raise AssertionError("enqueue wrote through an unsupported object")


@pytest.mark.parametrize("conn", [NotAConnection(), object(), None, "postgresql://x"])
def test_unsupported_connection(conn: Any) -> None:
    with pytest.raises(UnsupportedConnection, match="cannot enqueue through") as info:
        postlane.enqueue(conn, msg("k"))
    assert isinstance(info.value, TypeError)
    with pytest.raises(UnsupportedConnection):
        postlane.enqueue_many(conn, [msg("k")])


async def test_async_connection_needs_enqueue_async(pg_store: Store) -> None:
    url = pg_store.url  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(url) as conn:
        with pytest.raises(UnsupportedConnection, match="enqueue_async"):
            postlane.enqueue(conn, msg("k"))
        with pytest.raises(UnsupportedConnection):
            postlane.enqueue_many(conn, [msg("k")])
    with psycopg.connect(url) as sync_conn:
        with pytest.raises(UnsupportedConnection):
            await postlane.enqueue_async(sync_conn, msg("k"))
        with pytest.raises(UnsupportedConnection):
            await postlane.enqueue_many_async(sync_conn, [msg("k")])
    assert await pg_store.get("k") is None
