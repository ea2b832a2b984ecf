"""What every part of the PostgreSQL store shares: the pool and its connections' set-up,
opening and closing, migrations, the wake-up on new work, and reading a delivery row."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool

from postlane.core.message import Delivery, delivery_of_row
from postlane.core.states import State
from postlane.core.validation import Limits
from postlane.errors import StoreConflict, StoreError, StoreUnavailable
from postlane.store import migrations, queries
from postlane.store.base import DELIVERY_COLUMNS, HINTS_AT, Store
from postlane.store.unreadable import check_headers, check_metadata, read_columns

Q = queries.load("postgres")
"""Every statement this engine runs, by name (``sql/postgres/queries.sql``)."""


_JSON = json.JSONDecoder()

CONNECT_TIMEOUT_S = 5
"""libpq's ``connect_timeout`` unless the URL sets one: a host that drops packets fails in
seconds, not after the operating system's TCP timeout of minutes."""


def _json_loads(data: bytes | str) -> Any:
    """jsonb from the server: ``{}`` (most headers and metadata) without parsing, the rest
    without ``json.loads``' encoding sniffing and whitespace scans (PostgreSQL writes none
    before the value): ``json.loads`` was the largest part of a claim's client time."""
    if data == b"{}":
        return {}
    text = data.decode() if isinstance(data, bytes) else data
    return _JSON.raw_decode(text)[0]


@contextlib.contextmanager
def postgres_errors() -> Iterator[None]:
    """psycopg's exceptions as Postlane's, around every operation (``store.seam``).

    An ``OperationalError`` is the database not answering as asked: a refused or dropped
    connection, the pool's timeout (``PoolTimeout`` is one), a statement or lock timeout,
    a deadlock, the server shutting down; the caller may try again. A unique violation
    the operation did not absorb is a conflict; anything else is a ``StoreError``."""
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        raise StoreConflict(f"PostgreSQL: {_first_line(exc)}") from exc
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"PostgreSQL: {_first_line(exc) or type(exc).__name__}"
                               ) from exc
    except psycopg.Error as exc:
        raise StoreError(f"PostgreSQL: {_first_line(exc) or type(exc).__name__}") from exc


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().split("\n", 1)[0]


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    set_json_loads(_json_loads, conn)


class PostgresBase(Store):
    engine = "postgres"

    def __init__(
        self,
        url: str,
        *,
        limits: Limits | None = None,
        min_size: int = 1,
        max_size: int = 4,
    ) -> None:
        super().__init__(limits)
        self.url = url
        self._connect_kwargs: dict[str, Any] = {"autocommit": True}
        try:
            if "connect_timeout" not in conninfo_to_dict(url):
                self._connect_kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
        except psycopg.ProgrammingError:
            pass  # a malformed URL: the first connection attempt says what is wrong with it
        self._pool = AsyncConnectionPool(
            url, min_size=min_size, max_size=max_size, open=False,
            kwargs=self._connect_kwargs, configure=_configure,
        )
        self._wakeup = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None

    async def open(self) -> None:
        # One direct connection first: a server that is down, a database that does not
        # exist or a role it refuses is said at once, with libpq's own words, instead of
        # the pool retrying (and logging each retry) until its own timeout.
        try:
            probe = await psycopg.AsyncConnection.connect(self.url, **self._connect_kwargs)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
        await probe.close()
        try:
            await self._pool.open(wait=True, timeout=10)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
        await self._pool.close()

    # -- migrations ------------------------------------------------------------------------
    async def _applied(self, conn: psycopg.AsyncConnection[Any]) -> set[int]:
        await conn.execute(Q["migrations_create"])
        cur = await conn.execute(Q["migrations_applied"])
        return {row[0] for row in await cur.fetchall()}

    async def migrate(self) -> list[str]:
        applied: list[str] = []
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(Q["migrate_lock"])  # one migrator at a time
            done = await self._applied(conn)
            for migration in migrations.load(self.engine):
                if migration.version in done:
                    continue
                await conn.execute(migration.sql.encode())
                await conn.execute(Q["migration_record"],
                                   (migration.version, migration.name))
                applied.append(migration.label)
        return applied

    async def pending_migrations(self) -> list[str]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["migrations_table_exists"],
                                     (migrations.MIGRATIONS_TABLE,))
            row = await cur.fetchone()
            done: set[int] = set()
            if row and row[0]:
                cur = await conn.execute(Q["migrations_applied"])
                done = {r[0] for r in await cur.fetchall()}
        return [m.label for m in migrations.load(self.engine) if m.version not in done]

    async def wait_for_work(self, timeout: float) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen())
        if not self._wakeup.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
        self._wakeup.clear()

    async def _listen(self) -> None:
        """Hold one connection on LISTEN; reconnect after a drop (polling covers the gap)."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.url, **self._connect_kwargs)
                async with conn:
                    await conn.execute(Q["listen"])
                    self._wakeup.set()  # anything enqueued while we were not listening
                    async for _ in conn.notifies():
                        self._wakeup.set()
            except psycopg.Error:
                await asyncio.sleep(1.0)


_STATE_INDEX = DELIVERY_COLUMNS.index("state")


_DECODERS = {"state": State}
_HEADERS_INDEX = DELIVERY_COLUMNS.index("headers")
_METADATA_INDEX = DELIVERY_COLUMNS.index("metadata")


def _delivery(row: Sequence[Any], hinted: bool = False) -> Delivery:
    """DELIVERY_COLUMNS are in Delivery's field order (checked by a test), so a row maps
    positionally; only the state needs converting. Headers that are not an object of text
    (or metadata not an object) make it an ``UnreadableDelivery``. A ``hinted`` row (a
    claim's) ends with ``may_be_suppressed`` and ``has_attachments``."""
    values = list(row[:HINTS_AT]) if hinted else list(row)
    values[_STATE_INDEX] = State(values[_STATE_INDEX])
    try:
        check_headers(values[_HEADERS_INDEX])
        check_metadata(values[_METADATA_INDEX])
    except ValueError as exc:
        return read_columns(dict(zip(DELIVERY_COLUMNS, values, strict=True)), _DECODERS,
                            exc)
    if hinted:
        return delivery_of_row(values, row[HINTS_AT], row[HINTS_AT + 1])
    return delivery_of_row(values)


async def _deliveries(cur: psycopg.AsyncCursor[Any], hinted: bool = False) -> list[Delivery]:
    """Every row of ``cur`` (``DELIVERY_COLUMNS``) as a ``Delivery``. A row psycopg cannot
    load (a time past year 9999: "timestamp too large") comes back as an
    ``UnreadableDelivery`` instead of failing the rows fetched with it; the fast path, one
    ``fetchall``, is taken whenever every row loads."""
    try:
        rows = await cur.fetchall()
    except (psycopg.DataError, ValueError):  # ValueError: text that is not UTF-8
        pass
    else:
        return [_delivery(row, hinted) for row in rows]
    result = cur.pgresult
    assert result is not None  # fetchall found one to fail on
    deliveries: list[Delivery] = []
    for number in range(result.ntuples):
        await cur.scroll(number, mode="absolute")
        try:
            row = await cur.fetchone()
        except (psycopg.DataError, ValueError) as exc:
            deliveries.append(read_columns(_columns(cur, result, number), _DECODERS, exc))
        else:
            assert row is not None
            deliveries.append(_delivery(row, hinted))
    return deliveries


def _columns(cur: psycopg.AsyncCursor[Any], result: pq.abc.PGresult,
             number: int) -> dict[str, Any]:
    """Row ``number`` loaded column by column, an exception in place of each that fails."""
    values: dict[str, Any] = {}
    for index, column in enumerate(DELIVERY_COLUMNS):
        data = result.get_value(number, index)
        if data is None:
            values[column] = None
            continue
        oid, fmt = result.ftype(index), pq.Format(result.fformat(index))
        loader = cur.adapters.get_loader(oid, fmt)
        try:
            if loader is None:
                raise psycopg.DataError(f"no loader for type {oid}")
            values[column] = loader(oid, cur).load(data)
        except (psycopg.Error, ValueError) as exc:
            values[column] = exc
    return values
