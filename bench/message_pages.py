"""What one page of ``GET /v1/messages`` costs at a million rows: the first page and a page
near the end (keyset cursor), per filter, through ``Store.list_deliveries`` on PostgreSQL.

    python -m bench.message_pages [--rows 1000000]

Rows are written by one ``INSERT ... SELECT generate_series`` (states spread as a kept
history looks: mostly sent, some dead, cancelled, pending), then ``VACUUM ANALYZE``. Each
figure is the median of five calls. Writes the ``message_pages`` section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import psycopg

from bench._common import fresh_pg_database, postlane_commit, write_section
from postlane.core.records import DeliveryFilter
from postlane.store import open_store

# The narrow rows and their messages (0007), one id each: the ids are the series.
_FILL = """
WITH d AS (
    INSERT INTO postlane_deliveries (id, lane, state, attempts, import_id, finished_at)
    OVERRIDING SYSTEM VALUE
    SELECT i, CASE WHEN i %% 5 = 0 THEN 'interactive' ELSE 'bulk' END,
           CASE WHEN i %% 1000 = 0 THEN 'dead' WHEN i %% 200 = 0 THEN 'cancelled'
                WHEN i %% 100 = 0 THEN 'pending' ELSE 'sent' END,
           CASE WHEN i %% 1000 = 0 THEN 5 WHEN i %% 300 = 0 THEN 2 ELSE 1 END,
           'import-' || (i %% 20),
           CASE WHEN i %% 100 = 0 AND i %% 200 <> 0 THEN NULL ELSE now() END
    FROM generate_series(1, %(rows)s) AS i
)
INSERT INTO postlane_messages (id, idempotency_key, recipient, subject, text_body, template_id)
SELECT i, 'k:' || i, 'u' || (i %% 50000) || '@example.com', 's', 't', 'tpl-' || (i %% 10)
FROM generate_series(1, %(rows)s) AS i
"""

FILTERS: list[tuple[str, DeliveryFilter]] = [
    ("none", DeliveryFilter()),
    ("lane=interactive", DeliveryFilter(lane="interactive")),
    ("state=sent", DeliveryFilter(state="sent")),
    ("state=queued (1%)", DeliveryFilter(state="queued")),
    ("state=dead (0.1%)", DeliveryFilter(state="dead")),
    ("recipient (20 rows)", DeliveryFilter(recipient="u123@example.com")),
    ("import_id (5%)", DeliveryFilter(import_id="import-7")),
]


async def _median_ms(call: object) -> float:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        await call()  # type: ignore[operator]
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def measure(url: str, rows: int) -> list[tuple[str, float, float]]:
    async with open_store(url) as store:
        await store.migrate()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_FILL, {"rows": rows})
        conn.execute("SELECT setval('postlane_deliveries_id_seq', %(rows)s)", {"rows": rows})
        conn.execute("VACUUM ANALYZE postlane_deliveries")
        conn.execute("VACUUM ANALYZE postlane_messages")
    found = []
    async with open_store(url) as store:
        deep_cursor = rows // 20  # a page near the end: past 95 % of the rows, newest first
        for name, selection in FILTERS:
            first = await _median_ms(lambda s=selection: store.list_deliveries(s, limit=100))
            deep = await _median_ms(lambda s=selection: store.list_deliveries(
                s, before=deep_cursor, limit=100))
            found.append((name, first, deep))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    with fresh_pg_database("postlane_bench_pages") as url:
        results = asyncio.run(measure(url, args.rows))
    load = " / ".join(Path("/proc/loadavg").read_text().split()[:3])
    lines = [
        "## Messages list: one page at a million rows",
        "",
        f"Command: `python -m bench.message_pages --rows {args.rows}`; postlane "
        f"{postlane_commit()}; load average {load}. One page of 100 of `GET /v1/messages` "
        "(`Store.list_deliveries`, PostgreSQL, newest first), median of five calls: the "
        "first page, and a page whose keyset cursor is past 95 % of the rows. Rare states "
        "are found by walking the primary key backwards (the only indexes on `state` are "
        "the partial ones on pending and leased rows), so their cost grows with their "
        "rarity; a partial index on the rare states would bound it (left for the merge "
        "with issue 14's hot-path work, which owns the deliveries table).",
        "",
        f"| filter ({args.rows:,} rows) | first page, ms | page past 95 %, ms |",
        "|---|---:|---:|",
        *(f"| {name} | {first:.1f} | {deep:.1f} |" for name, first, deep in results),
    ]
    print("\n".join(lines))
    write_section("message_pages", "\n".join(lines))


if __name__ == "__main__":
    main()
