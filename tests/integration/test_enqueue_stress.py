"""One business event, one delivery: concurrent bulk enqueues of overlapping keys, with real
OS processes, on both engines.

Six processes (spawn context, each with its own store) enqueue random batches drawn from one
shared pool of keys, with repeats inside a batch, so batches collide on keys another
process has just written or is writing. On PostgreSQL that drives both ways through
``enqueue_many``: the direct COPY, and the insert-or-find it falls back to when the COPY
meets a key that exists or that a concurrent transaction holds. Every process records each
result it got.

Afterwards: one row per distinct key; every result anyone got for a key names that row's
id; exactly one result per key says ``created``; one ``enqueued`` event per row; and keys
really did collide across processes (the test would prove nothing otherwise).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import sqlite3
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest

from postlane import Message, open_store

N_PROCESSES = 6
BATCHES = 25
POOL = 3_000


def enqueuer_main(url: str, seed: int, out: str) -> None:
    asyncio.run(_enqueuer(url, seed, out))


async def _enqueuer(url: str, seed: int, out: str) -> None:
    rng = random.Random(seed)
    records: list[tuple[str, int, bool, int]] = []
    async with open_store(url, pool_size=2) as store:
        for batch_no in range(BATCHES):
            keys = [f"welcome:{rng.randrange(POOL)}" for _ in range(rng.randint(1, 300))]
            keys += rng.sample(keys, k=min(len(keys), rng.randint(0, 5)))  # repeats
            results = await store.enqueue_many([
                Message(key=k, to=f"user{k.split(':')[1]}@example.com", subject="Welcome",
                        text=f"welcome {k}", lane="bulk")  # content by key only
                for k in keys
            ])
            assert [r.key for r in results] == keys
            records += [(r.key, r.id, r.created, batch_no) for r in results]
    Path(out).write_text(json.dumps(records))


def _rows(url: str) -> tuple[dict[str, int], tuple[int, int, int]]:
    """Every key's id, and how many deliveries, messages and event rows there are."""
    query_rows = "SELECT idempotency_key, id FROM postlane_delivery_rows"
    query_counts = ("SELECT (SELECT count(*) FROM postlane_deliveries), "
                    "(SELECT count(*) FROM postlane_messages), "
                    "(SELECT count(*) FROM postlane_events)")
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            rows = conn.execute(query_rows).fetchall()
            counts = conn.execute(query_counts).fetchone()
        finally:
            conn.close()
    else:
        with psycopg.connect(url) as pg:
            rows = pg.execute(query_rows).fetchall()
            counts = pg.execute(query_counts).fetchone()
    assert counts is not None
    return dict(rows), counts


def run_enqueue_stress(url: str, tmp: Path) -> None:
    async def migrate() -> None:
        async with open_store(url) as store:
            await store.migrate()
    asyncio.run(migrate())

    ctx = multiprocessing.get_context("spawn")
    outs = [tmp / f"enqueuer-{i}.json" for i in range(N_PROCESSES)]
    procs = [ctx.Process(target=enqueuer_main, args=(url, i, str(outs[i])))
             for i in range(N_PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

    results: dict[str, list[tuple[int, bool, int]]] = defaultdict(list)
    for i, out in enumerate(outs):
        for key, id_, created, _batch in json.loads(out.read_text()):
            results[key].append((id_, created, i))
    rows, (deliveries, messages, events) = _rows(url)

    assert set(rows) == set(results), "a key was lost or a row appeared from nowhere"
    creators: dict[str, int] = {}
    for key, got in results.items():
        assert {id_ for id_, _, _ in got} == {rows[key]}, f"{key}: callers were told {got}"
        made = [proc for _, created, proc in got if created]
        assert len(made) == 1, f"{key}: created {len(made)} times"
        creators[key] = made[0]
    # A batch that lost a race left nothing behind: no delivery without its message or
    # the other way round, and no event row (an enqueue writes none: its timeline entry
    # is the delivery's created_at).
    assert (deliveries, messages, events) == (len(rows), len(rows), 0)
    # Collisions really happened: some process found a key that another one had created.
    found_others = sum(1 for key, got in results.items()
                       for _, created, proc in got if not created and proc != creators[key])
    assert found_others > 100


@pytest.mark.slow
def test_enqueue_stress_sqlite(tmp_path: Path) -> None:
    run_enqueue_stress(f"sqlite:///{tmp_path / 'enqueue.db'}", tmp_path)


@pytest.mark.slow
def test_enqueue_stress_postgres(fresh_pg_url: str, tmp_path: Path) -> None:
    run_enqueue_stress(fresh_pg_url, tmp_path)
