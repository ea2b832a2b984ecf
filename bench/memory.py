"""Memory: a worker's peak RSS with a million pending deliveries, next to an idle one.

    python -m bench --only memory
    python -m bench.memory --pending 1000000 --seconds 5

A fresh PostgreSQL database is bulk-loaded with ``--pending`` pending deliveries: the first
5,000 through ``Store.enqueue_many`` (COPY), the rest by one server-side
``INSERT ... SELECT generate_series`` copying their shape (same columns, sizes and indexes; no
per-row timeline event, which the worker never reads), then ``VACUUM ANALYZE``. A
``postlane worker --provider noop://`` (default settings) then claims and sends at full speed
for ``--seconds``; its peak resident set (``VmHWM`` in ``/proc/<pid>/status``) is read just
before it is stopped. The same worker on an empty database is the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench import _harness as h
from bench._common import fresh_pg_database
from postlane.worker.runner import WorkerConfig


@dataclass
class MemoryRun:
    label: str
    pending: int
    load_s: float
    hwm_kib: int | None
    rss_series: list[tuple[float, int]]
    sent: int
    seconds: float


async def _seed(db: str, n: int) -> None:
    from postlane.store import open_store

    async with open_store(db) as store:
        await store.enqueue_many(h.bulk_messages(n, tag="mem"))


def load(db: str, pending: int) -> float:
    started = time.perf_counter()
    seed = min(5000, pending)
    asyncio.run(_seed(db, seed))
    if pending > seed:
        with psycopg.connect(db, autocommit=True) as conn:
            # The message and its narrow delivery row share an id (migration 0007).
            conn.execute(
                "WITH m AS (INSERT INTO postlane_messages (id, idempotency_key, recipient, "
                "sender, subject, text_body, html_body, headers, metadata) "
                "SELECT nextval('postlane_deliveries_id_seq'), 'mem:' || g, "
                "'user' || g || '@example.com', t.sender, t.subject, t.text_body, t.html_body, "
                "t.headers, jsonb_build_object('user', g) "
                "FROM generate_series(%s::bigint, %s::bigint) AS g, "
                "(SELECT * FROM postlane_delivery_rows ORDER BY id LIMIT 1) AS t RETURNING id) "
                "INSERT INTO postlane_deliveries (id, lane, channel, run_at, expires_at) "
                "OVERRIDING SYSTEM VALUE SELECT m.id, t.lane, t.channel, t.run_at, t.expires_at "
                "FROM m, (SELECT * FROM postlane_deliveries ORDER BY id LIMIT 1) AS t",
                (seed, pending - 1))
            conn.execute("VACUUM ANALYZE postlane_deliveries")
            conn.execute("VACUUM ANALYZE postlane_messages")
    return time.perf_counter() - started


def status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def one_run(work: Path, label: str, pending: int, seconds: float) -> MemoryRun:
    with fresh_pg_database("postlane_bench_memory") as db:
        h.migrate(db, work)
        load_s = load(db, pending) if pending else 0.0
        proc = h.worker(db, "noop://", log_path=work / f"memory-{label}.log",
                        name=f"worker ({label})")
        series: list[tuple[float, int]] = []
        hwm = None
        started = time.monotonic()
        try:
            while time.monotonic() - started < seconds:
                time.sleep(0.25)
                rss = status_kib(proc.pid, "VmRSS")
                if rss is not None:
                    series.append((round(time.monotonic() - started, 2), rss))
                if not proc.alive():
                    raise RuntimeError("the worker died\n" + proc.log_tail())
            hwm = h.vm_hwm_kib(proc.pid)
        finally:
            proc.stop()
        (sent,), = h.query(db, "SELECT count(*) FROM postlane_deliveries WHERE state = 'sent'")
    return MemoryRun(label, pending, load_s, hwm, series, sent, seconds)


def measure(pending: int, seconds: float) -> list[MemoryRun]:
    runs = []
    with h.workdir("memory") as work:
        print("bench memory: idle worker (empty queue)...", flush=True)
        runs.append(one_run(work, "empty queue", 0, seconds))
        print(f"bench memory: {pending:,} pending...", flush=True)
        runs.append(one_run(work, f"{pending:,} pending", pending, seconds))
    return runs


def markdown(runs: list[MemoryRun], command: str) -> str:
    lines = [
        "## Memory: worker peak RSS with a million pending deliveries",
        "",
        f"Command: `{command}`. One `postlane worker --provider noop://` (default settings: "
        f"concurrency {WorkerConfig().concurrency}, batches of {WorkerConfig().batch_size}) "
        "claiming and sending at full speed for "
        f"{runs[0].seconds if runs else 0:g} s; peak RSS = `VmHWM` from `/proc/<pid>/status`, "
        "read just before the worker is stopped.",
        "",
        "| queue | bulk load | sent in the window | peak RSS (VmHWM) | RSS at the end |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in runs:
        end = r.rss_series[-1][1] if r.rss_series else None
        lines.append(
            f"| {r.label} | {r.load_s:.1f} s | {r.sent:,} | "
            f"{(r.hwm_kib or 0) / 1024:.1f} MiB | {(end or 0) / 1024:.1f} MiB |")
    lines += ["", "The pending rows are the first 5,000 enqueued with `Store.enqueue_many` (COPY) "
              "and the rest copied from them server-side (`INSERT ... SELECT generate_series`), "
              "then `VACUUM ANALYZE`. A worker holds at most `concurrency` deliveries, so its "
              "memory should not depend on the depth of the queue."]
    return "\n".join(lines)


def run(quick: bool = False, command: str = "", pending: int | None = None,
        seconds: float = 5.0) -> tuple[str, list[MemoryRun]]:
    runs = measure(pending or (100_000 if quick else 1_000_000), seconds)
    return markdown(runs, command), runs


def main() -> None:
    from bench._common import command_line, write_section

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pending", type=int, default=None)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    body, _ = run(a.quick, command_line(), a.pending, a.seconds)
    print(body)
    if not a.no_write:
        write_section("memory", body)


if __name__ == "__main__":
    main()
