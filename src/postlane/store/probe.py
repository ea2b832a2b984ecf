"""A read-only look at a database before traffic (``postlane check``): can it be reached,
which migrations does it have, how busy is it?

It opens one connection of its own, never a store: a store would create what it lacks (the
SQLite file, the migrations table) and a check must write nothing. The drivers' exceptions
stop here, as at every seam (``postlane.store.seam``): ``StoreUnavailable`` when the
database cannot be reached or opened, ``StoreError`` when it answered with an error.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from postlane.errors import StoreError, StoreUnavailable
from postlane.extras import requires
from postlane.store.migrations import MIGRATIONS_TABLE

if TYPE_CHECKING:
    import psycopg


@dataclass(frozen=True, slots=True)
class PostgresProbe:
    server_version: str
    max_connections: str
    connections_in_use: int
    applied: frozenset[int]
    """The versions in the migrations table (none when it does not exist)."""


async def probe_postgres(url: str, *, timeout_s: float) -> PostgresProbe:
    """Connect once (libpq's ``connect_timeout`` from ``timeout_s``) and read. Raises
    ``MissingExtra`` without ``postlane[postgres]``."""
    with requires("postgres", "a PostgreSQL database"):
        import psycopg
    try:
        async with asyncio.timeout(timeout_s + 1):
            conn = await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=max(2, math.ceil(timeout_s)))
    except TimeoutError as exc:
        raise StoreUnavailable(f"no connection within {timeout_s + 1:g} s") from exc
    except (psycopg.Error, OSError) as exc:
        raise StoreUnavailable(str(exc)) from exc
    try:
        async with conn:
            version = await _scalar(conn, "SHOW server_version")
            max_connections = await _scalar(conn, "SHOW max_connections")
            in_use = await _scalar(conn, "SELECT count(*) FROM pg_stat_activity")
            exists = await _scalar(conn, "SELECT to_regclass(%s) IS NOT NULL",
                                   (MIGRATIONS_TABLE,))
            applied: set[int] = set()
            if exists:
                cur = await conn.execute(f"SELECT version FROM {MIGRATIONS_TABLE}")
                applied = {int(row[0]) for row in await cur.fetchall()}
    except psycopg.Error as exc:
        raise StoreError(str(exc)) from exc
    return PostgresProbe(str(version), str(max_connections), int(in_use), frozenset(applied))


async def _scalar(conn: psycopg.AsyncConnection[Any], sql: str,
                  params: tuple[Any, ...] = ()) -> Any:
    cur = await conn.execute(sql, params)
    row = await cur.fetchone()
    return row[0] if row else None


async def sqlite_applied(path: str) -> frozenset[int]:
    """The migration versions recorded in the SQLite file at ``path``, read through a
    read-only connection (a missing file is an error, never created)."""

    def _read() -> frozenset[int]:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                                  "AND name = ?", (MIGRATIONS_TABLE,)).fetchone()
            if not exists:
                return frozenset()
            return frozenset(int(r[0]) for r in
                             conn.execute(f"SELECT version FROM {MIGRATIONS_TABLE}"))
        finally:
            conn.close()

    try:
        return await asyncio.to_thread(_read)
    except sqlite3.Error as exc:
        raise StoreError(str(exc)) from exc
