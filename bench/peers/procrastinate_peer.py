"""procrastinate peer: ``install`` the schema, ``enqueue`` N no-op jobs with
``batch_defer_async`` (its bulk API), or ``consume`` them with ``run_worker_async(wait=False)``
(exits once the queue is caught up). The bench runs 2 processes, ``--concurrency`` each."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time

import _peerstats
import procrastinate


def make_app(dsn: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop", queue="bench")
    async def noop(i: int) -> None:
        _peerstats.tick()

    return app


async def run(action: str, dsn: str, jobs: int, batch: int, concurrency: int) -> float:
    app = make_app(dsn)
    async with app.open_async():
        if action == "install":
            await app.schema_manager.apply_schema_async()
            return 0.0
        if action == "enqueue":
            task = app.tasks["noop"]
            started = time.perf_counter()
            for i in range(0, jobs, batch):
                await task.batch_defer_async(*({"i": k} for k in range(i, min(jobs, i + batch))))
            return time.perf_counter() - started
        await app.run_worker_async(queues=["bench"], concurrency=concurrency, wait=False,
                                   install_signal_handlers=True)
        _peerstats.flush()
        return 0.0


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["install", "enqueue", "consume"])
    p.add_argument("--dsn", required=True)
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=10)
    a = p.parse_args()
    seconds = asyncio.run(run(a.action, a.dsn, a.jobs, a.batch, a.concurrency))
    if a.action == "enqueue":
        print(json.dumps({"seconds": seconds}))


if __name__ == "__main__":
    main()
