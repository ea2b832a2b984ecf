"""Migrations: idempotent, complete, and producing exactly the checked-in schema.

The expected schemas live in ``tests/integration/schema/{postgres,sqlite}.txt``. After a
deliberate schema change (a new migration), regenerate them from the repository root with::

    python -m tests.integration.test_migrations --write

and review the diff like any other code change.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
from pathlib import Path

import psycopg

from postlane import open_store
from postlane.store import migrations

SCHEMA_DIR = Path(__file__).parent / "schema"
ENGINES = ("postgres", "sqlite")


# -- schema dumps (deterministic text) ---------------------------------------------------
def dump_postgres(url: str) -> str:
    lines: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        lines.append("# columns: table.column type nullable default identity")
        for row in conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, "
            "coalesce(column_default, '-'), is_identity, coalesce(identity_generation, '-') "
            "FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name LIKE 'postlane\\_%' "
            "ORDER BY table_name, ordinal_position"
        ):
            table, column, type_, nullable, default, identity, generation = row
            null = "NULL" if nullable == "YES" else "NOT NULL"
            ident = f" IDENTITY {generation}" if identity == "YES" else ""
            lines.append(f"{table}.{column} {type_} {null} default={default}{ident}")
        lines.append("# constraints")
        for name, table, definition in conn.execute(
            "SELECT c.conname, t.relname, pg_get_constraintdef(c.oid) "
            "FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid "
            "JOIN pg_namespace n ON n.oid = t.relnamespace "
            "WHERE n.nspname = 'public' AND t.relname LIKE 'postlane\\_%' "
            "ORDER BY t.relname, c.conname"
        ):
            lines.append(f"{table} {name}: {definition}")
        lines.append("# indexes")
        for (definition,) in conn.execute(
            "SELECT indexdef FROM pg_indexes "
            "WHERE schemaname = 'public' AND tablename LIKE 'postlane\\_%' "
            "ORDER BY tablename, indexname"
        ):
            lines.append(definition)
        lines.append("# triggers")
        for name, table, definition in conn.execute(
            "SELECT tg.tgname, t.relname, pg_get_triggerdef(tg.oid) "
            "FROM pg_trigger tg JOIN pg_class t ON t.oid = tg.tgrelid "
            "WHERE NOT tg.tgisinternal AND t.relname LIKE 'postlane\\_%' "
            "ORDER BY t.relname, tg.tgname"
        ):
            lines.append(f"{table} {name}: {definition}")
        lines.append("# functions")
        for name, args, result in conn.execute(
            "SELECT p.proname, pg_get_function_identity_arguments(p.oid), "
            "pg_get_function_result(p.oid) FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public' AND p.proname LIKE 'postlane\\_%' ORDER BY 1, 2"
        ):
            lines.append(f"{name}({args}) -> {result}")
    return "\n".join(lines) + "\n"


def dump_sqlite(path: str) -> str:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master "
            "WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY tbl_name, type DESC, name"
        ).fetchall()
    finally:
        conn.close()
    blocks = [f"-- {type_} {name} on {table}\n{(sql or '').strip()};"
              for type_, name, table, sql in rows]
    return "\n\n".join(blocks) + "\n"


async def _migrate(url: str) -> list[str]:
    async with open_store(url) as store:
        return await store.migrate()


def _expected(engine: str) -> str:
    return (SCHEMA_DIR / f"{engine}.txt").read_text("utf-8")


def _diff_hint(engine: str) -> str:
    return (f"the {engine} schema differs from tests/integration/schema/{engine}.txt; if the "
            "change is intended, run `python -m tests.integration.test_migrations --write`")


# -- tests -------------------------------------------------------------------------------
ALL = [m.label for m in migrations.load("postgres")]


def test_both_engines_ship_the_same_migrations() -> None:
    assert [m.label for m in migrations.load("sqlite")] == ALL
    assert ALL[:2] == ["0001_initial", "0002_controls"]
    # Numbers are handed out per branch (this one has 0011 while 0007-0010 are on others),
    # so a gap is allowed; order and uniqueness are not negotiable.
    versions = [m.version for m in migrations.load("sqlite")]
    assert versions == sorted(set(versions)) and versions[0] == 1


async def test_postgres_migrate_from_empty(fresh_pg_url: str) -> None:
    async with open_store(fresh_pg_url) as store:
        assert await store.pending_migrations() == ALL
        assert await store.pending_migrations() == ALL  # asking changes nothing
        assert await store.migrate() == ALL
        assert await store.pending_migrations() == []
        assert await store.migrate() == []
    async with open_store(fresh_pg_url) as store:  # a later process sees the same
        assert await store.pending_migrations() == []
        assert await store.migrate() == []
    assert dump_postgres(fresh_pg_url) == _expected("postgres"), _diff_hint("postgres")
    with psycopg.connect(fresh_pg_url) as conn:
        rows = conn.execute("SELECT version, name FROM postlane_migrations ORDER BY 1").fetchall()
        # The bulk enqueue reserves ids from this sequence by name.
        sequence = conn.execute(
            "SELECT pg_get_serial_sequence('postlane_deliveries', 'id')").fetchone()
    assert [f"{v:04d}_{n}" for v, n in rows] == ALL
    assert sequence == ("public.postlane_deliveries_id_seq",)


async def test_sqlite_migrate_from_empty(sqlite_url: str) -> None:
    async with open_store(sqlite_url) as store:
        assert await store.pending_migrations() == ALL
        assert await store.migrate() == ALL
        assert await store.pending_migrations() == []
        assert await store.migrate() == []
    async with open_store(sqlite_url) as store:
        assert await store.pending_migrations() == []
        assert await store.migrate() == []
    path = sqlite_url[len("sqlite:///"):]
    assert dump_sqlite(path) == _expected("sqlite"), _diff_hint("sqlite")
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = conn.execute("SELECT version, name FROM postlane_migrations ORDER BY 1").fetchall()
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert [f"{v:04d}_{n}" for v, n in rows] == ALL


async def test_postgres_migrate_partial(fresh_pg_url: str) -> None:
    """A database at 0001 gets exactly the rest."""
    first = migrations.load("postgres")[0]
    with psycopg.connect(fresh_pg_url, autocommit=True) as conn:
        conn.execute(first.sql.encode())
        conn.execute("CREATE TABLE postlane_migrations (version INTEGER PRIMARY KEY, "
                     "name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
        conn.execute("INSERT INTO postlane_migrations (version, name) VALUES (%s, %s)",
                     (first.version, first.name))
    async with open_store(fresh_pg_url) as store:
        assert await store.pending_migrations() == ALL[1:]
        assert await store.migrate() == ALL[1:]
    assert dump_postgres(fresh_pg_url) == _expected("postgres"), _diff_hint("postgres")


async def test_postgres_concurrent_migrators(fresh_pg_url: str) -> None:
    stores = [open_store(fresh_pg_url) for _ in range(3)]
    for s in stores:
        await s.open()
    try:
        results = await asyncio.gather(*(s.migrate() for s in stores))
    finally:
        for s in stores:
            await s.close()
    assert sorted(results, key=len) == [[], [], ALL]
    assert dump_postgres(fresh_pg_url) == _expected("postgres")


async def test_sqlite_concurrent_migrators(tmp_path: Path) -> None:
    """Several processes starting at once on a new file: each migration applied once, no
    "table already exists". Repeated because the race window is small."""
    for round_ in range(20):
        url = f"sqlite:///{tmp_path / f'race{round_}.db'}"
        stores = [open_store(url) for _ in range(5)]
        for s in stores:
            await s.open()
        try:
            results = await asyncio.gather(*(s.migrate() for s in stores))
        finally:
            for s in stores:
                await s.close()
        assert sorted(label for r in results for label in r) == ALL  # each exactly once
        assert dump_sqlite(url[len("sqlite:///"):]) == _expected("sqlite")


# -- regeneration ------------------------------------------------------------------------
def _write_expected() -> None:
    admin = os.environ.get("POSTLANE_TEST_PG_ADMIN_URL",
                           "postgresql://postgres@127.0.0.1:5432/postgres")
    name = f"postlane_schema_{os.getpid()}"
    SCHEMA_DIR.mkdir(exist_ok=True)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = admin.rsplit("/", 1)[0] + f"/{name}"
        asyncio.run(_migrate(url))
        (SCHEMA_DIR / "postgres.txt").write_text(dump_postgres(url), "utf-8")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "schema.db")
        asyncio.run(_migrate(f"sqlite:///{path}"))
        (SCHEMA_DIR / "sqlite.txt").write_text(dump_sqlite(path), "utf-8")
    print(f"wrote {SCHEMA_DIR / 'postgres.txt'} and {SCHEMA_DIR / 'sqlite.txt'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true",
                        help="regenerate the expected schema files from the migrations")
    if not parser.parse_args().write:
        parser.print_help()
        sys.exit(2)
    _write_expected()
