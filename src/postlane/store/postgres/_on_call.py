"""The on-call view on PostgreSQL: workers' heartbeats and outcomes per minute (migration
0011). The messages browser's and the bulk actions' queries are ``_operating``'s, shared
with the HTTP API."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from postlane.core.records import OutcomeMinute, WorkerHeartbeat, WorkerSeen
from postlane.store.postgres._base import PostgresBase, Q

KEEP_MINUTES_S = 2 * 86400
"""Outcome minutes older than this are dropped as new ones are written."""
KEEP_GONE_S = 86400
"""A worker that stopped heart-beating is listed (as gone) this long, then dropped."""


class OnCallMixin(PostgresBase):
    async def record_heartbeat(self, heartbeat: WorkerHeartbeat,
                               outcomes: Mapping[tuple[str, str], int]) -> None:
        counted = [(lane, outcome, n) for (lane, outcome), n in sorted(outcomes.items()) if n]
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(Q["heartbeat"], {
                "owner": heartbeat.owner, "host": heartbeat.host, "pid": heartbeat.pid,
                "version": heartbeat.version, "provider": heartbeat.provider,
                "lanes": Jsonb(dict(heartbeat.lanes)), "in_flight": heartbeat.in_flight,
                "interval_s": heartbeat.interval_s})
            await conn.execute(Q["forget_gone_workers"], (KEEP_GONE_S,))
            if counted:
                await conn.execute(Q["add_outcomes"], {
                    "lanes": [c[0] for c in counted], "outcomes": [c[1] for c in counted],
                    "counts": [c[2] for c in counted]})
                await conn.execute(Q["forget_old_minutes"], (KEEP_MINUTES_S,))

    async def forget_worker(self, owner: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(Q["forget_worker"], (owner,))

    async def list_workers(self) -> list[WorkerSeen]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["workers"])
            return [_seen(row) for row in await cur.fetchall()]

    async def outcome_minutes(self, window: timedelta) -> list[OutcomeMinute]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["outcome_minutes"], (window.total_seconds(),))
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
