"""Pickup: enqueue-to-claim latency on an idle queue, PostgreSQL (LISTEN/NOTIFY) and SQLite
(the store polls ``PRAGMA data_version`` every 50 ms for commits by other connections).

    python -m bench --only pickup
    python -m bench.pickup --messages 50

One idle ``postlane worker --provider noop://`` runs; ``--messages`` single messages are
enqueued one at a time (``postlane.enqueue``, one transaction each), 0.2-0.6 s apart (random,
so the enqueues do not lock onto the poll period). Latency = the delivery's ``claimed_at``
minus its ``created_at``, both from the database (PostgreSQL: the start of the claim's
statement and of the enqueueing transaction; SQLite: unix seconds written by the store);
enqueue-to-sent is given too.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench import _harness as h
from bench._common import fresh_pg_database
from postlane import Message, enqueue


@dataclass
class PickupRun:
    engine: str
    claim: list[float]
    sent: list[float]
    messages: int


def _enqueue_spaced(db: str, n: int, proc: h.Proc) -> None:
    rng = random.Random(11)
    for i in range(n):
        message = Message(key=f"pickup:{i}", to=f"person{i}@example.com",
                          subject="Your sign-in code", text="123456", lane="interactive")
        if db.startswith("sqlite:"):
            conn = sqlite3.connect(db[len("sqlite:///"):], timeout=30)
            try:
                with conn:
                    enqueue(conn, message)
            finally:
                conn.close()
        else:
            with psycopg.connect(db) as conn:
                enqueue(conn, message)
        time.sleep(rng.uniform(0.2, 0.6))
        if not proc.alive():
            raise RuntimeError("the worker died\n" + proc.log_tail())


def one_run(work: Path, engine: str, db: str, n: int) -> PickupRun:
    h.migrate(db, work)
    proc = h.postlane(db, "worker", "--provider", "noop://", "--log-level", "INFO",
                      log_path=work / f"pickup-{engine.split()[0]}.log", name=f"worker ({engine})")
    try:
        h.wait_for(lambda: "started" in proc.log_path.read_text(errors="replace"), 30,
                   "the worker to start")
        time.sleep(1.0)
        _enqueue_spaced(db, n, proc)
        h.wait_for(lambda: h.query(db, "SELECT count(*) FROM postlane_deliveries "
                                       "WHERE state = 'sent'")[0][0] >= n, 30, "every send")
    finally:
        proc.stop()
    # claimed_at: the (first and only) claim's time, kept on the narrow row (0015).
    rows = h.query(db, f"SELECT {h.epoch(db, 'd.claimed_at')} - {h.epoch(db, 'd.created_at')}, "
                       f"{h.epoch(db, 'd.sent_at')} - {h.epoch(db, 'd.created_at')} "
                       "FROM postlane_deliveries d WHERE d.claimed_at IS NOT NULL")
    return PickupRun(engine, [r[0] for r in rows], [r[1] for r in rows], n)


def measure(n: int) -> list[PickupRun]:
    runs = []
    with h.workdir("pickup") as work:
        print(f"bench pickup: PostgreSQL, {n} spaced enqueues...", flush=True)
        with fresh_pg_database("postlane_bench_pickup") as db:
            runs.append(one_run(work, "PostgreSQL (LISTEN/NOTIFY)", db, n))
        print(f"bench pickup: SQLite, {n} spaced enqueues...", flush=True)
        runs.append(one_run(work, "SQLite (data_version polled every 50 ms)",
                            f"sqlite:///{work / 'pickup.db'}", n))
    return runs


def markdown(runs: list[PickupRun], command: str) -> str:
    lines = [
        "## Pickup: enqueue to claim on an idle queue",
        "",
        f"Command: `{command}`. One idle `postlane worker --provider noop://` (default "
        "settings); single enqueues (`postlane.enqueue`, one transaction each) 0.2–0.6 s apart; "
        "times from the database.",
        "",
        "| engine | messages | claim p50 | claim p99 | claim max | sent p50 | sent p99 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r.engine} | {len(r.claim)} of {r.messages} | {h.fmt_ms(h.percentile(r.claim, 50))}"
            f" | {h.fmt_ms(h.percentile(r.claim, 99))}"
            f" | {h.fmt_ms(max(r.claim, default=float('nan')))}"
            f" | {h.fmt_ms(h.percentile(r.sent, 50))} | {h.fmt_ms(h.percentile(r.sent, 99))} |")
    lines += ["", "SQLite has no notification across processes: an idle worker checks "
              "`PRAGMA data_version` every 50 ms (and wakes at once on an enqueue made in its "
              "own process); PostgreSQL wakes it with NOTIFY (one per enqueueing statement)."]
    return "\n".join(lines)


def run(quick: bool = False, command: str = "", messages: int | None = None
        ) -> tuple[str, list[PickupRun]]:
    runs = measure(messages or (15 if quick else 50))
    return markdown(runs, command), runs


def main() -> None:
    from bench._common import command_line, write_section

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    body, _ = run(a.quick, command_line(), a.messages)
    print(body)
    if not a.no_write:
        write_section("pickup", body)


if __name__ == "__main__":
    main()
