"""PgQueuer peer: ``enqueue`` N no-op jobs in batches, or ``consume`` them in drain mode.

Tuned as PgQueuer's own benchmark does (tools/benchmark.py, drain strategy): several
QueueManagers per process, each on its own asyncpg connection, ``batch_size`` jobs per
dequeue. The bench runs 2 processes x 2 managers, batches of 100.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import _peerstats
import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode


async def install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def enqueue(dsn: str, jobs: int, batch: int) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        started = time.perf_counter()
        for i in range(0, jobs, batch):
            n = min(batch, jobs - i)
            await queries.enqueue(["noop"] * n, [b"%d" % (i + k) for k in range(n)], [0] * n)
        return time.perf_counter() - started
    finally:
        await conn.close()


async def consume(dsn: str, managers: int, batch: int) -> None:
    async def one() -> None:
        conn = await asyncpg.connect(dsn)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            _peerstats.tick()

        try:
            await pgq.run(batch_size=batch, mode=QueueExecutionMode.drain)
        finally:
            await conn.close()

    await asyncio.gather(*(one() for _ in range(managers)))
    _peerstats.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["install", "enqueue", "consume"])
    p.add_argument("--dsn", required=True)
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--managers", type=int, default=2)
    a = p.parse_args()
    if a.action == "install":
        asyncio.run(install(a.dsn))
    elif a.action == "enqueue":
        print(json.dumps({"seconds": asyncio.run(enqueue(a.dsn, a.jobs, a.batch))}))
    else:
        asyncio.run(consume(a.dsn, a.managers, a.batch))


if __name__ == "__main__":
    main()
