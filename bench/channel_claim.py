"""Channel claims: what the channel filter costs, and what the ready index on (lane, channel,
run_at, id) of migration 0010 buys, on PostgreSQL.

    python -m bench.channel_claim                     # 40,000 bulk emails, 20 SMS
    python -m bench.channel_claim --emails 100000

A bulk lane holds ``--emails`` ready emails and, oldest last, ``--sms`` ready SMS. Timed, each
``--rounds`` times (median): an email worker's claim of 100 (``channel='email'``) and an SMS
worker's claim of 10 (``channel='sms'``), each rolled back after it (a claim that is never
committed changes nothing, so every round sees the same table), with migration 0010's index
and then with the index it replaced, (lane, run_at, id), side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import psycopg

from bench._common import command_line, fresh_pg_database, machine_info, write_section
from postlane import Message, open_store
from postlane.core.sms import sms_message
from postlane.store.postgres._base import Q

OLD_INDEX = ("CREATE INDEX postlane_deliveries_ready ON postlane_deliveries (lane, run_at, id) "
             "WHERE state = 'pending'")
NEW_INDEX = ("CREATE INDEX postlane_deliveries_ready_channel ON postlane_deliveries "
             "(lane, channel, run_at, id) WHERE state = 'pending'")


async def _load(url: str, emails: int, sms: int) -> None:
    async with open_store(url) as store:
        await store.migrate()
        batch = 5000
        for start in range(0, emails, batch):
            await store.enqueue_many([
                Message(key=f"digest:{i}", to=f"reader{i}@example.com", subject="Digest",
                        text="Hello", lane="bulk")
                for i in range(start, min(emails, start + batch))])
        await store.enqueue_many([sms_message(key=f"otp:{i}", to="+14155550100",
                                              text="Code", lane="bulk") for i in range(sms)])


def _time_claims(url: str, channel: str, limit: int, rounds: int) -> float:
    params = {"lane": "bulk", "channel": channel, "limit": limit, "owner": "bench",
              "lease_s": 30.0, "exclude_imports": []}
    times = []
    with psycopg.connect(url) as conn:
        for _ in range(rounds):
            started = time.perf_counter()
            rows = conn.execute(Q["claim"], params, prepare=False).fetchall()
            times.append(time.perf_counter() - started)
            assert rows, f"nothing claimed for {channel}"
            conn.rollback()
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--emails", type=int, default=40_000)
    parser.add_argument("--sms", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with fresh_pg_database("postlane_bench_channel") as url:
        asyncio.run(_load(url, args.emails, args.sms))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE postlane_deliveries")
        figures = {}
        for label, drop, create in (("0010 index (lane, channel, run_at, id)", None, None),
                                    ("old index (lane, run_at, id)",
                                     "DROP INDEX postlane_deliveries_ready_channel",
                                     OLD_INDEX)):
            if drop is not None:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(drop)
                    conn.execute(create)  # type: ignore[arg-type]
                    conn.execute("ANALYZE postlane_deliveries")
            figures[label] = (_time_claims(url, "email", 100, args.rounds),
                              _time_claims(url, "sms", 10, args.rounds))
        info = machine_info(url)
    rows = "\n".join(f"| {label} | {email_ms:.2f} | {sms_ms:.2f} |"
                     for label, (email_ms, sms_ms) in figures.items())
    new, old = figures["0010 index (lane, channel, run_at, id)"], figures[
        "old index (lane, run_at, id)"]
    body = f"""## Channel claims: an SMS worker behind an email backlog

`{command_line()}` on {info.cpu}, {info.nproc} cores; commit {info.commit}; {info.date}.

{args.emails:,} ready bulk emails and {args.sms} ready SMS behind them (oldest last), on
PostgreSQL; median of {args.rounds} claims (the worker's claim statement), each rolled back.

| ready index | email claim of 100 (ms) | SMS claim of 10 (ms) |
|---|---:|---:|
{rows}

With the channel leading into the index, an SMS worker's claim no longer walks the email
backlog of its lane: {old[1] / new[1]:.1f}x faster here; the email claim is unchanged
({new[0] / old[0]:.2f}x).
"""
    print(body)
    write_section("channel-claim", body)


if __name__ == "__main__":
    main()
