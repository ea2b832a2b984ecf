"""The on-call view on PostgreSQL: workers' heartbeats and outcomes per minute (migration
0011). The messages browser's and the bulk actions' queries are ``_operating``'s, shared
with the HTTP API."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from postlane.core.records import OutcomeMinute, WorkerHeartbeat, WorkerSeen
from postlane.store.postgres._base import PostgresBase

KEEP_MINUTES_S = 2 * 86400
"""Outcome minutes older than this are dropped as new ones are written."""
KEEP_GONE_S = 86400
"""A worker that stopped heart-beating is listed (as gone) this long, then dropped."""

_HEARTBEAT = """
INSERT INTO postlane_workers (owner, host, pid, version, provider, lanes, in_flight, interval_s)
VALUES (%(owner)s, %(host)s, %(pid)s, %(version)s, %(provider)s, %(lanes)s, %(in_flight)s,
        %(interval_s)s)
ON CONFLICT (owner) DO UPDATE SET lanes = excluded.lanes, in_flight = excluded.in_flight,
    interval_s = excluded.interval_s, heartbeat_at = now()
"""
_ADD_OUTCOMES = """
INSERT INTO postlane_outcome_minutes (minute, lane, outcome, count)
SELECT (floor(EXTRACT(EPOCH FROM now()) / 60) * 60)::bigint, lane, outcome, n
FROM unnest(%(lanes)s::text[], %(outcomes)s::text[], %(counts)s::bigint[]) AS t(lane, outcome, n)
ON CONFLICT (minute, lane, outcome)
DO UPDATE SET count = postlane_outcome_minutes.count + excluded.count
"""
_WORKERS = """
SELECT owner, host, pid, version, provider, lanes, in_flight, interval_s, started_at,
       heartbeat_at, EXTRACT(EPOCH FROM now() - heartbeat_at)::float8
FROM postlane_workers ORDER BY host, pid, owner
"""


class OnCallMixin(PostgresBase):
    async def record_heartbeat(self, heartbeat: WorkerHeartbeat,
                               outcomes: Mapping[tuple[str, str], int]) -> None:
        counted = [(lane, outcome, n) for (lane, outcome), n in sorted(outcomes.items()) if n]
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(_HEARTBEAT, {
                "owner": heartbeat.owner, "host": heartbeat.host, "pid": heartbeat.pid,
                "version": heartbeat.version, "provider": heartbeat.provider,
                "lanes": Jsonb(dict(heartbeat.lanes)), "in_flight": heartbeat.in_flight,
                "interval_s": heartbeat.interval_s})
            await conn.execute(
                "DELETE FROM postlane_workers "
                "WHERE heartbeat_at < now() - make_interval(secs => %s)", (KEEP_GONE_S,))
            if counted:
                await conn.execute(_ADD_OUTCOMES, {
                    "lanes": [c[0] for c in counted], "outcomes": [c[1] for c in counted],
                    "counts": [c[2] for c in counted]})
                await conn.execute(
                    "DELETE FROM postlane_outcome_minutes "
                    "WHERE minute < EXTRACT(EPOCH FROM now()) - %s", (KEEP_MINUTES_S,))

    async def forget_worker(self, owner: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute("DELETE FROM postlane_workers WHERE owner = %s", (owner,))

    async def list_workers(self) -> list[WorkerSeen]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_WORKERS)
            return [_seen(row) for row in await cur.fetchall()]

    async def outcome_minutes(self, window: timedelta) -> list[OutcomeMinute]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT minute, lane, outcome, count FROM postlane_outcome_minutes "
                "WHERE minute >= EXTRACT(EPOCH FROM now()) - %s ORDER BY minute, lane, outcome",
                (window.total_seconds(),))
            return [OutcomeMinute(int(m), lane, o, int(n))
                    for m, lane, o, n in await cur.fetchall()]


def _seen(row: Sequence[Any]) -> WorkerSeen:
    (owner, host, pid, version, provider, lanes, in_flight, interval_s, started_at,
     heartbeat_at, age_s) = row
    return WorkerSeen(
        WorkerHeartbeat(owner, host, int(pid), version, provider,
                        {str(k): float(v) for k, v in lanes.items()}, int(in_flight),
                        float(interval_s)),
        started_at, heartbeat_at, max(0.0, float(age_s)))
