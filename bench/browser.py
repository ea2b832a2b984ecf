"""The messages browser at a million deliveries: each page and count the dashboard asks
for, timed through ``PostgresStore`` and explained (``EXPLAIN (ANALYZE, BUFFERS)``), with and
without migration 0011's partial index on the states the send path never writes.

    python -m bench.browser --rows 1000000          # writes the "browser" section
    python -m bench.browser --rows 200000 --no-write

A fresh PostgreSQL database is migrated and filled server-side (one ``INSERT ... SELECT
generate_series``) with a mix spread evenly over the ids: 90 % sent, 6 % pending, 1 %
retrying, 1.5 % dead, 0.5 % each cancelled and suppressed, 0.3 % ambiguous, 0.2 % expired;
lanes 70/30; the bulk lane's rows in imports of 6,000 (template ``welcome``); five
deliveries per recipient. Then ``VACUUM ANALYZE``. Each query runs ``--repeat`` times;
the median is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench import _harness as h
from bench._common import command_line, fresh_pg_database, write_section
from postlane.core.records import DeliveryFilter
from postlane.store import open_store
from postlane.store.base import DELIVERY_COLUMNS, delivery_conditions

FILL = """
INSERT INTO postlane_deliveries (idempotency_key, lane, recipient, subject, text_body, state,
    attempts, import_id, template_id, template_version, dead_reason, run_at, created_at,
    updated_at, sent_at, finished_at)
SELECT 'k:' || g, lane, 'user' || (g % (%(rows)s / 5)) || '@example.com', 'Your digest',
    'Hello', state,
    CASE WHEN b BETWEEN 960 AND 969 THEN 2 WHEN state = 'pending' THEN 0 ELSE 1 END,
    CASE WHEN lane = 'bulk' THEN 'imp-' || (g / 20000) END,
    CASE WHEN lane = 'bulk' THEN 'welcome' END, CASE WHEN lane = 'bulk' THEN 1 END,
    CASE WHEN state = 'dead' THEN 'permanent' END,
    t, t, t, CASE WHEN state = 'sent' THEN t END,
    CASE WHEN state IN ('sent', 'dead', 'expired', 'cancelled', 'suppressed') THEN t END
FROM (
    SELECT g, g % 1000 AS b, now() - make_interval(secs => (%(rows)s - g)::float8) AS t,
           CASE WHEN g % 10 < 7 THEN 'interactive' ELSE 'bulk' END AS lane,
           CASE WHEN g % 1000 < 900 THEN 'sent'
                WHEN g % 1000 < 970 THEN 'pending'
                WHEN g % 1000 < 985 THEN 'dead'
                WHEN g % 1000 < 990 THEN 'cancelled'
                WHEN g % 1000 < 995 THEN 'suppressed'
                WHEN g % 1000 < 998 THEN 'ambiguous'
                ELSE 'expired' END AS state
    FROM generate_series(1, %(rows)s) AS g
) s
"""


@dataclass(frozen=True)
class Case:
    label: str
    selection: DeliveryFilter
    deep: bool = False
    """A page from the middle of the ids (``before`` = half the rows)."""


def cases(rows: int) -> list[Case]:
    mid = f"imp-{rows // 2 // 20000}"
    return [
        Case("everything, first page", DeliveryFilter()),
        Case("everything, a page half-way down", DeliveryFilter(), deep=True),
        Case("state=sent, lane=bulk", DeliveryFilter(state="sent", lane="bulk")),
        Case("state=pending", DeliveryFilter(state="pending")),
        Case("state=retrying", DeliveryFilter(state="retrying")),
        Case("state=dead", DeliveryFilter(state="dead")),
        Case("state=dead, half-way down", DeliveryFilter(state="dead"), deep=True),
        Case("state=ambiguous, lane=interactive",
             DeliveryFilter(state="ambiguous", lane="interactive")),
        Case("state=cancelled", DeliveryFilter(state="cancelled")),
        Case(f"import_id={mid}", DeliveryFilter(import_id=mid)),
        Case(f"import_id={mid}, state=pending", DeliveryFilter(import_id=mid, state="pending")),
        Case("template_id=welcome, state=dead",
             DeliveryFilter(template_id="welcome", state="dead")),
        Case("recipient=user1234@example.com", DeliveryFilter(recipient="user1234@example.com")),
        Case("key=k:424242", DeliveryFilter(key="k:424242")),
        Case("no match: state=sent, lane=interactive, template_id=welcome",
             DeliveryFilter(state="sent", lane="interactive", template_id="welcome")),
    ]


def explain(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> str:
    """The plan's nodes in one line, with the rows and buffers the top node touched."""
    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()
    assert plan is not None
    root = plan[0][0]["Plan"]
    nodes: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        name = node["Node Type"]
        if "Index Name" in node:
            name += f" {node['Index Name']}"
        nodes.append(name)
        for child in node.get("Plans", []):
            walk(child)

    walk(root)
    hits = root.get("Shared Hit Blocks", 0) + root.get("Shared Read Blocks", 0)
    return f"{' → '.join(n for n in nodes if n != 'Limit')} ({hits:,} buffers)"


async def median_ms(call: Callable[[], Awaitable[object]], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def measure(db: str, rows: int, repeat: int) -> list[tuple[str, float, str, float, str]]:
    results = []
    async with open_store(db) as store:
        with psycopg.connect(db, autocommit=True) as conn:
            for case in cases(rows):
                before = rows // 2 if case.deep else None
                # The same SQL as PostgresStore.list_deliveries and count_deliveries.
                where, params = delivery_conditions(case.selection, lambda n: f"%({n})s",
                                                    before=before)
                page_sql = (f"SELECT {', '.join(DELIVERY_COLUMNS)} FROM postlane_deliveries "
                            f"WHERE {where} ORDER BY id DESC LIMIT %(limit)s")
                count_where, count_params = delivery_conditions(case.selection,
                                                                lambda n: f"%({n})s")
                count_sql = (f"SELECT count(*), COALESCE(max(id), 0) FROM (SELECT id FROM "
                             f"postlane_deliveries WHERE {count_where} LIMIT %(cap)s) s")
                page_ms = await median_ms(lambda c=case, b=before: store.list_deliveries(
                    c.selection, before=b, limit=51), repeat)
                count_ms = await median_ms(lambda c=case: store.count_deliveries(
                    c.selection, cap=10_000), repeat)
                results.append((
                    case.label, page_ms, explain(conn, page_sql, {**params, "limit": 51}),
                    count_ms, explain(conn, count_sql, {**count_params, "cap": 10_001})))
    return results


def table(results: list[tuple[str, float, str, float, str]]) -> list[str]:
    lines = ["| selection | page of 50 | plan | count (to 10,001) | plan |",
             "|---|---:|---|---:|---|"]
    for label, page_ms, page_plan, count_ms, count_plan in results:
        lines.append(f"| {label} | {page_ms:.1f} ms | {page_plan} | {count_ms:.1f} ms | "
                     f"{count_plan} |")
    return lines


def run(rows: int, repeat: int) -> str:
    with h.workdir("browser") as work, fresh_pg_database("postlane_bench_browser") as db:
        h.migrate(db, Path(work))
        started = time.perf_counter()
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(FILL.replace("%(rows)s", str(int(rows))))
            conn.execute("VACUUM ANALYZE postlane_deliveries")
        load_s = time.perf_counter() - started
        with_index = asyncio.run(measure(db, rows, repeat))
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("DROP INDEX postlane_deliveries_settled")
            conn.execute("ANALYZE postlane_deliveries")
        settled = [c for c in cases(rows) if c.selection.state in
                   ("dead", "ambiguous", "cancelled", "expired", "suppressed")]
        without = [r for r in asyncio.run(measure(db, rows, repeat))
                   if r[0] in {c.label for c in settled}]
    body = [
        "## Browser: the messages browser at a million deliveries",
        "",
        f"Command: `{command_line()}`. {rows:,} deliveries loaded server-side in "
        f"{load_s:.1f} s (mix in `bench/browser.py`: 90 % sent, 6 % pending, 1 % retrying, "
        "1.5 % dead, 0.5 % cancelled, 0.5 % suppressed, 0.3 % ambiguous, 0.2 % expired, "
        "spread evenly over the ids), then `VACUUM ANALYZE`. Each call through "
        f"`PostgresStore.list_deliveries` (keyset page of 50 whole rows, +1 to know if "
        "there is an older page: the query `GET /v1/messages` runs too) and "
        f"`count_deliveries` (capped at 10,000), median of {repeat}; plans from "
        "`EXPLAIN (ANALYZE, BUFFERS)` of the same SQL.",
        "",
        *table(with_index),
        "",
        "Without migration 0011's `postlane_deliveries_settled` (partial index on "
        "`(state, id)` for ambiguous, dead, expired, cancelled and suppressed), the same "
        "selections of rare states:",
        "",
        *table(without),
        "",
        "Slow cases left: a selection that matches nothing and that no index narrows (the "
        "last row of the first table) reads the whole table backwards by the primary key; "
        "and counting `retrying` (pending after a failed attempt) is a sequential scan, "
        "here where pending rows are spread over the whole table (in a real queue they are "
        "the newest rows). Pages of `retrying` stay fast. The partial index costs the send "
        "path nothing: a row enters it only when it reaches one of those states, never on "
        "pending → sending → sent; the import and template indexes only gained the id.",
        "",
        f"Load average while measuring: {os.getloadavg()[0]:.1f} (other work shared the "
        "two cores), so single figures are noisy; the plans and buffer counts are not.",
    ]
    return "\n".join(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    body = run(args.rows, args.repeat)
    print(body)
    if not args.no_write:
        write_section("browser", body)


if __name__ == "__main__":
    main()
