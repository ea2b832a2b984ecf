"""Lanes: how long an interactive message waits while a bulk burst drains at the ceiling.

    python -m bench --only lanes
    python -m bench.lanes --bulk 40000 --interactive 30 --runs 5

A fresh PostgreSQL database gets ``--bulk`` messages in the ``bulk`` lane at once; one
``postlane worker --provider noop:// --rate 200/s`` starts; then an interactive message is
enqueued (one transaction each, ``postlane.enqueue``) every ~0.5 s. Latency is measured on the
database clock: ``sent_at - created_at``. The run stops once ``--interactive`` messages were
enqueued and sent (or 15 s after the last one): it does not drain the burst.

The same run is repeated with a single FIFO lane (``--lanes bulk=100``; the "interactive"
messages are enqueued into ``bulk`` behind the burst). There they are not sent within the
run: the section gives the time they had waited when the run stopped (a lower bound) and
the wait their queue position implies at the measured send rate.

The lanes configuration runs ``--runs`` times (default 3), each on a fresh database and a fresh
worker: the promise is a p99 under one second in *every* run, so the section lists each run
and the worst of them, not an average.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench import _harness as h
from bench._common import fresh_pg_database
from postlane import Message, enqueue
from postlane.worker.runner import WorkerConfig

RATE = 200.0


@dataclass
class LaneRun:
    label: str
    lanes: str
    bulk: int
    interactive: int
    latencies: list[float]
    unsent_waits: list[float]
    projected: list[float]
    bulk_rate: float
    duration_s: float


async def _load(db: str, n: int) -> float:
    from postlane.store import open_store

    messages = h.bulk_messages(n, tag="burst")
    async with open_store(db) as store:
        started = time.perf_counter()
        for i in range(0, n, 5000):
            await store.enqueue_many(messages[i:i + 5000])
        return time.perf_counter() - started


def one_run(work: Path, label: str, lanes: str, interactive_lane: str, bulk: int,
            interactive: int, every_s: float) -> LaneRun:
    with fresh_pg_database("postlane_bench_lanes") as db:
        h.migrate(db, work)
        asyncio.run(_load(db, bulk))
        proc = h.worker(db, "noop://", "--rate", f"{RATE:g}/s", "--lanes", lanes,
                        log_path=work / f"lanes-{label}.log", name=f"worker ({label})")
        rng = random.Random(7)
        try:
            h.wait_for(lambda: h.query(db, "SELECT 1 FROM postlane_deliveries "
                                           "WHERE state = 'sent' LIMIT 1"), 30,
                       "the first bulk send")
            started = time.time()
            with psycopg.connect(db, autocommit=False) as conn:
                for i in range(interactive):
                    with conn.transaction():
                        enqueue(conn, Message(
                            key=f"interactive:{i}", to=f"person{i}@example.com",
                            subject="Your password reset link", text="Reset it here: ...",
                            lane=interactive_lane))
                    time.sleep(every_s * rng.uniform(0.8, 1.2))
                    if not proc.alive():
                        raise RuntimeError("the worker died\n" + proc.log_tail())
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                (left,), = h.query(db, "SELECT count(*) FROM postlane_delivery_rows WHERE "
                                       "idempotency_key LIKE 'interactive:%%' AND sent_at IS NULL")
                if left == 0:
                    break
                time.sleep(0.25)
            duration = time.time() - started
        finally:
            proc.stop()
        latencies = [r[0] for r in h.query(
            db, "SELECT extract(epoch FROM sent_at - created_at)::float8 "
                "FROM postlane_delivery_rows "
                "WHERE idempotency_key LIKE 'interactive:%%' AND sent_at IS NOT NULL")]
        unsent = [r[0] for r in h.query(
            db, "SELECT extract(epoch FROM now() - created_at)::float8 "
                "FROM postlane_delivery_rows "
                "WHERE idempotency_key LIKE 'interactive:%%' AND sent_at IS NULL")]
        (sent_bulk, span), = h.query(
            db, "SELECT count(*), extract(epoch FROM max(sent_at) - min(sent_at))::float8 "
                "FROM postlane_delivery_rows WHERE idempotency_key LIKE 'burst:%%' "
                "AND sent_at IS NOT NULL")
        bulk_rate = (sent_bulk - 1) / span if span else 0.0
        # Queue position of each unsent message: bulk rows ahead of it (claimed oldest first)
        # that were not yet sent when it was enqueued.
        ahead = [r[0] for r in h.query(
            db, "SELECT (SELECT count(*) FROM postlane_delivery_rows b WHERE b.lane = i.lane "
                "AND b.idempotency_key LIKE 'burst:%%' AND (b.run_at, b.id) < (i.run_at, i.id) "
                "AND (b.sent_at IS NULL OR b.sent_at > i.created_at)) "
                "FROM postlane_delivery_rows i WHERE i.idempotency_key LIKE 'interactive:%%' "
                "AND i.sent_at IS NULL")]
        projected = [a / bulk_rate for a in ahead] if bulk_rate else []
    return LaneRun(label, lanes, bulk, interactive, latencies, unsent, projected, bulk_rate,
                   duration)


def measure(bulk: int, interactive: int, every_s: float, repeats: int) -> list[LaneRun]:
    runs = []
    with h.workdir("lanes") as work:
        for n in range(1, repeats + 1):
            print(f"bench lanes: lanes run {n} of {repeats}, {bulk:,} bulk + {interactive} "
                  "interactive...", flush=True)
            runs.append(one_run(work, f"lanes #{n}", "interactive=70,bulk=30", "interactive",
                                bulk, interactive, every_s))
        print("bench lanes: single FIFO lane...", flush=True)
        runs.append(one_run(work, "fifo", "bulk=100", "bulk", bulk, interactive, every_s))
    return runs


def _row(run: LaneRun) -> str:
    if run.latencies:
        p50, p99 = h.percentile(run.latencies, 50), h.percentile(run.latencies, 99)
        got = (f"{len(run.latencies)} of {run.interactive} | {h.fmt_ms(p50)} | {h.fmt_ms(p99)} "
               f"| {h.fmt_ms(max(run.latencies))}")
    else:
        got = f"0 of {run.interactive} | — | — | —"
    if run.unsent_waits:
        waited = (f"{len(run.unsent_waits)} unsent after waiting {min(run.unsent_waits):.0f}–"
                  f"{max(run.unsent_waits):.0f} s; queue position implies "
                  f"p50 {h.percentile(run.projected, 50):.0f} s, "
                  f"p99 {h.percentile(run.projected, 99):.0f} s")
    else:
        waited = "all sent"
    return (f"| {run.label} (`--lanes {run.lanes}`) | {got} | {waited} | "
            f"{run.bulk_rate:.1f}/s |")


def _worst(runs: list[LaneRun]) -> str:
    lanes = [r for r in runs if r.label.startswith("lanes")]
    if not lanes:
        return ""
    p99s = [h.percentile(r.latencies, 99) for r in lanes if r.latencies]
    unsent = sum(len(r.unsent_waits) for r in lanes)
    if not p99s:
        return "No interactive message was sent in any lanes run."
    worst = max(p99s)
    verdict = "under" if worst < 1.0 and unsent == 0 else "NOT under"
    return (f"Worst interactive p99 over the {len(lanes)} lanes runs: **{h.fmt_ms(worst)}** "
            f"(best {h.fmt_ms(min(p99s))}; {unsent} interactive messages unsent): {verdict} "
            "one second in every run.")


def markdown(runs: list[LaneRun], command: str) -> str:
    bulk = runs[0].bulk if runs else 0
    return "\n".join([
        "## Lanes: interactive latency behind a bulk burst at the ceiling",
        "",
        f"Command: `{command}`. {bulk:,} bulk messages enqueued at once into PostgreSQL, one "
        f"`postlane worker --provider noop:// --rate {RATE:g}/s` (in-process limiter, default "
        f"headroom 2 %, concurrency {WorkerConfig().concurrency}), then one interactive "
        "message every ~0.5 s; the lanes configuration runs several times, each on a fresh "
        "database and worker "
        "(`postlane.enqueue`, one transaction each). Latency = `sent_at - created_at` on the "
        "database clock (p99 of a few dozen samples is their maximum). The run stops after the "
        "interactive messages (it does not drain the burst).",
        "",
        "| configuration | interactive sent | p50 | p99 | max | not sent when the run stopped "
        "| bulk send rate |",
        "|---|---|---:|---:|---:|---|---:|",
        *(_row(r) for r in runs),
        "",
        _worst(runs),
        "",
        "With one FIFO lane an interactive message waits behind every bulk message enqueued "
        "before it: at the ceiling that is the burst's size divided by the rate. Lanes give "
        "the interactive lane its own share of the worker slots (70 of 100) and it takes the "
        "next free send slot from the shared limiter.",
    ])


def run(quick: bool = False, command: str = "", bulk: int | None = None,
        interactive: int | None = None, repeats: int | None = None) -> tuple[str, list[LaneRun]]:
    bulk = bulk or (10_000 if quick else 40_000)
    interactive = interactive or (10 if quick else 30)
    repeats = repeats or (1 if quick else 3)
    runs = measure(bulk, interactive, 0.5, repeats)
    return markdown(runs, command), runs


def main() -> None:
    from bench._common import command_line, write_section

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bulk", type=int, default=None)
    p.add_argument("--interactive", type=int, default=None)
    p.add_argument("--runs", type=int, default=None,
                   help="how many times to run the lanes configuration (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    if a.runs is not None and a.runs < 1:
        p.error("--runs must be at least 1")
    body, _ = run(a.quick, command_line(), a.bulk, a.interactive, a.runs)
    print(body)
    if not a.no_write:
        write_section("lanes", body)


if __name__ == "__main__":
    main()
