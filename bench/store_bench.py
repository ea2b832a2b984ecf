"""Store throughput: enqueue (single and bulk) and the worker's claim -> start -> ack loop,
on each engine, next to the same work done in plain SQL on a bare table.

    python -m bench.store_bench                      # both engines, 100,000 rows, ~3-4 min
    python -m bench.store_bench --rows 20000 --engines postgres --no-write

    # to measure one commit exactly while others edit src/:
    git archive HEAD src | tar -x -C /tmp/snap
    PYTHONPATH=/tmp/snap/src python -m bench.store_bench

What is measured (rows/s = rows moved / wall time of the phase; CPU µs/row = CPU time of
this process, and of the PostgreSQL backends serving it, per row):

1. ``enqueue, one per commit``: ``Store.enqueue`` once per message (``--single`` of them).
2. ``enqueue_many``: ``Store.enqueue_many`` in batches of ``--enqueue-batch`` (a COPY of the
   messages, then one statement for the deliveries and their events, on PostgreSQL);
   ``--rows`` messages, median over every fill of the run.
3. ``claim + ack``: one or two asyncio tasks, each looping
   ``claim_batch(lane, --claim-batch, owner, lease)`` -> [``start_attempts``] ->
   ``set_state_if_sending_many(... SENT ...)`` until a claim comes back empty, over
   ``--rows`` pending deliveries; with and without the start mark.

The plain-SQL baseline does the same work on a bare table with the same columns, a
primary key and the one partial index the claim needs (no unique key, no other indexes,
no timeline events, no NOTIFY trigger): ``INSERT`` per commit; ``COPY`` in the same
batches; ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n) RETURNING id``
then ``UPDATE ... SET state = 'sent' WHERE id = ANY(...)``. The bare table is the one wide
row a delivery was before migration 0007 split it (``PG_WIDE``), so figures from before and
after the split compare. On PostgreSQL the loop is also run on that wide table with all the
indexes and constraints it had (still no events), to split the gap between what the old
schema costs and what the store's statements cost.

Every drain starts from a freshly filled, ``VACUUM ANALYZE``d table after a ``CHECKPOINT``
(SQLite: ``ANALYZE`` and a WAL checkpoint), so the runs are comparable. The figures go to
the ``store`` section of ``bench/RESULTS.md`` (``--no-write`` to only print them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sqlite3
import statistics
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench._common import (
    RESULTS,
    Meter,
    Timer,
    command_line,
    fresh_pg_database,
    machine_info,
    pg_admin_url,
    write_section,
)
from postlane.core.message import Message
from postlane.core.states import State
from postlane.store import Claim, Store, Transition, open_store

LANE = "bulk"
LEASE = timedelta(minutes=5)
SUBJECT = "Your weekly digest is ready"
TEXT = "Hello,\n\n" + "This is the body of a benchmark message, about as long as a short one. " * 4

# (tasks, with_start) for every drain, in run order.
DRAINS: tuple[tuple[int, bool], ...] = ((1, False), (1, True), (2, False), (2, True))


def make_messages(tag: str, n: int) -> list[Message]:
    return [
        Message(key=f"bench:{tag}:{i}", to=f"user{i}@example.com", subject=SUBJECT, text=TEXT,
                lane=LANE, metadata={"user": i})
        for i in range(n)
    ]


def plain_row(m: Message) -> tuple[Any, ...]:
    """The columns a plain INSERT/COPY writes: what the store's COPY and insert carry."""
    return (m.key, m.lane, m.channel, m.to, m.sender, m.subject, m.text, m.html,
            json.dumps(dict(m.headers)), json.dumps(dict(m.metadata)))


PLAIN_COLS = ("idempotency_key, lane, channel, recipient, sender, subject, text_body, "
              "html_body, headers, metadata")


# -- results -------------------------------------------------------------------------------
@dataclass
class Measure:
    rows: int
    seconds: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    server_cpu: list[float | None] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.rows / statistics.median(self.seconds)

    @property
    def client_us(self) -> float:
        """Median CPU microseconds per row in this (the benchmark's) process."""
        return statistics.median(self.client_cpu) / self.rows * 1e6

    @property
    def server_us(self) -> float | None:
        """Median CPU microseconds per row in the PostgreSQL backends, when known."""
        known = [v for v in self.server_cpu if v is not None]
        return statistics.median(known) / self.rows * 1e6 if known else None

    def cpu(self) -> str:
        server = self.server_us
        if server is None:
            return f"{self.client_us:,.0f}"
        return f"{self.client_us:,.0f} + {server:,.0f}"


@dataclass
class Results:
    # results[engine][variant][op]; variant is "store", "plain" or "plain+indexes"
    data: dict[str, dict[str, dict[str, Measure]]] = field(default_factory=dict)

    def add(self, engine: str, variant: str, op: str, rows: int, meter: Meter) -> None:
        slot = self.data.setdefault(engine, {}).setdefault(variant, {})
        measure = slot.setdefault(op, Measure(rows))
        measure.seconds.append(meter.seconds)
        measure.client_cpu.append(meter.client_cpu)
        measure.server_cpu.append(meter.server_cpu)
        server = "" if meter.server_cpu is None else f" + {meter.server_cpu / rows * 1e6:,.0f}"
        print(f"  {engine:8} {variant:14} {op:15} {rows:>8,} rows {meter.seconds:7.2f} s "
              f"{rows / meter.seconds:>9,.0f} rows/s  CPU us/row "
              f"{meter.client_cpu / rows * 1e6:,.0f}{server}", flush=True)

    def get(self, engine: str, variant: str, op: str) -> Measure | None:
        return self.data.get(engine, {}).get(variant, {}).get(op)


def drain_op(tasks: int, with_start: bool) -> str:
    return f"drain_{tasks}{'_start' if with_start else ''}"


def op_label(op: str, args: argparse.Namespace) -> str:
    if op == "enqueue_single":
        return "enqueue, one per commit"
    if op == "enqueue_bulk":
        return f"enqueue_many, batches of {args.enqueue_batch:,}"
    if op == "copy_one":
        return "one COPY of all rows (for scale)"
    _, tasks, *start = op.split("_")
    steps = "claim + start + ack" if start else "claim + ack"
    return f"{steps}, {args.claim_batch}-row batches, {tasks} task{'s' * (tasks != '1')}"


# -- the store -----------------------------------------------------------------------------
async def drain_store(store: Store, owner: str, with_start: bool, batch: int) -> int:
    done = 0
    while True:
        claimed = await store.claim_batch(LANE, batch, owner, LEASE)
        if not claimed:
            return done
        claims = [Claim(d.id, d.claims) for d in claimed]
        if with_start:
            held = await store.start_attempts(owner, claims)
        else:
            held = {c.id for c in claims}
        applied = await store.set_state_if_sending_many(owner, [
            Transition(c.id, c.claims, State.SENT, "sent", detail={"outcome": "sent"})
            for c in claims if c.id in held
        ])
        done += len(applied)


class Engine:
    """How to get an empty, migrated store of one engine, and to settle it before a drain."""

    name: str
    url: str
    pg_url: str | None = None
    """Set for PostgreSQL: the database whose backends' CPU time is measured."""

    async def reset(self) -> None: ...

    async def settle(self) -> None: ...


class SQLiteEngine(Engine):
    name = "sqlite"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.generation = 0
        self.path = folder / "bench-0.db"
        self.url = f"sqlite:///{self.path}"

    async def reset(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self.generation += 1
        self.path = self.folder / f"bench-{self.generation}.db"
        self.url = f"sqlite:///{self.path}"

    async def settle(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("ANALYZE")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()


class PostgresEngine(Engine):
    name = "postgres"

    def __init__(self, url: str) -> None:
        self.url = self.pg_url = url

    async def reset(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            exists = await (await conn.execute(
                "SELECT to_regclass('postlane_deliveries') IS NOT NULL")).fetchone()
            if exists and exists[0]:
                await conn.execute(
                    "TRUNCATE postlane_deliveries, postlane_messages, postlane_events, "
                    "postlane_dead_letters "
                    "RESTART IDENTITY CASCADE")
                await conn.execute(
                    "DO $$ BEGIN IF to_regclass('postlane_callbacks') IS NOT NULL THEN "
                    "TRUNCATE postlane_callbacks; END IF; END $$")

    async def settle(self) -> None:
        await pg_settle(self.url, ["postlane_deliveries", "postlane_messages",
                                   "postlane_events"])


async def pg_settle(url: str, tables: Sequence[str]) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for table in tables:
            await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
        await conn.execute("CHECKPOINT")


CALLBACK_ENDPOINT = {"on": False}
"""``--callback-endpoint``: every opened store has one endpoint for every delivery."""


@contextlib.asynccontextmanager
async def opened(engine: Engine) -> AsyncIterator[Store]:
    async with open_store(engine.url, pool_size=4) as store:
        await store.migrate()
        if CALLBACK_ENDPOINT["on"] and not await store.list_callback_endpoints():
            await store.add_callback_endpoint("http://127.0.0.1:9/", "whsec_AAAA", None, ())
        yield store


async def store_single(engine: Engine, args: argparse.Namespace, results: Results) -> None:
    await engine.reset()
    async with opened(engine) as store:
        messages = make_messages("single", args.single)
        with Meter(engine.pg_url) as t:
            for m in messages:
                await store.enqueue(m)
    results.add(engine.name, "store", "enqueue_single", len(messages), t)
    await engine.reset()


async def store_fill_and_drain(
    engine: Engine, tasks: int, with_start: bool, args: argparse.Namespace, results: Results
) -> None:
    name = engine.name
    await engine.reset()
    async with opened(engine) as store:
        messages = make_messages(f"drain{tasks}{int(with_start)}", args.rows)
        with Meter(engine.pg_url) as t:
            for i in range(0, len(messages), args.enqueue_batch):
                await store.enqueue_many(messages[i:i + args.enqueue_batch])
        results.add(name, "store", "enqueue_bulk", len(messages), t)
        del messages
    await engine.settle()
    async with opened(engine) as store:
        with Meter(engine.pg_url) as t:
            counts = await asyncio.gather(*(
                drain_store(store, f"bench-worker-{k}", with_start, args.claim_batch)
                for k in range(tasks)
            ))
        stats = await store.stats()
    check(name, sum(counts), args.rows, stats.states)
    results.add(name, "store", drain_op(tasks, with_start), sum(counts), t)
    await engine.reset()


def check(engine: str, done: int, expected: int, states: dict[str, int]) -> None:
    if done != expected or states.get("sent") != expected:
        raise SystemExit(
            f"{engine}: drained {done} of {expected} rows; states now {states}: "
            "the figures would be wrong, stopping")


# -- plain SQL on PostgreSQL ---------------------------------------------------------------
# The baseline keeps the one wide table a delivery was before migration 0007 (every
# column in one row), so that figures from before and after the store's split compare.
PG_WIDE = """
    CREATE TABLE {t} (
        id BIGINT GENERATED ALWAYS AS IDENTITY, idempotency_key TEXT NOT NULL,
        lane TEXT NOT NULL, channel TEXT NOT NULL DEFAULT 'email', recipient TEXT NOT NULL,
        sender TEXT, subject TEXT NOT NULL DEFAULT '', text_body TEXT, html_body TEXT,
        headers JSONB NOT NULL DEFAULT '{{}}', metadata JSONB NOT NULL DEFAULT '{{}}',
        import_id TEXT, template_id TEXT, template_version INTEGER,
        state TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0,
        claims INTEGER NOT NULL DEFAULT 0, run_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        expires_at TIMESTAMPTZ, lease_owner TEXT, lease_expires_at TIMESTAMPTZ,
        attempt_started_at TIMESTAMPTZ, provider_message_id TEXT, dead_reason TEXT,
        last_error TEXT, created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now(), sent_at TIMESTAMPTZ,
        finished_at TIMESTAMPTZ, provider_status TEXT, request_hash TEXT, producer TEXT
    );
    ALTER TABLE {t} ADD PRIMARY KEY (id);
    CREATE INDEX ON {t} (lane, run_at, id) WHERE state = 'pending';
"""
PG_TABLES = {
    # Same columns (and identity, defaults); primary key and the claim's partial index only.
    "plain": PG_WIDE,
    # Every index and constraint the wide table had (0006); still no events, no trigger.
    "plain+indexes": PG_WIDE + """
    ALTER TABLE {t} ADD UNIQUE (idempotency_key);
    ALTER TABLE {t} ADD CHECK ((state = 'sending') = (lease_owner IS NOT NULL));
    CREATE INDEX ON {t} (lease_expires_at) WHERE state = 'sending';
    CREATE INDEX ON {t} (finished_at) WHERE finished_at IS NOT NULL;
    CREATE INDEX ON {t} (recipient);
    CREATE INDEX ON {t} (import_id) WHERE import_id IS NOT NULL;
    CREATE INDEX ON {t} (provider_message_id) WHERE provider_message_id IS NOT NULL;
    CREATE INDEX ON {t} (updated_at) WHERE state = 'ambiguous';
    CREATE INDEX ON {t} (template_id) WHERE template_id IS NOT NULL;
    """,
}
PG_CLAIM = """
UPDATE {t} SET state = 'sending', lease_owner = %(owner)s,
    lease_expires_at = now() + interval '5 minutes', claims = claims + 1, updated_at = now()
WHERE id IN (
    SELECT id FROM {t}
    WHERE state = 'pending' AND lane = %(lane)s AND run_at <= now()
    ORDER BY run_at, id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
RETURNING id
"""
PG_START = "UPDATE {t} SET attempt_started_at = now(), updated_at = now() WHERE id = ANY(%s)"
PG_COMPLETE = """
UPDATE {t} SET state = 'sent', lease_owner = NULL, lease_expires_at = NULL,
    attempt_started_at = NULL, sent_at = now(), finished_at = now(), updated_at = now()
WHERE id = ANY(%s)
"""


def _q(template: str, table: str) -> sql.Composed:
    return sql.SQL(template).format(t=sql.Identifier(table))


async def pg_drain_plain(
    conn: psycopg.AsyncConnection[Any], table: str, owner: str, with_start: bool, batch: int
) -> int:
    claim, start, complete = _q(PG_CLAIM, table), _q(PG_START, table), _q(PG_COMPLETE, table)
    params = {"owner": owner, "lane": LANE, "limit": batch}
    done = 0
    while True:
        cur = await conn.execute(claim, params)
        ids = [row[0] for row in await cur.fetchall()]
        if not ids:
            return done
        if with_start:
            await conn.execute(start, (ids,))
        cur = await conn.execute(complete, (ids,))
        done += cur.rowcount


async def pg_copy(conn: psycopg.AsyncConnection[Any], table: str,
                  messages: Sequence[Message], batch: int) -> None:
    stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(table), sql.SQL(PLAIN_COLS))
    for i in range(0, len(messages), batch):
        async with conn.transaction(), conn.cursor() as cur, cur.copy(stmt) as copy:
            for m in messages[i:i + batch]:
                await copy.write_row(plain_row(m))


class PlainPostgres:
    """The plain-SQL baseline on PostgreSQL; ``setup`` first (it needs the store's table
    to copy the columns from)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def setup(self) -> None:
        async with opened(PostgresEngine(self.url)):
            pass

    async def fresh(self, conn: psycopg.AsyncConnection[Any], variant: str) -> str:
        table = "bench_" + variant.replace("+", "_")
        await conn.execute(_q("DROP TABLE IF EXISTS {t}", table))
        await conn.execute(_q(PG_TABLES[variant], table))
        return table

    async def single(self, args: argparse.Namespace, results: Results) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            table = await self.fresh(conn, "plain")
            messages = make_messages("plain-single", args.single)
            insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                sql.Identifier(table), sql.SQL(PLAIN_COLS), sql.SQL(", ".join(["%s"] * 10)))
            with Meter(self.url) as t:
                for m in messages:
                    await conn.execute(insert, plain_row(m))
            results.add("postgres", "plain", "enqueue_single", len(messages), t)
            await conn.execute(_q("DROP TABLE {t}", table))

    async def copy_one(self, args: argparse.Namespace, results: Results) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            table = await self.fresh(conn, "plain")
            messages = make_messages("plain-copy-one", args.rows)
            with Meter(self.url) as t:
                await pg_copy(conn, table, messages, len(messages))
            results.add("postgres", "plain", "copy_one", len(messages), t)
            await conn.execute(_q("DROP TABLE {t}", table))

    async def fill_and_drain(self, variant: str, tasks: int, with_start: bool,
                             args: argparse.Namespace, results: Results) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            table = await self.fresh(conn, variant)
            messages = make_messages(f"plain{tasks}{int(with_start)}", args.rows)
            with Meter(self.url) as t:
                await pg_copy(conn, table, messages, args.enqueue_batch)
            results.add("postgres", variant, "enqueue_bulk", len(messages), t)
            del messages
            await pg_settle(self.url, [table])
            workers = [await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                       for _ in range(tasks)]
            try:
                with Meter(self.url) as t:
                    counts = await asyncio.gather(*(
                        pg_drain_plain(w, table, f"bench-worker-{k}", with_start,
                                       args.claim_batch)
                        for k, w in enumerate(workers)
                    ))
            finally:
                for w in workers:
                    await w.close()
            cur = await conn.execute(_q("SELECT state, count(*) FROM {t} GROUP BY 1", table))
            check(f"postgres {variant}", sum(counts), args.rows, dict(await cur.fetchall()))
            results.add("postgres", variant, drain_op(tasks, with_start), sum(counts), t)
            await conn.execute(_q("DROP TABLE {t}", table))


# -- plain SQL on SQLite -------------------------------------------------------------------
SQLITE_PLAIN = """
CREATE TABLE bench_plain (
    id INTEGER PRIMARY KEY, idempotency_key TEXT NOT NULL, lane TEXT NOT NULL,
    channel TEXT NOT NULL DEFAULT 'email', recipient TEXT NOT NULL, sender TEXT,
    subject TEXT NOT NULL DEFAULT '', text_body TEXT, html_body TEXT,
    headers TEXT NOT NULL DEFAULT '{}', metadata TEXT NOT NULL DEFAULT '{}', import_id TEXT,
    template_id TEXT, template_version INTEGER, state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0, claims INTEGER NOT NULL DEFAULT 0,
    run_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    expires_at REAL, lease_owner TEXT,
    lease_expires_at REAL, attempt_started_at REAL, provider_message_id TEXT,
    dead_reason TEXT, last_error TEXT,
    created_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    updated_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    sent_at REAL, finished_at REAL
);
CREATE INDEX bench_plain_ready ON bench_plain (lane, run_at, id) WHERE state = 'pending';
"""
SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"  # the store's clock expression
SQLITE_CLAIM = f"""
UPDATE bench_plain SET state = 'sending', lease_owner = ?, lease_expires_at = {SQLITE_NOW} + 300,
    claims = claims + 1, updated_at = {SQLITE_NOW}
WHERE id IN (SELECT id FROM bench_plain
             WHERE state = 'pending' AND lane = ? AND run_at <= {SQLITE_NOW}
             ORDER BY run_at, id LIMIT ?)
RETURNING id
"""
SQLITE_START = (f"UPDATE bench_plain SET attempt_started_at = {SQLITE_NOW}, "
                f"updated_at = {SQLITE_NOW} WHERE id IN (SELECT value FROM json_each(?))")
SQLITE_COMPLETE = f"""
UPDATE bench_plain SET state = 'sent', lease_owner = NULL, lease_expires_at = NULL,
    attempt_started_at = NULL, sent_at = {SQLITE_NOW}, finished_at = {SQLITE_NOW},
    updated_at = {SQLITE_NOW}
WHERE id IN (SELECT value FROM json_each(?))
"""


def sqlite_connect(path: Path) -> sqlite3.Connection:
    """Configured as the store configures its connections (WAL, synchronous=FULL)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


class PlainSQLite:
    """The plain-SQL baseline on SQLite: one connection, synchronous (it is what the
    store's single thread does, without the thread hop)."""

    insert = f"INSERT INTO bench_plain ({PLAIN_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def fresh(self, tag: str) -> sqlite3.Connection:
        path = self.folder / f"plain-{tag}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        conn = sqlite_connect(path)
        conn.executescript(SQLITE_PLAIN)
        return conn

    def single(self, args: argparse.Namespace, results: Results) -> None:
        conn = self.fresh("single")
        messages = make_messages("plain-single", args.single)
        with Meter() as t:
            for m in messages:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(self.insert, plain_row(m))
                conn.execute("COMMIT")
        results.add("sqlite", "plain", "enqueue_single", len(messages), t)
        conn.close()

    def fill_and_drain(self, with_start: bool, args: argparse.Namespace,
                       results: Results) -> None:
        conn = self.fresh("drain")
        messages = make_messages(f"plain{int(with_start)}", args.rows)
        with Meter() as t:
            for i in range(0, len(messages), args.enqueue_batch):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(self.insert, map(plain_row, messages[i:i + args.enqueue_batch]))
                conn.execute("COMMIT")
        results.add("sqlite", "plain", "enqueue_bulk", len(messages), t)
        del messages
        conn.execute("ANALYZE")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        done = 0
        with Meter() as t:
            while True:
                conn.execute("BEGIN IMMEDIATE")
                ids = [r[0] for r in conn.execute(
                    SQLITE_CLAIM, ("bench-worker-0", LANE, args.claim_batch)).fetchall()]
                conn.execute("COMMIT")
                if not ids:
                    break
                encoded = json.dumps(ids)
                if with_start:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute(SQLITE_START, (encoded,))
                    conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
                done += conn.execute(SQLITE_COMPLETE, (encoded,)).rowcount
                conn.execute("COMMIT")
        states = dict(conn.execute("SELECT state, count(*) FROM bench_plain GROUP BY 1"))
        conn.close()
        check("sqlite plain", done, args.rows, states)
        results.add("sqlite", "plain", drain_op(1, with_start), done, t)


# -- report --------------------------------------------------------------------------------
OPS = ("enqueue_single", "enqueue_bulk", "copy_one",
       *(drain_op(tasks, start) for tasks, start in DRAINS))


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def report(results: Results, args: argparse.Namespace, info_md: str) -> str:
    samples = "one run" if args.repeat == 1 else f"the median of {args.repeat} runs"
    lines = [
        "## Store",
        "",
        "Throughput of `Store` (`src/postlane/store/`) on each engine, next to the same work",
        "in plain SQL on a bare table: same columns, a primary key and the claim's partial",
        "index; no unique key, no other indexes, no timeline events, no NOTIFY trigger.",
        "Rows/s is rows moved divided by the wall time of the phase; a *store / plain* ratio",
        "below 0.50 misses the goal of staying within a factor of two of plain SQL.",
        "",
        info_md,
        f"- Command: `{command_line()}` ({args.elapsed / 60:.1f} min; load average "
        f"{args.load[0]} before, {args.load[1]} after)",
        f"- Rows per phase: {args.rows:,} (single-commit enqueue: {args.single:,}); "
        f"enqueue batches of {args.enqueue_batch:,}; claim batches of {args.claim_batch}; "
        "lease 5 min; one lane; no provider: the ack follows the claim at once, with "
        "`detail={\"outcome\": \"sent\"}` and no provider message id.",
        f"- Each figure is {samples}; enqueue_many is the median over every fill made for "
        "the drains. Store and plain steps alternate, so background load weighs on both.",
        "- Each drain starts from a freshly filled table after `VACUUM ANALYZE` and "
        "`CHECKPOINT` (SQLite: `ANALYZE` and a WAL checkpoint), through a fresh store "
        "(PostgreSQL: pool of 4, two connections busy with two tasks).",
        "- SQLite: a file in a temp dir, WAL, `synchronous=FULL` (the store's settings). "
        "Its plain baseline is one synchronous connection, so it has no two-task rows.",
        "",
    ]
    for engine in results.data:
        cpu_note = ("benchmark process + PostgreSQL backends" if engine == "postgres"
                    else "the benchmark process, SQLite included")
        lines += [
            f"### Store: {engine}",
            "",
            f"CPU µs/row: median CPU time per row, {cpu_note}; steadier than rows/s when the "
            "machine is shared, and it shows which side spends the time.",
            "",
            "| Operation | Rows | Store rows/s | Plain SQL rows/s | Store / plain "
            "| Store CPU µs/row | Plain CPU µs/row |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for op in OPS:
            store = results.get(engine, "store", op)
            plain = results.get(engine, "plain", op)
            if store is None and plain is None:
                continue
            rows = (store or plain).rows  # type: ignore[union-attr]
            ratio = f"**{store.rate / plain.rate:.2f}**" if store and plain else "—"
            lines.append(
                f"| {op_label(op, args)} | {rows:,} | {_fmt(store.rate if store else None)} "
                f"| {_fmt(plain.rate if plain else None)} | {ratio} "
                f"| {store.cpu() if store else '—'} | {plain.cpu() if plain else '—'} |")
        lines.append("")
        indexed = results.data[engine].get("plain+indexes")
        if indexed:
            lines += [
                "The plain loop again on the wide table with **all** the indexes and "
                "constraints it had before the store split it (0006: unique key, recipient, "
                "ready, leased, finished, import, provider id, ambiguous, template; still no "
                "events and no trigger). It splits the gap into what the old schema costs "
                "(*÷ plain*) and where the store stands against it (*store ÷ this*):",
                "",
                "| Operation | Plain + all indexes rows/s | ÷ plain | Store ÷ this | CPU µs/row |",
                "|---|---:|---:|---:|---:|",
            ]
            for op, measure in indexed.items():
                plain = results.get(engine, "plain", op)
                store = results.get(engine, "store", op)
                lines.append(
                    f"| {op_label(op, args)} | {measure.rate:,.0f} "
                    f"| {measure.rate / plain.rate:.2f} "  # type: ignore[union-attr]
                    f"| {f'{store.rate / measure.rate:.2f}' if store else '—'} "
                    f"| {measure.cpu()} |")
            lines.append("")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.store_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000,
                   help="rows per bulk enqueue and per drain (default 100,000)")
    p.add_argument("--single", type=int, default=2_000,
                   help="messages for the one-commit-each enqueue (default 2,000)")
    p.add_argument("--engines", default="sqlite,postgres",
                   help="comma-separated: sqlite, postgres (default both)")
    p.add_argument("--enqueue-batch", type=int, default=1_000)
    p.add_argument("--claim-batch", type=int, default=200)
    p.add_argument("--no-plain", action="store_true", help="skip the plain-SQL baselines")
    p.add_argument("--no-write", action="store_true",
                   help="print the table only; leave bench/RESULTS.md alone")
    p.add_argument("--callback-endpoint", action="store_true",
                   help="register one status callback endpoint for every delivery, so each "
                        "ack also queues a callback (issue 16; the default measures the "
                        "trigger with none registered)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run everything N times and report medians (default 1)")
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - {"sqlite", "postgres"}
    if unknown:
        p.error(f"unknown engine(s): {', '.join(sorted(unknown))}")
    return args


async def run_sqlite(folder: Path, args: argparse.Namespace, results: Results) -> None:
    engine, plain = SQLiteEngine(folder), PlainSQLite(folder)
    await store_single(engine, args, results)
    if not args.no_plain:
        plain.single(args, results)
    for tasks, with_start in DRAINS:
        await store_fill_and_drain(engine, tasks, with_start, args, results)
        if not args.no_plain and tasks == 1:
            plain.fill_and_drain(with_start, args, results)


async def run_postgres(url: str, args: argparse.Namespace, results: Results) -> None:
    engine, plain = PostgresEngine(url), PlainPostgres(url)
    await plain.setup()
    await store_single(engine, args, results)
    if not args.no_plain:
        await plain.single(args, results)
    for tasks, with_start in DRAINS:
        await store_fill_and_drain(engine, tasks, with_start, args, results)
        if not args.no_plain:
            await plain.fill_and_drain("plain", tasks, with_start, args, results)
    if not args.no_plain:
        await plain.copy_one(args, results)
        for tasks in (1, 2):
            await plain.fill_and_drain("plain+indexes", tasks, False, args, results)


async def run(args: argparse.Namespace) -> Results:
    """Store and plain SQL alternate step by step, so that whatever else the machine is
    doing at a given moment weighs on both sides of a ratio alike."""
    results = Results()
    for round_ in range(1, args.repeat + 1):
        for engine in args.engines:
            print(f"== {engine}, round {round_} of {args.repeat}", flush=True)
            if engine == "sqlite":
                with tempfile.TemporaryDirectory(prefix="postlane-bench-") as folder:
                    await run_sqlite(Path(folder), args, results)
            else:
                with fresh_pg_database() as url:
                    await run_postgres(url, args, results)
    return results


ANALYSIS_BEGIN = "<!-- store analysis: hand-written, kept when the figures are regenerated -->"
ANALYSIS_END = "<!-- /store analysis -->"


def kept_analysis() -> str:
    """The hand-written profile notes inside the current ``store`` section, if any, so that
    regenerating the figures does not drop them (they carry their own date and commit)."""
    if not RESULTS.exists():
        return ""
    text = RESULTS.read_text("utf-8")
    begin, end = text.find(ANALYSIS_BEGIN), text.find(ANALYSIS_END)
    if begin < 0 or end < begin:
        return ""
    return "\n\n" + text[begin:end + len(ANALYSIS_END)]


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    CALLBACK_ENDPOINT["on"] = args.callback_endpoint
    info = machine_info(pg_admin_url() if "postgres" in args.engines else None)
    load_before = loadavg()
    with Timer() as t:
        results = asyncio.run(run(args))
    args.load = (load_before, loadavg())
    args.elapsed = t.seconds
    text = report(results, args, info.markdown())
    print()
    print(text)
    if not args.no_write:
        write_section("store", text + kept_analysis())
        print("\nwritten to bench/RESULTS.md (section `store`)")


if __name__ == "__main__":
    main()
